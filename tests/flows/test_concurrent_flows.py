"""Two evolution flows write one warehouse at once, and `cake sql` answers while they do."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from warehouse import Warehouse

pytestmark = pytest.mark.services


def test_two_flows_at_once_and_a_reader(services, tmp_path):
    from flows.evolve import evolve_flow

    wh_root = tmp_path / "warehouse"
    Warehouse(wh_root)
    results, errors = {}, []

    def go(run_id, seed):
        try:
            results[run_id] = evolve_flow(problem="gemm_bf16", shape_set="gemm_small", generations=2,
                                          population=4, seed=seed, run_id=run_id, warehouse_root=str(wh_root),
                                          cache_dir=str(services["home"] / "cache"))
        except Exception as e:  # handed to the test thread
            errors.append(e)

    threads = [threading.Thread(target=go, args=(f"flow-{i}", i)) for i in (1, 2)]
    for t in threads:
        t.start()
    env = {**os.environ, "CAKE_HOME": str(tmp_path)}
    answers = 0
    while any(t.is_alive() for t in threads):
        p = subprocess.run([str(Path(sys.executable).parent / "cake"), "sql", "select count(*) from attempts",
                            "--format", "csv"], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        answers += 1
        time.sleep(2)
    for t in threads:
        t.join()
    assert not errors, errors
    assert answers >= 1
    wh = Warehouse(wh_root)
    for run_id, summary in results.items():
        n = wh.query("select count(*) as n from attempts where run_id = ?", [run_id]).to_pylist()[0]["n"]
        assert n == sum(summary["outcomes"].values())
    status = {r["run_id"]: r["status"] for r in wh.query("select run_id, status from runs_latest").to_pylist()}
    assert status == {"flow-1": "completed", "flow-2": "completed"}
