"""How a run spends its workers (``cake_core.pipeline.policy``) and where it stands (``pipeline.progress``)."""
from __future__ import annotations

from cake_core.ir.text import parse_program
from cake_core.model.base import geomean
from cake_core.outcome import Outcome
from cake_core.pipeline import policy
from cake_core.pipeline.plan import RunPlan
from cake_core.pipeline.progress import RunProgress
from cake_core.pipeline.verdicts import ShapeVerdict
from cake_core.problems import get_problem, shape_key

GEMM = get_problem("gemm_bf16")


def _v(shape: str, correct: bool) -> ShapeVerdict:
    return ShapeVerdict(shape, "gpu", Outcome.MEASURED if correct else Outcome.WRONG)


def test_jobs_go_cheapest_shape_first_in_batches_that_keep_every_runner_busy():
    shapes = [{"M": 512, "N": 512, "K": 512}, {"M": 64, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 64}]
    assert policy.cost_order(GEMM, shapes) == [1, 2, 0]
    assert [policy.batch_size(n, 2) for n in (0, 1, 4, 40, 400)] == [1, 1, 1, 8, 8]


def test_the_filter_passes_its_top_k_and_two_more_unless_it_is_off():
    plan = RunPlan("r", "gemm_bf16", "s", population=8)
    assert policy.filter_counts(plan, 8) == (4, policy.EXPLORE, policy.SAMPLE_OUT)
    assert policy.filter_counts(RunPlan("r", "gemm_bf16", "s", filter_keep=2), 8)[0] == 2
    assert policy.filter_counts(RunPlan("r", "gemm_bf16", "s", cost_filter=False), 7) == (7, 0, 0)
    assert policy.filter_seed(plan, 3) != policy.filter_seed(plan, 4)


def test_a_loser_is_cut_at_three_times_the_shapes_best_so_far():
    assert policy.loser_cutoffs({"a": 1.0, "b": 0.5}) == {"a": 3.0, "b": 1.5}


def test_only_a_candidate_right_on_every_shape_it_ran_goes_on_to_its_strict_shapes():
    program = parse_program(GEMM.seed_text())
    verdicts = {0: [_v("s", True)], 1: [_v("s", False)], 2: []}      # right; wrong; ran nowhere
    strict, why, pairs = policy.strict_jobs([program] * 3, verdicts, GEMM, [{"M": 64, "N": 64, "K": 64}])
    assert strict and {i for i, _ in pairs} == {0} and set(why) == {shape_key(s) for s in strict}


def test_a_round_confirms_the_winners_no_job_confirmed():
    picks = [{"attempt_id": "a", "shape": "s1"}, {"attempt_id": "b", "shape": "s2"}]
    assert policy.unconfirmed(picks, {("a", "s1")}) == [picks[1]]
    assert policy.unconfirmed(picks, {("a", "s1"), ("b", "s2")}) == []


def test_progress_is_what_the_rows_say():
    p = RunProgress("r").apply({
        "counts": [{"generation": 0, "outcome": "checked", "n": 3, "ms": 2.0},
                   {"generation": 0, "outcome": "wrong", "n": 1, "ms": 0.1},
                   {"generation": 1, "outcome": "measured", "n": 2, "ms": 1.5},
                   {"generation": None, "outcome": "checked", "n": 9, "ms": 0.01}],
        "best": {"attempt_id": "x", "basis": "measured", "score_ms": 1.2},
        "baselines": [{"name": "hand", "source": "hand_written", "basis": "measured", "score_ms": 1.0,
                       "correct": True}]})
    assert p.total() == 6 and p.by_outcome() == {"checked": 3, "wrong": 1, "measured": 2}
    assert p.predicted == {0: 2.0, 1: 1.5} and p.best_predicted_ms == 1.5     # a wrong kernel is no best
    assert (p.best_ms, p.best_basis, p.generation_done()) == (1.2, "measured", 2)
    assert p.apply({"best": None}).best_ms is None and p.total() == 6


def test_one_geometric_mean():
    assert geomean([1.0, 4.0]) == 2.0 and geomean(x for x in (2.0, 8.0)) == 4.0
    assert geomean([]) != geomean([])          # nan: no figure to add up
