"""Bounds of index expressions over every launch: what a ring-slot index can reach, whatever the shape.

:func:`loop_bounds` gives each node the range of the loop variables and bindings in scope (a loop
variable runs from its start's least value to its stop's greatest minus one; a problem dimension is any
value from 1 up, a CTA coordinate from 0, a CTA count from 1); :func:`bounds` folds an expression over
such ranges into an :class:`Interval`. Bounds are sound (every value the expression takes lies within
them) and lose precision where that is cheap: a product or quotient of operands whose signs are not known
is unbounded. ``a % c`` and ``a // c`` follow C (the lowering's) as well as Python: ``|a % c| < c``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cake_core.ir.expr import CTA_COORDS, CTA_COUNTS, Bin, Call, Expr, Sym
from cake_core.ir.opdef import Op, Scope
from cake_core.ir.tree import loop_range


@dataclass(frozen=True)
class Interval:
    lo: int | None        # None: no lower bound
    hi: int | None        # None: no upper bound

    def __str__(self) -> str:
        return f"[{'-inf' if self.lo is None else self.lo}, {'inf' if self.hi is None else self.hi}]"


ANY = Interval(None, None)


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _scale(x: Interval, c: int) -> Interval:
    lo, hi = (x.lo, x.hi) if c >= 0 else (x.hi, x.lo)
    return Interval(None if lo is None else lo * c, None if hi is None else hi * c)


def bounds(e: Expr, env: Mapping[str, Interval]) -> Interval:
    """The values ``e`` can take when each symbol lies in its interval of ``env`` (a symbol not in it: any)."""
    if isinstance(e, bool) or isinstance(e, float):
        return ANY
    if isinstance(e, int):
        return Interval(e, e)
    if isinstance(e, Sym):
        return env.get(e.name, ANY)
    if isinstance(e, Bin):
        a, b = bounds(e.a, env), bounds(e.b, env)
        if e.op == "+":
            return Interval(_add(a.lo, b.lo), _add(a.hi, b.hi))
        if e.op == "-":
            return Interval(_add(a.lo, None if b.hi is None else -b.hi), _add(a.hi, None if b.lo is None else -b.lo))
        const_b = b.lo if b.lo is not None and b.lo == b.hi else None
        const_a = a.lo if a.lo is not None and a.lo == a.hi else None
        if e.op == "*":
            if const_b is not None:
                return _scale(a, const_b)
            if const_a is not None:
                return _scale(b, const_a)
            if a.lo is not None and b.lo is not None and a.lo >= 0 and b.lo >= 0:
                return Interval(a.lo * b.lo, None if a.hi is None or b.hi is None else a.hi * b.hi)
            return ANY
        if const_b is None or const_b <= 0:
            return ANY
        if e.op == "%":
            return Interval(0 if a.lo is not None and a.lo >= 0 else -(const_b - 1), const_b - 1)
        return _div(a, const_b, ceil=False)
    if isinstance(e, Call):
        xs = [bounds(x, env) for x in e.args]
        if e.fn == "min":
            his = [x.hi for x in xs if x.hi is not None]
            return Interval(None if any(x.lo is None for x in xs) else min(x.lo for x in xs),
                            min(his) if his else None)
        if e.fn == "max":
            los = [x.lo for x in xs if x.lo is not None]
            return Interval(max(los) if los else None,
                            None if any(x.hi is None for x in xs) else max(x.hi for x in xs))
        if e.fn == "cdiv":
            c = xs[1]
            if c.lo is None or c.lo != c.hi or c.lo <= 0:
                return ANY
            return _div(xs[0], c.lo, ceil=True)
    return ANY


def _div(a: Interval, c: int, ceil: bool) -> Interval:
    """``a // c`` (or cdiv) for a constant ``c > 0``: C truncates toward zero, Python floors; the bounds hold
    either way (they widen by one below zero)."""
    def f(x: int | None, low: bool) -> int | None:
        if x is None:
            return None
        q = -(-x // c) if ceil else x // c
        return q - 1 if low and x < 0 else q + 1 if not low and x < 0 else q
    return Interval(f(a.lo, True), f(a.hi, False))


def loop_bounds(program: Any, dims: set[str]) -> dict[int, dict[str, Interval]]:
    """id(node) -> the intervals of every symbol in scope there: consts (exact), dims, CTA coordinates and
    counts, loop variables, ``let`` bindings and the values read from memory (``scalar``, ``fetch_add``,
    ``compact``: 0 to their declared maximum); names other binders compute are left unbounded."""
    base: dict[str, Interval] = {k: Interval(v, v) for k, v in program.consts if isinstance(v, int)}
    base.update({d: Interval(1, None) for d in dims})
    base.update({c: Interval(0, None) for c in CTA_COORDS})
    base.update({c: Interval(1, None) for c in CTA_COUNTS})
    out: dict[int, dict[str, Interval]] = {}

    def visit(nodes: tuple[Any, ...], env: dict[str, Interval]) -> None:
        for n in nodes:
            out[id(n)] = env
            if n.op is Op.FOR:
                start, stop, _ = loop_range(n)
                s, t = bounds(start, env), bounds(stop, env)
                visit(n.body, {**env, n.args[0]: Interval(s.lo, None if t.hi is None else t.hi - 1)})
            elif n.body:
                visit(n.body, env)
            if n.op is Op.LET:
                env = {**env, n.args[0]: bounds(n.args[1], env)}
            elif n.decl.data_dependent:   # read from memory (scalar, fetch_add, compact), within its declared range
                env = {**env, n.arg("var"): Interval(0, bounds(n.arg("max"), env).hi)}
            else:
                env = {**env, **{k: ANY for k in n.decl.bound_names(n, Scope.BLOCK)}}

    visit(program.body, base)
    return out
