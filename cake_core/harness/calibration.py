"""Cost-model calibration from measurements: where the error clusters, a refit, judged on held-out attempts.

The seam to the cost model is small: a model predicts a program's time at a shape
(``AnalyticModel.estimate(...).ms``), names the term that bound the estimate (``Estimate.bound``), and has
named positive factors (``AnalyticModel.eff``) that a refit may move. The refit searches those factors on the
model itself (coordinate descent over a geometric grid, each candidate scored by re-predicting every fit
sample), so a refit that is proposed is one whose predictions change; nothing assumes how a factor
enters the formula.

Error clusters: each sample is classed by what bound its estimate: ``memory`` (the ``bytes`` factor) or
``compute:<unit>`` (``fma``, ``mma_sync``, ``wgmma``, ``tcgen05_mma`` or ``simt``, the factor of that unit).
A class clusters when its median |log(predicted / measured)| exceeds a threshold on enough samples.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from cake_core.ir.ops import Op
from cake_core.ir.program import Program, walk
from cake_core.model.analytic import AnalyticModel
from cake_core.model.quality import best_survives, median_abs_log_error, rank_correlation

FACTOR_RANGE = (1e-4, 4.0)   # above 1: the model counts bytes that caches serve (re-reads across CTAs)
GRID = tuple(2.0 ** (k / 4) for k in range(-16, 17))


@dataclass(frozen=True)
class Sample:
    """One measured attempt at one shape."""

    attempt_id: str
    problem: str
    program: Program
    shape: dict[str, int]
    measured_ms: float
    group: str          # candidates compared for rank quality: one problem at one shape

    @property
    def label(self) -> str:
        return f"{self.program.name} @ {self.group.split('|', 1)[1]}"


def unit(program: Program) -> str:
    """The compute unit a program's estimate charges its FLOPs to (the last MMA-class op, as the model)."""
    found = "simt"
    for n, _, _ in walk(program.body):
        if n.op is Op.MMA:
            found = n.attr("atom")
        elif n.op in (Op.WGMMA, Op.TCGEN05_MMA):
            found = n.op.value
    return found


def error_class(model: AnalyticModel, s: Sample) -> str:
    est = model.estimate(s.program, s.shape)
    return "memory" if est.bound == "memory" else f"compute:{unit(s.program)}"


def factor_of(cls: str) -> str:
    return "bytes" if cls == "memory" else cls.split(":", 1)[1]


def predict(model: AnalyticModel, samples: Sequence[Sample]) -> list[float]:
    return [model.estimate(s.program, s.shape).ms for s in samples]


def split(samples: Sequence[Sample], every: int = 3) -> tuple[list[Sample], list[Sample]]:
    """(fit, held out): within each problem, the samples in a fixed order (program hash, shape) and every
    ``every``-th held out, so both sides see every problem and the split does not move when the same
    kernels are measured again."""
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.problem, []).append(s)
    fit, held = [], []
    for rows in by.values():
        for i, s in enumerate(sorted(rows, key=lambda s: (s.program.hash, s.group, s.attempt_id))):
            (held if i % every == every - 1 else fit).append(s)
    return fit, held


def _log_errors(pred: Sequence[float], samples: Sequence[Sample]) -> list[float]:
    return [math.log(p / s.measured_ms) for p, s in zip(pred, samples) if p > 0 and s.measured_ms > 0]


def _by_class(model: AnalyticModel, samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(error_class(model, s), []).append(s)
    return dict(sorted(by.items()))


def class_errors(model: AnalyticModel, samples: Sequence[Sample]) -> dict[str, dict]:
    """Every error class with its sample and attempt counts and its median (|) log error, clustered or not."""
    out = {}
    for cls, rows in _by_class(model, samples).items():
        errs = _log_errors(predict(model, rows), rows)
        if errs:
            out[cls] = {"samples": len(rows), "median_log_ratio": round(statistics.median(errs), 4),
                        "median_abs_log_error": round(statistics.median(abs(e) for e in errs), 4),
                        "factor": factor_of(cls), "attempts": len({s.attempt_id for s in rows}),
                        "errors": len(errs)}
    return out


def clusters(model: AnalyticModel, samples: Sequence[Sample], threshold: float, min_samples: int) -> dict[str, dict]:
    """Error classes whose median |log error| exceeds ``threshold`` on ``min_samples`` or more samples."""
    return {cls: e for cls, e in class_errors(model, samples).items()
            if e["errors"] >= min_samples and e["median_abs_log_error"] > threshold}


def factors_used(model: AnalyticModel, samples: Sequence[Sample]) -> list[str]:
    """The model's factors whose change moves at least one of these samples' estimates."""
    base = predict(model, samples)
    return [f for f in sorted(model.eff)
            if any(abs(a / b - 1) > 1e-6 for a, b in zip(predict(model.with_eff({f: model.eff[f] * 0.5}), samples),
                                                        base) if b > 0)]


def mean_abs_log_error(model: AnalyticModel, samples: Sequence[Sample]) -> float:
    """The mean |log(predicted / measured)| over ``samples``: what a refit minimises."""
    errs = _log_errors(predict(model, samples), samples)
    return sum(abs(e) for e in errs) / len(errs) if errs else math.inf



def refit(model: AnalyticModel, fit: Sequence[Sample], factors: Sequence[str], sweeps: int = 2) -> AnalyticModel:
    """``model`` with ``factors`` moved to minimise the mean |log error| over ``fit``."""
    best = model.with_eff(dict(model.eff))
    best_loss = mean_abs_log_error(best, fit)
    lo, hi = FACTOR_RANGE
    for _ in range(sweeps):
        for f in factors:
            start = best.eff.get(f, 0.05)
            for g in GRID:
                v = min(hi, max(lo, start * g))
                trial = best.with_eff({**best.eff, f: v})
                loss = mean_abs_log_error(trial, fit)
                if loss < best_loss - 1e-9:
                    best, best_loss = trial, loss
    return best.with_eff(best.eff, f"{model.version}+refit({','.join(sorted(factors))})")


def quality(model: AnalyticModel, samples: Sequence[Sample]) -> dict[str, float | None]:
    """Median |log error|, rank correlation within each (problem, shape) group (mean over groups of 3 or
    more) and how often the truly fastest of a group is the predicted fastest."""
    pred = predict(model, samples)
    groups: dict[str, list[tuple[float, float]]] = {}
    for p, s in zip(pred, samples):
        groups.setdefault(s.group, []).append((p, s.measured_ms))
    rhos = [r for g in groups.values() if len(g) >= 3
            if (r := rank_correlation([p for p, _ in g], [m for _, m in g])) is not None]
    mle = median_abs_log_error(pred, [s.measured_ms for s in samples])
    top1 = best_survives([(s.group, p, s.measured_ms) for p, s in zip(pred, samples)], k=1)
    return {"median_abs_log_error": None if mle is None else round(mle, 4),
            "rank_correlation": round(statistics.fmean(rhos), 4) if rhos else None,
            "best_is_predicted_best": None if top1 is None else round(top1, 4)}


def changed(before: AnalyticModel, after: AnalyticModel, samples: Sequence[Sample], rel: float = 0.01) -> int:
    """How many of ``samples`` the two models predict more than ``rel`` apart."""
    return sum(abs(b - a) > rel * b for b, a in zip(predict(before, samples), predict(after, samples)))
