"""The learned model (fit, determinism, too little data) and model files (round trip, refusals, fallback)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from model_fixtures import gemm_variants, measured

from cake_core.model.analytic import AnalyticModel
from cake_core.model.artifact import load_model, model_for_run, read_header, save_model
from cake_core.model.base import ModelFileError, NotEnoughData
from cake_core.model.learned import LearnedModel, labels

SHAPES = [{"M": m, "N": n, "K": 2048} for m in (1024, 2048) for n in (1024, 4096)]
A = AnalyticModel("H200")


def truth(p, s):
    """A 'GPU' on which the analytic model is wrong in a structured way: BN=128 tiles are 3x slower."""
    base = A.predict_features(__import__("cake_core.model.features", fromlist=["extract"]).extract(p, s))
    return base * (3.0 if p.const_env.get("BN") == 128 else 1.0)


@pytest.fixture(scope="module")
def data():
    return [x for r in range(3) for x in measured(gemm_variants(), SHAPES, truth, f"run{r}")]


@pytest.fixture(scope="module")
def fitted(data):
    return LearnedModel("H200").update(data)


def test_labels_grade_by_distance_to_the_best():
    # three grades per factor of 2, fifteen in all: 32x slower and beyond get none
    assert labels([1.0, 1.0, 2 ** (1 / 3), 2.0, 2 ** 4, 2 ** 6]) == [15, 15, 14, 12, 3, 0]


def test_learned_model_learns_what_the_analytic_one_misses(data, fitted):
    from cake_core.model.evaluate import figures, grade
    off = [s for s in data if s.program.const_env.get("BN") == 128]
    err = (lambda m: float(np.mean(np.abs(np.log(m.predict(off) / [s.measured_ms for s in off])))))
    assert err(A) == pytest.approx(math.log(3)) and err(fitted) < 0.2
    assert figures(grade(fitted, data))["spearman"] > figures(grade(A, data))["spearman"]


def test_fitting_is_deterministic(data, fitted):
    again = LearnedModel("H200").update(data)
    assert np.array_equal(again.predict(data), fitted.predict(data))
    assert np.array_equal(again.score(data), fitted.score(data))


def test_too_little_data_is_one_clear_error(data):
    with pytest.raises(NotEnoughData, match=r"needs 12 measured samples in 3 groups .* got 4 samples"):
        LearnedModel("H200").update(data[:4])


def test_round_trip_keeps_predictions(tmp_path, data, fitted):
    path = save_model(fitted.with_comparison({"learned_wins": True, "summary": "test"}), tmp_path / "m.json")
    back = load_model(path, "H200")
    assert back.kind == "learned" and back.version == fitted.version and back.beats_analytic
    assert np.allclose(back.predict(data), fitted.predict(data)) and np.allclose(back.score(data), fitted.score(data))
    h = read_header(path)
    assert (h["kind"], h["gpu"], h["target"]) == ("learned", "H200", "sm_90a") and len(h["feature_schema"]) > 40
    a = save_model(A.update(data), tmp_path / "a.json")
    assert load_model(a).predict(data[:3]) == pytest.approx(A.update(data).predict(data[:3]))


def test_a_file_of_another_gpu_is_refused(tmp_path):
    path = save_model(AnalyticModel("B200"), tmp_path / "b200.json")
    with pytest.raises(ModelFileError, match=r"is for B200 \(sm_100a\), not H200 \(sm_90a\)"):
        load_model(path, "H200")
    model, line = model_for_run(path, "H200")
    assert model.kind == "analytic" and model.gpu == "H200"
    assert line.startswith("falling back to the analytic model: model file") and "B200" in line


@pytest.mark.parametrize("damage", ["truncate", "payload", "garbage"])
def test_a_corrupted_file_is_refused(tmp_path, fitted, damage):
    path = save_model(fitted, tmp_path / "m.json")
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "payload":
        doc = json.loads(text)
        doc["payload"]["regressor"] = doc["payload"]["regressor"].replace("tree", "tre", 1)
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(b"\x00\xff not a model")
    with pytest.raises(ModelFileError, match="corrupted|not a Cake cost-model file|cannot be read"):
        load_model(path, "H200")
    model, line = model_for_run(path, "H200")
    assert model.kind == "analytic" and line.startswith("falling back to the analytic model: ")


def test_a_learned_model_that_lost_on_held_out_data_is_not_used(tmp_path, fitted):
    lost = fitted.with_comparison({"learned_wins": False, "summary": "Spearman 0.1 vs 0.3"})
    model, line = model_for_run(save_model(lost, tmp_path / "lost.json"), "H200")
    assert model.kind == "analytic" and "did not beat the analytic one on held-out data (Spearman 0.1 vs 0.3)" in line
    won = fitted.with_comparison({"learned_wins": True, "summary": "ok"})
    model, line = model_for_run(save_model(won, tmp_path / "won.json"), "H200")
    assert model.kind == "learned" and line.startswith("cost model: learned")
    assert model_for_run(None, "H200")[0].kind == "analytic"


def test_missing_file_falls_back(tmp_path):
    model, line = model_for_run(tmp_path / "nope.json", "H200")
    assert model.kind == "analytic" and "does not exist" in line
    assert math.isfinite(model.predict(measured(gemm_variants()[:1], SHAPES[:1], truth, "r"))[0])


def test_a_learned_model_serves_the_problems_it_won_on_and_leaves_the_others_to_the_analytic_one(tmp_path, fitted):
    mixed = fitted.with_comparison({"learned_wins": False, "summary": "overall 0.28 vs 0.34",
                                    "per_problem": {"kmeans_assign": {"learned_wins": True, "summary": "0.91 vs 0.22"},
                                                    "tinygemm": {"learned_wins": False, "summary": "-0.30 vs 0.16"}}})
    path = save_model(mixed, tmp_path / "mixed.json")
    model, line = model_for_run(path, "H200", problem="kmeans_assign")
    assert model.kind == "learned" and "kmeans_assign: 0.91 vs 0.22" in line
    model, line = model_for_run(path, "H200", problem="tinygemm")
    assert model.kind == "analytic" and "did not beat the analytic one on held-out data (tinygemm: -0.30 vs 0.16)" in line
    model, line = model_for_run(path, "H200", problem="knn_topk")       # never graded: the overall verdict
    assert model.kind == "analytic" and "overall 0.28 vs 0.34" in line


def test_compare_gives_a_verdict_per_problem_on_its_own_cells():
    from cake_core.model.evaluate import Scored, compare
    rows_a, rows_l = [], []
    for prob, learned_right in (("kmeans_assign", True), ("tinygemm", False)):
        for cell in range(3):
            for s in measured(gemm_variants()[:4], SHAPES[:1], truth, f"{prob}-{cell}", problem=prob):
                good, bad = -s.measured_ms, s.measured_ms
                rows_a.append(Scored(s, bad if learned_right else good, s.measured_ms, "f"))
                rows_l.append(Scored(s, good if learned_right else bad, s.measured_ms, "f"))
    c = compare(rows_a, rows_l)
    assert c["problems_won"] == ["kmeans_assign"]
    assert c["per_problem"]["tinygemm"]["learned_wins"] is False and "held-out cells 3" in c["per_problem"]["tinygemm"]["summary"]
