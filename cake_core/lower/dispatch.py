"""The lowering dispatch: one entry per op, assembled here, in one table.

Where an op lowers differently by context, its entry lists named variants, each chosen by a predicate, in the
order they are tried (the last one always applies): ``store`` of a wgmma accumulator, of argmin_bias row state
or of a topk_bias list inside a role, ``mma`` per atom, ``atomic_add`` of a wgmma accumulator (split-K)... No
lowering module replaces another's hook. Entries that do not handle the mma_sync fragment layout themselves
run ``lower_tile.layout_guard`` first (``lower.acc_layout``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cake_core.ir.ops import Node, Op
from cake_core.lower import (lower_async, lower_cluster, lower_compute, lower_control, lower_splitk, lower_tile,
                             lower_topk)
from cake_core.lower.context import Ctx, Line, Lowering, LowerError


def always(n: Node, ctx: Ctx) -> bool:
    return True


@dataclass(frozen=True)
class Variant:
    """One way of lowering an op: ``lower`` applies when ``when`` holds."""

    name: str
    when: Callable[[Node, Ctx], bool]
    lower: Lowering


@dataclass(frozen=True)
class Dispatch:
    """One op's lowering: the first variant whose predicate holds lowers the node."""

    variants: tuple[Variant, ...]
    fragment_aware: bool = False      # follows the mma_sync fragment layout itself (no layout guard)

    def variant_for(self, n: Node, ctx: Ctx) -> Variant:
        for v in self.variants:
            if v.when(n, ctx):
                return v
        raise LowerError("lower.unknown_op", f"no lowering of `{n.op.value}` applies here "
                                             f"(variants: {', '.join(v.name for v in self.variants)})")

    def __call__(self, n: Node, ctx: Ctx) -> list[Line]:
        if not self.fragment_aware:
            lower_tile.layout_guard(n, ctx)
        return self.variant_for(n, ctx).lower(n, ctx)


def _one(fn: Lowering, fragment_aware: bool = False) -> Dispatch:
    return Dispatch((Variant("default", always, fn),), fragment_aware)


def _in_role(fn: Lowering) -> Variant:
    return Variant("in_role", lower_async.in_role, fn)


LOWERINGS: dict[Op, Lowering] = {
    # -- allocation
    Op.SMEM: _one(lower_tile.lower_smem, fragment_aware=True),
    Op.RMEM: Dispatch((
        Variant("argmin_bias_row_state", lower_async.is_rowstate, lower_async.lower_rowstate_rmem),
        Variant("topk_bias_lists", lower_topk.is_topk_list, lower_topk.lower_topk_rmem),
        Variant("wgmma_accumulator", lower_async.is_wgmma_acc, lower_async.lower_acc_rmem),
        _in_role(lower_async.refuse_rmem_in_role),                       # v1 tiles spread over the CTA
        Variant("cta", always, lower_tile.lower_rmem),
    ), fragment_aware=True),
    Op.MBARRIER: _one(lower_async.lower_mbarrier),
    # -- copies
    Op.LOAD: Dispatch((_in_role(lower_async.refuse_cta_op_in_role), Variant("cta", always, lower_tile.lower_load)),
                      fragment_aware=True),
    Op.STORE: Dispatch((
        Variant("argmin_bias_row_state", lower_async.stores_rowstate, lower_async.lower_store_rowstate),
        Variant("topk_bias_lists", lower_topk.stores_topk_list, lower_topk.lower_topk_store),
        Variant("wgmma_accumulator", lower_async.reads_wgmma_acc, lower_async.lower_store_acc),
        _in_role(lower_async.refuse_store_in_role),
        Variant("cta", always, lower_tile.lower_store),
    ), fragment_aware=True),
    Op.TMA_LOAD: _one(lower_async.lower_tma_load),
    Op.TMA_STORE: _one(lower_async.lower_tma_store),
    Op.CP_ASYNC: _one(lower_async.lower_cp_async),
    Op.CP_ASYNC_BAR: _one(lower_async.lower_cp_async_bar),
    # -- synchronisation
    Op.SYNC: _one(lower_tile.lower_sync, fragment_aware=True),
    Op.EXPECT_TX: _one(lower_async.lower_expect_tx),
    Op.ARRIVE: _one(lower_async.lower_arrive),
    Op.WAIT: _one(lower_async.lower_wait),
    Op.CP_ASYNC_WAIT: _one(lower_async.lower_cp_async_wait),
    Op.FENCE_ASYNC: _one(lower_async.lower_fence),
    Op.WGMMA_WAIT: _one(lower_async.lower_wgmma_wait),
    Op.CLUSTER_SYNC: _one(lower_async.lower_cluster_sync),
    # -- matrix multiply-accumulate
    Op.MMA: Dispatch((
        _in_role(lower_async.refuse_cta_op_in_role),
        Variant("fma", lower_tile.atom_is("fma"), lower_tile.lower_mma_fma),
        Variant("mma_sync", lower_tile.atom_is("mma_sync"), lower_tile.lower_mma_sync),
        Variant("other_atom", always, lower_tile.refuse_mma_atom),       # wgmma: the wgmma op
    ), fragment_aware=True),
    Op.WGMMA: _one(lower_async.lower_wgmma),
    Op.TCGEN05_MMA: _one(lower_async.lower_tcgen05),
    # -- structure
    Op.FOR: _one(lower_control.lower_for, fragment_aware=True),
    Op.IF: _one(lower_control.lower_if),
    Op.LET: _one(lower_control.lower_let, fragment_aware=True),
    Op.ROLE: _one(lower_async.lower_role),
    Op.CLUSTER: _one(lower_async.lower_cluster),
    # -- compute
    Op.FILL: _one(lower_compute.lower_fill),
    Op.CAST: _one(lower_compute.lower_cast),
    Op.UNARY: _one(lower_compute.lower_unary),
    Op.EWISE: _one(lower_compute.lower_ewise),
    Op.TRANSPOSE: _one(lower_compute.lower_transpose),
    Op.REDUCE: _one(lower_compute.lower_reduce),
    Op.SCAN: _one(lower_compute.lower_scan),
    Op.ARGMIN: _one(lower_compute.lower_argreduce),
    Op.ARGMAX: _one(lower_compute.lower_argreduce),
    Op.ARGMIN_UPDATE: _one(lower_compute.lower_argmin_update),
    Op.TOPK_MERGE: _one(lower_compute.lower_topk_merge),
    Op.ATOMIC_ADD: Dispatch((
        Variant("wgmma_accumulator", lower_async.reads_wgmma_acc, lower_splitk.lower_atomic_add_acc),   # split-K
        _in_role(lower_splitk.refuse_atomic_add_in_role),
        Variant("cta", always, lower_compute.lower_atomic_add),
    )),
    Op.SCATTER_ADD: _one(lower_compute.lower_scatter_add),
    Op.GATHER_ADD: _one(lower_compute.lower_gather_add),
    # -- fused epilogues, row norms, cluster exchanges
    Op.ARGMIN_BIAS: _one(lower_async.lower_argmin_bias),
    Op.TOPK_BIAS: _one(lower_topk.lower_topk_bias),
    Op.SQNORM_ROWS: _one(lower_topk.lower_sqnorm_rows),
    Op.TOPK_PUBLISH: _one(lower_topk.lower_topk_publish),
    Op.TOPK_CLUSTER_MERGE: _one(lower_topk.lower_topk_cluster_merge),
    Op.ACC_PUBLISH: _one(lower_cluster.lower_acc_publish),
    Op.ACC_CLUSTER_REDUCE: _one(lower_cluster.lower_acc_cluster_reduce),
}
