"""`cake deploy` registers every deployment of prefect.yaml on a fresh server; a real `cake worker` runs each one.

The evolution run starts its own Ray in the worker's flow-run process; the sweep
joins the session's Ray through CAKE_RAY_ADDRESS; the harness review needs none.
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from warehouse import Warehouse
from marked_processes import described, marked

pytestmark = pytest.mark.services

CAKE = str(Path(sys.executable).parent / "cake")
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _env(services, marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAKE_", "PREFECT_API_URL"))}
    env.update({"CAKE_HOME": str(services["home"]), "CAKE_PREFECT_PORT": str(services["port"]),
                "CAKE_GPU": "off", marker.split("=")[0]: marker.split("=")[1]})
    return env


def _wait(client, run_id, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = client.read_flow_run(run_id).state
        if state is not None and state.type.value in FINAL:
            return state.type.value
        time.sleep(1.0)
    return client.read_flow_run(run_id).state.type.value


def test_every_deployment_registers_and_runs_with_a_real_worker(services, tmp_path):
    import ray
    from prefect.client.orchestration import get_client

    marker = f"CAKE_TEST_MARK={uuid.uuid4().hex}"
    env = _env(services, marker)
    p = subprocess.run([CAKE, "deploy"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "work pool cake: created" in p.stdout
    for name in ("evolve/nightly-gemm", "harness-review/weekly-harness-review", "sweep/sweep"):
        assert f"registered {name}" in p.stdout, p.stdout
    again = subprocess.run([CAKE, "deploy"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "work pool cake: already there" in again.stdout, again.stderr

    wh_root = services["home"] / "warehouse"
    worker = subprocess.Popen([CAKE, "worker"], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=(tmp_path / "worker.out").open("w"),
                              stderr=(tmp_path / "worker.err").open("w"), start_new_session=True)
    try:
        with get_client(sync_client=True) as client:
            deps = {d.name: d for d in client.read_deployments()}
            assert deps["nightly-gemm"].parameters["warehouse_root"] == str(wh_root)
            assert deps["nightly-gemm"].work_pool_name == "cake"
            assert [s.schedule.cron for s in deps["nightly-gemm"].schedules] == ["0 2 * * *"]

            # an empty warehouse: nothing to propose, the review completes without pausing
            review = client.create_flow_run_from_deployment(deps["weekly-harness-review"].id)
            assert _wait(client, review.id, 300) == "COMPLETED", (tmp_path / "worker.err").read_text()[-3000:]

            nightly = client.create_flow_run_from_deployment(deps["nightly-gemm"].id, parameters={
                "shape_set": "gemm_small", "generations": 1, "population": 3, "gpu_models": []})
            assert _wait(client, nightly.id, 600) == "COMPLETED", (tmp_path / "worker.err").read_text()[-3000:]

            sweep = client.create_flow_run_from_deployment(
                deps["sweep"].id, parameters={"problem": "tinygemm", "shape_sets": ["tinygemm_small"],
                                              "generations": 1, "population": 2},
                job_variables={"env": {"CAKE_RAY_ADDRESS": ray.get_runtime_context().gcs_address}})
            assert _wait(client, sweep.id, 600) == "COMPLETED", (tmp_path / "worker.err").read_text()[-3000:]
    finally:
        os.killpg(worker.pid, signal.SIGINT)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()

    wh = Warehouse(wh_root)
    runs = {r["shape_set"]: r for r in wh.query("select * from runs_latest").to_pylist()}
    assert runs["gemm_small"]["status"] == "completed" and runs["gemm_small"]["problem"] == "gemm_bf16"
    assert runs["tinygemm_small"]["status"] == "completed" and runs["tinygemm_small"]["problem"] == "tinygemm"
    deadline = time.monotonic() + 30
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marked(marker) == [], "the worker left processes behind: " + described(marked(marker))
