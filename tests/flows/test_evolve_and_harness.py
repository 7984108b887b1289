"""The whole loop on the CPU: a real run → warehouse → clusters → proposal → pause → CLI approval → new version
used by the next evolve run; and the named approval policies a program runs the review with."""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from warehouse import Warehouse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))   # harness_runs: real CPU runs

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


@pytest.fixture(scope="module")
def mined_warehouse(mined_warehouse_once):
    """Real cold-start runs on the CPU (``harness_runs.mined_runs``: knn_topk, kmeans_assign, gemm_bf16; made
    once per session, each test copies it) whose agent keeps writing mma_sync children of the distance
    kernels that the lowering refuses."""
    root = mined_warehouse_once
    n = Warehouse(root).query("select count(*) as n from attempts where error_rule = 'lower.acc_layout'").to_pylist()
    assert n[0]["n"] >= 3, n
    return root


def _pending(wh, flow: threading.Thread, timeout_s=240, seen=()):
    """The pending proposals not in ``seen`` that wait for a person (they passed the corpus gate: one it refused
    is rejected by the flow itself, a moment after it is recorded), once there are some; none once ``flow`` has
    ended without one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ended = not flow.is_alive()        # read before the query: an ended flow adds no proposal after it
        rows = wh.query("select proposal_id, kind, title, gate_report, evidence from proposals_latest "
                        "where status = 'pending'").to_pylist()
        rows = [r for r in rows if r["proposal_id"] not in seen and json.loads(r["gate_report"])["passed"]]
        if rows or ended:
            return rows
        time.sleep(0.5)
    return []


def test_a_mined_rule_pauses_the_review_is_approved_from_the_cli_and_used_by_the_next_run(
        services, mined_warehouse, tmp_path, share_compile_cache, corpus_gate_store):
    from flows.harness import harness_review_flow

    wh_root = tmp_path / "warehouse"
    shutil.copytree(mined_warehouse, wh_root)
    share_compile_cache(tmp_path)                 # the session's cubins and corpus gate store
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("out", harness_review_flow(
        warehouse_root=str(wh_root), min_support=3, pause_timeout_s=600, pause_poll_s=1)))
    t.start()
    wh = Warehouse(wh_root)
    pending = _pending(wh, t)
    assert pending, "the harness flow made no proposal"
    prop = pending[0]
    assert prop["kind"] == "rule" and "op.mma.atom=mma_sync > 0" in prop["title"] and "op.ewise > 0" in prop["title"]
    gate = json.loads(prop["gate_report"])
    assert gate["passed"] and gate["caught"]["cluster_caught"] == gate["caught"]["cluster_size"] >= 3
    assert json.loads(prop["evidence"])["gate"]["corpus"]["hand-written"] >= 20

    # Approve through the CLI (its warehouse is CAKE_HOME/warehouse), which resumes the paused flow run; the
    # flow then pauses on the next proposal (the primitive and the macro these runs also give): rejected.
    out = _cake(services, "harness", "approve", prop["proposal_id"], "--reason", "ewise on a fragment never lowers",
                home=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    rejected = []
    while t.is_alive():
        nxt = _pending(wh, t, timeout_s=120, seen=rejected)
        if not nxt:
            break
        rejected.append(nxt[0]["proposal_id"])
        out = _cake(services, "harness", "reject", nxt[0]["proposal_id"], "--reason", "not in this test",
                    home=tmp_path)
        assert out.returncode == 0, out.stderr + out.stdout
    t.join(timeout=120)
    assert not t.is_alive()
    # the flow's outcomes come in the order it decided them: a proposal the corpus gate refused on its own (never
    # paused on) may come before the one we approved
    mine = [o for o in result["out"] if o["proposal_id"] == prop["proposal_id"]]
    assert mine == [{"proposal_id": prop["proposal_id"], "kind": "rule", "decision": "approved", "new_version": 1}]
    others = [o for o in result["out"] if o["proposal_id"] != prop["proposal_id"]]
    assert set(rejected) <= {o["proposal_id"] for o in others}
    assert all(o["proposal_id"] in rejected or o["by"] == "corpus-gate" for o in others)
    assert {o["decision"] for o in others} <= {"rejected"}
    versions = wh.query("select version, parent from harness_versions").to_pylist()
    assert versions == [{"version": 1, "parent": 0}]
    assert (tmp_path / "harness" / "harness-v1.json").exists()

    # a later cold run with the whole tactic table; seed 0, whose first generations try mma_sync on the seed (a warm
    # run would fill its first generation with the hand-written kernels instead)
    from flows.evolve import evolve_flow
    second = evolve_flow(problem="knn_topk", shape_set="knn_topk_small", run_id="knn-2", generations=2,
                         population=8, seed=0, cold=True, warehouse_root=str(wh_root),
                         cache_dir=str(services["home"] / "cache"))
    assert second["harness_version"] == 1
    payloads = wh.query("select kind, payload from proposals_latest where status = 'approved'").to_pylist()
    rule_id = json.loads(payloads[0]["payload"])["id"]
    rows = wh.query("select stage, error_rule from attempts where run_id = 'knn-2'").to_pylist()
    assert any(r["error_rule"] == rule_id and r["stage"] == "verify" for r in rows)
    assert not any(r["error_rule"] == "lower.acc_layout" for r in rows)


@pytest.mark.parametrize("policy, decision", [("approve-gated", "approved"), ("record-only", "pending")])
def test_a_named_policy_decides_without_a_person(services, mined_warehouse, tmp_path, share_compile_cache,
                                                corpus_gate_store, policy, decision):
    from flows.harness import harness_review_flow

    wh_root = tmp_path / "warehouse"
    shutil.copytree(mined_warehouse, wh_root)
    share_compile_cache(tmp_path)                 # the session's corpus gate store
    out = harness_review_flow(warehouse_root=str(wh_root), min_support=3, policy=policy)
    gated = [o for o in out if o["by"] != "corpus-gate"]          # those the gate refused are rejected by it
    # the mma_sync rule first, then whatever else the runs' failures and wins support (another rule where a
    # cluster reaches the support: which clusters do depends on the runs' trajectories), a primitive and a tactic
    kinds = [o["kind"] for o in gated]
    assert kinds[0] == "rule" and {"primitive", "tactic"} <= set(kinds) <= {"rule", "primitive", "tactic"}, kinds
    assert {o["decision"] for o in gated} == {decision} and {o["by"] for o in gated} == {policy}
    assert all(o["decision"] == "rejected" for o in out if o["by"] == "corpus-gate")
    versions = Warehouse(wh_root).query("select version from harness_versions order by version").to_pylist()
    assert versions == ([{"version": v} for v in range(1, len(gated) + 1)] if decision == "approved" else [])
    again = harness_review_flow(warehouse_root=str(wh_root), min_support=3, policy=policy)
    # nothing is proposed twice, whatever became of it; once the winners' TMA producer step is a composite, the
    # next pattern they share (the cp.async producer step) may come up in the next review
    titles = [r["title"] for r in Warehouse(wh_root).query("select title from proposals_latest").to_pylist()]
    assert len(titles) == len(set(titles)) == len(out) + len(again)
    # a rule the gate refused is rejected for good, so a next review may mine that cluster's next predicate
    # (refused by the gate too, never put to anyone)
    asked = [o for o in again if o["by"] != "corpus-gate"]
    assert {o["kind"] for o in asked} <= {"primitive"}
    assert all(o["decision"] == "rejected" for o in again if o["by"] == "corpus-gate")
    if decision == "pending":
        assert asked == []                               # a question awaiting its answer is not asked again
