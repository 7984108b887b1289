"""The learned cost model: two LightGBM boosters per GPU over the features and the analytic model's terms.

Design. The input is the fixed-length vector of ``Features.vector()`` plus the analytic model's time
terms and its prediction (log2 of microseconds), so the boosters learn *corrections* of a physical
model rather than times from scratch, which matters with a few hundred measurements. Besides, the
same quantities as ratios that do not grow with the problem or its shape (``RELATIVE``, log2 ratios):
the grid's traffic over the parameters' footprint (how often data is re-read) and each analytic term's
share of the analytic total (what bounds the kernel). A tree cannot form a difference of two inputs, and
absolute sizes differ by orders of magnitude between problems and shapes, so without these a split
learned on one problem's sizes means nothing on another's.

- ranker: ``objective="lambdarank"`` grouped by ``Sample.group`` (one shape of one run: the candidates
  the filter compares). Labels are graded by distance to the group's measured best:
  ``max(0, LEVELS - round(GRADES_PER_OCTAVE * log2(t / t_best)))``, so the best gets the top grade and
  each factor of 2^(1/3) slower one grade less (down to 32x slower). Every pair of a group counts
  (``TRUNCATION`` above any group's size): the filter keeps half a generation, so the order of the whole
  group matters, not only its head. It starts from the analytic ordering (``init_score`` =
  ``PRIOR * -log(analytic ms)``) and learns a correction of it, so with little data it stays close to the
  physical model; ``score`` is that prior plus the ranker's output: what the filter ranks by.
- regressor: least squares on ``log(measured / analytic)``; ``predict`` is the analytic time times
  ``exp`` of it: what the filter records and the error factor is measured on.

Deterministic: fixed seeds, one thread, ``deterministic=True``. ``update`` refits both boosters on the
samples given (all the measurements the caller wants it to learn from) and returns a new model.
Whether it is used is decided on held-out runs (``evaluate.compare``): ``beats_analytic`` and the
comparison travel in the model file's header.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from cake_core.model.analytic import AnalyticModel
from cake_core.model.base import CostModelBase, ModelFileError, NotEnoughData, Sample
from cake_core.model.features import FEATURE_NAMES, log_size

VERSION = "learned-2"
TERMS = ("tensor", "fma", "simt", "smem", "sync", "math_cta", "wave_math", "wave_memory", "tail", "total")
TRAFFIC_RATIOS = ("dram_bytes", "l2_bytes", "unique_bytes", "wave_bytes")     # over footprint_bytes
RELATIVE = tuple(f"rel.{n}" for n in TRAFFIC_RATIOS) + tuple(f"share.{t}" for t in TERMS if t != "total")
INPUT_NAMES = FEATURE_NAMES + tuple(f"analytic.{t}" for t in TERMS) + RELATIVE
LEVELS = 15                    # relevance grades of the ranker's labels
GRADES_PER_OCTAVE = 3          # grades per factor of 2 in measured time
TRUNCATION = 1000              # lambdarank pairs: every pair of a group
MIN_SAMPLES = 12
MIN_GROUPS = 3                 # groups of 2+ candidates, for the ranker
ROUNDS = 150
PRIOR = 5.0                    # ranker units per e-fold of analytic time: its starting point
PARAMS: dict[str, Any] = {
    "learning_rate": 0.05, "num_leaves": 7, "min_data_in_leaf": 3, "min_sum_hessian_in_leaf": 1e-3,
    "feature_fraction": 0.8, "bagging_fraction": 1.0, "lambda_l2": 1.0, "max_bin": 63,
    "deterministic": True, "force_row_wise": True, "num_threads": 1, "seed": 7, "verbose": -1,
}


def inputs(samples: Sequence[Sample], base: AnalyticModel) -> np.ndarray:
    """The input matrix (``INPUT_NAMES`` columns) of ``samples``."""
    rows = []
    for s in samples:
        f = s.features
        t = base.terms(f)
        t["total"] = base.predict_features(f) / 1e3
        terms = [math.log2(1.0 + max(t[k], 0.0) * 1e6) for k in TERMS]
        footprint = log_size(f.footprint_bytes)
        rows.append(f.vector() + terms + [log_size(getattr(f, n)) - footprint for n in TRAFFIC_RATIOS] +
                    [x - terms[-1] for x in terms[:-1]])
    return np.array(rows, dtype=float).reshape(len(samples), len(INPUT_NAMES))


def labels(measured: Sequence[float]) -> list[int]:
    best = min(measured)
    return [max(0, LEVELS - round(GRADES_PER_OCTAVE * math.log2(m / best))) for m in measured]


class LearnedModel(CostModelBase):
    kind = "learned"

    def __init__(self, gpu: str = "H200", version: str = VERSION, ranker: Any = None, regressor: Any = None,
                 base: AnalyticModel | None = None, trained_on: dict[str, Any] | None = None,
                 comparison: dict[str, Any] | None = None):
        super().__init__(gpu, version)
        self.ranker, self.regressor = ranker, regressor
        self.base = base or AnalyticModel(gpu)
        self.trained_on = dict(trained_on or {})
        self.comparison = dict(comparison or {})

    @property
    def beats_analytic(self) -> bool:
        return bool(self.comparison.get("learned_wins"))

    @property
    def comparison_line(self) -> str:
        return str(self.comparison.get("summary", "no held-out comparison recorded"))

    def beats_analytic_on(self, problem: str | None) -> tuple[bool, str]:
        """Whether a run of ``problem`` should use this model, and the held-out figures that say so: the
        problem's own verdict where its cells were graded, else the overall one."""
        own = (self.comparison.get("per_problem") or {}).get(problem) if problem else None
        if own is None:
            return self.beats_analytic, self.comparison_line
        return bool(own.get("learned_wins")), f"{problem}: {own.get('summary', '')}"

    # ------------------------------------------------------------ predict

    def _require(self) -> None:
        if self.ranker is None or self.regressor is None:
            raise NotEnoughData(f"learned model {self.version} is not fitted: call update() with measurements")

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        self._require()
        if not samples:
            return np.zeros(0)
        x = inputs(samples, self.base)
        return self.base.predict(samples) * np.exp(self.regressor.predict(x))

    def score(self, samples: Sequence[Sample]) -> np.ndarray:
        self._require()
        if not samples:
            return np.zeros(0)
        prior = -PRIOR * np.log(self.base.predict(samples))
        return prior + np.asarray(self.ranker.predict(inputs(samples, self.base)), dtype=float)

    # ------------------------------------------------------------ fit

    def update(self, samples: Sequence[Sample]) -> "LearnedModel":
        import lightgbm as lgb

        measured = [s for s in samples if s.measured_ms and s.measured_ms > 0]
        groups: dict[tuple, list[Sample]] = defaultdict(list)
        for s in measured:
            groups[s.group].append(s)
        ranked = [g for g in groups.values() if len(g) >= 2]
        if len(measured) < MIN_SAMPLES or len(ranked) < MIN_GROUPS:
            raise NotEnoughData(f"a learned model needs {MIN_SAMPLES} measured samples in {MIN_GROUPS} groups of "
                                f"2+ candidates (one shape of one run); got {len(measured)} samples, "
                                f"{len(ranked)} such groups")
        x = inputs(measured, self.base)
        base_ms = self.base.predict(measured)
        y = np.log(np.array([s.measured_ms for s in measured]) / base_ms)
        regressor = lgb.train(dict(PARAMS, objective="regression"),
                              lgb.Dataset(x, y, feature_name=list(_safe(INPUT_NAMES)), free_raw_data=False),
                              num_boost_round=ROUNDS)
        order = [s for g in ranked for s in g]
        xr = inputs(order, self.base)
        yr = [lab for g in ranked for lab in labels([s.measured_ms for s in g])]
        ranker = lgb.train(dict(PARAMS, objective="lambdarank", label_gain=[2 ** i - 1 for i in range(LEVELS + 1)],
                                lambdarank_truncation_level=TRUNCATION),
                           lgb.Dataset(xr, yr, group=[len(g) for g in ranked], feature_name=list(_safe(INPUT_NAMES)),
                                       init_score=-PRIOR * np.log(self.base.predict(order)), free_raw_data=False),
                           num_boost_round=ROUNDS)
        trained_on = {"samples": len(measured), "groups": len(ranked), "runs": len({s.run_id for s in measured}),
                      "problems": sorted({s.problem for s in measured}),
                      "run_ids": sorted({s.run_id for s in measured})}
        return LearnedModel(self.gpu, f"{VERSION}+n{len(measured)}", ranker, regressor, self.base, trained_on)

    def with_comparison(self, comparison: dict[str, Any]) -> "LearnedModel":
        return LearnedModel(self.gpu, self.version, self.ranker, self.regressor, self.base, self.trained_on,
                            comparison)

    # ------------------------------------------------------------ artefact

    def header_extra(self) -> dict[str, Any]:
        return {"trained_on": self.trained_on, "evaluation": self.comparison, "beats_analytic": self.beats_analytic}

    def payload(self) -> dict[str, Any]:
        self._require()
        return {"ranker": self.ranker.model_to_string(), "regressor": self.regressor.model_to_string(),
                "analytic": self.base.payload(), "inputs": list(INPUT_NAMES)}

    @classmethod
    def from_payload(cls, gpu: str, version: str, payload: dict[str, Any], header: dict[str, Any]) -> "LearnedModel":
        import lightgbm as lgb

        if payload.get("inputs") != list(INPUT_NAMES):
            raise ModelFileError("learned model's inputs differ from this code's (features or analytic terms "
                                 "changed); refit it with `cake model fit`")
        try:
            ranker = lgb.Booster(model_str=payload["ranker"])
            regressor = lgb.Booster(model_str=payload["regressor"])
        except (KeyError, TypeError, lgb.basic.LightGBMError) as e:
            raise ModelFileError(f"learned model's boosters do not load ({' '.join(str(e).split())[:160]}); "
                                 "refit it with `cake model fit`") from None
        base = AnalyticModel.from_payload(gpu, "analytic", payload.get("analytic", {"eff": {}}), header)
        return cls(gpu, version, ranker, regressor, base, header.get("trained_on"), header.get("evaluation"))


def _safe(names: Sequence[str]) -> list[str]:
    """LightGBM feature names may not hold ``=`` or ``.``."""
    return [n.replace("=", "_is_").replace(".", "_") for n in names]
