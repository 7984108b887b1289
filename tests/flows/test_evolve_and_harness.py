"""The whole loop on the CPU: evolve → warehouse → clusters → proposal → pause → CLI approval → new version."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cake_core.agents import tactics as tactics_mod
from warehouse import Warehouse

pytestmark = pytest.mark.services


def _evolve(services, wh_root, run_id, monkeypatch=None, **kw):
    from flows.evolve import evolve_flow
    return evolve_flow(problem="gemm_bf16", shape_set="gemm_small", run_id=run_id,
                       warehouse_root=str(wh_root), cache_dir=str(services["home"] / "cache"), **kw)


def test_evolve_records_every_attempt(services, tmp_path):
    wh_root = tmp_path / "warehouse"
    summary = _evolve(services, wh_root, "run-a", generations=2, population=4, seed=3)
    wh = Warehouse(wh_root)
    rows = wh.query("select outcome, count(*) as n from attempts where run_id = 'run-a' group by 1").to_pylist()
    assert sum(r["n"] for r in rows) == sum(summary["outcomes"].values()) >= 6
    assert {r["outcome"]: r["n"] for r in rows} == summary["outcomes"]
    assert not summary["timed"], "no GPU here: nothing may claim to be timed"
    assert wh.query("select count(*) as n from measurements").to_pylist()[0]["n"] == 0
    checked = wh.query("select count(*) as n from checks c join attempts a using (attempt_id) "
                       "where a.outcome = 'checked' and c.backend = 'interpreter' and c.correct").to_pylist()
    assert checked[0]["n"] >= 6
    status = wh.query("select status from runs_latest where run_id = 'run-a'").to_pylist()
    assert status == [{"status": "completed"}]


def _cake(services, *args, home, timeout=120):
    exe = Path(sys.executable).parent / "cake"
    env = {**os.environ, "CAKE_PREFECT_API_URL": services["api_url"], "CAKE_HOME": str(home)}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_planted_failure_becomes_an_approved_rule_used_by_the_next_run(services, tmp_path, monkeypatch):
    from flows.harness import harness_review_flow

    wh_root = tmp_path / "warehouse"
    # Plant a recurring failure: an agent that keeps dropping tail guards on ragged shapes.
    planted = {"drop_guards": tactics_mod.drop_guards, "retile": tactics_mod.retile}
    monkeypatch.setattr(tactics_mod, "TACTICS", planted)
    from dataclasses import replace

    from cake_core.problems import PROBLEMS
    monkeypatch.setitem(PROBLEMS, "gemm_bf16", replace(PROBLEMS["gemm_bf16"], best_files=()))  # mutants only
    first = _evolve(services, wh_root, "run-1", generations=2, population=5, seed=11)
    assert first["outcomes"].get("runtime_fault", 0) >= 3, first

    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("out", harness_review_flow(
        warehouse_root=str(wh_root), min_support=3, pause_timeout_s=300)))
    t.start()
    wh = Warehouse(wh_root)
    deadline = time.monotonic() + 120
    pending = []
    while time.monotonic() < deadline and not pending:
        pending = wh.query("select proposal_id, kind, title, gate_report from proposals_latest "
                           "where status = 'pending'").to_pylist()
        time.sleep(0.5)
    assert pending, "the harness flow made no proposal"
    prop = pending[0]
    assert prop["kind"] == "rule" and "unguarded" in prop["title"]
    gate = json.loads(prop["gate_report"])
    assert gate["passed"] and gate["caught"] == gate["cluster_size"] >= 3

    # Approve through the CLI (its warehouse is CAKE_HOME/warehouse), which resumes the paused flow run.
    out = _cake(services, "harness", "approve", prop["proposal_id"], "--reason", "caught by the interpreter",
                home=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    t.join(timeout=60)
    assert not t.is_alive()
    assert result["out"][0]["decision"] == "approved" and result["out"][0]["new_version"] == 1
    versions = wh.query("select version, parent from harness_versions").to_pylist()
    assert versions == [{"version": 1, "parent": 0}]
    assert (tmp_path / "harness" / "harness-v1.json").exists()

    second = _evolve(services, wh_root, "run-2", generations=1, population=6, seed=12)
    assert second["harness_version"] == 1
    rows = wh.query("select outcome, error_rule, features from attempts where run_id = 'run-2'").to_pylist()
    unguarded = [r for r in rows if json.loads(r["features"]).get("unguarded_load")]
    assert unguarded, "the planted agent should still propose unguarded programs"
    assert all(r["outcome"] == "verify_failed" and r["error_rule"] == "harness.learned_1" for r in unguarded)
    assert not any(r["outcome"] == "runtime_fault" for r in rows)
