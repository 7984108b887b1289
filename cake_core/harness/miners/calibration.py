"""The calibration miner: refit the cost model where its error clusters, judged on held-out attempts.

Samples are measured attempts at their shapes, re-predicted with the current harness's model. Where an
error class clusters (:func:`cake_core.harness.calibration.clusters`), the factors of the clustered
classes are refit on the fit attempts (every class's samples count, so a refit that helps one class at
the cost of another loses). Where no class clusters on its own, the error may still be one factor's
(a bandwidth efficiency that is optimistic for every kernel by a little): each factor the samples'
estimates use is refit alone and the one with the lowest median fit error is the candidate. Either way the
refit is proposed only if, on the held-out attempts, its median error is lower by ``MIN_GAIN``, its rank
quality is not worse and its predictions differ from the current model's.
"""
from __future__ import annotations

import math
from typing import Sequence

from cake_core.harness import calibration as cal
from cake_core.model.analytic import AnalyticModel
from cake_core.harness.proposal import Proposal

THRESHOLD = math.log(1.5)      # a class whose median estimate is off by more than 1.5x clusters
MIN_GAIN = 0.1                 # the held-out median error must fall by at least this share
RANK_SLACK = 0.05              # ... while the mean rank correlation may not fall by more than this


def mine_calibration(samples: Sequence[cal.Sample], model: AnalyticModel, threshold: float = THRESHOLD,
                     min_samples: int = 6) -> tuple[Proposal | None, dict]:
    """A calibration proposal, or None with the reason."""
    why = {"signature": "cost_model"}
    if len(samples) < min_samples:
        return None, {**why, "why": f"{len(samples)} measured samples, fewer than {min_samples}"}
    fit, held = cal.split(samples)
    if not held or not fit:
        return None, {**why, "why": "too few measured attempts to hold some out"}
    bad = cal.clusters(model, fit, threshold, min_samples // 2)
    if bad:
        factors = sorted({c["factor"] for c in bad.values()})
        refit = cal.refit(model, fit, factors)
    else:
        refit, factors = _best_single_factor(model, fit)
        if refit is None:
            return None, {**why, "why": f"no error class is off by more than {math.exp(threshold):.2f}x and "
                                        "no single factor's refit lowers the fit error"}
    before, after = cal.quality(model, held), cal.quality(refit, held)
    n_changed = cal.changed(model, refit, held)
    judged = {"before": before, "after": after, "held_out_samples": len(held),
              "held_out_attempts": len({s.attempt_id for s in held}), "predictions_changed": n_changed}
    eb, ea = before["median_abs_log_error"], after["median_abs_log_error"]
    rb, ra = before["rank_correlation"], after["rank_correlation"]
    if n_changed == 0:
        return None, {**why, "why": "the refit changes no held-out prediction", "judged": judged}
    if eb is None or ea is None or ea > eb * (1 - MIN_GAIN):
        return None, {**why, "why": "the refit does not lower the held-out error enough", "judged": judged}
    if rb is not None and ra is not None and ra < rb - RANK_SLACK:
        return None, {**why, "why": "the refit ranks held-out attempts worse", "judged": judged}
    eff = {f: round(refit.eff[f], 6) for f in factors if abs(refit.eff[f] / model.eff.get(f, 1.0) - 1) > 0.01}
    factors = sorted(eff)
    signature = "cost_model:" + ",".join(sorted(bad) if bad else [f"factor={f}" for f in factors])
    examples = []
    for s, b, a in sorted(zip(held, cal.predict(model, held), cal.predict(refit, held)),
                          key=lambda x: -abs(math.log(x[1] / x[0].measured_ms)))[:5]:
        examples.append({"attempt_id": s.attempt_id, "kernel": s.label, "measured_ms": s.measured_ms,
                         "predicted_ms_before": round(b, 6), "predicted_ms_after": round(a, 6)})
    evidence = {
        "definition": {"model": model.version, "factors": {f: {"before": model.eff.get(f), "after": eff[f]}
                                                           for f in factors}},
        "cluster": {"signature": signature, "classes": bad or cal.class_errors(model, fit),
                    "clustered": bool(bad), "samples": len(samples), "fit_samples": len(fit)},
        "judged_on_held_out": judged,
        "examples": examples,
    }
    title = "refit cost-model factors " + ", ".join(f"{f} {model.eff.get(f)} -> {eff[f]:.4g}" for f in factors)
    return Proposal("calibration", signature, title,
                    {"model": model.version, "eff": eff}, evidence), {}


def _best_single_factor(model: AnalyticModel, fit: Sequence[cal.Sample]) -> tuple[AnalyticModel | None, list[str]]:
    """The one-factor refit with the lowest median fit error (robust to a few kernels the model cannot
    describe at all), or None when none lowers it by ``MIN_GAIN``."""
    def median_error(m: AnalyticModel) -> float:
        e = cal.quality(m, fit)["median_abs_log_error"]
        return math.inf if e is None else e

    best, best_err, best_f = None, median_error(model) * (1 - MIN_GAIN), []
    for f in cal.factors_used(model, fit):
        trial = cal.refit(model, fit, [f])
        err = median_error(trial)
        if err < best_err:
            best, best_err, best_f = trial, err, [f]
    return best, best_f
