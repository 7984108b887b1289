"""IR features: a flat, comparable summary of a program's schedule.

The warehouse stores them with every attempt; failure signatures bucket them; learned verifier rules
(harness proposals) are predicates over them, and the cost model's calibration groups measurements by
``mma_atom``. Every value is a bool, an int or a string, so that ``(feature, value)`` pairs are hashable.
They are read from the op declarations, not from lists of ops:

- ``mma_atom``: the atom of the first op of the MMA family (fma, mma_sync, wgmma, tcgen05), "none" without one;
- ``copy_engine``: the engines (plain, cp_async, tma) of the copies that read gmem, joined by "+";
- ``n_roles``, ``role_regs`` (each role's setmaxnreg budget, "/"-joined, "none" without roles);
- ``smem_stages`` (the deepest smem ring), ``mbarrier_slots`` (the most slots of one mbarrier array);
- ``cluster_size``, ``multicast`` (a copy or an arrive reaches other CTAs of the cluster);
- ``persistent``: a tile loop over the grid's CTAs (``range(bid.x, tiles, ncta.x)``);
- ``epilogue``: the ops that read an MMA accumulator, "+"-joined ("none" without an MMA);
- ``unguarded_load`` / ``unguarded_store``: an op with ``guard=False`` that reads / writes or adds into gmem;
- ``n_sync``, ``n_loops``, ``max_unroll``, ``threads``, ``ctas_per_sm``, ``const.*``; with a known target,
  ``smem_kib`` and ``regs_per_thread`` bucketed up to the target's limits.
"""
from __future__ import annotations

import math
from typing import Any

from cake_core.ir.expr import try_evaluate
from cake_core.ir.opdef import Alloc, Family, SyncKind
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.program import Program, walk
from cake_core.ir.rule_ctx import build_ctx, rmem_words_per_thread, smem_bytes
from cake_core.ir.tree import is_persistent_loop
from cake_core.targets import find_arch


def _bucket(v: int | None, edges: tuple[int, ...]) -> str:
    if v is None:
        return "unknown"
    for e in edges:
        if v <= e:
            return f"<={e}"
    return f">{edges[-1]}"


def _gmem_accesses(n: Node) -> tuple[bool, bool]:
    """Whether ``n`` reads gmem, and whether it writes or adds into gmem (through its view operands)."""
    reads = writes = False
    for o, a in zip(REGISTRY[n.op].operands, n.args):
        if o.kind == "view":
            e = o.effect_of(n)
            reads |= e.reads
            writes |= e.modifies
    return reads, writes


def _joined(names: list[str]) -> str:
    return "+".join(sorted(set(names))) or "none"


def features(program: Program) -> dict[str, Any]:
    nodes = [n for n, _, _ in walk(program.body)]
    decl = {id(n): REGISTRY[n.op] for n in nodes}
    mmas = [n for n in nodes if decl[id(n)].family is Family.MMA]
    accs = {n.arg("acc") for n in mmas}
    guarded = [(n, _gmem_accesses(n)) for n in nodes if "guard" in decl[id(n)].attrs]
    roles = [n for n in nodes if n.op is Op.ROLE]
    cluster = next((n for n in program.body if n.op is Op.CLUSTER), None)
    f: dict[str, Any] = {
        "threads": program.threads,
        "ctas_per_sm": program.ctas_per_sm,
        "unguarded_load": any(not n.attr("guard") and reads for n, (reads, _) in guarded),
        "unguarded_store": any(not n.attr("guard") and writes for n, (_, writes) in guarded),
        "mma_atom": decl[id(mmas[0])].atom_of(mmas[0]) if mmas else "none",
        "copy_engine": _joined([decl[id(n)].engine for n in nodes
                                if decl[id(n)].family is Family.COPY and _gmem_accesses(n)[0]]),
        "n_roles": len(roles),
        "role_regs": "/".join(str(n.attr("regs")) for n in roles) or "none",
        "n_sync": sum(decl[id(n)].sync is SyncKind.CTA for n in nodes),
        "n_loops": sum(n.op is Op.FOR for n in nodes),
        "max_unroll": max([n.attr("unroll") for n in nodes if n.op is Op.FOR] or [0]),
        "smem_stages": max([n.attr("stages") for n in nodes if decl[id(n)].allocates is Alloc.SMEM] or [0]),
        "mbarrier_slots": max([v for n in nodes if decl[id(n)].allocates is Alloc.MBARRIER
                               for v in [_const(n.args[0], program)] if v is not None] or [0]),
        "cluster_size": _cluster_size(cluster, program),
        "multicast": any(n.attr("multicast") for n in nodes if "multicast" in decl[id(n)].attrs),
        "persistent": any(is_persistent_loop(n) for n in nodes),
        "epilogue": _joined([n.op.value for n in nodes if decl[id(n)].family is not Family.MMA
                             and any(o.kind == "buf" and o.effect_of(n).reads and a in accs
                                     for o, a in zip(decl[id(n)].operands, n.args))]) if mmas else "none",
    }
    for k, v in program.consts:
        f[f"const.{k}"] = v
    arch = find_arch(program.target)
    if arch is not None:
        ctx = build_ctx(program, arch)
        f["smem_kib"] = _bucket((smem_bytes(ctx) or 0) // 1024, (16, 48, 100, 160, arch.smem_per_cta_bytes // 1024))
        f["regs_per_thread"] = _bucket(rmem_words_per_thread(ctx), (32, 64, 128, 192, arch.max_regs_per_thread))
    return f


def _const(e: Any, program: Program) -> int | None:
    v = try_evaluate(e, program.const_env)
    return int(v) if v is not None else None


def _cluster_size(n: Node | None, program: Program) -> int:
    """CTAs per cluster: 1 without a cluster declaration, 0 for one whose shape is not static."""
    if n is None:
        return 1
    dims = [_const(d, program) for d in n.args[0]]
    return 0 if None in dims else math.prod(dims)
