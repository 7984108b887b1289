"""The cost filter: which candidates of a generation reach the GPU, and a measure of what it threw away.

``cost_filter`` ranks the candidates by the model's score averaged over the run's shapes (for the
analytic model: the geometric mean of predicted times) and keeps the top ``keep``. It adds ``explore``
others from those the mean dropped, the best placed on some one shape first: a kernel predicted to win the
largest shape while kernels tuned for the small ones win the mean still reaches the GPU, and the run keeps a
winner per shape (``leaderboard``). Replayed on runs that timed everything (``bench/filter_replay.py``), that
pick kept a (generation, shape) cell's measured best more often than a random one. Then it picks ``sample_out``
random candidates among the rest to be timed *only to grade the filter* (timed, they can still be parents):
each run measures its own recall on live data instead of assuming it. Every candidate gets a decision:
``kept``, ``explored``, ``sampled`` (filtered, but timed to check) or ``filtered``; the caller records it
with the predictions (the warehouse's ``predictions.decision``; view ``cost_filter_recall``).

``filter_recall`` grades one generation from the measured times of kept, explored and sampled
candidates: whether a sampled one beat every candidate the filter let through (a miss: the filter would
have lost the generation's best), and how many sampled ones beat the worst survivor.

Pure: no Prefect, no GPU; deterministic under ``seed``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

import numpy as np

from cake_core.ir.program import Program
from cake_core.model.base import CostModelBase, Sample

T = TypeVar("T")
DECISIONS = ("kept", "explored", "sampled", "filtered")
TIMED = ("kept", "explored", "sampled")


@dataclass
class FilterResult(Generic[T]):
    items: list[T]
    decisions: list[str]                    # one of DECISIONS per item
    scores: list[float]                     # mean score over shapes (higher: predicted faster)
    predicted_ms: list[dict[str, float]]    # per item: shape key -> predicted ms
    model_version: str
    model_kind: str
    shape_scores: list[dict[str, float]] = field(default_factory=list)    # per item: shape key -> score

    def _pick(self, *which: str) -> list[T]:
        return [x for x, d in zip(self.items, self.decisions) if d in which]

    @property
    def kept(self) -> list[T]:
        """The survivors: the top ``keep`` and the explored ones (what evolution goes on with)."""
        return self._pick("kept", "explored")

    @property
    def sampled(self) -> list[T]:
        """Filtered out, timed only to measure the filter's recall."""
        return self._pick("sampled")

    @property
    def filtered(self) -> list[T]:
        """Filtered out and not timed (sampled ones excluded)."""
        return self._pick("filtered")

    @property
    def to_time(self) -> list[T]:
        return self._pick(*TIMED)

    def prediction_rows(self, attempt_id: Callable[[T], str]) -> list[dict[str, Any]]:
        """Rows of the warehouse's ``predictions`` table: one per item and shape, with the decision."""
        return [{"attempt_id": attempt_id(x), "model_version": self.model_version, "model_kind": self.model_kind,
                 "shape": k, "predicted_ms": ms, "score": self.shape_scores[i].get(k) if self.shape_scores else None,
                 "decision": d}
                for i, (x, d) in enumerate(zip(self.items, self.decisions)) for k, ms in self.predicted_ms[i].items()]


def cost_filter(items: Sequence[T], shapes: Sequence[dict[str, int]], model: CostModelBase, keep: int,
                explore: int, sample_out: int, seed: int,
                program: Callable[[T], Program] = lambda x: x,          # type: ignore[assignment,return-value]
                resources: Callable[[T], Any] = lambda x: None, problem: str = "") -> FilterResult[T]:
    """Rank ``items`` with ``model`` over ``shapes`` and decide which are timed.

    Parameters
    ----------
    items : sequence
        The candidates (programs, or anything ``program`` maps to one).
    shapes : sequence of dict
        The run's shapes; a candidate's score is its mean over them.
    model : CostModelBase
        Analytic or learned.
    keep, explore, sample_out : int
        Top-k kept; others explored, the best placed on some one shape first (kept too); random filtered
        ones timed to grade the filter.
    seed : int
        The generation's seed: the same seed gives the same decisions.
    program, resources : callable
        An item's Program and ptxas resources (None: the IR's estimates).

    Returns
    -------
    FilterResult
    """
    n = len(items)
    if n == 0:
        return FilterResult([], [], [], [], model.version, model.kind)
    samples = [Sample.of(program(x), s, model.gpu, resources(x), problem=problem) for x in items for s in shapes]
    ms = model.predict(samples).reshape(n, len(shapes))
    sc = model.score(samples).reshape(n, len(shapes))
    mean = sc.mean(axis=1)
    order = mean_order(sc)
    decisions = ["filtered"] * n
    for i in order[:max(keep, 0)]:
        decisions[i] = "kept"
    rng = np.random.default_rng(seed)
    rest = order[max(keep, 0):]
    explored = set(explore_picks(sc, rest, explore))
    for i in explored:
        decisions[i] = "explored"
    left = [i for i in rest if i not in explored]
    sampled = set(rng.choice(left, size=min(max(sample_out, 0), len(left)), replace=False).tolist()) if left else set()
    for i in sampled:
        decisions[i] = "sampled"
    keys = [",".join(f"{k}={v}" for k, v in s.items()) for s in shapes]
    return FilterResult(list(items), decisions, [float(x) for x in mean],
                        [{k: float(v) for k, v in zip(keys, row)} for row in ms], model.version, model.kind,
                        [{k: float(v) for k, v in zip(keys, row)} for row in sc])


def mean_order(scores: np.ndarray) -> list[int]:
    """Candidates by mean score over the shapes (``scores``: candidates x shapes, higher predicted faster),
    ties in the given order: the order ``cost_filter`` keeps its top ``keep`` from."""
    mean = scores.mean(axis=1)
    return sorted(range(scores.shape[0]), key=lambda i: (-mean[i], i))


def explore_picks(scores: np.ndarray, rest: Sequence[int], n: int) -> list[int]:
    """The ``n`` candidates of ``rest`` (those the mean order dropped) ``cost_filter`` explores: the best placed
    on some one shape first (:func:`best_places`), then by mean score, then by position."""
    place, mean = best_places(scores), scores.mean(axis=1)
    return sorted(rest, key=lambda i: (place[i], -mean[i], i))[:max(n, 0)]


def best_places(scores: np.ndarray) -> list[int]:
    """Per candidate, its best place on any one shape (0: predicted fastest there); ``scores`` is candidates x
    shapes, higher predicted faster, ties placed by mean score, then by position."""
    n = scores.shape[0]
    mean = scores.mean(axis=1)
    place = [n] * n
    for col in scores.T:
        for r, i in enumerate(sorted(range(n), key=lambda i: (-col[i], -mean[i], i))):
            place[i] = min(place[i], r)
    return place


@dataclass(frozen=True)
class Recall:
    survivors: int
    sampled: int
    missed_best: bool | None        # a sampled candidate beat every survivor (None: nothing to compare)
    beat_worst: int                 # sampled candidates faster than the slowest survivor


def filter_recall(decisions: Sequence[str], measured_ms: Sequence[float | None]) -> Recall:
    """Grade one generation: ``measured_ms`` per candidate (geomean over shapes; None when not timed)."""
    surv = [m for d, m in zip(decisions, measured_ms) if d in ("kept", "explored") and m is not None]
    samp = [m for d, m in zip(decisions, measured_ms) if d == "sampled" and m is not None]
    if not surv or not samp:
        return Recall(len(surv), len(samp), None, 0)
    return Recall(len(surv), len(samp), min(samp) < min(surv), sum(m < max(surv) for m in samp))

