"""Lowering hooks of the distance-kernel ops on Hopper, onto header/cake_async.cuh (smem lists: cake_topk_smem.cuh).

- ``topk_bias``: on a wgmma accumulator's fragment (``cake::topk_bias_rmem_wgmma_acc``): each thread keeps,
  for the 2 rows it owns per warpgroup, a sorted list of KMAX (value, index) pairs over its own columns
  (``float top_v[2][KMAX]; int top_i[2][KMAX]``, constant indices only: registers, no local memory),
  letting in only scores below the row's bar (the largest of the quad's ceil(KMAX / 4)-th entries: at
  least KMAX of the row's scores are at or below it); ``store`` of either tile merges the quad's 4 lists (2 shuffles per output column) and writes the first
  k columns of each row. The op ends with a warpgroup barrier, so an ``arrive`` after it releases the bias
  slot only once every thread has read it.
- ``topk_shift``: ``cake::topk_shift_rows``: each thread adds its 2 rows' values (read from smem) to its lists.
- ``sqnorm_rows``: ``cake::sqnorm_rows_smem``: one thread of the role per row, or two (a shuffle adds
  their halves) where the role has twice the rows' threads; 16-byte smem reads, f32 sums, then a named barrier over the role's threads (id 1 + the role's first warpgroup; ids 1..4 are
  the warpgroups' own barriers, never ``__syncthreads``'s 0).
``rmem`` and ``store`` of a topk_bias list inside a role are variants of those ops (``dispatch``), chosen by
:func:`is_topk_list` and :func:`stores_topk_list`.
"""
from __future__ import annotations

import math

from cake_core.ir.ops import Node, Op, Tile
from cake_core.ir.program import walk
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, window
from cake_core.ir.rules_topk import KMAX_LIMIT, KMAX_SMEM_LIMIT
from cake_core.lower.lower_async import in_role, named_barrier, role_threads, slot_ptr
from cake_core.lower.lower_cluster import cluster_top_level
from cake_core.lower.lower_wgmma import epilogue_operands, fragment_rows


def topk_rowstate(ctx: Ctx) -> dict[str, tuple[int, str]]:
    """topk_bias lists: name -> (0 values / 1 indices, the partner tile)."""
    st = ctx.__dict__.get("topk_state")
    if st is None:
        st = ctx.__dict__["topk_state"] = {"lists": {}, "kmax": {}}
        for n, _, _ in walk(ctx.program.body):
            if n.op is Op.TOPK_BIAS:
                st["lists"][n.arg("top_v")] = (0, n.arg("top_i"))
                st["lists"][n.arg("top_i")] = (1, n.arg("top_v"))
    return st["lists"]


def _kmax(ctx: Ctx) -> dict[str, int]:
    topk_rowstate(ctx)
    return ctx.__dict__["topk_state"]["kmax"]


def is_topk_list(n: Node, ctx: Ctx) -> bool:
    """An rmem allocation, inside a role, of a topk_bias list (top_v / top_i)."""
    return in_role(n, ctx) and n.result in topk_rowstate(ctx)


def stores_topk_list(n: Node, ctx: Ctx) -> bool:
    """A store, inside a role, of a topk_bias list kept in registers (smem lists store like any smem tile)."""
    return in_role(n, ctx) and n.arg("src") in topk_rowstate(ctx) and _smem_list(ctx, n.arg("src")) is None


def _smem_list(ctx: Ctx, name: str) -> Buf | None:
    """The smem tile ``name`` when a topk_bias keeps its list there, else None."""
    try:
        b = ctx.buf(name, (MemSpace.SMEM, MemSpace.RMEM), "topk_bias list")
    except LowerError:
        return None
    return b if b.type.space is MemSpace.SMEM else None


def _smem_lists(ctx: Ctx, tv: str, ti: str, count: int) -> tuple[Buf, Buf, int] | None:
    """top_v / top_i as smem tiles (rows, KMAX), f32 and i32, one row per fragment row of the role's
    ``count`` threads; None where they are not smem tiles (the rmem lists)."""
    bv, bi = _smem_list(ctx, tv), _smem_list(ctx, ti)
    if bv is None and bi is None:
        return None
    rows = fragment_rows(ctx, count)
    for b, dt in ((bv, DType.F32), (bi, DType.I32)):
        if b is None or b.type.dtype is not dt or len(b.shape) != 2 or b.shape[0] != rows or \
                not 1 <= b.shape[1] <= KMAX_SMEM_LIMIT or b.numel != rows * b.shape[1]:
            what = f"{b.type.dtype.value} {b.shape}" if b is not None else "not an smem tile"
            raise LowerError("lower.shape_mismatch", f"topk_bias smem list `{tv if b is bv else ti}` is {what}; "
                                                     f"a one-stage {dt.value} ({rows}, KMAX) tile, "
                                                     f"KMAX <= {KMAX_SMEM_LIMIT}, is needed (64 rows a warpgroup)")
    if bv.shape != bi.shape:
        raise LowerError("lower.shape_mismatch", f"`{tv}` is {bv.shape} and `{ti}` {bi.shape}")
    return bv, bi, bv.shape[1]


def lower_topk_rmem(n: Node, ctx: Ctx) -> list[Line]:
    """top_v / top_i of topk_bias: 2 sorted lists of KMAX per thread, the fragment rows it owns."""
    dtype, shape = n.args
    dims = [ctx.static(d, "an rmem shape") for d in shape]
    first, count = role_threads(ctx)
    which = topk_rowstate(ctx)[n.result][0]
    rows = fragment_rows(ctx, count)
    if count % ctx.arch.warpgroup_threads or len(dims) != 2 or dims[0] != rows or not 1 <= dims[1] <= KMAX_LIMIT or \
            dtype is not (DType.I32 if which else DType.F32):
        raise LowerError("lower.shape_mismatch", f"topk_bias list `{n.result}` is {dtype.value} {tuple(dims)} over "
                                                 f"{count} threads; ({rows}, KMAX) {'i32' if which else 'f32'} "
                                                 "(64 rows per warpgroup, KMAX <= 32) needed")
    ctx.scopes[-1][n.result] = Buf(n.result, TileType(dtype, tuple(shape), MemSpace.RMEM), tuple(dims))
    _kmax(ctx)[n.result] = dims[1]
    fill = n.attr("fill")
    if which:
        lit = str(int(fill)) if fill is not None and math.isfinite(fill) else "-1"
    else:
        lit = "__int_as_float(0x7f800000)" if fill is None or (math.isinf(fill) and fill > 0) else \
            "__int_as_float(0xff800000)" if math.isinf(fill) else f"{float(fill)!r}f"
    c = dtype.c_type
    return [f"{c} {n.result}[2][{dims[1]}];  // topk_bias lists: this thread's 2 fragment rows (a quarter of its quad)",
            f"for (int cake_h = 0; cake_h < 2; ++cake_h) for (int cake_p = 0; cake_p < {dims[1]}; ++cake_p) "
            f"{n.result}[cake_h][cake_p] = {lit};"]


def lower_topk_bias(n: Node, ctx: Ctx) -> list[Line]:
    dots, frag, pb = epilogue_operands(n, ctx)
    kmax = _kmax(ctx)
    tv, ti = n.arg("top_v"), n.arg("top_i")
    first, count = role_threads(ctx)
    sm = _smem_lists(ctx, tv, ti, count)
    if sm is not None:
        return [f"cake::topk_bias_smem_wgmma_acc<{frag[1]}, {sm[2]}>({tv}, {ti}, {dots}, {pb}, "
                f"{float(n.attr('beta'))!r}f, {ctx.check_expr(n.arg('base'), 'base')}, "
                f"{ctx.check_expr(n.arg('limit'), 'limit')}, (int)threadIdx.x - {first});  // lists in smem"]
    for x in (tv, ti):
        if x not in kmax:
            raise LowerError("lower.unsupported_operand", f"`{x}` is not a topk_bias list allocated in this role")
    if kmax[tv] != kmax[ti]:
        raise LowerError("lower.shape_mismatch", f"`{tv}` keeps {kmax[tv]} and `{ti}` {kmax[ti]} per row")
    return [f"cake::topk_bias_rmem_wgmma_acc<{frag[1]}, {kmax[tv]}>({tv}, {ti}, {dots}, {pb}, "
            f"{float(n.attr('beta'))!r}f, {ctx.check_expr(n.arg('base'), 'base')}, "
            f"{ctx.check_expr(n.arg('limit'), 'limit')}, (int)threadIdx.x - {first});"]


def lower_topk_shift(n: Node, ctx: Ctx) -> list[Line]:
    tv = n.arg("top_v")
    kmax = _kmax(ctx)
    first, count = role_threads(ctx)
    state = topk_rowstate(ctx).get(tv)
    sm = _smem_lists(ctx, tv, state[1], count) if state is not None and state[0] == 0 else None
    if sm is None and (tv not in kmax or state is None or state[0] != 0):
        raise LowerError("lower.unsupported_operand", f"`{tv}` is not a topk_bias values list allocated in this role")
    rows, pr = slot_ptr(ctx, n.arg("rows"), "topk_shift rows")
    if rows.type.dtype is not DType.F32 or rows.numel != fragment_rows(ctx, count):
        raise LowerError("lower.shape_mismatch", f"topk_shift reads {rows.name} {rows.shape}: "
                                                 f"{fragment_rows(ctx, count)} f32 values needed")
    if sm is not None:
        return [f"cake::topk_shift_smem<{sm[2]}>({tv}, {pr}, (int)threadIdx.x - {first});"]
    return [f"cake::topk_shift_rows<{kmax[tv]}>({tv}, {pr}, (int)threadIdx.x - {first});"]


def lower_sqnorm_rows(n: Node, ctx: Ctx) -> list[Line]:
    if not in_role(n, ctx):
        raise LowerError("lower.unsupported_operand", "sqnorm_rows is lowered inside a role")
    src, ps = slot_ptr(ctx, n.arg("src"), "sqnorm_rows source")
    dst, pd = slot_ptr(ctx, n.arg("dst"), "sqnorm_rows destination")
    if len(src.shape) != 2 or src.type.dtype not in (DType.BF16, DType.F16) or src.shape[1] % 8 or \
            (int(src.type.swizzle) and src.shape[1] * 2 > int(src.type.swizzle)):
        raise LowerError("lower.unsupported_layout", f"sqnorm_rows reads {src.name} {src.shape}: a 16-bit (R, C) tile, "
                                                     "C % 8 == 0, rows within one swizzle span",
                         "call it once per (R, 64) block with accumulate=True after the first")
    if dst.type.dtype is not DType.F32 or dst.numel != src.shape[0]:
        raise LowerError("lower.shape_mismatch", f"sqnorm_rows writes {dst.name} {dst.shape}: {src.shape[0]} f32 "
                                                 "values needed")
    first, count = role_threads(ctx)
    if count % ctx.arch.warp_size:
        raise LowerError("lower.shape_mismatch", "sqnorm_rows runs on a role of whole warps")
    acc = "true" if n.attr("accumulate") else "false"
    return [f"cake::sqnorm_rows_smem<{src.shape[0]}, {src.shape[1]}, {count}, {acc}, {named_barrier(ctx, first)}>("
            f"{pd}, {ps}, "
            f"(int)threadIdx.x - {first});"]


def lower_topk_store(n: Node, ctx: Ctx) -> list[Line]:
    view, src = n.args
    which, partner = topk_rowstate(ctx)[src]
    kmax = _kmax(ctx)
    if src not in kmax or partner not in kmax:
        raise LowerError("lower.unsupported_operand", f"`{src}` and its partner `{partner}` must be allocated in this "
                                                      "role")
    tv, ti = (src, partner) if which == 0 else (partner, src)
    first, count = role_threads(ctx)
    rows, k = fragment_rows(ctx, count), kmax[src]
    w = window(view, (rows, k), ctx, "destination")
    if (w.rows, w.cols) != (rows, k):
        raise LowerError("lower.shape_mismatch", f"topk_bias list `{src}` ({rows}, {k}) stores into a window of "
                                                 f"{w.rows} x {w.cols}")
    n_rows, n_cols = (f"(int)({w.rows_in})", f"(int)({w.cols_in})") if n.attr("guard") else (str(rows), str(k))
    return [f"cake::store_gmem_topk<{which}, {k}>({w.base}, {tv}, {ti}, {w.ld_row}, {w.ld_col}, {n_rows}, {n_cols}, "
            f"(int)threadIdx.x - {first});  // merges each row's quad, first k columns"]


def _pub_tiles(n: Node, ctx: Ctx, rows: int | None, kmax: int | None) -> tuple[Buf, Buf]:
    """pub_v (rows, KMAX) f32 and pub_i (rows, KMAX) i32: single-stage smem tiles of the same shape."""
    pv = ctx.buf(n.arg("pub_v"), (MemSpace.SMEM,), "pub_v")
    pi = ctx.buf(n.arg("pub_i"), (MemSpace.SMEM,), "pub_i")
    want = (rows, kmax) if rows is not None else pv.shape
    for b, dt in ((pv, DType.F32), (pi, DType.I32)):
        if b.type.dtype is not dt or len(b.shape) != 2 or tuple(b.shape) != tuple(want) or b.numel != math.prod(want):
            raise LowerError("lower.shape_mismatch", f"`{b.name}` is {b.type.dtype.value} {b.shape}; "
                                                     f"{dt.value} {tuple(want)} (one stage) needed")
    return pv, pi


def lower_topk_publish(n: Node, ctx: Ctx) -> list[Line]:
    if not in_role(n, ctx):
        raise LowerError("lower.unsupported_operand", "topk_publish is lowered inside the role of its topk_bias")
    kmax = _kmax(ctx)
    tv, ti = n.arg("top_v"), n.arg("top_i")
    first, count = role_threads(ctx)
    sm = _smem_lists(ctx, tv, ti, count)
    if sm is not None and topk_rowstate(ctx).get(tv) == (0, ti):
        _pub_tiles(n, ctx, fragment_rows(ctx, count), sm[2])
        return [f"cake::copy_smem_topk<{sm[2]}>({n.arg('pub_v')}, {n.arg('pub_i')}, {tv}, {ti}, "
                f"(int)threadIdx.x - {first});  // the smem lists, published to the cluster"]
    if tv not in kmax or ti not in kmax or topk_rowstate(ctx)[tv][0] != 0 or topk_rowstate(ctx)[ti][0] != 1:
        raise LowerError("lower.unsupported_operand", f"`{tv}` / `{ti}` are not the top_v / top_i lists of a "
                                                      "topk_bias allocated in this role")
    _pub_tiles(n, ctx, fragment_rows(ctx, count), kmax[tv])
    return [f"cake::store_smem_topk<{kmax[tv]}>({n.arg('pub_v')}, {n.arg('pub_i')}, {tv}, {ti}, "
            f"(int)threadIdx.x - {first});  // the quad-merged lists, published to the cluster"]


def lower_topk_cluster_merge(n: Node, ctx: Ctx) -> list[Line]:
    st = cluster_top_level(n, ctx)
    pv, pi = _pub_tiles(n, ctx, None, None)
    rows, kmax = pv.shape
    view = n.arg("dst")
    last = view.index[-1] if view.index else None
    cols = ctx.static(last.size, "a tile size") if isinstance(last, Tile) else None
    if cols is None or not 1 <= cols <= kmax:
        raise LowerError("lower.shape_mismatch", f"the window of `{view.buf}` must end in a tile of at most "
                                                 f"KMAX = {kmax} columns")
    w = window(view, (rows, cols), ctx, "destination")
    g = ctx.buf(view.buf, (MemSpace.GMEM,), "destination")
    which = 0 if g.type.dtype.is_float else 1
    cl = (st or {}).get("cluster") or (1, 1, 1)
    return [f"cake::topk_cluster_merge_gmem<{rows}, {kmax}, {math.prod(cl)}, {which}>({w.base}, {w.ld_row}, "
            f"{w.ld_col}, (int)({w.rows_in}), (int)({w.cols_in}), {pv.name}, {pi.name}, (int)threadIdx.x, "
            f"{ctx.threads});  // this CTA's share of the rows, merged over the cluster"]


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.TOPK_BIAS: lower_topk_bias,
    Op.TOPK_SHIFT: lower_topk_shift,
    Op.SQNORM_ROWS: lower_sqnorm_rows,
    Op.TOPK_PUBLISH: lower_topk_publish,
    Op.TOPK_CLUSTER_MERGE: lower_topk_cluster_merge,
}
