"""The lowering dispatch: one entry per op, assembled here.

An op that lowers one way has its hook in the ``HOOKS`` table of its lowering module (``lower_tile``,
``lower_control``, ``lower_async``, ``lower_wgmma``, ``lower_topk``, ``lower_cluster``, ``lower_compute``, ``lower_axis``). An op
that lowers differently by context has its entry in :data:`VARIANTS`: named variants, each chosen by a predicate,
in the order they are tried (the last one always applies): ``store`` of a wgmma accumulator, of argmin_bias row state
or of a topk_bias list inside a role, ``mma`` per atom, ``atomic_add`` of a wgmma accumulator (split-K), ``atomic_add``
and ``scatter_add`` of an mma_sync accumulator... No
lowering module replaces another's hook, and an op lowered twice is refused here. Entries that do not handle
the mma_sync fragment layout themselves run ``lower_tile.layout_guard`` first (``lower.acc_layout``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import cake_core.lower.lower_async as lower_async
import cake_core.lower.lower_cluster as lower_cluster
import cake_core.lower.lower_axis as lower_axis
import cake_core.lower.lower_compute as lower_compute
import cake_core.lower.lower_control as lower_control
import cake_core.lower.lower_splitk as lower_splitk
import cake_core.lower.lower_tile as lower_tile
import cake_core.lower.lower_topk as lower_topk
import cake_core.lower.lower_wgmma as lower_wgmma
from cake_core.ir.ops import Node, Op
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


def _guarded(fn: Lowering) -> Lowering:
    """``fn`` after the layout guard: a variant of a fragment-aware op that does not follow the layout itself."""
    def guarded(n: Node, ctx: Ctx) -> list[Line]:
        lower_tile.layout_guard(n, ctx)
        return fn(n, ctx)
    return guarded


def _one(fn: Lowering) -> Dispatch:
    return Dispatch((Variant("default", always, fn),))


def _in_role(fn: Lowering) -> Variant:
    return Variant("in_role", lower_async.in_role, fn)


# The ops that lower by context: their variants, in the order they are tried.
VARIANTS: dict[Op, Dispatch] = {
    Op.RMEM: Dispatch((
        Variant("argmin_bias_row_state", lower_wgmma.is_rowstate, lower_wgmma.lower_rowstate_rmem),
        Variant("topk_bias_lists", lower_topk.is_topk_list, lower_topk.lower_topk_rmem),
        Variant("wgmma_accumulator", lower_wgmma.is_wgmma_acc, lower_wgmma.lower_acc_rmem),
        Variant("role_fragment", lower_wgmma.is_role_fragment, lower_wgmma.lower_fragment_rmem),
        _in_role(lower_async.refuse_rmem_in_role),                       # v1 tiles spread over the CTA
        Variant("cta", always, lower_tile.lower_rmem),
    ), fragment_aware=True),
    Op.LOAD: Dispatch((_in_role(lower_async.refuse_cta_op_in_role), Variant("cta", always, lower_tile.lower_load)),
                      fragment_aware=True),
    Op.GATHER: Dispatch((_in_role(lower_async.refuse_cta_op_in_role), Variant("cta", always, lower_tile.lower_gather)),
                        fragment_aware=True),
    Op.FETCH_ADD: Dispatch((_in_role(lower_async.refuse_cta_op_in_role),
                            Variant("cta", always, lower_control.lower_fetch_add))),
    Op.COMPACT: Dispatch((_in_role(lower_async.refuse_cta_op_in_role), Variant("cta", always, lower_control.lower_compact))),
    Op.STORE: Dispatch((
        Variant("argmin_bias_row_state", lower_wgmma.stores_rowstate, lower_wgmma.lower_store_rowstate),
        Variant("topk_bias_lists", lower_topk.stores_topk_list, lower_topk.lower_topk_store),
        Variant("wgmma_accumulator", lower_wgmma.reads_wgmma_acc, lower_wgmma.lower_store_acc),
        Variant("role_row_vector", lower_wgmma.stores_rowvec, lower_wgmma.lower_store_rowvec),
        _in_role(lower_async.refuse_store_in_role),
        Variant("cta", always, lower_tile.lower_store),
    ), fragment_aware=True),
    Op.MMA: Dispatch((
        _in_role(lower_async.refuse_cta_op_in_role),
        Variant("fma", lower_tile.atom_is("fma"), lower_tile.lower_mma_fma),
        Variant("mma_sync", lower_tile.atom_is("mma_sync"), lower_tile.lower_mma_sync),
        Variant("other_atom", always, lower_tile.refuse_mma_atom),       # wgmma: the wgmma op
    ), fragment_aware=True),
    Op.ATOMIC_ADD: Dispatch((
        Variant("wgmma_accumulator", lower_wgmma.reads_wgmma_acc, lower_splitk.lower_atomic_add_acc),   # split-K
        _in_role(lower_splitk.refuse_atomic_add_in_role),
        Variant("mma_sync_accumulator", lower_tile.src_is_fragment, lower_compute.lower_atomic_add),
        Variant("cta", always, _guarded(lower_compute.lower_atomic_add)),
    ), fragment_aware=True),
    Op.SCATTER_ADD: Dispatch((
        Variant("mma_sync_accumulator", lower_tile.src_is_fragment, lower_compute.lower_scatter_add_cta),
        Variant("cta", always, _guarded(lower_compute.lower_scatter_add_cta)),
    ), fragment_aware=True),
}

# The modules whose ops lower one way, each with its table of hooks, in this order.
MODULES = (lower_tile, lower_control, lower_async, lower_wgmma, lower_topk, lower_cluster, lower_compute, lower_axis)


def _assemble() -> dict[Op, Lowering]:
    out: dict[Op, Lowering] = {}
    for m in MODULES:
        for op, hook in m.HOOKS.items():
            if op in out or op in VARIANTS:
                raise AssertionError(f"`{op.value}` has two lowerings ({m.__name__} and another)")
            # a hook that touches no tile operand is untouched by the guard; the others are guarded
            out[op] = _one(hook)
    out.update(VARIANTS)
    missing = [op.value for op in Op if op not in out]
    if missing:
        raise AssertionError(f"ops without a lowering: {', '.join(missing)}")
    return {op: out[op] for op in Op}


LOWERINGS: dict[Op, Lowering] = _assemble()
