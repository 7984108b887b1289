"""Each view on the fixture dataset (see wh_fixtures.dataset for the numbers)."""

import pytest
from wh_fixtures import SHAPES


def rows(wh, sql):
    return wh.query(sql).to_pylist()


def test_runs_latest(filled):
    got = rows(filled, "select run_id, status, finished_at is not null as done from runs_latest order by 1")
    assert got == [{"run_id": "run-a", "status": "completed", "done": True},
                   {"run_id": "run-b", "status": "completed", "done": True}]


def test_proposals_latest(filled):
    got = rows(filled, "select proposal_id, status, new_version, gate_report from proposals_latest order by 1")
    assert got == [
        {"proposal_id": "prop-0", "status": "approved", "new_version": 2, "gate_report": '{"ok": true}'},
        {"proposal_id": "prop-1", "status": "rejected", "new_version": None, "gate_report": None},
        {"proposal_id": "prop-2", "status": "pending", "new_version": None, "gate_report": None},
    ]


def test_failures(filled):
    got = rows(filled, "select outcome, count(*) n from failures group by 1 order by 1")
    assert got == [{"outcome": "compile_failed", "n": 6}, {"outcome": "verify_failed", "n": 12},
                   {"outcome": "wrong", "n": 6}]


def test_failure_clusters(filled):
    got = rows(filled, "select * from failure_clusters order by signature")
    assert [r["signature"] for r in got] == ["check:wrong:tail_shape", "compile:ptxas_register_limit",
                                             "verify:race_wgmma_read", "verify:smem_overflow"]
    for r in got:
        assert (r["n_attempts"], r["n_runs"], r["n_problems"]) == (6, 2, 1)
        assert r["gpu_seconds"] == pytest.approx(1.5)
        assert len(r["sample_attempt_ids"]) == 5 and r["first_seen"] < r["last_seen"]


def test_failure_history(filled):
    got = rows(filled, "select day, stage, rule, n_attempts from failure_history")
    assert len(got) == 3 * 4 and {r["n_attempts"] for r in got} == {2}
    assert len({r["day"] for r in got}) == 3


def test_leaderboard(filled):
    got = rows(filled, "select shape, best_ms, attempt_id, ir_hash, shape_set from leaderboard order by shape")
    assert [r["shape"] for r in got] == sorted(SHAPES)
    best = {r["shape"]: r for r in got}
    assert best[SHAPES[0]]["best_ms"] == pytest.approx(1 / 3)  # the wrong 0.001 ms run is not counted
    assert best[SHAPES[0]]["attempt_id"] == "run-a-att-14" and best[SHAPES[0]]["ir_hash"] == "h000014"
    assert best[SHAPES[1]]["best_ms"] == pytest.approx(2 / 3)
    assert {r["shape_set"] for r in got} == {"kmeans_portfolio"}


def test_convergence(filled):
    got = rows(filled, "select * from convergence where run_id = 'run-a' order by generation")
    assert [r["generation"] for r in got] == [0, 1, 2]
    assert [r["attempts"] for r in got] == [5, 5, 5]
    # the best so far is kernel_scores' figure: the winner's geomean over the headline shapes (here one; the
    # tail is measured and ranks nothing), not the fastest of all its shapes
    assert [r["best_ms_so_far"] for r in got] == pytest.approx([1.0, 1 / 2, 1 / 3])
    assert [r["cum_gpu_seconds"] for r in got] == pytest.approx([1.25, 2.5, 3.75])
    assert [r["cum_tokens"] for r in got] == [750, 1500, 2250]


def test_cost_model_error(filled):
    got = rows(filled, "select count(*) n, min(ratio) lo, max(ratio) hi from cost_model_error")
    assert got[0]["n"] == 12  # 6 winners x 2 shapes
    assert got[0]["lo"] == pytest.approx(2.0) and got[0]["hi"] == pytest.approx(2.0)


def test_rule_hits(filled):
    got = rows(filled, "select rule, n_attempts, n_stopped from rule_hits order by rule")
    assert got == [{"rule": "race_wgmma_read", "n_attempts": 6, "n_stopped": 6},
                   {"rule": "smem_overflow", "n_attempts": 6, "n_stopped": 6}]  # warnings not counted


def test_cost_filter_recall(tmp_path):
    """Per generation and shape: the fastest survivor against the fastest sampled-out candidate."""
    from wh_fixtures import attempt, measurement

    from warehouse import Warehouse
    wh = Warehouse(tmp_path / "wh")
    decided = [("kept", 2.0), ("explored", 3.0), ("sampled", 1.0), ("sampled", 5.0), ("filtered", None)]
    atts, preds, meas = [], [], []
    for i, (d, ms) in enumerate(decided):
        a = attempt(i, "run-r", 0)
        atts.append(a)
        preds.append(dict(attempt_id=a["attempt_id"], model_version="analytic-2", shape="M=1", predicted_ms=1.0 + i,
                          model_kind="analytic", score=-float(i), decision=d))
        if ms is not None:
            meas.append(measurement(a["attempt_id"], "run-r", "M=1", ms))
    wh.append("attempts", atts)
    wh.append("predictions", preds)
    wh.append("measurements", meas)
    got = wh.query("select survivors, sampled, filtered, best_survivor_ms, best_sampled_ms, missed_best, "
                   "sample_fraction, sampled_beat_worst from cost_filter_recall").to_pylist()
    assert got == [dict(survivors=2, sampled=2, filtered=1, best_survivor_ms=2.0, best_sampled_ms=1.0,
                        missed_best=True, sample_fraction=2 / 3, sampled_beat_worst=1)]
    from warehouse.errors import BatchRejected
    import pytest
    with pytest.raises(BatchRejected, match="decision"):
        wh.append("predictions", [dict(preds[0], decision="maybe")])


def test_kernel_scores_is_the_geomean_over_the_headline_shapes(filled):
    got = rows(filled, "select attempt_id, basis, score_ms, n_shapes from kernel_scores where run_id = 'run-a' "
                       "order by score_ms")
    # one winner per generation; the fast wrong run of att-0 on one shape scores nothing; the tail shape is
    # measured but ranks nothing
    assert [r["attempt_id"] for r in got] == ["run-a-att-14", "run-a-att-9", "run-a-att-4"]
    assert {r["basis"] for r in got} == {"measured"} and {r["n_shapes"] for r in got} == {1}
    assert got[0]["score_ms"] == pytest.approx(1 / 3)


def test_a_kernel_outside_its_domain_on_a_tail_is_scored_on_the_headlines(tmp_path):
    from wh_fixtures import attempt, dataset, measurement

    from warehouse import Warehouse
    w = Warehouse(tmp_path / "wh")
    for table, batch in dataset().items():
        w.append(table, batch)
    a = attempt(90, "run-a", 5)
    w.append("attempts", [a])
    w.append("measurements", [measurement(a["attempt_id"], "run-a", SHAPES[0], 0.1)])    # no tail row
    best = rows(w, "select attempt_id, score_ms from run_best where run_id = 'run-a'")
    assert best == [{"attempt_id": a["attempt_id"], "score_ms": pytest.approx(0.1)}]


def test_run_best_and_shape_best(filled):
    best = rows(filled, "select run_id, attempt_id, ir_text from run_best order by run_id")
    assert [(r["run_id"], r["attempt_id"]) for r in best] == [("run-a", "run-a-att-14"), ("run-b", "run-b-att-29")]
    assert best[0]["ir_text"] == "kernel k14 { }"
    per_shape = rows(filled, "select shape, attempt_id, median_ms, confirm_ms from shape_best "
                             "where run_id = 'run-a' order by shape")
    assert [(r["shape"], r["attempt_id"], r["confirm_ms"]) for r in per_shape] == \
        [(SHAPES[0], "run-a-att-14", None), (SHAPES[1], "run-a-att-14", None)]
    assert [r["median_ms"] for r in per_shape] == pytest.approx([1 / 3, 2 / 3])


def test_kernel_scores_never_counts_held_out_rows(wh):
    from wh_fixtures import attempt, measurement
    wh.append("attempts", [attempt(0), attempt(1)])
    # a and b on the two searched shapes: a is better; b is far better on a held-out row
    wh.append("measurements", [measurement("run-a-att-0", "run-a", SHAPES[0], 1.0),
                               measurement("run-a-att-0", "run-a", SHAPES[1], 1.0),
                               measurement("run-a-att-1", "run-a", SHAPES[0], 1.2),
                               measurement("run-a-att-1", "run-a", SHAPES[1], 1.2),
                               measurement("run-a-att-1", "run-a", "M=1,N=1,K=1", 0.001, kind="held_out")])
    assert rows(wh, "select attempt_id from run_best") == [{"attempt_id": "run-a-att-0"}]
    assert {r["shape"] for r in rows(wh, "select shape from shape_best")} == set(SHAPES)


def test_an_attempt_wrong_at_its_confirmation_wins_nothing(tmp_path):
    from wh_fixtures import dataset

    from warehouse import Warehouse
    w = Warehouse(tmp_path / "wh")
    for table, batch in dataset().items():
        w.append(table, batch)
    # run-a's winner (att-14) confirmed right on one shape and wrong on the other; its runner-up (att-9) right
    confirm = [dict(attempt_id="run-a-att-14", shape=SHAPES[0], backend="gpu", correct=True, max_error=1e-6,
                    message=None, kind="confirm"),
               dict(attempt_id="run-a-att-14", shape=SHAPES[1], backend="gpu", correct=False, max_error=0.5,
                    message="max error 0.5 above 0.01", kind="confirm"),
               dict(attempt_id="run-a-att-9", shape=SHAPES[0], backend="gpu", correct=True, max_error=1e-6,
                    message=None, kind="confirm")]
    w.append("checks", confirm)
    assert rows(w, "select attempt_id, shape, message from confirm_failures") == \
        [{"attempt_id": "run-a-att-14", "shape": SHAPES[1], "message": "max error 0.5 above 0.01"}]
    assert "run-a-att-14" not in {r["attempt_id"] for r in rows(w, "select attempt_id from kernel_scores")}
    assert rows(w, "select run_id, attempt_id from run_best order by run_id") == \
        [{"run_id": "run-a", "attempt_id": "run-a-att-9"}, {"run_id": "run-b", "attempt_id": "run-b-att-29"}]
    # on every shape, the one it was right on too: the next fastest correct kernel there wins
    assert rows(w, "select shape, attempt_id from shape_best where run_id = 'run-a' order by shape") == \
        [{"shape": s, "attempt_id": "run-a-att-9"} for s in sorted(SHAPES)]
    assert {r["attempt_id"] for r in rows(w, "select attempt_id from leaderboard")} == {"run-b-att-29"}


def test_a_correct_confirmation_keeps_the_winner(tmp_path):
    from wh_fixtures import dataset

    from warehouse import Warehouse
    w = Warehouse(tmp_path / "wh")
    for table, batch in dataset().items():
        w.append(table, batch)
    w.append("checks", [dict(attempt_id="run-a-att-14", shape=s, backend="gpu", correct=True, max_error=1e-6,
                             message=None, kind="confirm") for s in SHAPES])
    assert rows(w, "select * from confirm_failures") == []
    assert rows(w, "select attempt_id from run_best where run_id = 'run-a'") == [{"attempt_id": "run-a-att-14"}]
    assert {r["attempt_id"] for r in rows(w, "select attempt_id from shape_best where run_id = 'run-a'")} == \
        {"run-a-att-14"}


def _baseline(name, shape, role, median_ms, predicted_ms=1.0, correct=True):
    from wh_fixtures import T0
    return dict(run_id="run-h", name=name, source="hand_written", shape=shape, role=role, gpu_model="H200",
                timer="cuda_event", l2="cold-clean", median_ms=median_ms, p10_ms=None, p90_ms=None,
                runs=None if median_ms is None else 20, predicted_ms=predicted_ms,
                correct=None if median_ms is None else correct, message=None, measured_at=T0)


def test_a_baseline_is_scored_on_the_headline_shapes_like_the_runs_kernels(wh):
    # a TMA kernel whose domain leaves out the ragged tail shape is measured on both headline shapes: its
    # score is the geometric mean of those, measured, not the cost model's figure
    wh.append("baselines", [
        _baseline("tma.cake", "a", "headline", 1.0), _baseline("tma.cake", "b", "headline", 4.0),
        _baseline("tma.cake", "tail", "tail", None),
        _baseline("tma.cake", "held", "held_out", 9.0),
        _baseline("wrong.cake", "a", "headline", 0.5), _baseline("wrong.cake", "b", "headline", 0.5, correct=False),
        _baseline("half.cake", "a", "headline", 1.0), _baseline("half.cake", "b", "headline", None,
                                                                predicted_ms=4.0)])
    got = {r["name"]: r for r in rows(wh, "select name, basis, score_ms, correct from baseline_scores")}
    assert got["tma.cake"]["basis"] == "measured" and got["tma.cake"]["score_ms"] == pytest.approx(2.0)
    assert got["wrong.cake"]["basis"] == "predicted" and got["wrong.cake"]["correct"] is False
    assert got["half.cake"]["basis"] == "predicted" and got["half.cake"]["score_ms"] == pytest.approx(2.0)


def test_a_run_without_headline_rows_scores_its_baselines_on_every_searched_shape(wh):
    wh.append("baselines", [_baseline("k.cake", "a", "tail", 1.0), _baseline("k.cake", "b", "tail", 9.0),
                            _baseline("k.cake", "c", "held_out", 100.0)])
    (got,) = rows(wh, "select basis, score_ms from baseline_scores")
    assert got["basis"] == "measured" and got["score_ms"] == pytest.approx(3.0)


def test_kernel_shape_scores_and_the_best_of_any_run(filled):
    """Across both runs and shape sets: each kernel's best correct median per shape; the fastest kernel per shape
    (the wrong 0.001 ms row of run-a-att-0 counts nowhere)."""
    got = rows(filled, "select shape, ir_hash, best_ms, attempt_id, run_id, runs, kinds from shape_best_any_run "
                       "order by shape")
    assert [r["shape"] for r in got] == sorted(SHAPES)
    best = {r["shape"]: r for r in got}
    assert best[SHAPES[0]]["best_ms"] == pytest.approx(1 / 3) and best[SHAPES[0]]["attempt_id"] == "run-a-att-14"
    assert best[SHAPES[0]]["run_id"] == "run-a" and best[SHAPES[0]]["kinds"] == ["search"]
    per_kernel = rows(filled, "select ir_hash, count(*) as shapes from kernel_shape_scores group by ir_hash")
    assert all(r["shapes"] == 2 for r in per_kernel) and len(per_kernel) == 6     # 3 winners per run, 2 runs
    assert not rows(filled, "select * from kernel_shape_scores where ir_hash = 'h000000'"), "wrong rows do not score"


def test_a_kernel_measured_by_two_runs_scores_once_with_its_best(tmp_path):
    from warehouse import Warehouse
    from wh_fixtures import attempt, measurement
    wh = Warehouse(tmp_path / "wh")
    a, b = attempt(1, "region-00"), attempt(2, "region-01")
    b["ir_hash"] = a["ir_hash"]                    # the same kernel, found again by the other region's run
    wh.append("attempts", [a, b])
    wh.append("measurements", [measurement(a["attempt_id"], "region-00", SHAPES[0], 0.50),
                               measurement(b["attempt_id"], "region-01", SHAPES[0], 0.40, kind="held_out"),
                               measurement(b["attempt_id"], "region-01", SHAPES[0], 0.01, correct=False)])
    (r,) = rows(wh, "select * from kernel_shape_scores")
    assert (r["best_ms"], r["attempt_id"], r["run_id"], r["runs"], r["measurements"]) == \
        (pytest.approx(0.40), b["attempt_id"], "region-01", 2, 2)
    assert r["kinds"] == ["held_out", "search"]
