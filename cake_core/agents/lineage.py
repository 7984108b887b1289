"""An attempt's lineage: the path from the naive seed to it, one step per child, with what each step changed.

Each attempt records the tactics of its own step (``tactic``), its parents' IR hashes and the whole tactic
sequence since the seed (``lineage``); ``lineage_path`` walks the parents back to the seed and gives, per
step, the tactics applied, the time measured (or, without a GPU, predicted) and the op counts that changed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from cake_core.agents.rewrite import count_ops
from cake_core.ir.text import parse


@dataclass(frozen=True)
class Node:
    """What the walk needs of one attempt."""

    attempt_id: str
    ir_hash: str
    ir_text: str
    tactic: str | None
    parents: tuple[str, ...]
    measured_ms: float | None = None      # geometric mean over the run's search shapes
    predicted_ms: float | None = None


@dataclass(frozen=True)
class Step:
    attempt_id: str
    tactic: str
    measured_ms: float | None
    predicted_ms: float | None
    ops_changed: dict[str, tuple[int, int]]     # op -> (count in the parent, count here), changed ones only


def _ops(text: str) -> dict[str, int]:
    r = parse(text)
    return count_ops(r.program.body) if r.program is not None else {}


def lineage_path(attempt_id: str, by_id: Mapping[str, Node], by_hash: Mapping[str, Node]) -> list[Step]:
    """Seed first, ``attempt_id`` last. ``by_hash`` maps an IR hash to the attempt that introduced it (the
    earliest); a parent the warehouse does not hold ends the walk where it is missing."""
    chain: list[Node] = []
    node = by_id.get(attempt_id)
    if node is None:
        raise KeyError(attempt_id)
    seen = set()
    while node is not None and node.attempt_id not in seen:
        seen.add(node.attempt_id)
        chain.append(node)
        node = next((by_hash[h] for h in node.parents if h in by_hash), None)
    chain.reverse()
    steps, prev = [], {}
    for n in chain:
        ops = _ops(n.ir_text)
        changed = {k: (prev.get(k, 0), ops.get(k, 0)) for k in sorted(set(prev) | set(ops))
                   if prev.get(k, 0) != ops.get(k, 0)} if prev else {}
        steps.append(Step(n.attempt_id, n.tactic or "seed", n.measured_ms, n.predicted_ms, changed))
        prev = ops
    return steps


def render(steps: list[Step]) -> str:
    """The path as text, one line per step: tactics, time, op-count changes."""
    lines = []
    for i, s in enumerate(steps):
        t = f"{s.measured_ms:.4g} ms measured" if s.measured_ms is not None else \
            f"{s.predicted_ms:.4g} ms predicted" if s.predicted_ms is not None else "not timed"
        ops = ", ".join(f"{k} {a}->{b}" for k, (a, b) in s.ops_changed.items())
        lines.append(f"{i:>2}  {s.attempt_id}  {s.tactic:<32}  {t:<22}  {ops}")
    return "\n".join(lines)
