"""How a run spends its workers and GPUs: the decisions ``tasks/`` carry out, as plain values and functions.

- the watchdogs of the per-candidate stages, and the cost filter's extra candidates;
- the order and batching of (candidate, shape) jobs on the GPU runners: cheapest shape first;
- the timing cutoff of clear losers (:data:`LOSER_FACTOR`);
- the strict gate on the GPU (:func:`strict_jobs`): the same rule as the interpreter's
  (``execute.check_on_interpreter``), for a batch of candidates;
- the final stage's fresh inputs and its confirmation rounds (:func:`unconfirmed`).

Nothing here runs anything; ``tasks/stages.py`` and ``tasks/final.py`` are thin wrappers that do.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cake_core.pipeline.execute import strict_check_shapes
from cake_core.pipeline.verdicts import ShapeVerdict
from cake_core.problems.base import Shape, shape_key

CPU_TIMEOUT_S = {"verify": 120.0, "lower": 120.0, "compile": 300.0}   # the pool's watchdog per candidate
EXPLORE = 1               # candidates the cost filter lets through beside its top k (best placed on one shape)
SAMPLE_OUT = 1            # filtered-out candidates timed anyway, to measure what the filter threw away
MAX_BATCH = 8             # (candidate, shape) jobs a GPU runner takes at once
LOSER_FACTOR = 3.0
"""The time stage stops timing a candidate on a shape once the median of its first few timed launches
(``runtime.timing.CUTOFF_MIN_REPS``) is above LOSER_FACTOR x the run's best searched median there so far. The
noise of a median of a few launches is far below a factor of 3, so such a candidate is slower than the best on
that shape whatever its other launches would say, and it cannot be picked there (``shape_best``). Its figure
is still a median of timed launches after warm-up and L2 flush, of fewer runs (the measurement's ``runs``), and
it still scores the candidate (``kernel_scores``). The losers are where the time goes: each launch of one costs
more than the best's (an argmin-epilogue contraction's seed takes 64.6 ms against 1.33 ms after four
generations, bench/results/gpu-evolve-2026-12-01.md)."""

# Offsets of the final stage's input seeds from the run's: inputs no search saw. The baselines are measured
# on the confirmation's inputs: beside the run's confirmed figures, and drawn once per shape for both.
CONFIRM_SEED = 7919
HELD_OUT_SEED = 104729
SWEEP_SEED = 1299709        # the sweep's inputs: a draw of their own, like the held-out rows'
BASELINE_SEED = CONFIRM_SEED
# Rounds of confirmation a job runs: the winners, then the new winners of the shapes whose winner came out
# wrong, and so on; a winner still unconfirmed after them is confirmed by the run's next job.
CONFIRM_ROUNDS = 3


def filter_counts(plan: Any, n: int) -> tuple[int, int, int]:
    """(keep, explore, sample out) of the cost filter over ``n`` candidates of a run with ``plan``: the top
    ``keep_count`` by rank and the extra ones, or all ``n`` and none for a run without the filter
    (``--no-filter``: every candidate is timed)."""
    from cake_core.pipeline.stages import keep_count

    if not plan.cost_filter:
        return n, 0, 0
    return keep_count(plan.population, plan.filter_keep), EXPLORE, SAMPLE_OUT


def filter_seed(plan: Any, generation: int) -> int:
    """The cost filter's random state in a generation: its sampled candidates differ between generations and
    are the same in a resumed run."""
    return plan.seed * 1_000_003 + generation


def cost_order(prob: Any, shapes: Sequence[Shape]) -> list[int]:
    """Shape indices, cheapest first (flops + bytes of ``prob``): a wrong kernel is caught on the smallest
    shape, before the large ones."""
    return sorted(range(len(shapes)), key=lambda j: (prob.flops(shapes[j]) + prob.bytes(shapes[j]), j))


def batch_size(jobs: int, runners: int) -> int:
    """Jobs a GPU runner takes at once: two batches per runner at least, so a slow one does not hold the end,
    and at most :data:`MAX_BATCH`."""
    return max(1, min(MAX_BATCH, math.ceil(jobs / (2 * runners)))) if jobs else 1


def loser_cutoffs(best_ms: Mapping[str, float]) -> dict[str, float]:
    """The time stage's cutoff per shape key: :data:`LOSER_FACTOR` x the run's best searched median there (a
    shape without one, as in generation 0, gets none)."""
    return {k: LOSER_FACTOR * ms for k, ms in best_ms.items()}


def strict_jobs(programs: Sequence[Any], verdicts: Mapping[int, list[ShapeVerdict]], prob: Any,
                shapes: Sequence[Shape]) -> tuple[list[Shape], dict[str, str], set[tuple[int, int]]]:
    """The strict gate of a batch: each candidate right on every shape it ran on (``verdicts`` by index into
    ``programs``) is checked, untimed, on its strict shapes (``execute.strict_check_shapes``), as the
    interpreter's gate checks one. Returns the strict shapes of the batch (each once), what each exercises by
    shape key, and the (candidate index, strict shape index) pairs to run."""
    strict: list[Shape] = []
    why: dict[str, str] = {}
    pairs: set[tuple[int, int]] = set()
    for i, program in enumerate(programs):
        if not verdicts.get(i) or not all(v.correct for v in verdicts[i]):
            continue
        for s, w in strict_check_shapes(program, prob, list(shapes)):
            if s not in strict:
                strict.append(s)
            why[shape_key(s)] = w
            pairs.add((i, strict.index(s)))
    return strict, why, pairs


def unconfirmed(picks: Iterable[Mapping[str, Any]], confirmed: set[tuple[str, str]]) -> list[Mapping[str, Any]]:
    """The per-shape winners (``shape_best`` rows) no job has confirmed yet, right or wrong: what a round of
    confirmation measures. A round with none, or one in which every winner stood, ends the confirmation."""
    return [p for p in picks if (p["attempt_id"], p["shape"]) not in confirmed]
