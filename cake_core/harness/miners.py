"""Miners: turn a failure cluster into a proposed harness change, with evidence.

``mine_rule`` looks for the smallest conjunction of IR features (one or two
``feature == value`` pairs) that holds for every failing attempt of the
cluster and for no attempt that passed: a verifier rule with that predicate
would have rejected the whole cluster before the GPU and no passing kernel.
Structural features are preferred over tile constants, so the rule names a
construct rather than a size.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proposal:
    kind: str                       # rule | primitive | calibration | tactic
    signature: str
    title: str
    payload: dict[str, Any]
    evidence: dict[str, Any] = field(default_factory=dict)


def _pairs(feats: dict[str, Any]) -> set[tuple[str, Any]]:
    return {(k, v) for k, v in feats.items()}


def mine_rule(signature: str, failing: list[dict[str, Any]], passing: list[dict[str, Any]],
              rule_id: str, min_support: int = 3) -> Proposal | None:
    if len(failing) < min_support:
        return None
    common = set.intersection(*(_pairs(f) for f in failing))
    ranked = sorted(common, key=lambda kv: (kv[0].startswith("const."), kv[0], str(kv[1])))
    passing_pairs = [_pairs(p) for p in passing]
    for size in (1, 2):
        for combo in itertools.combinations(ranked, size):
            if not any(set(combo) <= pp for pp in passing_pairs):
                pred = [list(kv) for kv in combo]
                what = " and ".join(f"{k} = {v!r}" for k, v in combo)
                return Proposal(
                    "rule", signature, f"reject programs with {what}",
                    {"id": rule_id, "predicate": pred,
                     "message": f"programs with {what} failed {len(failing)} times as `{signature}` and "
                                "never passed", "hint": f"avoid {what}"},
                    {"failing": len(failing), "passing_checked": len(passing), "predicate": pred})
    return None
