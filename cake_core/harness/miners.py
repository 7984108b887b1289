"""Miners: turn a failure cluster into a proposed harness change, with evidence.

``mine_rule`` looks for the smallest conjunction of IR features (one or two
``feature == value`` pairs) that holds for every failing attempt of the
cluster and for no attempt that passed: a verifier rule with that predicate
would have rejected the whole cluster before the GPU and no passing kernel.
Structural features are preferred over tile constants, so the rule names a
construct rather than a size.

``mine_calibration`` refits the cost model's efficiency factors where its
prediction error clusters (median |log(predicted/measured)| above a threshold
for an MMA atom), fitting on half of the measurements and reporting the error
and rank correlation on the other half, before and after.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from cake_core.model.cost import CostModel, calibrate
from cake_core.model.quality import median_abs_log_error, rank_correlation


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


def mine_calibration(samples: list[tuple[float, float, str]], model: CostModel, threshold: float = math.log(2),
                     min_samples: int = 6) -> Proposal | None:
    """samples: (predicted_ms, measured_ms, atom), in time order. Propose refit factors for the atoms
    whose median |log error| exceeds ``threshold``, if the refit also helps on held-out samples."""
    by_atom: dict[str, list[tuple[float, float, str]]] = {}
    for s in samples:
        by_atom.setdefault(s[2], []).append(s)
    bad = {a: rows for a, rows in by_atom.items()
           if len(rows) >= min_samples and (median_abs_log_error([r[0] for r in rows], [r[1] for r in rows]) or 0)
           > threshold}
    if not bad:
        return None
    fit = [r for rows in bad.values() for r in rows[0::2]]
    held = [r for rows in bad.values() for r in rows[1::2]]
    refit = calibrate(model, fit)
    scale = {a: refit.eff[a] / model.eff.get(a, refit.eff[a]) for a in bad}
    after = [(p * model.eff.get(a, 1) / refit.eff[a], m, a) for p, m, a in held]  # time ∝ 1/eff
    err_before = median_abs_log_error([r[0] for r in held], [r[1] for r in held])
    err_after = median_abs_log_error([r[0] for r in after], [r[1] for r in after])
    if err_before is None or err_after is None or err_after >= err_before:
        return None
    atoms = ", ".join(sorted(bad))
    return Proposal(
        "calibration", f"cost_model:{atoms}", f"refit cost-model efficiency for {atoms}",
        {"eff": {a: refit.eff[a] for a in bad}},
        {"samples": len(fit) + len(held), "fit": len(fit), "held_out": len(held),
         "held_out_median_abs_log_error": {"before": err_before, "after": err_after},
         "held_out_rank_correlation": rank_correlation([r[0] for r in held], [r[1] for r in held]),
         "scale": scale})
