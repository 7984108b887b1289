"""Lowering of the structure ops: ``for`` (a C ``for`` loop, ``#pragma unroll``), ``if``, ``let`` and the bindings
read from memory.

- ``for`` → a C ``for`` loop; ``range(start, stop, step)`` keeps its bounds (``ncta.x`` → ``gridDim.x``).
- ``if`` → a C ``if`` over the condition (uniform across the CTA).
- ``name = expr`` (``let``) → ``const int name = expr;`` in the C block of its IR block (the same int
  arithmetic as the expression written inline at each use); ``tile_order`` → two ints set by
  ``cake::tile_order`` (header/cake.cuh), the same grouped order the interpreter binds; ``scalar`` → an int
  read from gmem or an smem tile by every thread (``cake::read_index``), clamped into its declared range.
- ``fetch_add`` → ``cake::fetch_add_gmem`` / ``fetch_add_smem`` (one thread's atomicAdd, its old value handed to
  the CTA through the op's scratch); ``compact`` → ``cake::compact_smem_smem`` (a warp ballot and a scan of the
  warps' counts). Both synchronise the CTA, so ``dispatch.VARIANTS`` refuses them inside a role.
"""
from __future__ import annotations

import math

from cake_core.ir.ops import At, Node, Op, View, loop_range
from cake_core.ir.scratch import own_scratch_bytes
from cake_core.ir.types import DType, MemSpace, Swizzle
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, window


def lower_for(n: Node, ctx: Ctx) -> list[Line]:
    var = n.args[0]
    if var in ctx.loop_vars or var in ctx.consts or var in ctx.dims:
        raise LowerError("lower.shadowed_name", f"loop variable `{var}` shadows a name already in scope")
    start, stop, step = loop_range(n)
    ext = ctx.check_expr(stop, "the loop extent")
    pad = "    " * ctx.depth
    out: list[Line] = []
    unroll = n.attr("unroll")
    if unroll != 1:
        out.append(f"#pragma unroll {unroll}" if unroll > 1 else "#pragma unroll")
    if len(n.args) == 2:
        out.append(f"for (int {var} = 0; {var} < {ext}; ++{var}) {{")
    else:     # range(start, stop, step): a persistent tile loop steps by ncta.x (gridDim.x)
        first, by = ctx.check_expr(start, "the loop start"), ctx.check_expr(step, "the loop step")
        out.append(f"for (int {var} = {first}; {var} < {ext}; {var} += {by}) {{")
    body = ctx.lower_nested(n.body, loop_var=var)
    return [(n.line, pad + x) for x in out] + body + [(n.line, pad + "}")]


def lower_if(n: Node, ctx: Ctx) -> list[Line]:
    # the condition sees only consts, dims, loop variables and bid: uniform across the CTA, so
    # collective tile ops and __syncthreads() inside the body stay safe
    cond = ctx.check_expr(n.args[0], "the condition")
    pad = "    " * ctx.depth
    body = ctx.lower_nested(n.body)
    return [(n.line, f"{pad}if {cond} {{")] + body + [(n.line, pad + "}")]


def _free(ctx: Ctx, names: list[str]) -> None:
    """Refuse the names a binding op binds when one is already in scope (or bound twice by the op)."""
    for i, var in enumerate(names):
        if var in ctx.loop_vars or var in ctx.bound or var in ctx.consts or var in ctx.dims or var in names[:i]:
            raise LowerError("lower.shadowed_name", f"binding `{var}` shadows a name already in scope")


def lower_let(n: Node, ctx: Ctx) -> list[Line]:
    # check_expr writes int arithmetic (consts, dims and loop variables are int; blockIdx/gridDim cast to
    # int), so the binding is exactly the int the expression would be where it is used; 64-bit offsets are
    # formed from it at the use (cake::index_t casts in the window code), as from an inline expression
    var, value = n.args
    _free(ctx, [var])
    c = ctx.check_expr(value, f"binding `{var}`")
    ctx.bound.append(var)
    return [f"const int {var} = {c};"]


def lower_tile_order(n: Node, ctx: Ctx) -> list[Line]:
    """``tile_order(tm, tn, t, tiles_m, tiles_n, group=G)`` → ``cake::tile_order`` into two ints of the block."""
    tm, tn, t, tiles_m, tiles_n, group = n.args
    _free(ctx, [tm, tn])
    g = ctx.static(group, "tile_order's group")
    args = [ctx.check_expr(e, f"tile_order's {what}") for e, what in ((t, "tile"), (tiles_m, "tiles_m"),
                                                                       (tiles_n, "tiles_n"))]
    ctx.bound.extend([tm, tn])
    return [f"int {tm}, {tn};  // tile_order: grouped tile coordinates",
            f"cake::tile_order({tm}, {tn}, {', '.join(args)}, {g});"]


def _element(ctx: Ctx, v: View, var: str, op: str) -> tuple[str, str, Buf]:
    """A C pointer to the one element view ``v`` names (of a gmem tensor or an smem tile), the C condition that
    it lies inside its tensor, and the buffer."""
    if not all(isinstance(i, At) for i in v.index):
        raise LowerError("lower.shape_mismatch", f"{op} `{var}` names a window of `{v.buf}`, not one element",
                         "index every dimension with a single index")
    g = ctx.buf(v.buf, (MemSpace.GMEM, MemSpace.SMEM), f"{op}'s element")
    if g.type.space is MemSpace.SMEM:        # a row-major tile of static shape: the element's flat offset
        idx = [f"({ctx.check_expr(i.index, f'{op} `{var}`s index')})" for i in v.index]
        if len(idx) != len(g.shape):
            raise LowerError("lower.shape_mismatch", f"{op} `{var}` indexes `{v.buf}` with {len(idx)} indices; "
                                                     f"it has rank {len(g.shape)}")
        flat = " + ".join(f"{i} * {math.prod(g.shape[d + 1:])}" for d, i in enumerate(idx))
        inside = " && ".join(f"{i} >= 0 && {i} < {size}" for i, size in zip(idx, g.shape))
        return f"{v.buf} + ({flat})", inside, g
    w = window(v, (1, 1), ctx, f"{op}'s element")
    return w.base, f"{w.rows_in} > 0", g


def lower_scalar(n: Node, ctx: Ctx) -> list[Line]:
    """``scalar(e, t[i, j], max=HI)`` → ``const int e = cake::read_index(...)``: every thread reads the one
    element (a broadcast), clamped into [0, HI]; outside the tensor it reads 0."""
    var, v, hi = n.arg("var"), n.arg("src"), n.arg("max")
    _free(ctx, [var])
    ptr, inside, g = _element(ctx, v, var, "scalar")
    if g.type.dtype not in (DType.I32, DType.I64):
        raise LowerError("lower.unsupported_operand", f"scalar `{var}` reads `{v.buf}` of {g.type.dtype.value}; "
                                                      "it reads i32 or i64 tensors")
    c = ctx.check_expr(hi, f"scalar `{var}`'s max")
    ctx.bound.append(var)
    return [f"const int {var} = cake::read_index({ptr}, {inside}, {c});"]


def _own_scratch(ctx: Ctx, n: Node, what: str) -> str:
    """A C ``int*`` to the shared-memory scratch ``n`` uses itself (``ir.smem_layout`` places it)."""
    r = ctx.smem_region(n, f"the scratch of `{n.op.value}` ({what})")
    if r.nbytes != own_scratch_bytes(n):
        raise LowerError("lower.smem_layout", f"`{n.op.value}` uses {own_scratch_bytes(n)} B of scratch, but the "
                                              f"shared-memory layout holds {r.nbytes} B for it")
    return f"reinterpret_cast<int*>(cake_smem + {r.offset})"


def lower_fetch_add(n: Node, ctx: Ctx) -> list[Line]:
    """``fetch_add(v, t[i], x, max=HI)`` → ``const int v = cake::fetch_add_gmem(...)`` (or ``_smem``): one thread
    adds x with an atomic that returns the old value and hands it to the CTA through scratch, clamped into [0, HI];
    an element outside its tensor is left alone and reads 0."""
    var, v = n.arg("var"), n.arg("dst")
    _free(ctx, [var])
    ptr, inside, g = _element(ctx, v, var, "fetch_add")
    if g.type.dtype is not DType.I32:
        raise LowerError("lower.unsupported_operand", f"fetch_add `{var}` adds into `{v.buf}` of "
                                                      f"{g.type.dtype.value}; it adds into i32")
    x = ctx.check_expr(n.arg("value"), f"fetch_add `{var}`'s value")
    hi = ctx.check_expr(n.arg("max"), f"fetch_add `{var}`'s max")
    scratch = _own_scratch(ctx, n, "the old value, handed from one thread to the others")
    ctx.bound.append(var)
    return [f"const int {var} = cake::fetch_add_{g.type.space.value}({ptr}, (int)({x}), {scratch}, {inside}, {hi});"]


def lower_compact(n: Node, ctx: Ctx) -> list[Line]:
    """``compact(c, dst, flags, base=B, limit=L, max=HI)`` → ``const int c = cake::compact_smem_smem<N, R,
    THREADS>(...)``: a warp ballot per round of THREADS flags and the warps' counts through scratch."""
    var = n.arg("var")
    _free(ctx, [var])
    dst = ctx.buf(n.arg("dst"), (MemSpace.SMEM,), "compact's positions")
    flags = ctx.buf(n.arg("flags"), (MemSpace.SMEM,), "compact's flags")
    if dst.type.dtype is not DType.I32 or len(dst.shape) != 1 or dst.numel < flags.numel or dst.name == flags.name \
            or dst.type.swizzle is not Swizzle.NONE or flags.type.swizzle is not Swizzle.NONE:
        raise LowerError("lower.unsupported_operand", f"compact `{var}` of `{flags.name}` {flags.shape} into "
                                                      f"`{dst.name}` {dst.shape}: the positions go to an unswizzled "
                                                      "1-D i32 smem tile of its own with as many entries as flags")
    base, limit, hi = (ctx.check_expr(n.arg(k), f"compact `{var}`'s {k}") for k in ("base", "limit", "max"))
    scratch = _own_scratch(ctx, n, "the warps' counts")
    ctx.bound.append(var)
    return [f"const int {var} = cake::compact_smem_smem<{flags.numel}, {dst.numel}, THREADS>({dst.name}, "
            f"{flags.name}, {scratch}, (int)({base}), (int)({limit}), {hi});"]


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables; fetch_add and
# compact are there, refused inside roles).
HOOKS: dict[Op, Lowering] = {
    Op.FOR: lower_for,
    Op.IF: lower_if,
    Op.LET: lower_let,
    Op.TILE_ORDER: lower_tile_order,
    Op.SCALAR: lower_scalar,
}
