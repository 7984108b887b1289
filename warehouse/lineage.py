"""A kernel's lineage: the attempts from its run's seed to it, each with the tactics of its step and its score.

An attempt names its parents by IR hash (``attempts.parents``); the parent is the attempt of the same run
with that hash that came first (the earliest generation and slot), so a program proposed again later does
not hide where it came from. Each step carries its score from ``kernel_scores`` (measured over the run's
headline shapes where it was timed, else predicted) and its speed-up over its parent on the same basis.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warehouse.errors import WarehouseError

ATTEMPTS_SQL = """
select a.attempt_id, a.run_id, a.generation, a.slot, a.ir_hash, a.parents, a.tactic, a.outcome, a.stage,
       a.problem, s.basis, s.score_ms
from attempts a left join kernel_scores s using (attempt_id)
where a.run_id = (select run_id from attempts where attempt_id = ?)
order by a.generation, a.slot
"""


class UnknownAttempt(WarehouseError):
    """No attempt with that id in the warehouse."""


@dataclass(frozen=True)
class Step:
    attempt_id: str
    generation: int
    slot: int
    ir_hash: str
    tactic: str
    outcome: str
    basis: str | None           # measured | predicted | None (not scored: failed before a score)
    score_ms: float | None
    speedup: float | None       # parent's score / this score, on the same basis

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def lineage(wh, attempt_id: str) -> list[Step]:
    """The steps from the seed (first) to ``attempt_id`` (last).

    Raises
    ------
    UnknownAttempt
        When the warehouse has no such attempt.
    """
    rows = wh.query(ATTEMPTS_SQL, [attempt_id]).to_pylist()
    by_id = {r["attempt_id"]: r for r in rows}
    if attempt_id not in by_id:
        raise UnknownAttempt(f"no attempt {attempt_id!r} in the warehouse; list some with: cake sql "
                             "\"select attempt_id, run_id, generation, tactic, outcome from attempts limit 20\"")
    first_of: dict[str, dict] = {}
    for r in rows:                                   # rows are in generation, slot order
        first_of.setdefault(r["ir_hash"], r)
    chain, seen = [by_id[attempt_id]], {attempt_id}
    while True:
        parents = [first_of[h] for h in (chain[-1]["parents"] or []) if h in first_of]
        parent = next((p for p in parents if p["attempt_id"] not in seen), None)
        if parent is None:
            break
        chain.append(parent)
        seen.add(parent["attempt_id"])
    chain.reverse()
    steps: list[Step] = []
    for i, r in enumerate(chain):
        prev = chain[i - 1] if i else None
        same_basis = prev is not None and prev["score_ms"] and r["score_ms"] and prev["basis"] == r["basis"]
        steps.append(Step(r["attempt_id"], r["generation"], r["slot"], r["ir_hash"], r["tactic"] or "",
                          r["outcome"], r["basis"], r["score_ms"],
                          prev["score_ms"] / r["score_ms"] if same_basis else None))
    return steps
