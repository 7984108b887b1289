"""Lowering of the structure ops: ``for`` (a C ``for`` loop, ``#pragma unroll``), ``if`` and ``let``.

- ``for`` → a C ``for`` loop; ``range(start, stop, step)`` keeps its bounds (``ncta.x`` → ``gridDim.x``).
- ``if`` → a C ``if`` over the condition (uniform across the CTA).
- ``name = expr`` (``let``) → ``const int name = expr;`` in the C block of its IR block (the same int
  arithmetic as the expression written inline at each use); ``tile_order`` → two ints set by
  ``cake::tile_order`` (header/cake.cuh), the same grouped order the interpreter binds; ``scalar`` → an int
  read from gmem or an smem tile by every thread (``cake::read_index``), clamped into its declared range.
"""
from __future__ import annotations

import math

from cake_core.ir.ops import At, Node, Op, loop_range
from cake_core.ir.types import DType, MemSpace
from cake_core.lower.context import Ctx, Line, Lowering, LowerError, window


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


def lower_scalar(n: Node, ctx: Ctx) -> list[Line]:
    """``scalar(e, t[i, j], max=HI)`` → ``const int e = cake::read_index(...)``: every thread reads the one
    element (a broadcast), clamped into [0, HI]; outside the tensor it reads 0."""
    var, v, hi = n.arg("var"), n.arg("src"), n.arg("max")
    _free(ctx, [var])
    if not all(isinstance(i, At) for i in v.index):
        raise LowerError("lower.shape_mismatch", f"scalar `{var}` reads a window of `{v.buf}`, not one element",
                         "index every dimension with a single index")
    g = ctx.buf(v.buf, (MemSpace.GMEM, MemSpace.SMEM), "scalar's source")
    if g.type.dtype not in (DType.I32, DType.I64):
        raise LowerError("lower.unsupported_operand", f"scalar `{var}` reads `{v.buf}` of {g.type.dtype.value}; "
                                                      "it reads i32 or i64 tensors")
    c = ctx.check_expr(hi, f"scalar `{var}`'s max")
    if g.type.space is MemSpace.SMEM:        # a row-major tile of static shape: the element's flat offset
        idx = [f"({ctx.check_expr(i.index, f'scalar `{var}`s index')})" for i in v.index]
        if len(idx) != len(g.shape):
            raise LowerError("lower.shape_mismatch", f"scalar `{var}` indexes `{v.buf}` with {len(idx)} indices; "
                                                     f"it has rank {len(g.shape)}")
        flat = " + ".join(f"{i} * {math.prod(g.shape[d + 1:])}" for d, i in enumerate(idx))
        inside = " && ".join(f"{i} >= 0 && {i} < {size}" for i, size in zip(idx, g.shape))
        ctx.bound.append(var)
        return [f"const int {var} = cake::read_index({v.buf} + ({flat}), {inside}, {c});"]
    w = window(v, (1, 1), ctx, "scalar's source")
    ctx.bound.append(var)
    return [f"const int {var} = cake::read_index({w.base}, {w.rows_in} > 0, {c});"]


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.FOR: lower_for,
    Op.IF: lower_if,
    Op.LET: lower_let,
    Op.TILE_ORDER: lower_tile_order,
    Op.SCALAR: lower_scalar,
}
