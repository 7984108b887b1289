"""IR → IR passes that are not tactics: pure functions ``Program -> Program``, and the operand expressions they
read and rewrite (``node_exprs``, ``map_operand_exprs``).

- ``inline_lets``: substitute every binding (``name = expr``) at its uses and drop it, giving the
  program as it would be written without bindings (the same kernel: the lowering's ``const int``
  is the int the expression is where it is used). Tests use it to show that a rewrite with bindings
  is the kernel that was measured (equal canonical text, so equal hash).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from cake_core.ir.expr import Expr, substitute
from cake_core.ir.ops import REGISTRY, At, Node, Op, Slot, Tile, View
from cake_core.ir.program import Program


def node_exprs(n: Node, slots: bool = True) -> list[Expr]:
    """The index expressions a node's operands hold (expr and shape operands, view indices and, with
    ``slots``, ring-slot indices); ``cond`` operands are left out."""
    exprs: list[Expr] = []
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.kind == "expr":
            exprs.append(a)
        elif o.kind == "shape":
            exprs.extend(a)
        elif o.kind == "view":
            for i in a.index:
                if isinstance(i, Tile):
                    exprs += i.exprs()
                elif isinstance(i, At):
                    exprs.append(i.index)
        elif slots and o.kind == "slot" and getattr(a, "index", None) is not None:
            exprs.append(a.index)
    return exprs


def map_operand_exprs(n: Node, fn) -> Node:
    """``n`` with ``fn`` applied to every index expression its operands hold (expr, cond and shape
    operands, view indices, ring-slot indices); the body is left as it is."""
    def one(kind: str, a: Any) -> Any:
        if kind in ("expr", "cond"):
            return fn(a)
        if kind == "shape":
            return tuple(fn(d) for d in a)
        if kind == "view":
            return View(a.buf, tuple(i.map(fn) if isinstance(i, Tile)
                                     else At(fn(i.index)) if isinstance(i, At) else i for i in a.index))
        if kind == "slot" and isinstance(a, Slot) and a.index is not None:
            return Slot(a.buf, fn(a.index))
        return a
    kinds = [o.kind for o in REGISTRY[n.op].operands]
    return replace(n, args=tuple(one(k, a) for k, a in zip(kinds, n.args)))


def _inline(nodes: tuple[Node, ...], env: Mapping[str, Expr]) -> tuple[Node, ...]:
    out = []
    for n in nodes:
        if n.op is Op.LET:
            env = {**env, n.args[0]: substitute(n.args[1], env)}
            continue
        m = map_operand_exprs(n, lambda e: substitute(e, env)) if env else n
        out.append(replace(m, body=_inline(n.body, env)) if n.body else m)
    return tuple(out)


def inline_lets(p: Program) -> Program:
    """``p`` without bindings: each use of a bound name replaced by its value (itself inlined)."""
    return replace(p, body=_inline(p.body, {}))
