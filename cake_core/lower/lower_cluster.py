"""Lowering of split-K over a cluster (header/cake_cluster.cuh): ``acc_publish`` and ``acc_cluster_reduce``.

- ``acc_publish(part, acc)``, inside the wgmma role: ``cake::store_smem_wgmma_acc_cluster`` writes the
  accumulator's fragment into ``part`` (row-major f32, 16-byte chunks XOR-swizzled by row % 8 when a row
  holds a multiple of 8 chunks: the layout is private to these two ops). A CTA whose K loop ran no trip
  publishes zeros (the accumulator is zeroed lazily, see lower_wgmma).
- ``acc_cluster_reduce(dst, part)``, at the top level between two ``cluster_sync()``:
  ``cake::cluster_reduce_gmem_f32<R, C, NC>``: NC is the declared cluster's size (1 without a cluster);
  each CTA sums its share of the in-bounds chunks over the cluster's tiles (mapa + ld.shared::cluster.v4)
  and stores them once (st.global.v4 when rows are contiguous and 16-byte aligned).
"""
from __future__ import annotations

import math

from cake_core.ir.ops import Node, Op
from cake_core.ir.types import DType, MemSpace
from cake_core.lower.context import Buf, Ctx, Line, Lowering, LowerError, window
from cake_core.lower.lower_wgmma import zero_unwritten_acc


def _part(n: Node, ctx: Ctx) -> Buf:
    p = ctx.buf(n.arg("part"), (MemSpace.SMEM,), "part")
    if p.type.dtype is not DType.F32 or len(p.shape) != 2 or p.shape[1] % 4:
        raise LowerError("lower.shape_mismatch", f"part `{p.name}` is {p.type.dtype.value} {p.shape}; an f32 "
                                                 "(R, C) smem tile with C % 4 == 0 is needed")
    return p


def lower_acc_publish(n: Node, ctx: Ctx) -> list[Line]:
    st = ctx.__dict__.get("async_state")
    acc = n.arg("acc")
    frag = st["frag"].get(acc) if st is not None and st["role"] is not None else None
    if frag is None:
        raise LowerError("lower.unsupported_operand", f"acc_publish of `{acc}`: lowered inside a role, from a "
                                                      "wgmma accumulator of that role")
    p = _part(n, ctx)
    if tuple(p.shape) != tuple(frag[:2]) or p.numel != math.prod(frag[:2]):
        raise LowerError("lower.shape_mismatch", f"part `{p.name}` {p.shape} for the accumulator {frag[:2]} "
                                                 "(one stage of the same shape needed)")
    first = st["role"][0]
    return zero_unwritten_acc(ctx, acc) + [
        f"cake::store_smem_wgmma_acc_cluster<{frag[1]}>({p.name}, {acc}, (int)threadIdx.x - {first});"
        "  // this CTA's partial sum, published to the cluster"]


def cluster_top_level(n: Node, ctx: Ctx) -> dict | None:
    """The async state of a cluster read (acc_cluster_reduce, topk_cluster_merge), refused inside a role: it
    runs on every thread of the CTA, between two cluster_sync()."""
    st = ctx.__dict__.get("async_state")
    if st is not None and st["role"] is not None:
        raise LowerError("lower.unsupported_in_role", f"{n.op.value} inside a role: it runs at the top level, "
                                                      "between two cluster_sync()")
    return st


def lower_acc_cluster_reduce(n: Node, ctx: Ctx) -> list[Line]:
    st = cluster_top_level(n, ctx)
    p = _part(n, ctx)
    view = n.arg("dst")
    g = ctx.buf(view.buf, (MemSpace.GMEM,), "destination")
    if g.type.dtype is not DType.F32:
        raise LowerError("lower.unsupported_operand", f"acc_cluster_reduce into {g.type.dtype.value} `{view.buf}`: "
                                                      "f32 gmem needed")
    rows, cols = p.shape
    w = window(view, (rows, cols), ctx, "destination")
    cl = (st or {}).get("cluster") or (1, 1, 1)
    return [f"cake::cluster_reduce_gmem_f32<{rows}, {cols}, {math.prod(cl)}>({w.base}, {w.ld_row}, {w.ld_col}, "
            f"(int)({w.rows_in}), (int)({w.cols_in}), {p.name}, (int)threadIdx.x, {ctx.threads});"
            "  // this CTA's share of the tile, summed over the cluster"]


# This module's ops that lower one way (dispatch.LOWERINGS assembles them with the variant tables).
HOOKS: dict[Op, Lowering] = {
    Op.ACC_PUBLISH: lower_acc_publish,
    Op.ACC_CLUSTER_REDUCE: lower_acc_cluster_reduce,
}
