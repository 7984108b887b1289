"""The default agent: offline, deterministic under a seed.

Generation 0 is the problem's seed program and its best-known programs (the seed alone in a cold run:
the hand-written kernels are never offered then). Later generations take parents
from the best candidates so far and apply one or two tactics, each chosen with
a weight from its track record (Laplace-smoothed success rate), skipping
programs already tried. The random numbers of a generation come from (seed, generation) alone, so a
resumed run proposes exactly what the uninterrupted one would have.
"""
from __future__ import annotations

import numpy as np

from cake_core.agents.base import Candidate, Context
from cake_core.agents.tactics import TACTICS
from cake_core.ir.text import parse_program
from cake_core.problems.base import Problem


class TacticAgent:
    name = "tactic"

    def __init__(self, seed: int, tactics: dict | None = None):
        self.seed = seed
        self.tactics = dict(tactics or TACTICS)

    def _weights(self, ctx: Context) -> np.ndarray:
        names = list(self.tactics)
        w = np.array([(ctx.tactic_stats.get(n, (0, 0))[1] + 1) / (ctx.tactic_stats.get(n, (0, 0))[0] + 2)
                      for n in names])
        return w / w.sum()

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate]:
        rng = np.random.default_rng([self.seed, ctx.generation])
        seed = parse_program(problem.seed_text(), problem.seed_file)
        if ctx.generation == 0:
            known = [Candidate(seed.text(), (), self.name, "seed")]
            if not ctx.cold:
                known += [Candidate(parse_program(t).text(), (), self.name, "best-known") for t in problem.best_texts()]
            known = known[: ctx.population]
            taken = {parse_program(c.text).hash for c in known}
            return known + self._mutants([(seed.text(), 0.0)], ctx, ctx.population - len(known), rng, taken)
        return self._mutants(ctx.best or [(seed.text(), 0.0)], ctx, ctx.population, rng)

    def _mutants(self, parents: list[tuple[str, float]], ctx: Context, n: int, rng: np.random.Generator,
                 taken: set[str] = frozenset()) -> list[Candidate]:
        out: list[Candidate] = []
        names = list(self.tactics)
        seen = set(ctx.seen) | set(taken)
        for _ in range(n * 20):
            if len(out) >= n:
                break
            ptext = parents[int(rng.integers(min(len(parents), 4)))][0]
            parent = parse_program(ptext)
            prog, used = parent, []
            for _ in range(int(rng.integers(1, 3))):
                t = names[int(rng.choice(len(names), p=self._weights(ctx)))]
                nxt = self.tactics[t](prog, rng)
                if nxt is not None:
                    prog, used = nxt, used + [t]
            if not used or prog.hash in seen:
                continue
            seen.add(prog.hash)
            out.append(Candidate(prog.text(), (parent.hash,), self.name, "+".join(used)))
        return out
