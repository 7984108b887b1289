"""IR features: a flat, comparable summary of a program.

The warehouse stores them with every attempt; failure signatures bucket them;
learned verifier rules (harness proposals) are predicates over them.
"""
from __future__ import annotations

from typing import Any

from cake_core.ir.ops import Op
from cake_core.ir.program import Program, walk
from cake_core.ir.targets import load_target
from cake_core.ir.verify import build_ctx, rmem_words_per_thread, smem_bytes


def _bucket(v: int | None, edges: tuple[int, ...]) -> str:
    if v is None:
        return "unknown"
    for e in edges:
        if v <= e:
            return f"<={e}"
    return f">{edges[-1]}"


def features(program: Program) -> dict[str, Any]:
    nodes = [n for n, _, _ in walk(program.body)]
    loads = [n for n in nodes if n.op is Op.LOAD]
    stores = [n for n in nodes if n.op is Op.STORE]
    mmas = [n for n in nodes if n.op is Op.MMA]
    f: dict[str, Any] = {
        "threads": program.threads,
        "ctas_per_sm": program.ctas_per_sm,
        "unguarded_load": any(not n.attr("guard") for n in loads),
        "unguarded_store": any(not n.attr("guard") for n in stores),
        "mma_atom": mmas[0].attr("atom") if mmas else "none",
        "n_sync": sum(n.op is Op.SYNC for n in nodes),
        "n_loops": sum(n.op is Op.FOR for n in nodes),
        "max_unroll": max([n.attr("unroll") for n in nodes if n.op is Op.FOR] or [0]),
        "smem_stages": max([n.attr("stages") for n in nodes if n.op is Op.SMEM] or [0]),
    }
    for k, v in program.consts:
        f[f"const.{k}"] = v
    target = load_target(program.target)
    if target is not None:
        ctx = build_ctx(program, target)
        f["smem_kib"] = _bucket((smem_bytes(ctx) or 0) // 1024, (16, 48, 100, 160, 227))
        f["regs_per_thread"] = _bucket(rmem_words_per_thread(ctx), (32, 64, 128, 192, 255))
    return f
