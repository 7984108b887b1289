"""Verifier rules on every op's operands, read from the declarations (family: types).

- ``types.undefined``: each tile, slot, mbarrier and gmem view operand names a buffer that is in scope
  there: a parameter, or an allocation earlier in the same block or an enclosing one (a block's
  allocations end with it: a tile allocated in one role is not the other roles'). The interpreter and
  the lowering resolve names the same way.
- ``types.space``: the buffer lives in a memory space the operand's declaration allows (ops whose own
  rules judge their operands' spaces with a more specific message are left to those rules:
  :data:`OWN_SPACE_RULES`).
- ``types.rmem_role``: a register tile is held by the threads that run the op, so the roles that touch
  one rmem tile are one role.
- ``types.index``: index expressions (shapes, tile indices and sizes, slot indices, counts, phases,
  conditions) are integers; ``shapes.divisor``: no ``//``, ``%`` or ``cdiv`` divides by a constant zero
  or less.
- ``gather.operands``: a gather fills a 2-D unswizzled single-stage smem tile of the source's dtype from a
  window that keeps `:` (the rows gathered) and a tile of the destination's columns, by a 1-D i32 gmem index
  tensor.
- ``types.narrowing``: an op that moves values between tiles of different dtypes converts them
  implicitly; where that loses the value's kind or range (float -> integer, a wider integer -> a narrower
  one, anything -> bool, a fractional or infinite fill into an integer tile) it must be an explicit
  ``cast``. Float -> narrower float (an f32 accumulator stored as bf16) rounds and is allowed.
"""
from __future__ import annotations

import difflib
import math
from typing import Any, Iterable, Iterator

from cake_core.ir.expr import Bin, Call, Cmp, Expr, fmt_expr, try_evaluate
from cake_core.ir.opdef import Alloc, Completion, Family, Operand, Scope, buffer_name
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Tile, View
from cake_core.ir.ops_compute import COMPARE_FNS
from cake_core.ir.registry import ops_of
from cake_core.ir.rule_ctx import Ctx, RuleSet, fmt_shape, same_extent
from cake_core.ir.types import DType, MemSpace
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

_MEMORY_KINDS = ("buf", "view", "slot")
_MEMORY_OPS = frozenset(op for op, d in REGISTRY.items() if any(o.kind in _MEMORY_KINDS for o in d.operands))
# ops whose operand spaces their own rules check, each with a message about what the op does with them
OWN_SPACE_RULES = (ops_of(Family.ATOMIC, Family.GATHER, Family.EPILOGUE, Family.CLUSTER)
                   | frozenset(op for op in ops_of(Family.MMA) if REGISTRY[op].completion is Completion.MMA_GROUP))
_BINDERS = frozenset(op for op, d in REGISTRY.items() if any(o.binds is Scope.BLOCK for o in d.operands))
_EXPR_KINDS = ("expr", "shape", "view", "slot", "cond")
# an explicit conversion: the one op that may narrow
_CONVERTS = frozenset({Op.CAST})
# ops whose own dtype rules fix what they write (index outputs, accumulators, atomics, epilogue state, loads)
_OWN_DTYPE_RULES = (ops_of(Family.ATOMIC, Family.EPILOGUE, Family.CLUSTER, Family.MMA, Family.RUNNING,
                           Family.GATHER) | {Op.LOAD, Op.TMA_LOAD, Op.CP_ASYNC, Op.CP_ASYNC_BAR})


def memory_operands(n: Node) -> Iterator[tuple[Operand, Any]]:
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.kind in _MEMORY_KINDS:
            yield o, a


# ------------------------------------------------------------------ scopes

def _allocations(nodes: tuple[Node, ...], block: str, out: dict[str, tuple[Node, str]]) -> None:
    """Every allocation (smem, rmem, mbarrier) with a description of the block it is allocated in."""
    for n in nodes:
        if n.result and n.decl.allocates is not None and n.result not in out:
            out[n.result] = (n, block)
        if n.body:
            inner = (f"role `{n.args[0]}`" if n.op is Op.ROLE else f"the body of the loop over `{n.args[0]}`"
                     if n.op is Op.FOR else "an `if` body" if n.op is Op.IF else f"a `{n.op.value}` block")
            _allocations(n.body, inner, out)


def scoped(ctx: Ctx) -> Iterator[tuple[Node, str, dict[str, Node]]]:
    """Every node with its path and the buffers visible to it: parameters and the allocations made earlier in
    its block or an enclosing one (name -> allocating node; None for a parameter)."""
    paths = {id(n): p for n, p, _ in ctx.nodes}
    params: dict[str, Node] = {p.name: None for p in ctx.program.params}       # type: ignore[misc]

    def visit(nodes: tuple[Node, ...], visible: dict[str, Node]) -> Iterator[tuple[Node, str, dict[str, Node]]]:
        visible = dict(visible)
        for n in nodes:
            yield n, paths.get(id(n), ""), visible
            if n.body:
                yield from visit(n.body, visible)
            if n.result and n.decl.allocates is not None and n.result not in visible:
                visible[n.result] = n
    return visit(ctx.program.body, params)


@rule("types.undefined", "types", "an operand names a tile, slot, mbarrier or tensor that is not in scope there",
      guards=_MEMORY_OPS)
def _undefined(ctx: Ctx) -> Iterable[Diagnostic]:
    allocs: dict[str, tuple[Node, str]] = {}
    _allocations(ctx.program.body, "the kernel body", allocs)
    names = sorted(set(allocs) | {p.name for p in ctx.program.params})
    order = {id(n): i for i, (n, _, _) in enumerate(ctx.nodes)}
    paths = {id(n): p for n, p, _ in ctx.nodes}
    for n, path, visible in scoped(ctx):
        for o, a in memory_operands(n):
            name = buffer_name(a)
            if name is None or name in visible:
                continue
            what = f"`{n.op.value}` operand `{o.name}`"
            if name in allocs:
                at, block = allocs[name]
                outer = paths.get(id(at), "").rpartition(".")[0]       # the block it is allocated in
                if order.get(id(at), 0) > order.get(id(n), 0) and (not outer or path.startswith(outer + ".")):
                    msg, hint = (f"{what} names `{name}` before its allocation at line {at.line}",
                                 f"move `{name} = {at.op.value}(...)` above this statement")
                else:
                    msg, hint = (f"{what} names `{name}`, allocated at line {at.line} in {block}: it is not "
                                 "visible here (a block's tiles end with it)",
                                 f"allocate `{name}` where every statement that uses it can see it (above the "
                                 "roles for shared tiles), or give this block its own")
            else:
                close = difflib.get_close_matches(name, names, n=1)
                msg = f"{what} names `{name}`, which is not defined"
                hint = (f"did you mean `{close[0]}`? " if close else "") + \
                    "allocate it with smem(...)/rmem(...)/mbarrier(...) before use, or name a kernel parameter"
            yield ctx.diag("types.undefined", n, msg, path=path, hint=hint)


# ------------------------------------------------------------------ spaces

@rule("types.space", "types", "an operand lives in a memory space the op cannot use",
      guards=_MEMORY_OPS)
def _space(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, visible in scoped(ctx):
        yield from _barriers_as_data(ctx, n, path, visible)
        if n.op in OWN_SPACE_RULES:
            continue
        for o, a in memory_operands(n):
            name = buffer_name(a)
            t = ctx.buffers.get(name) if name in visible else None
            if o.barrier is not None or not o.space or t is None or t.space in o.space:
                continue
            want = "/".join(s.value for s in o.space)
            yield ctx.diag("types.space", n, f"`{n.op.value}` operand `{o.name}` must be in {want}; `{name}` is in "
                                             f"{t.space.value}", path=path,
                           hint=("name a kernel parameter" if o.space == (MemSpace.GMEM,) else
                                 f"allocate it with {o.space[0].value}(...)" if len(o.space) == 1 else
                                 "stage the data through the right memory space with load/store"))


def _barriers_as_data(ctx: Ctx, n: Node, path: str, visible: dict[str, Node]) -> Iterator[Diagnostic]:
    """A tile or tensor operand that names an mbarrier (every op, those with their own space rules too: an
    mbarrier has no tile type, so their rules, which judge typed tiles, pass it by)."""
    for o, a in memory_operands(n):
        name = buffer_name(a)
        at = visible.get(name) if o.barrier is None else None
        if at is not None and at.decl.allocates is Alloc.MBARRIER:
            want = "/".join(s.value for s in o.space) or "memory"
            yield ctx.diag("types.space", n, f"`{n.op.value}` operand `{o.name}` names the mbarrier `{name}` "
                                             f"(line {at.line}): it must be a tile or tensor in {want}", path=path,
                           hint="name the tile the op reads or writes; mbarriers are the bar= operands of "
                                "wait, arrive, expect_tx and the copies")


@rule("types.rmem_role", "types", "a register tile is used by one role only: its elements live in the registers "
                                  "of the threads that run the op", guards=_MEMORY_OPS)
def _rmem_role(ctx: Ctx) -> Iterable[Diagnostic]:
    """The role that first writes an rmem tile holds it (the first role to use it, if none writes it); a use
    from another role is the mistake."""
    uses: dict[str, list[tuple[Node, str, Node, bool]]] = {}     # rmem tile -> (op, path, role, writes)
    for n, path, _ in ctx.nodes:
        role = ctx.role_of.get(id(n))
        if role is None:
            continue
        for o, a in memory_operands(n):
            name = buffer_name(a)
            t = ctx.buffers.get(name)
            if t is not None and t.space is MemSpace.RMEM and o.barrier is None:
                uses.setdefault(name, []).append((n, path, role, o.effect_of(n).modifies))
    for name, us in uses.items():
        owner = next((u for u in us if u[3]), us[0])
        for n, path, role, _ in us:
            if role is not owner[2]:
                yield ctx.diag("types.rmem_role", n, f"role `{role.args[0]}` uses the register tile `{name}` that "
                                                     f"role `{owner[2].args[0]}` holds: its values are in the "
                                                     "other role's registers", path=path,
                               witness=[f"{owner[0].op.value} at line {owner[0].line} (role {owner[2].args[0]})",
                                        f"{n.op.value} at line {n.line} (role {role.args[0]})"],
                               hint="pass values between roles through an smem tile and an mbarrier, or keep the "
                                    "work in one role")


# ----------------------------------------------------------- index values

def _exprs(n: Node) -> list[Expr]:
    out: list[Expr] = []
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.kind in ("expr", "cond"):
            out.append(a)
        elif o.kind == "shape":
            out.extend(a)
        elif o.kind == "view" and isinstance(a, View):
            for i in a.index:
                out += i.exprs() if isinstance(i, Tile) else [i.index] if isinstance(i, At) else []
        elif o.kind == "slot" and getattr(a, "index", None) is not None:
            out.append(a.index)
    return out


def _floats(e: Expr) -> Iterator[float]:
    if isinstance(e, float):
        yield e
    elif isinstance(e, (Bin, Cmp)):
        yield from _floats(e.a)
        yield from _floats(e.b)
    elif isinstance(e, Call):
        for a in e.args:
            yield from _floats(a)


def _divisors(e: Expr) -> Iterator[Expr]:
    if isinstance(e, (Bin, Cmp)):
        if isinstance(e, Bin) and e.op in ("//", "%"):
            yield e.b
        yield from _divisors(e.a)
        yield from _divisors(e.b)
    elif isinstance(e, Call):
        if e.fn == "cdiv":
            yield e.args[1]
        for a in e.args:
            yield from _divisors(a)


@rule("types.index", "types", "index expressions (shapes, tiles, slots, counts, phases, conditions) are integers",
      guards=frozenset(op for op, d in REGISTRY.items() if any(o.kind in _EXPR_KINDS for o in d.operands))
      - _BINDERS)
def _index(ctx: Ctx) -> Iterable[Diagnostic]:
    grid = [g for g in ctx.program.grid if next(_floats(g), None) is not None]
    if grid:
        yield ctx.diag("types.index", None, f"the grid extent `{fmt_expr(grid[0])}` holds a float", path="kernel.grid",
                       hint="grid extents are integer expressions of consts and dims")
    for n, path, _ in ctx.nodes:
        if n.op in _BINDERS:
            continue                # let.value reports a binding's float
        bad = next((f for e in _exprs(n) for f in _floats(e)), None)
        if bad is not None:
            yield ctx.diag("types.index", n, f"`{n.op.value}` has the float {bad!r} in an index expression; "
                                             "indices, sizes, counts and phases are integers", path=path,
                           hint="write it with integers, consts and dims (a ratio: `//` rounds down, cdiv up)")


@rule("shapes.divisor", "shapes", "a `//`, `%` or cdiv divides by a constant that is zero or negative",
      guards=frozenset(op for op, d in REGISTRY.items() if any(o.kind in _EXPR_KINDS for o in d.operands)))
def _divisor(ctx: Ctx) -> Iterable[Diagnostic]:
    def bad(exprs: Iterable[Expr]) -> Expr | None:
        for e in exprs:
            for d in _divisors(e):
                v = try_evaluate(d, ctx.consts)
                if isinstance(v, (int, float)) and v <= 0:
                    return d
        return None

    g = bad(ctx.program.grid)
    if g is not None:
        yield ctx.diag("shapes.divisor", None, f"the grid divides by `{fmt_expr(g)}`, which is {try_evaluate(g, ctx.consts)}",
                       path="kernel.grid", hint="divide by a positive constant")
    for n, path, _ in ctx.nodes:
        d = bad(_exprs(n))
        if d is not None:
            yield ctx.diag("shapes.divisor", n, f"`{n.op.value}` divides by `{fmt_expr(d)}`, which is "
                                                f"{try_evaluate(d, ctx.consts)}: the index is undefined", path=path,
                           hint="divide by a positive constant (a ring index is `kt % S` with S >= 1)")


# ------------------------------------------------------------------ narrowing

def narrows(src: DType, dst: DType) -> bool:
    """Whether converting a ``src`` value to ``dst`` loses its kind or range (see the module docstring)."""
    if dst is DType.BOOL:
        return src is not DType.BOOL
    if src.is_float and not dst.is_float:
        return True
    if not src.is_float and not dst.is_float:
        return dst.bytes < src.bytes
    return False


def _value_operands(n: Node) -> tuple[list[tuple[Operand, Any]], list[tuple[Operand, Any]]]:
    """(written, read) value operands of ``n``: tiles, slots and views, index operands and barriers left out."""
    out, srcs = [], []
    for o, a in memory_operands(n):
        if o.index or o.predicate or o.barrier is not None:
            continue
        e = o.effect_of(n)
        if e.modifies:
            out.append((o, a))
        elif e.reads:
            srcs.append((o, a))
    return out, srcs


@rule("types.narrowing", "types", "an op converts values implicitly where the conversion loses them (float -> "
                                  "integer, wider -> narrower integer, -> bool, a fractional fill of an integer "
                                  "tile): cast() explicitly", guards=frozenset(REGISTRY) - _CONVERTS - _OWN_DTYPE_RULES)
def _narrowing(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        fill = n.attr("fill") if n.decl.allocates is Alloc.RMEM else n.attr("value") if n.op is Op.FILL else None
        if fill is not None:
            dst = n.args[0] if n.decl.allocates is Alloc.RMEM else getattr(ctx.buffers.get(n.args[0]), "dtype", None)
            if isinstance(dst, DType) and not dst.is_float and (math.isinf(fill) or math.isnan(fill)
                                                               or fill != int(fill)):
                yield ctx.diag("types.narrowing", n, f"the fill {fill!r} of an {dst.value} tile is not a whole "
                                                     "number: it would be truncated", path=path,
                               hint="fill integer tiles with whole numbers (e.g. -1 for `no index yet`)")
            continue
        if n.op in _CONVERTS or n.op in _OWN_DTYPE_RULES:
            continue
        if n.op is Op.EWISE and n.attr("fn") in COMPARE_FNS:
            continue        # a compare writes 1 or 0, never its operands' values
        outs, srcs = _value_operands(n)
        for o, a in outs:
            d = ctx.buffers.get(buffer_name(a))
            for so, sa in srcs:
                s = ctx.buffers.get(buffer_name(sa))
                if d is None or s is None or not narrows(s.dtype, d.dtype):
                    continue
                yield ctx.diag("types.narrowing", n, f"`{n.op.value}` writes {s.dtype.value} values of "
                                                     f"`{buffer_name(sa)}` into the {d.dtype.value} "
                                                     f"`{buffer_name(a)}`: an implicit narrowing conversion",
                               path=path, hint=f"convert first with cast(tmp_{d.dtype.value}, {buffer_name(sa)}), "
                                               f"or give `{buffer_name(a)}` the dtype {s.dtype.value}")
                break


@rule("gather.operands", "shapes", "a gather fills a 2-D unswizzled smem tile from `:` rows and a tile of its "
                                   "columns, by a 1-D i32 gmem index tensor", guards=(Op.GATHER,))
def _gather_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.GATHER:
            continue
        dst, v, idx = ctx.buf_of(n.arg("dst")), n.arg("src"), ctx.buf_of(n.arg("idx"))
        src = ctx.buf_of(v.buf)
        if dst is None or src is None or idx is None:
            continue          # types.undefined names it
        kept = [i for i in v.index if not isinstance(i, At)] if len(v.index) == src.rank else None
        bad = ""
        swizzled = ctx.swizzle_of(n.arg("dst"))
        if dst.space is not MemSpace.SMEM or dst.rank != 2 or swizzled or dst.stages != 1:
            bad = f"`{n.arg('dst')}` is {dst}; gather writes a 2-D unswizzled single-stage smem tile"
        elif dst.dtype is not src.dtype:
            bad = f"`{n.arg('dst')}` is {dst.dtype.value} and `{v.buf}` {src.dtype.value}; gather copies one dtype"
        elif kept is None or len(kept) != 2 or not isinstance(kept[0], Full) or not isinstance(kept[1], Tile):
            bad = (f"the window of `{v.buf}` must keep two dimensions, `:` (the rows gathered from) and then a "
                   "tile of columns")
        elif not same_extent(ctx, (dst.shape[1],), (kept[1].size,)):
            bad = (f"the window's {fmt_shape(ctx, (kept[1].size,))} columns differ from `{n.arg('dst')}`'s "
                   f"{fmt_shape(ctx, (dst.shape[1],))}")
        elif idx.space is not MemSpace.GMEM or idx.rank != 1 or idx.dtype is not DType.I32:
            bad = f"`{n.arg('idx')}` is {idx}; the indices are a 1-D i32 gmem tensor"
        if bad:
            yield ctx.diag("gather.operands", n, bad, path=path,
                           hint="gather(a_s, x[:, tile(kt, BK)], perm, base=..., limit=...) with a_s = "
                                "smem(<x's dtype>, (BM, BK))")
