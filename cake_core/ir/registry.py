"""The op registry, assembled in this one place from the declaration modules, in a fixed order.

``ops_core`` (allocation, CTA-wide copies, sync, mma, structure), ``ops_async`` (roles, mbarriers, TMA,
cp.async, wgmma, epilogues, cluster exchanges) and ``ops_compute`` (tile math, reductions, running merges,
atomics, gathers) each declare a tuple of :class:`~cake_core.ir.opdef.OpDef`; nothing registers itself by
being imported. Every ``Op`` is declared exactly once (checked here, at import).

The declaration modules and the semantics they name import ``opdef`` (the vocabulary), never ``ops`` (whose
``Node`` reads this registry): that keeps the import graph free of cycles.
"""
from __future__ import annotations

from typing import Callable, Mapping

from cake_core.ir import ops_async, ops_compute, ops_core
from cake_core.ir.opdef import Family, Op, OpDef

DECLARATIONS: tuple[OpDef, ...] = ops_core.DECLS + ops_async.DECLS + ops_compute.DECLS


def _assemble(decls: tuple[OpDef, ...]) -> dict[Op, OpDef]:
    out: dict[Op, OpDef] = {}
    for d in decls:
        if d.op in out:
            raise AssertionError(f"op `{d.op.value}` is declared twice")
        kw = [o.keyword for o in d.operands]
        if kw != sorted(kw):
            raise AssertionError(f"`{d.op.value}`: keyword operands come after the positional ones")
        out[d.op] = d
    missing = [op.value for op in Op if op not in out]
    if missing:
        raise AssertionError(f"ops without a declaration: {', '.join(missing)}")
    return {op: out[op] for op in Op}          # in the enum's order (the reference's)


REGISTRY: Mapping[Op, OpDef] = _assemble(DECLARATIONS)
SEMANTICS: Mapping[Op, Callable] = {op: d.semantics for op, d in REGISTRY.items()}


def ops_of(*families: Family) -> frozenset[Op]:
    """The ops of these families: every op group other modules need is one of these."""
    return frozenset(op for op, d in REGISTRY.items() if d.family in families)


def opdef(name: str) -> OpDef | None:
    """The declaration of the op spelt ``name`` (``"tma_load"``), or None."""
    try:
        return REGISTRY[Op(name)]
    except ValueError:
        return None


COMPUTE_FAMILIES = (Family.ELEMENTWISE, Family.AXIS, Family.RUNNING, Family.ATOMIC, Family.GATHER)
COMPUTE_OPS = ops_of(*COMPUTE_FAMILIES)      # CTA-wide tile math on smem/rmem tiles (rules_compute, lower_compute)
