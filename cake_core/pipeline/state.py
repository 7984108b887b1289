"""The select stage: a run's state, rebuilt from its warehouse rows before every generation.

The state of generation ``n`` is a function of the rows of generations ``0 .. n-1`` only: the agent's
context (the best kernels so far as parents, the tactics' track records, the programs already tried, the
diagnostics of recent failures), the budget spent and whether the run stops. An uninterrupted run and a
run resumed from the warehouse after a crash compute it from the same rows, so they go on identically.

"Best" is ``kernel_scores``' ranking (warehouse/schema/003_runs_resume.sql): the callers pass its rows,
nothing here recomputes a score.

Rows, as the tasks query them (one dict per row):
  attempts  : generation, slot, ir_hash, tactic, outcome, gpu_seconds, prompt_tokens, completion_tokens
  scores    : generation, slot, ir_hash, score_ms, ir_text, lineage, parents
              (``kernel_scores`` of the run, with the text, the lineage and the parents' hashes)
  history   : ir_hash, score_ms, lineage, parents, run_id  (the scored kernels of the problem's runs that had
              finished when this one started: the tactics' track records carry across runs)
  failures  : generation, slot, ir_text, rule, severity, message, line, col, path, hint, witness
              (the first error diagnostic of each failed attempt)
  generations_done : the generations whose select stage finished (their stage_times 'select' rows)
  shape_scores : shape, generation, slot, ir_hash, ms  (every correct search measurement of the run's scored
              kernels on its headline shapes: each shape's fastest is a parent of its own, see ``search``)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cake_core.agents.base import Context, Scored
from cake_core.agents.search import tactic_record
from cake_core.outcome import Diagnostic, Outcome, Severity
from cake_core.pipeline.plan import RunPlan

PARENTS = 4          # best kernels the agent sees as parents
FEEDBACK = 12        # failure diagnostics the agent sees (the most recent)


@dataclass
class RunState:
    """Where a run stands before generation ``generation``."""

    generation: int                        # the next generation to run
    attempts: int                          # attempts recorded so far
    gpu_seconds: float
    tokens: int
    best: list[tuple[str, float]] = field(default_factory=list)      # (IR text, score), best first
    best_generation: int = -1              # the generation that set the best score (-1: none yet)
    best_score: float | None = None
    tactic_stats: dict[str, tuple[int, int]] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    feedback: list[str] = field(default_factory=list)
    stop: str | None = None                # why the run stops now (expectations.STOP_REASONS), None: go on
    population: int = 0                    # candidates the next generation may propose
    scored: list[Scored] = field(default_factory=list)   # every scored kernel of the run, in score order
    shape_winners: list[Scored] = field(default_factory=list)   # each headline shape's fastest, by shape

    def context(self, plan: RunPlan, harness_version: int, bounds: dict[str, int] | None = None,
                known: list[str] | None = None) -> Context:
        """What the agent sees for the next generation; ``bounds``: the largest value of each dimension over
        the search shapes (never the held-out ones); ``known``: the hand-written programs a warm run offers
        (ignored by a cold one)."""
        return Context(harness_version, self.generation, self.population, list(self.best),
                       dict(self.tactic_stats), set(self.seen), list(self.feedback), list(self.scored),
                       dict(bounds or {}), cold=plan.cold, known=[] if plan.cold else list(known or []),
                       seed=plan.seed, shape_winners=list(self.shape_winners),
                       candidates_left=None if plan.budget_candidates is None else plan.budget_candidates - self.attempts,
                       gpu_minutes_left=None if plan.budget_gpu_minutes is None
                       else plan.budget_gpu_minutes - self.gpu_seconds / 60)


def select_stage(plan: RunPlan, generations_done: set[int], attempts: list[dict[str, Any]],
                 scores: list[dict[str, Any]], failures: list[dict[str, Any]],
                 history: list[dict[str, Any]] = (), shape_scores: list[dict[str, Any]] = ()) -> RunState:
    """The run's state before its next generation, from the rows of the generations it finished.

    The next generation is the first one not finished; rows of later generations (a generation cut short
    by a crash) are left out, so it is redone from the same state. A tactic's record counts the children it
    made that scored better than their parent, in this run and in the ``history`` of earlier runs. Each
    headline shape's winner is the fastest of ``shape_scores`` among the scored kernels (ties: the earlier).
    """
    n = 0
    while n in generations_done:
        n += 1
    attempts = [a for a in attempts if a["generation"] < n]
    scores = sorted((s for s in scores if s["generation"] is not None and s["generation"] < n),
                    key=lambda s: (s["score_ms"], s["generation"], s["slot"] if s["slot"] is not None else -1,
                                   s["ir_hash"] or ""))
    scored = _scored(scores)
    stats = tactic_record(_scored(sorted(history, key=lambda h: (h["run_id"], h["ir_hash"]))) + scored)
    st = RunState(generation=n, attempts=len(attempts), gpu_seconds=sum(a["gpu_seconds"] or 0.0 for a in attempts),
                  tokens=sum((a["prompt_tokens"] or 0) + (a["completion_tokens"] or 0) for a in attempts),
                  best=[(s["ir_text"], s["score_ms"]) for s in scores[:PARENTS]], tactic_stats=stats,
                  seen={a["ir_hash"] for a in attempts}, scored=scored,
                  shape_winners=_shape_winners(scores, scored, shape_scores, n))
    if scores:
        st.best_score = scores[0]["score_ms"]
        st.best_generation = min(s["generation"] for s in scores if s["score_ms"] == st.best_score)
    st.feedback = _feedback([f for f in failures if f["generation"] < n])
    st.stop, st.population = _stop(plan, st)
    return st


def _scored(rows: list[dict[str, Any]]) -> list[Scored]:
    """Scored kernels with their lineage and their parent's score (the first parent scored in the same rows)."""
    by_hash: dict[str, float] = {}
    for r in rows:
        by_hash.setdefault(r["ir_hash"], r["score_ms"])
    return [Scored(r["ir_text"] if "ir_text" in r else "", r["score_ms"], tuple(r.get("lineage") or ()),
                   next((by_hash[h] for h in (r.get("parents") or ()) if h in by_hash), None)) for r in rows]


def _shape_winners(scores: list[dict[str, Any]], scored: list[Scored], shape_scores: list[dict[str, Any]],
                   n: int) -> list[Scored]:
    """The fastest scored kernel on each headline shape (by shape name; one entry per kernel)."""
    by_hash = {s["ir_hash"]: k for s, k in zip(scores, scored)}
    best: dict[str, tuple] = {}
    for r in shape_scores:
        if r["generation"] is None or r["generation"] >= n or r["ir_hash"] not in by_hash or not r["ms"] > 0:
            continue
        key = (r["ms"], r["generation"], r["slot"] if r["slot"] is not None else -1, r["ir_hash"])
        if r["shape"] not in best or key < best[r["shape"]]:
            best[r["shape"]] = key
    out: list[Scored] = []
    for shape in sorted(best):
        k = by_hash[best[shape][3]]
        if k not in out:
            out.append(k)
    return out


def _feedback(failures: list[dict[str, Any]]) -> list[str]:
    ordered = sorted(failures, key=lambda f: (f["generation"], f["slot"] if f["slot"] is not None else -1))
    out, last = [], None
    for f in ordered:
        key = (f["generation"], f["slot"])
        if key == last:       # one diagnostic per attempt
            continue
        last = key
        d = Diagnostic(f["rule"], Severity(f["severity"]), f["message"], f["line"] or 0, f["col"] or 0,
                       f["path"] or "", f["hint"] or "", tuple(f["witness"] or ()))
        out.append(d.format("candidate.cake", f["ir_text"]))
    return out[-FEEDBACK:]


def _stop(plan: RunPlan, st: RunState) -> tuple[str | None, int]:
    """Why the run stops before generation ``st.generation`` (None: it goes on), and the next population."""
    population = plan.population
    if plan.budget_candidates is not None:
        population = min(population, plan.budget_candidates - st.attempts)
    if st.generation >= plan.generations:
        return "generations", 0
    if population <= 0:
        return "budget_candidates", 0
    if plan.budget_gpu_minutes is not None and st.gpu_seconds / 60 >= plan.budget_gpu_minutes:
        return "budget_gpu_minutes", 0
    if plan.patience is not None and st.generation - 1 - st.best_generation >= plan.patience:
        return "no_improvement", 0
    return None, population
