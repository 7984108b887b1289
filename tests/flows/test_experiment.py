"""The frozen-vs-evolving experiment: its CPU mode end to end (services), and its bookkeeping."""
import json

import pytest

from cake_core.errors import CakeError
from tasks.experiment import (COLUMNS, convergence, experiment_plan, next_block, record_review, run_result, summary,
                              table, write_report)
from warehouse import Warehouse

# The agent's seed. The runs' trajectory depends on it and on the tactic table (a tactic added to the table changes
# every draw): the test needs one whose first block has three mma_sync children fail to lower; seed 1 does with
# today's table.
SEED = 1


@pytest.mark.services
def test_both_arms_run_in_blocks_the_evolving_one_under_what_its_review_approved(services, tmp_path,
                                                                                 share_compile_cache,
                                                                                 corpus_gate_store):
    """kmeans_assign, seed SEED, generations of 8 in blocks of two (a budget of 24 candidates: a block of two
    generations, then one of one): within its first block the agent's mma_sync children fail to lower three
    times, enough for the review between the blocks to mine a rule, under which the evolving arm's third
    generation runs; the frozen arm stays on v0. Both report every column; calling it again continues nothing
    (every run is done) and reports the same."""
    from cake_cli.experiment_cli import run_experiment
    out = tmp_path / "fve"
    share_compile_cache(out)                                  # the session's cubins, not the experiment's own
    share_compile_cache(out / f"evolving-s{SEED}")            # its reviews' corpus gate store: the session's
    kw = dict(problem="kmeans_assign", out_dir=str(out), seeds=[SEED], shape_set="kmeans_assign_small", population=8,
              block=2, budget_candidates=24, approve="gate-passing")
    said: list[str] = []
    rep = run_experiment(**kw, say=said.append)
    blocks = [line for line in said if "generations" in line and "under harness" in line]
    assert len(blocks) == 4 and all(line.endswith(" s)") and "best " in line for line in blocks), said
    assert [line for line in said if "harness review after generation 2" in line], said   # the evolving arm's one
    assert rep["policy"]["name"] == "gate-passing" and rep["policy"]["harness_review_policy"] == "approve-gated"
    rows = {r["arm"]: r for r in rep["rows"]}
    assert set(rows) == {"frozen", "evolving"}
    for r in rows.values():
        assert set(COLUMNS) <= set(r) and r["attempts"] == 24 and r["generations"] == 3
        assert r["hand_written_ms"] > 0 and r["best_ms"] > 0 and r["basis"] == "predicted"
        assert r["gpu_s_failed"] == 0                           # nothing ran on a GPU
    assert rows["frozen"]["harness_versions"] == [0] and rows["frozen"]["approved"] == {}
    assert rows["evolving"]["harness_versions"][0] == 0 and rows["evolving"]["harness_versions"][-1] >= 1
    assert rows["evolving"]["approved"].get("rule", 0) >= 1
    [review] = rep["reviews"]
    assert review["arm"] == "evolving" and review["after_generation"] == 2
    assert {d["decision"] for d in review["decisions"]} == {"approved"}
    ewh = Warehouse(out / f"evolving-s{SEED}" / "warehouse")
    by_gen = ewh.query("select generation, min(harness_version) as lo, max(harness_version) as hi from attempts "
                       "group by 1 order by 1").to_pylist()
    assert [(r["lo"], r["hi"]) for r in by_gen[:2]] == [(0, 0), (0, 0)] and all(r["lo"] >= 1 for r in by_gen[2:])
    fwh = Warehouse(out / f"frozen-s{SEED}" / "warehouse")
    assert fwh.query("select count(*) as n from proposals").to_pylist()[0]["n"] == 0
    md = (out / "frozen-vs-evolving.md").read_text()
    assert "`gate-passing`" in md and all(c in md for c in COLUMNS)
    on_disk = json.loads((out / "experiment.json").read_text())
    assert on_disk["policy"]["name"] == "gate-passing" and len(on_disk["reviews"]) == 1
    again = run_experiment(**kw)                      # every run is done: nothing more runs
    assert again["rows"] == rep["rows"] and again["reviews"] == rep["reviews"]
    assert fwh.query("select count(*) as n from attempts").to_pylist()[0]["n"] == 24


def _row(**kw):
    base = {"arm": "frozen", "seed": 0, "attempts": 8, "converged": False, "gpu_s_to_converge": None,
            "gpu_s_failed": 0.0, "failed_candidates": 0}
    return {**base, **kw}


def test_convergence_is_the_first_kernel_within_ninety_percent_of_the_hand_written_best():
    scores = [{"generation": 0, "score_ms": 2.0}, {"generation": 1, "score_ms": 1.2},
              {"generation": 2, "score_ms": 1.05}, {"generation": 3, "score_ms": 0.9}]
    assert convergence(scores, 1.0)["generation"] == 2          # 1.05 <= 1.0 / 0.9
    assert convergence(scores, 0.5) is None
    assert convergence(scores, None) is None                    # no hand-written kernel scored on these shapes


def test_a_kernel_wrong_at_its_confirmation_neither_is_the_best_nor_converges(tmp_path):
    """A GPU run's kernels: A at 1.0 ms, B at 2.0 ms, the hand-written kernel at 1.0 ms; A came out wrong when the
    final stage confirmed it. The run's best is B, which is not within 90% of the hand-written kernel's speed."""
    from datetime import datetime
    wh = Warehouse(tmp_path / "wh")
    t = datetime(2026, 12, 1, 10)
    wh.append("runs", [{"run_id": "r", "problem": "gemm_bf16", "shape_set": "set", "harness_version": 0,
                        "agent": "tactic", "seed": 0, "generations": 2, "population": 1, "host": "h",
                        "started_at": t, "status": "completed", "finished_at": t, "recorded_at": t}])
    ids = {}
    for g, (name, ms) in enumerate([("a", 1.0), ("b", 2.0)]):
        ids[name] = f"r-{name}"
        wh.append("attempts", [{"attempt_id": ids[name], "run_id": "r", "generation": g, "slot": 0,
                                "problem": "gemm_bf16", "ir_hash": name, "ir_text": name, "agent": "tactic",
                                "harness_version": 0, "stage": "time", "outcome": "measured"}])
        wh.append("measurements", [{"attempt_id": ids[name], "run_id": "r", "shape": "M=1", "gpu_model": "H200",
                                    "l2": "cold-clean", "median_ms": ms, "p10_ms": ms, "p90_ms": ms, "runs": 20,
                                    "correct": True, "kind": "search", "measured_at": t}])
    wh.append("baselines", [{"run_id": "r", "name": "hand.cake", "source": "hand_written", "shape": "M=1",
                             "role": "headline", "median_ms": 1.0, "correct": True, "measured_at": t}])
    plan, run = {"mode": "gpu"}, {"warehouse_root": str(wh.root), "run_id": "r", "arm": "frozen", "seed": 0}
    assert (run_result(plan, run)["best_ms"], run_result(plan, run)["converged"]) == (1.0, True)
    wh.append("checks", [{"attempt_id": ids["a"], "shape": "M=1", "backend": "gpu", "correct": False,
                          "max_error": 0.5, "message": "max error 0.5 above 0.01", "kind": "confirm"}])
    got = run_result(plan, run)
    assert (got["best_ms"], got["converged"]) == (2.0, False)


def test_a_run_goes_block_by_block_until_its_generations_or_budget_are_spent():
    plan = {"generations": 5, "block": 2, "budget_candidates": 24, "budget_gpu_minutes": None}
    assert next_block(plan, {"generations": 0, "attempts": 0, "gpu_seconds": 0.0}) == 2
    assert next_block(plan, {"generations": 4, "attempts": 16, "gpu_seconds": 0.0}) == 5
    assert next_block(plan, {"generations": 5, "attempts": 20, "gpu_seconds": 0.0}) is None
    assert next_block(plan, {"generations": 3, "attempts": 24, "gpu_seconds": 0.0}) is None
    gpu = {**plan, "budget_candidates": None, "budget_gpu_minutes": 1.0}
    assert next_block(gpu, {"generations": 2, "attempts": 16, "gpu_seconds": 59.0}) == 4
    assert next_block(gpu, {"generations": 2, "attempts": 16, "gpu_seconds": 60.0}) is None


def test_the_summary_counts_converged_runs_and_the_evolving_arms_saving_on_failures():
    rows = [_row(seed=0, converged=True, gpu_s_to_converge=4.0, gpu_s_failed=10.0, failed_candidates=5),
            _row(seed=1, gpu_s_failed=6.0, failed_candidates=3),
            _row(arm="evolving", seed=0, converged=True, gpu_s_to_converge=2.0, gpu_s_failed=4.0, failed_candidates=2),
            _row(arm="evolving", seed=1, converged=True, gpu_s_to_converge=3.0, gpu_s_failed=0.0, failed_candidates=0)]
    s = summary(rows)
    assert (s["frozen"]["converged"], s["evolving"]["converged"]) == (1, 2)
    assert s["evolving"]["median_gpu_s_to_converge"] == 2.5 and s["frozen"]["gpu_s_failed"] == 16.0
    assert s["evolving_fewer_gpu_s_failed"] == 0.75 and s["evolving_fewer_failed_candidates"] == 0.75
    assert summary([_row(), _row(arm="evolving")])["evolving_fewer_gpu_s_failed"] is None    # nothing to save on
    md = table(rows)
    assert md.splitlines()[0] == "| " + " | ".join(COLUMNS) + " |" and len(md.splitlines()) == 2 + len(rows)


def test_the_plan_refuses_what_it_cannot_run(tmp_path):
    from cake_core.errors import CakeError
    from tasks.experiment import experiment_plan
    plan = experiment_plan
    args = dict(problem="kmeans_assign", shape_set=None, seeds=[0], out_dir=str(tmp_path / "x"), population=8,
                block=2, generations=None, budget_candidates=16, budget_gpu_minutes=None, approve="gate-passing",
                timed=False)
    got = plan(**args)
    assert got["generations"] == 2 and [r["arm"] for r in got["runs"]] == ["frozen", "evolving"]
    with pytest.raises(CakeError, match="unknown approval policy `manual`"):
        plan(**{**args, "approve": "manual"})
    with pytest.raises(CakeError, match="--budget-gpu-minutes needs a GPU"):
        plan(**{**args, "budget_gpu_minutes": 1.0})
    with pytest.raises(CakeError, match="holds an experiment with other settings .block 2, not 3"):
        plan(**{**args, "block": 3})


def test_a_review_is_kept_the_moment_it_is_decided_so_a_cut_short_call_loses_none(tmp_path):
    """The first call runs one review and is then cut short (it never writes its report); the second call runs
    another and finishes: its report lists both, in order, and the plan it kept."""
    plan = experiment_plan("kmeans_assign", "kmeans_assign_small", [0], str(tmp_path / "fve"), 8, 1, None, 24, None,
                           "gate-passing", timed=False)
    first = {"arm": "evolving", "seed": 0, "after_generation": 1, "seconds": 6.5,
             "decisions": [{"proposal_id": "p1", "kind": "calibration", "decision": "approved"}]}
    record_review(plan, first)
    again = experiment_plan("kmeans_assign", "kmeans_assign_small", [0], str(tmp_path / "fve"), 8, 1, None, 24,
                            None, "gate-passing", timed=False)                   # the next call, same settings
    second = {**first, "after_generation": 2, "decisions": [{"proposal_id": "p2", "kind": "rule",
                                                             "decision": "rejected"}]}
    record_review(again, second)
    rep = write_report(again, [_row(), _row(arm="evolving")])
    assert [r["after_generation"] for r in rep["reviews"]] == [1, 2]
    on_disk = json.loads((tmp_path / "fve" / "experiment.json").read_text())
    assert on_disk["reviews"] == rep["reviews"] and on_disk["plan"]["budget_candidates"] == 24


def test_the_report_says_when_convergence_cannot_separate_the_arms():
    """The H200 run of 2026-12-02 on kmeans_assign_small: every frozen run converged in one or two generations."""
    easy = [_row(seed=s, converged=True, generations_to_converge=g, gpu_s_to_converge=1.0)
            for s, g in enumerate((2, 1, 1))]
    easy += [_row(arm="evolving", seed=s, converged=True, generations_to_converge=1, gpu_s_to_converge=1.0)
             for s in range(3)]
    assert "does not separate the arms" in summary(easy)["separates"]
    hard = [_row(seed=0, converged=True, generations_to_converge=9, gpu_s_to_converge=9.0), _row(seed=1)] + easy[3:]
    assert summary(hard)["separates"] is None


def test_on_a_gpu_the_evolving_arms_corpus_gate_replays_on_the_gpu_unless_told_otherwise(tmp_path):
    def args(out):
        return ("kmeans_assign", "kmeans_assign_small", [0], str(tmp_path / out), 8, 1, None, 24, None, "gate-passing")
    assert experiment_plan(*args("a"), timed=True)["gate_gpu"] is True
    assert experiment_plan(*args("b"), timed=True, gate_gpu=False)["gate_gpu"] is False
    assert experiment_plan(*args("c"), timed=False)["gate_gpu"] is False
    with pytest.raises(CakeError, match="only in GPU mode"):
        experiment_plan(*args("d"), timed=False, gate_gpu=True)
    plan = experiment_plan(*args("a"), timed=True)
    assert write_report(plan, [_row(), _row(arm="evolving")])["policy"]["corpus_gate"] == "CPU interpreter and the GPU"
    assert "the corpus gate on the CPU interpreter and the GPU" in (tmp_path / "a" / "frozen-vs-evolving.md").read_text()
