"""The search's memory: a map of schedule niches, parent selection over it, tactic track records.

Selection over the top few by score alone collapses onto one design: the naive seed's tile variants win
the first generations and the structural rewrites that are slower until their follow-ups land are never
parents again. So candidates are placed in niches by their schedule (MMA atom, copy engine, warp roles,
resident operands, persistence, split, stages and tile shape), each niche keeps its best, and parents are
drawn from the niches as well as from the best overall (MAP-Elites).

A run's product is a kernel per shape (the dispatch table), not only its best geometric mean: the fastest
kernel measured on each headline shape is a parent pool of its own. A kernel that wins the large shapes and
loses the small ones (wide tiles: few CTAs on a small problem) is never the best overall, and as one niche's
elite among many it is drawn rarely; as a shape's winner it is refined every generation.

A tactic's record is (tried, won): ``won`` counts children faster than their parent, not merely correct.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from cake_core.agents.base import Scored
from cake_core.ir.expr import symbols
from cake_core.ir.ops import Op, loop_range
from cake_core.ir.program import Program, walk


@dataclass(frozen=True)
class Niche:
    atom: str          # fma | mma_sync | wgmma
    copy: str          # plain | cp_async | tma
    consumers: int     # consumer roles (0: CTA-collective)
    resident: bool     # an operand copied once per tile
    persistent: bool   # a tile loop over ncta.x
    split: bool        # split-K / a split grid dimension
    tile: str          # the accumulator's shape, as constants name it

    def __str__(self) -> str:
        flags = "".join(f for f, on in (("R", self.resident), ("P", self.persistent), ("K", self.split)) if on)
        return f"{self.atom}/{self.copy}/{self.consumers}c{('/' + flags) if flags else ''}/{self.tile}"


def niche(p: Program) -> Niche:
    nodes = [n for n, _, _ in walk(p.body)]
    ops = {n.op for n in nodes}
    if Op.WGMMA in ops:
        atom = "wgmma"
    else:
        atoms = {n.attr("atom") for n in nodes if n.op is Op.MMA}
        atom = "mma_sync" if "mma_sync" in atoms else "wgmma" if "wgmma" in atoms else "fma"
    copy = "tma" if Op.TMA_LOAD in ops else "cp_async" if ops & {Op.CP_ASYNC, Op.CP_ASYNC_BAR} else "plain"
    consumers = sum(1 for n in p.body if n.op is Op.ROLE and any(m.op is Op.WGMMA for m, _, _ in walk(n.body)))
    once = {n.arg("bar").buf for n in nodes if n.op is Op.WAIT and n.arg("bar").index == 0 and n.arg("phase") == 0}
    resident = bool(once) or any(n.op is Op.MBARRIER and n.result.endswith("_empty") for n in nodes)
    persistent = any(n.op is Op.FOR and getattr(loop_range(n)[2], "name", "") == "ncta.x" for n in nodes)
    # split-K: partial products of an mma accumulator added into the output (a segment sum's atomics are not), or
    # a reduction loop whose trips depend on the CTA (its share of the reduction: a grouped GEMM's scatter-add of
    # partial sums looks like its seed's)
    mmas = (Op.MMA, Op.WGMMA, Op.TCGEN05_MMA)
    accs = {m.arg("acc") for m in nodes if m.op in mmas}
    split = any(n.op is Op.ATOMIC_ADD and n.arg("src") in accs for n in nodes) or any(
        n.op is Op.FOR and any(m.op in mmas for m in n.body)
        and any(s.startswith("bid.") for s in symbols(loop_range(n)[1])) for n in nodes)
    acc = next((n for n in nodes if n.op is Op.RMEM and n.result and any(
        m.op in (Op.MMA, Op.WGMMA) and m.arg("acc") == n.result for m in nodes)), None)
    env = p.const_env
    tile = "x".join(str(_eval(d, env)) for d in acc.arg("shape")) if acc is not None else "-"
    return Niche(atom, copy, consumers, resident, persistent, split, tile)


def _eval(e, env) -> str:
    from cake_core.ir.expr import fmt_expr, try_evaluate
    v = try_evaluate(e, env)
    return str(int(v)) if v is not None else fmt_expr(e)


class Archive:
    """The best candidate of each niche, the best overall, and each headline shape's winner."""

    def __init__(self, scored: Iterable[Scored], niche_of, shape_winners: Iterable[Scored] = ()):
        self.shape_winners: list[Scored] = list(shape_winners)
        self.elites: dict[Niche, Scored] = {}
        self.all: list[Scored] = sorted((s for s in scored if math.isfinite(s.score)), key=lambda s: s.score)
        for s in self.all:
            n = niche_of(s.text)
            if n is not None and n not in self.elites:
                self.elites[n] = s

    def pick(self, rng: np.random.Generator, top: int = 4) -> Scored | None:
        """Half the time one of the ``top`` best overall; else, a quarter of the time, a headline shape's winner
        (where the run measured any), else the elite of a niche chosen uniformly. Without shape winners the
        draws are those of the niches alone."""
        if not self.all:
            return None
        if not self.elites and not self.shape_winners:
            return self.all[int(rng.integers(min(top, len(self.all))))]
        r = rng.random()
        if r < 0.5:
            return self.all[int(rng.integers(min(top, len(self.all))))]
        if self.shape_winners and (r < 0.75 or not self.elites):
            return self.shape_winners[int(rng.integers(len(self.shape_winners)))]
        keys = sorted(self.elites, key=str)
        return self.elites[keys[int(rng.integers(len(keys)))]]


def tactic_record(scored: Iterable[Scored]) -> dict[str, tuple[int, int]]:
    """(tried, won) per tactic from scored children: each tactic of a child's last step counts it as tried,
    and as won when the child scored better than its parent."""
    out: dict[str, tuple[int, int]] = {}
    for s in scored:
        if s.parent_score is None or not s.lineage:
            continue
        step = s.lineage[-1]
        for t in step.split("+"):
            tried, won = out.get(t, (0, 0))
            out[t] = (tried + 1, won + int(s.score < s.parent_score))
    return out
