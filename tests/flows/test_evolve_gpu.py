"""The evolution flow on a GPU (marked `gpu`): timed candidates, shapes spread over the runners, the final stage.

On the GPU machine: ``python3 -m pytest -m gpu tests/flows/test_evolve_gpu.py -o addopts=""`` (a local Ray with
the machine's GPUs; Prefect starts a temporary server when no PREFECT_API_URL is set).
"""
from __future__ import annotations

import pytest

from warehouse import Warehouse

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_ray():
    ray = pytest.importorskip("ray")
    from cake_cli.services import detect_gpus
    from tasks.gpus import local_resources
    gpus = detect_gpus()
    if not gpus:
        pytest.skip("no NVIDIA GPU here")
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, num_gpus=len(gpus), resources=local_resources(gpus))
    yield gpus
    if started:
        ray.shutdown()


def test_a_cold_gpu_run_times_confirms_reports_held_out_rows_and_measures_the_baselines(gpu_ray, tmp_path):
    from flows.evolve import evolve_flow

    root = tmp_path / "warehouse"
    out = evolve_flow(problem="gemm_bf16", shape_set="gemm_small", generations=2, population=6, seed=4, cold=True,
                      run_id="gpu-1", warehouse_root=str(root), cache_dir=str(tmp_path / "cache"),
                      gpu_models=gpu_ray[:1])
    wh = Warehouse(root)
    assert out["timed"] and out["outcomes"].get("measured", 0) >= 1 and out["best_score_kind"] == "measured geomean ms"
    kinds = {r["kind"]: r["n"] for r in wh.query("select kind, count(*) as n from measurements group by 1").to_pylist()}
    assert kinds.get("search", 0) >= 5 and kinds.get("confirm", 0) >= 1
    held = wh.query("select c.shape, c.correct from checks c where c.kind = 'held_out'").to_pylist()
    assert [r["shape"] for r in held] == ["M=130,N=70,K=50"]
    searched = {r["shape"] for r in wh.query("select shape from measurements where kind = 'search'").to_pylist()}
    assert "M=130,N=70,K=50" not in searched
    dispatch = wh.query("select shape from dispatch").to_pylist()
    assert len(dispatch) == 5
    peers = wh.query("select name, count(median_ms) as timed from baselines where source = 'peer' group by 1"
                     ).to_pylist()
    assert peers and all(p["timed"] >= 1 for p in peers), peers
    stages = {r["stage"] for r in wh.query("select stage from stage_times").to_pylist()}
    assert {"verify", "lower", "compile", "cost_filter", "time", "select", "final"} <= stages
    gpu_s = wh.query("select sum(gpu_seconds) as s from attempts").to_pylist()[0]["s"]
    assert gpu_s > 0
