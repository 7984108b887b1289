"""The default agent: offline, deterministic under a seed.

Generation 0 is the problem's seed program and its best-known programs. Later generations take parents
from the best candidates so far and apply one or two tactics, each chosen with
a weight from its track record (Laplace-smoothed success rate), skipping
programs already tried.

``read`` and ``write`` say how a program's text is read and written (by default the plain IR text): a
harness with composite ops reads texts that call them and writes each program with its composites.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from cake_core.agents.base import Candidate, Context
from cake_core.agents.tactics import TACTICS
from cake_core.ir.program import Program
from cake_core.ir.text import parse_program
from cake_core.problems.base import Problem


class TacticAgent:
    name = "tactic"

    def __init__(self, seed: int, tactics: dict | None = None, read: Callable[[str], Program] | None = None,
                 write: Callable[[Program], str] | None = None):
        self.rng = np.random.default_rng(seed)
        self.tactics = dict(tactics or TACTICS)
        self.read = read or parse_program
        self.write = write or Program.text

    def _weights(self, ctx: Context) -> np.ndarray:
        names = list(self.tactics)
        w = np.array([(ctx.tactic_stats.get(n, (0, 0))[1] + 1) / (ctx.tactic_stats.get(n, (0, 0))[0] + 2)
                      for n in names])
        return w / w.sum()

    def propose(self, problem: Problem, ctx: Context) -> list[Candidate]:
        seed = parse_program(problem.seed_text(), problem.seed_file)
        if ctx.generation == 0:
            known = [Candidate(self.write(seed), (), self.name, "seed")] + \
                [Candidate(self.write(parse_program(t)), (), self.name, "best-known") for t in problem.best_texts()]
            known = known[: ctx.population]
            return known + self._mutants([(self.write(seed), 0.0)], ctx, ctx.population - len(known))
        return self._mutants(ctx.best or [(self.write(seed), 0.0)], ctx, ctx.population)

    def _mutants(self, parents: list[tuple[str, float]], ctx: Context, n: int) -> list[Candidate]:
        out: list[Candidate] = []
        names = list(self.tactics)
        seen = set(ctx.seen)
        for _ in range(n * 20):
            if len(out) >= n:
                break
            ptext = parents[int(self.rng.integers(min(len(parents), 4)))][0]
            parent = self.read(ptext)
            prog, used = parent, []
            for _ in range(int(self.rng.integers(1, 3))):
                t = names[int(self.rng.choice(len(names), p=self._weights(ctx)))]
                nxt = self.tactics[t](prog, self.rng)
                if nxt is not None:
                    prog, used = nxt, used + [t]
            if not used or prog.hash in seen:
                continue
            seen.add(prog.hash)
            out.append(Candidate(self.write(prog), (parent.hash,), self.name, "+".join(used)))
        return out
