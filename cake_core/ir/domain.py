"""Kernel domains: the shapes a program handles, derived from the program, and the refusal of the others.

A kernel written for a bounded problem (a top-k list of KMAX, D loaded as a fixed number of tiles, TMA's
16-byte strides) returns wrong answers, or out-of-range indices, on a shape past that bound. The domain
makes the bound explicit, so that every caller refuses such a shape before a launch with a diagnostic
that names it: the CPU and GPU gates (``runtime.cpu``, ``runtime.gpu``), ``cake run``, and a dispatch
table choosing a kernel per shape: the per-shape table a run records (``flows.evolve._dispatch``) holds
only shapes the kernel was measured correct on, so the caller that serves a shape outside that table
(an exported dispatcher, an inference engine) calls :func:`domain_violations` and skips a kernel with any.

Bounds derived (each a :class:`Bound`, checked per shape by :func:`domain_violations`):

``domain.extent``
    Along a dimension of a gmem tensor, every access the shape executes is a tile at a static position
    (``tile(0, KMAX)``, ``tile(1, BK)``: no loop over the dimension, no CTA coordinate): elements past the
    last such tile are never read or written, so the dimension must not exceed it (``k <= KMAX`` of the
    top-k kernels, ``D <= 2 * BK`` of a kernel that loads D as two tiles), or tiles indexed by a loop that
    stops at ``min(x, c)`` with ``c`` static (``range(min(cdiv(D, BK), 8))``: ``D <= 8 * BK``; the loop is
    capped, so what lies past the cap is outside the kernel, not a mistake in it). Accesses under an ``if`` whose
    condition is false on the shape do not count; a whole-dimension access (``:``) lifts the bound.
``domain.tile_multiple``
    An unguarded access (``guard=False``) tiles a dimension in tiles of T: the dimension must be a
    multiple of T (the ``shapes.tail_guard`` warning, as a bound).
``domain.tma_stride``
    A TMA copy of a gmem tensor needs every stride (the bytes of the inner dimensions) a multiple of the
    target's ``tma.global_align_bytes`` (16 B: ``D % 8 == 0`` for 16-bit rows of D elements).
``domain.grid``
    A launch's grid is at most 2^31 - 1 CTAs along x and 65535 along y and z (CUDA's limits): a grid dimension
    past its limit on the shape cannot be launched at all (``grid=(H, B)`` with B > 65535).

Imports: stdlib and ``ir`` only (the target's TMA alignment through ``ir.targets``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator

from cake_core.ir.expr import Call, Cmp, Expr, fmt_expr, substitute, symbols, try_evaluate
from cake_core.ir.ops import REGISTRY, At, Node, Op, Tile, View, loop_range
from cake_core.ir.program import Program, walk
from cake_core.ir.printer import fmt_index
from cake_core.targets import find_arch
from cake_core.outcome import Diagnostic, Severity

GRID_LIMITS = (2**31 - 1, 65535, 65535)   # CUDA's largest grid along x, y and z
MAX_ENUMERATED = 4096       # loop-variable combinations tried when bounding a tile's static position
TMA_ALIGN_FALLBACK = 16     # an unknown target's TMA stride alignment (the verifier refuses the target anyway)
_TMA_OPS = (Op.TMA_LOAD, Op.TMA_STORE)


@dataclass(frozen=True)
class Access:
    """One access of a gmem tensor along one of its dimensions: up to ``end`` elements (None: any)."""

    param: str
    axis: int
    end: int | None
    conds: tuple[Cmp, ...]           # the enclosing ``if`` conditions
    node: Node
    path: str
    text: str                        # the index as written, e.g. ``tile(0, KMAX)``
    writes: bool = False             # the op writes (or adds into) the tensor there


@dataclass(frozen=True)
class Bound:
    """One constraint on shapes: ``expr <= value`` (``kind='<='``) or ``expr % value == 0`` (``kind='%'``),
    with the IR node it comes from and the reason."""

    rule: str
    expr: Expr
    kind: str
    value: int
    reason: str
    node: Node
    path: str
    hint: str
    conds: tuple[Cmp, ...] = ()
    param: str = ""                  # the gmem tensor it is about

    def text(self) -> str:
        e = fmt_expr(self.expr)
        return f"{e} <= {self.value}" if self.kind == "<=" else f"{e} % {self.value} == 0"

    def applies(self, shape: dict[str, int], consts: dict[str, int]) -> bool:
        env = {**shape, **consts}
        return all(try_evaluate(c, env) is not False for c in self.conds)

    def holds(self, shape: dict[str, int], consts: dict[str, int]) -> bool | None:
        """Whether ``shape`` satisfies the bound (None: it cannot tell, e.g. a symbol the shape lacks)."""
        v = try_evaluate(self.expr, {**shape, **consts})
        if v is None:
            return None
        return v <= self.value if self.kind == "<=" else int(v) % self.value == 0


def lets_of(program: Program) -> dict[str, Expr]:
    """Every binding of the program (``name = expr``), by name (names are unique: rule let.shadow)."""
    return {n.args[0]: n.args[1] for n, _, _ in walk(program.body) if n.op is Op.LET}


def expand_lets(e: Expr, lets: dict[str, Expr]) -> Expr:
    """``e`` with every binding it names replaced by its expression, down to consts, dims and loop variables."""
    for _ in range(16):             # bindings may name earlier bindings; 16 levels is far past any program
        if not symbols(e) & set(lets):
            break
        e = substitute(e, {k: v for k, v in lets.items()})
    return e


def _gmem_views(n: Node) -> Iterator[View]:
    for v, _ in _gmem_views_written(n):
        yield v


def _gmem_views_written(n: Node) -> Iterator[tuple[View, bool]]:
    """Each gmem view operand of ``n``, and whether ``n`` writes (or adds into) it."""
    for o, arg in zip(REGISTRY[n.op].operands, n.args):
        if o.kind == "view" and isinstance(arg, View):
            yield arg, any(e.modifies for e in o.effects)


def walk_with_conds(nodes: tuple[Node, ...], conds: tuple[Cmp, ...] = (), loops: dict | None = None,
                     path: str = "") -> Iterator[tuple[Node, tuple[Cmp, ...], dict, str]]:
    """Every node as ``program.walk`` names it, with the enclosing ``if`` conditions and loop ranges."""
    loops = loops or {}
    counts: dict[str, int] = {}
    for n in nodes:
        key = walk_key(n)
        counts[key] = counts.get(key, 0) + 1
        here = f"{path}.{key}" if path else key
        if counts[key] > 1:
            here += f"#{counts[key]}"
        yield n, conds, loops, here
        if n.body:
            inner_conds = conds + ((n.args[0],) if n.op is Op.IF else ())
            inner_loops = {**loops, n.args[0]: loop_range(n)} if n.op is Op.FOR else loops
            yield from walk_with_conds(n.body, inner_conds, inner_loops, here)


def walk_key(n: Node) -> str:
    """The name of ``n`` in an IR path, as ``program.walk`` gives it."""
    if n.op is Op.FOR:
        return f"for[{n.args[0]}]"
    if n.op is Op.LET:
        return f"let[{n.args[0]}]"
    if n.op is Op.IF:
        return "if"
    if n.op is Op.ROLE:
        return f"role[{n.args[0]}]"
    return f"{n.op.value}[{n.result}]" if n.result else n.op.value


def _static_max(e: Expr, loops: dict[str, tuple], consts: dict[str, int], lets: dict[str, Expr]) -> int | None:
    """The largest value ``e`` takes over the static ranges of the loop variables it names; None when it
    names anything else (a dimension, a CTA coordinate, a loop whose range depends on the shape). A loop
    that stops at ``min(x, c)`` with ``c`` static runs at most to ``c`` (``range(min(cdiv(D, BK), 8))`` reaches
    8 tiles at most, whatever D: D past them is never read)."""
    e = expand_lets(e, lets)
    free = symbols(e) - set(consts)
    ranges = {}
    for s in free:
        if s not in loops:
            return None
        begin, end, by = (expand_lets(v, lets) for v in loops[s])
        start, stop, step = (try_evaluate(v, consts) for v in (begin, end, by))
        if stop is None:
            stop = _static_cap(end, consts)
        if start is None or stop is None or step is None or step < 1:
            return None
        ranges[s] = range(int(start), int(stop), int(step))
        if not ranges[s]:
            return None     # the loop never runs: no access to bound
    if math.prod(len(r) for r in ranges.values()) > MAX_ENUMERATED:
        return None
    best = None
    names = sorted(ranges)
    for combo in itertools.product(*(ranges[s] for s in names)):
        v = try_evaluate(e, {**consts, **dict(zip(names, combo))})
        if v is None:
            return None
        best = v if best is None else max(best, v)
    return None if best is None else int(best)


def _static_cap(e: Expr, consts: dict[str, int]) -> int | None:
    """A static upper bound of ``e`` when it is ``min(a, b)`` with ``a`` or ``b`` static (the smaller of the
    static ones), else None."""
    if not (isinstance(e, Call) and e.fn == "min"):
        return None
    caps = [c for c in (try_evaluate(a, consts) if try_evaluate(a, consts) is not None else _static_cap(a, consts)
                        for a in e.args) if c is not None]
    return int(min(caps)) if caps else None


_MEMO: dict[int, tuple[Program, dict[str, object]]] = {}     # id(program) -> (program, derived facts)


def _memo(program: Program) -> dict[str, object]:
    """Facts derived once per program object (hashing a whole program per call would cost more than deriving)."""
    hit = _MEMO.get(id(program))
    if hit is None or hit[0] is not program:
        if len(_MEMO) > 256:
            _MEMO.clear()
        hit = _MEMO[id(program)] = (program, {})
    return hit[1]


def accesses(program: Program) -> tuple[Access, ...]:
    """Every access of a gmem parameter along each of its dimensions (derived once per program)."""
    memo = _memo(program)
    if "accesses" not in memo:
        memo["accesses"] = _accesses(program)
    return memo["accesses"]  # type: ignore[return-value]


def _accesses(program: Program) -> tuple[Access, ...]:
    consts, lets = program.const_env, lets_of(program)
    params = {p.name: p for p in program.params}
    out: list[Access] = []
    for n, conds, loops, path in walk_with_conds(program.body):
        whole = [(a, any(e.modifies for e in o.effects))
                 for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf" and a in params]
        for name, writes in whole:       # a whole-tensor operand reaches every element
            for axis, _ in enumerate(params[name].type.shape):
                out.append(Access(name, axis, None, conds, n, path, name, writes))
        for v, writes in _gmem_views_written(n):
            p = params.get(v.buf)
            if p is None or len(v.index) != len(p.type.shape):
                continue
            for axis, i in enumerate(v.index):
                end: int | None = None
                if isinstance(i, Tile) and i.offset:     # at an offset: as far as its first element goes, and a tile
                    size = try_evaluate(expand_lets(i.size, lets), consts)
                    first = _static_max(i.start, loops, consts, lets)
                    end = None if size is None or first is None else first + int(size)
                elif isinstance(i, Tile):
                    size = try_evaluate(expand_lets(i.size, lets), consts)
                    top = _static_max(i.index, loops, consts, lets)
                    end = None if size is None or top is None else (top + 1) * int(size)
                elif isinstance(i, At):
                    top = _static_max(i.index, loops, consts, lets)
                    end = None if top is None else top + 1
                out.append(Access(v.buf, axis, end, conds, n, path, fmt_index(i), writes))
    return tuple(out)


def kernel_domain(program: Program) -> list[Bound]:
    """The bounds the program puts on shapes (see the module doc), in program order."""
    memo = _memo(program)
    if "bounds" not in memo:
        memo["bounds"] = _kernel_domain(program)
    return list(memo["bounds"])  # type: ignore[arg-type]


def _kernel_domain(program: Program) -> list[Bound]:
    consts, lets = program.const_env, lets_of(program)
    bounds: list[Bound] = []
    params = {p.name: p for p in program.params}
    # domain.extent, on every shape: each (tensor, axis) whose every access stops at a static end
    # (domain_violations evaluates it per shape, leaving out accesses under an `if` the shape does not take)
    for p in program.params:
        for axis, dim in enumerate(p.type.shape):
            acc = [a for a in accesses_of(program, p.name) if a.axis == axis]
            if try_evaluate(dim, consts) is not None or not acc or any(a.end is None for a in acc):
                continue
            a = max(acc, key=lambda a: (a.end, a.node.line))
            bounds.append(Bound("domain.extent", dim, "<=", a.end,
                                f"`{p.name}` is reached along {fmt_expr(dim)} only up to {a.end} "
                                f"({a.text}, line {a.node.line})", a.node, a.path,
                                f"run it on shapes with {fmt_expr(dim)} <= {a.end}, or loop over "
                                f"{fmt_expr(dim)} in tiles", param=p.name))
    # domain.tile_multiple: unguarded tiles along a symbolic dimension
    for n, conds, _, path in walk_with_conds(program.body):
        if "guard" not in REGISTRY[n.op].attrs or n.attr("guard"):
            continue
        for v in _gmem_views(n):
            p = params.get(v.buf)
            if p is None or len(v.index) != len(p.type.shape):
                continue
            for i, dim in zip(v.index, p.type.shape):
                size = try_evaluate(expand_lets(i.size, lets), consts) if isinstance(i, Tile) and not i.offset \
                    else None
                if size is None or size <= 1 or try_evaluate(dim, consts) is not None:
                    continue
                bounds.append(Bound("domain.tile_multiple", dim, "%", int(size),
                                    f"the unguarded {n.op.value} of `{v.buf}` (line {n.line}) tiles "
                                    f"{fmt_expr(dim)} by {int(size)}", n, path,
                                    f"run it on multiples of {int(size)}, or drop guard=False", conds, v.buf))
    # domain.tma_stride: every stride of a tensor a TMA copy reads or writes
    arch = find_arch(program.target)
    align = arch.tma.global_align_bytes if arch is not None else TMA_ALIGN_FALLBACK
    for n, conds, _, path in walk_with_conds(program.body):
        if n.op not in _TMA_OPS:
            continue
        for v in _gmem_views(n):
            p = params.get(v.buf)
            if p is None:
                continue
            nbytes = p.type.dtype.bytes
            for k in range(1, len(p.type.shape)):
                stride: Expr = nbytes
                for d in p.type.shape[k:]:
                    stride = _mul(stride, d)
                if try_evaluate(stride, consts) is not None and try_evaluate(stride, consts) % align == 0:
                    continue
                bounds.append(Bound("domain.tma_stride", stride, "%", align,
                                    f"the TMA copy of `{v.buf}` (line {n.line}) needs its rows "
                                    f"{fmt_expr(stride)} bytes apart to be a multiple of {align}", n, path,
                                    f"run it on shapes whose inner dimensions are multiples of {align // nbytes} "
                                    "elements, or copy with load()/cp_async()", conds, v.buf))
    # one bound per (rule, tensor, expression, conditions): a tensor copied by several ops is bounded once
    unique: dict[tuple, Bound] = {}
    for b in bounds:
        unique.setdefault((b.rule, b.param, b.text(), b.conds), b)
    return list(unique.values())


def _mul(a: Expr, b: Expr) -> Expr:
    from cake_core.ir.expr import Bin  # noqa: PLC0415 - one use
    if a == 1:
        return b
    return Bin("*", a, b)


def accesses_of(program: Program, param: str) -> list[Access]:
    """The accesses that bound gmem parameter ``param`` (see :func:`accesses`): its writes when the program writes
    it (an output's elements past its last write are never produced, whatever reads reach further: a kernel that
    reads back the top-k ids it stored, over all k of them, still writes only its own k), else its reads."""
    mine = [a for a in accesses(program) if a.param == param]
    written = [a for a in mine if a.writes]
    return written or mine


def extent_limit(program: Program, param: str, axis: int, shape: dict[str, int]) -> int | None:
    """How far along ``axis`` of ``param`` the accesses that run on ``shape`` reach (None: every element)."""
    consts = program.const_env
    ends = []
    for a in accesses_of(program, param):
        if a.axis != axis:
            continue
        env = {**shape, **consts}
        if any(try_evaluate(c, env) is False for c in a.conds):
            continue             # under an `if` the shape does not take
        if a.end is None:
            return None
        ends.append(a.end)
    return max(ends) if ends else None


def domain_violations(program: Program, shape: dict[str, int]) -> list[Diagnostic]:
    """The bounds of ``program``'s domain that ``shape`` breaks, one error diagnostic each (rule
    ``domain.extent``, ``domain.tile_multiple`` or ``domain.tma_stride``), naming the bound and the IR line;
    empty when the shape is inside the domain."""
    consts = program.const_env
    out: list[Diagnostic] = []
    where = ", ".join(f"{k}={v}" for k, v in shape.items())
    seen: set[tuple[str, int]] = set()
    for p in program.params:
        for axis, dim in enumerate(p.type.shape):
            v = try_evaluate(dim, {**shape, **consts})
            if v is None or try_evaluate(dim, consts) is not None or (p.name, axis) in seen:
                continue
            limit = extent_limit(program, p.name, axis, shape)
            if limit is not None and v > limit:
                seen.add((p.name, axis))
                a = max((a for a in accesses_of(program, p.name) if a.axis == axis and a.end == limit),
                        key=lambda a: a.node.line)
                out.append(Diagnostic(
                    "domain.extent", Severity.ERROR,
                    f"shape {where} is outside the kernel's domain: {fmt_expr(dim)} = {int(v)} > {limit}, the "
                    f"most that `{p.name}` is read or written along {fmt_expr(dim)} ({a.text} at line {a.node.line})",
                    a.node.line, a.node.col, a.path,
                    f"use this kernel for {fmt_expr(dim)} <= {limit} only, or loop over {fmt_expr(dim)} in tiles",
                    (f"bound {fmt_expr(dim)} <= {limit}",)))
    for axis, (extent, limit) in enumerate(zip(program.grid, GRID_LIMITS)):
        v = try_evaluate(extent, {**shape, **consts})
        if v is not None and v > limit:
            out.append(Diagnostic(
                "domain.grid", Severity.ERROR,
                f"shape {where} is outside the kernel's domain: its grid's {'xyz'[axis]} dimension "
                f"{fmt_expr(extent)} = {int(v)} > {limit}, the most CUDA launches along {'xyz'[axis]}",
                program.line, 0, "kernel",
                "use this kernel for smaller shapes, or put the larger coordinate on the grid's x dimension",
                (f"bound {fmt_expr(extent)} <= {limit}",)))
    for b in kernel_domain(program):
        if b.rule == "domain.extent" or not b.applies(shape, consts):
            continue
        if b.holds(shape, consts) is False:
            v = try_evaluate(b.expr, {**shape, **consts})
            out.append(Diagnostic(
                b.rule, Severity.ERROR,
                f"shape {where} is outside the kernel's domain: {fmt_expr(b.expr)} = {int(v)}, not a multiple of "
                f"{b.value} ({b.reason})", b.node.line, b.node.col, b.path, b.hint, (f"bound {b.text()}",)))
    return out
