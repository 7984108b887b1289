"""Several GPUs on the CPU: the time stage's scheduling over a Ray with fake GPU resources (marked `services`).

``multi_gpu_driver.py`` runs in a process of its own (its Ray offers 4 fake ``gpu_model:H200`` GPUs and 2
``gpu_model:H100``, which the flow tests' session Ray cannot), drives the real ``on_gpu`` / ``ActorPool`` with
fake runners that log every execution, and writes what happened as JSON; the tests read it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

DRIVER = Path(__file__).with_name("multi_gpu_driver.py")
DRIVER_TIMEOUT_S = 900      # Ray's start and five pools of actors, on a busy 2-core machine


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("ray")
    out = tmp_path_factory.mktemp("multi-gpu")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True, env=env,
                          timeout=DRIVER_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


def _ran(scn: dict) -> Counter:
    return Counter(tuple(k) for e in scn["executions"].values() for k in e["ran"])


def test_the_local_ray_is_on_loopback_and_offers_each_model_it_was_given(result):
    assert result["gcs"].startswith("127.0.0.1:")
    assert result["offered"] == {"H100": 2, "H200": 4}


def test_units_spread_over_every_runner_of_the_model_and_none_runs_twice(result):
    scn = result["spread"]
    assert scn["runners"] == 4 and scn["resource"] == "gpu_model:H200"
    assert len(scn["answers"]) == 8 * 4 and not any(a["fault"] for a in scn["answers"].values())
    worked = {pid for pid, e in scn["executions"].items() if e["ran"]}
    assert len(worked) == 4                                      # every runner got work
    assert set(_ran(scn).values()) == {1} and len(_ran(scn)) == 32    # no unit ran twice
    assert scn["lost"] == [] and scn["reruns"] == [] and scn["replaced"] == 0
    assert all(e["assigned"].get("gpu_model:H200") == 1 and e["assigned"].get("GPU") == 1
               for e in scn["executions"].values())


def test_a_runner_that_dies_has_its_units_run_again_elsewhere_and_recorded(result):
    scn = result["killed"]
    assert scn["replaced"] == 1
    answers = scn["answers"]
    assert len(answers) == 32 and not any(a["fault"] for a in answers.values())   # each unit one good answer
    pids = {w["pid"] for w in scn["lost"]}
    assert len(pids) == 1
    dead_pid = pids.pop()
    assert [2, 1] in scn["executions"][str(dead_pid)]["ran"]
    lost = {tuple(w["key"]) for w in scn["lost"]}
    assert (2, 1) in lost and len(lost) == len(scn["lost"]) >= 2       # the whole batch went back
    assert all(w["cause"] == "died" and w["node_id"] for w in scn["lost"])
    for k in lost:                                              # answered by another runner
        assert answers[f"{k[0]},{k[1]}"]["pid"] != dead_pid
    ran = _ran(scn)           # the batch's units after the fatal one never ran on the dead runner
    assert ran[(2, 1)] == 2 and all(n == 1 for k, n in ran.items() if k not in lost)
    rows = scn["reruns"]
    assert sorted((r["attempt_id"], r["shape"]) for r in rows) == sorted(
        (f"mg-att-{i}", "M={},N=64,K=32".format(64 * (j + 1))) for i, j in lost)
    assert all(r["cause"] == "died" and r["pid"] == dead_pid and r["kind"] == "search" and r["generation"] == 0
               for r in rows)


def test_one_writer_the_runners_never_load_the_warehouse(result):
    for name in ("spread", "killed", "h100"):
        scn = result[name]
        assert not any(a.get("writer") for a in scn["answers"].values())
        assert scn["driver_pid"] not in {a["pid"] for a in scn["answers"].values()}
        assert len(scn["reruns"]) == len(scn["lost"])        # every re-run landed once, by the driver's recorder


def test_each_kernel_is_timed_on_the_gpu_model_it_asked_for(result):
    scn = result["h100"]
    assert scn["runners"] == 2 and scn["resource"] == "gpu_model:H100"
    assert all(e["assigned"].get("gpu_model:H100") == 1 and "gpu_model:H200" not in e["assigned"]
               for e in scn["executions"].values())
    assert len(scn["answers"]) == 2 * 4 and result["limited"] == 2


def test_a_unit_alone_that_kills_its_runner_is_its_fault_unless_its_node_went(result):
    blamed = result["alone_blamed"]["answers"]["0,2"]
    assert blamed["fault"] and blamed["outcome"] == "runtime_fault" and "died" in blamed["message"]
    assert result["alone_blamed"]["reruns"] == []
    scn = result["alone_node_lost"]
    assert not scn["answers"]["0,2"]["fault"]
    assert [(w["key"], w["cause"]) for w in scn["lost"]] == [([0, 2], "node_lost")]
    assert [r["cause"] for r in scn["reruns"]] == ["node_lost"]


def test_a_gpu_model_the_cluster_lacks_is_refused_with_what_to_do(result):
    msg = result["missing"]
    assert msg.startswith("the run asks for GPU model B200 (gpu_model:B200) but the Ray cluster (1 node) offers "
                          "2 x H100, 4 x H200")
    assert "--resources='{\"gpu_model:B200\": N}'" in msg and "CAKE_GPU_MODEL" in msg and "CAKE_GPU=off" in msg
    assert "\n" not in msg
