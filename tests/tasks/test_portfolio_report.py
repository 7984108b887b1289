"""The portfolio's rows against the peer (``tasks.portfolio.portfolio_report``): per row the fastest kernel any run
measured correct there and the fastest peer timed there, on one GPU model; coverage, the geomean over the rows
with both figures, searched and held-out rows apart, the rows below 1x, the rows nothing serves; the Markdown and
the plot."""
from __future__ import annotations

from datetime import datetime

import pytest

from cake_cli.report_figures import portfolio_speedup
from cake_core.problems import get_problem, shape_key
from tasks.portfolio import portfolio_markdown, portfolio_report
from warehouse import Warehouse

P = get_problem("kmeans_assign")
SET = P.shape_set("kmeans_portfolio")
SEARCHED = [shape_key(s) for s, r in zip(SET.shapes, SET.roles) if r != "held_out"]
HELD = [shape_key(s) for s, r in zip(SET.shapes, SET.roles) if r == "held_out"]
T = datetime(2026, 12, 6, 12)


def _run(wh: Warehouse, rid: str, problem: str = "kmeans_assign") -> None:
    wh.append("runs", [{"run_id": rid, "problem": problem, "shape_set": "region", "harness_version": 0,
                        "agent": "tactic", "seed": 0, "generations": 1, "population": 1, "host": "h",
                        "status": "completed", "started_at": T, "session": 0, "recorded_at": T}])


def _kernel(wh: Warehouse, rid: str, aid: str, ms_by_shape: dict[str, float], gpu: str = "H100",
            correct: bool = True, kind: str = "sweep") -> None:
    wh.append("attempts", [{"attempt_id": aid, "run_id": rid, "generation": 0, "slot": 0, "problem": "kmeans_assign",
                            "ir_hash": f"h-{aid}", "ir_text": "x", "agent": "tactic", "harness_version": 0,
                            "stage": "time", "outcome": "measured"}])
    wh.append("measurements", [{"attempt_id": aid, "run_id": rid, "shape": s, "gpu_model": gpu, "timer": "cuda_event",
                                "l2": "cold-clean", "median_ms": v, "p10_ms": v, "p90_ms": v, "runs": 20, "correct": correct,
                                "max_error": 0.0, "kind": kind, "measured_at": T} for s, v in ms_by_shape.items()])


def _peer(wh: Warehouse, rid: str, name: str, ms_by_shape: dict[str, float], gpu: str = "H100") -> None:
    wh.append("baselines", [{"run_id": rid, "name": name, "source": "peer", "shape": s, "role": "sweep",
                             "gpu_model": gpu, "timer": "cuda_event (torch)", "l2": "cold-clean", "median_ms": v,
                             "correct": True,
                             "measured_at": T} for s, v in ms_by_shape.items()])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("pf") / "warehouse"
    wh = Warehouse(root)
    _run(wh, "r0")
    _run(wh, "r1")
    a, b = SEARCHED[:3], SEARCHED[3:5]
    _kernel(wh, "r0", "k0", {a[0]: 1.0, a[1]: 2.0, a[2]: 4.0, HELD[0]: 1.0}, kind="search")
    _kernel(wh, "r1", "k1", {a[0]: 0.5, b[0]: 1.0, b[1]: 1.0})                 # faster on a[0]: the row's kernel
    _kernel(wh, "r1", "k2", {b[0]: 0.1}, correct=False)                      # wrong: never counts
    _kernel(wh, "r1", "k3", {b[1]: 0.2}, gpu="H200")                         # another GPU model
    _peer(wh, "r0", "flash-kmeans", {a[0]: 1.0, a[1]: 1.0, a[2]: 2.0, HELD[0]: 2.0, b[0]: 2.0})
    _peer(wh, "r1", "torch", {a[0]: 0.8, b[0]: 3.0})                          # the faster peer on a[0]
    return root, portfolio_report(str(root), "kmeans_assign", "kmeans_portfolio"), a, b


def test_each_row_has_its_fastest_correct_kernel_and_fastest_peer_on_one_gpu_model(report):
    _, rep, a, b = report
    rows = {r["shape"]: r for r in rep["rows"]}
    assert rep["gpu_model"] == "H100" and len(rows) == len(SET.shapes) == 123
    assert (rows[a[0]]["ours_ms"], rows[a[0]]["attempt_id"], rows[a[0]]["peer"], rows[a[0]]["peer_ms"]) == \
        (0.5, "k1", "torch", 0.8)
    assert rows[a[0]]["speedup"] == pytest.approx(1.6)
    assert rows[b[0]]["ours_ms"] == 1.0, "the wrong kernel's 0.1 ms never counts"
    assert rows[b[1]]["ours_ms"] == 1.0 and rows[b[1]]["speedup"] is None, "no peer figure on H100 there"


def test_the_summary_keeps_held_out_rows_apart_and_names_the_rows_below_1x_and_unserved(report):
    _, rep, a, b = report
    s = rep["summary"]
    assert (s["all"]["rows"], s["all"]["covered"], s["all"]["with_peer"]) == (123, 6, 5)
    assert (s["held_out"]["rows"], s["held_out"]["covered"], s["held_out"]["with_peer"]) == (len(HELD), 1, 1)
    assert s["held_out"]["geomean"] == pytest.approx(2.0)
    # searched: a0 1.6, a1 0.5, a2 0.5, b0 2.0
    assert s["searched"]["geomean"] == pytest.approx((1.6 * 0.5 * 0.5 * 2.0) ** 0.25)
    assert sorted(s["searched"]["below_1x"]) == sorted([a[1], a[2]])
    assert len(s["all"]["uncovered"]) == 123 - 6
    md = portfolio_markdown(rep)
    assert "| held_out | 18 | 1 | 1 | 2.00× | 0 |" in md and "117 rows no measured kernel serves" in md


def test_another_gpu_model_is_reported_when_asked(report):
    root, _, a, b = report
    rep = portfolio_report(str(root), "kmeans_assign", "kmeans_portfolio", gpu_model="H200")
    rows = {r["shape"]: r for r in rep["rows"]}
    assert rows[b[1]]["ours_ms"] == 0.2 and rep["summary"]["all"]["covered"] == 1


def test_the_plot_is_drawn_where_rows_have_both_figures(report, tmp_path):
    _, rep, _, _ = report
    png = portfolio_speedup(rep["rows"], tmp_path / "speedup.png")
    assert png is not None and png.stat().st_size > 1000
    assert portfolio_speedup([dict(r, speedup=None) for r in rep["rows"]], tmp_path / "none.png") is None


def test_a_home_with_no_warehouse_reports_every_row_unserved(tmp_path):
    rep = portfolio_report(str(tmp_path / "warehouse"), "kmeans_assign", "kmeans_portfolio")
    assert rep["gpu_model"] is None and rep["summary"]["all"]["covered"] == 0
    assert rep["summary"]["all"]["geomean"] is None
