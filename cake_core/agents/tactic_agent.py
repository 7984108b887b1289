"""The default agent: offline, deterministic under a seed, evolving a population with tactics.

Generation 0 is the problem's naive seed (and, in a warm run only, the hand-written programs the caller
passes in ``Context.known``: the agent itself never reads stored programs). Each later
child takes a parent from the archive (the best of each schedule niche, or the best overall: see
``search``) and applies one to three tactics in a row; each is drawn among those whose precondition holds
for the program at hand, weighted by its record (Laplace-smoothed rate of children faster than their
parent). A tactic that refuses is recorded with its reason (``refusals``) and another is drawn. No
program is proposed twice. Every choice draws from a generator seeded by (run seed, generation), so a
resumed run proposes what the uninterrupted one would have.

``read`` and ``write`` say how a program's text is read and written (the plain IR text by default): a harness
with composite ops reads texts that call them and writes each program with its composites.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from cake_core.agents.base import Candidate, Context, Refusal, Scored
from cake_core.agents.rewrite import Refused
from cake_core.agents.search import Archive, niche
from cake_core.agents.tactics import TACTICS, apply
from cake_core.errors import CakeError
from cake_core.ir.program import Program
from cake_core.ir.text import parse_program
from cake_core.problems.base import Problem

MAX_STEP = 3            # tactics applied in a row to make one child
TRIES_PER_CHILD = 20


class TacticAgent:
    name = "tactic"

    def __init__(self, seed: int, tactics: dict | None = None, read: Callable[[str], Program] | None = None,
                 write: Callable[[Program], str] | None = None):
        self.seed = seed
        self.tactics = dict(tactics or TACTICS)
        self.read = read or parse_program
        self.write = write or Program.text
        self.refusals: list[Refusal] = []          # what the last propose() was refused, for the warehouse
        self._refused: set[Refusal] = set()

    def _weights(self, ctx: Context, names: list[str]) -> np.ndarray:
        stats = ctx.tactic_stats
        w = np.array([(stats.get(n, (0, 0))[1] + 1) / (stats.get(n, (0, 0))[0] + 2) for n in names])
        return w / w.sum()

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate]:
        rng = np.random.default_rng([self.seed, ctx.generation])
        self.refusals, self._refused = [], set()
        seed = parse_program(problem.seed_text(), problem.seed_file)
        seen = set(ctx.seen)
        out: list[Candidate] = []
        if ctx.generation == 0 or not (ctx.scored or ctx.best):
            known = [Candidate(self.write(seed), (), self.name, "seed")]
            if not ctx.cold:
                known += [Candidate(self.write(parse_program(t)), (), self.name, "best-known") for t in ctx.known]
            for c in known[: ctx.population]:
                h = self.read(c.text).hash
                if h not in seen:
                    seen.add(h)
                    out.append(c)
            parents = [Scored(self.write(seed), float("inf"))]
        else:
            parents = None
        scored = ctx.scored or [Scored(t, s) for t, s in ctx.best]
        archive = Archive(scored, self._niche_of, ctx.shape_winners) if scored else None
        for _ in range((ctx.population - len(out)) * TRIES_PER_CHILD):
            if len(out) >= ctx.population:
                break
            parent = archive.pick(rng) if archive is not None and archive.all else parents[0] if parents else None
            if parent is None:
                break
            child = self._child(parent, ctx, rng)
            if child is None:
                continue
            prog, used = child
            if prog.hash in seen:
                continue
            seen.add(prog.hash)
            step = "+".join(used)
            out.append(Candidate(self.write(prog), (self.read(parent.text).hash,), self.name, step,
                                 lineage=tuple(parent.lineage) + (step,)))
        return out

    def _child(self, parent: Scored, ctx: Context, rng: np.random.Generator) -> tuple[Program, list[str]] | None:
        prog = self.read(parent.text)
        used: list[str] = []
        for _ in range(int(rng.integers(1, MAX_STEP + 1))):
            names = [n for n in self.tactics]
            w = self._weights(ctx, names)
            for _attempt in range(len(names)):
                t = names[int(rng.choice(len(names), p=w))]
                r = apply(t, prog, rng, ctx.bounds, self.tactics)
                if isinstance(r, Refused):
                    ref = Refusal(t, prog.hash, r.reason)
                    if ref not in self._refused:
                        self._refused.add(ref)
                        self.refusals.append(ref)
                    w = w.copy()
                    w[names.index(t)] = 0.0
                    if w.sum() == 0:
                        break
                    w = w / w.sum()
                    continue
                prog, used = r, used + [t]
                break
        return (prog, used) if used else None

    def _niche_of(self, text: str):
        try:
            return niche(self.read(text))
        except CakeError:
            return None
