"""Each proposal kind from real CPU runs: mined, gated, approved (as `cake harness approve` does), used later.

The warehouses come from real cold-start runs of the tactic agent (``harness_runs.mined_runs``: knn_topk,
kmeans_assign and gemm_bf16, 4 generations of 8, seeds 2, 2, 1, the tactic table without drop_guards) and,
for calibration, from the H200 measurements of the corpus kernels recorded under bench/results. Nothing is
planted: the failures and wins are what the agent produced, the later runs are cold-start runs under the
approved version.
"""
import json
import shutil

import pytest

from cake_core.agents.tactics import STRUCTURAL, TACTICS
from cake_core.harness.review import review
from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from harness_runs import MINED_TACTICS, cpu_run, replay_measurements
from tasks.harness import load_harness, load_review_input, record_proposal
from warehouse import Warehouse


def _copy(src, tmp_path):
    dst = tmp_path / "warehouse"
    shutil.copytree(src, dst)
    return dst


def _approve(root, prop, gate) -> int:
    from flows.harness import decide_proposal          # what `cake harness approve ID` calls
    pid = record_proposal(str(root), prop, gate, None)
    return decide_proposal(pid, True, "caught in review", "test", str(root))


def _one(found, kind, signature: str = ""):
    """The one proposal of ``kind`` (whose signature starts with ``signature``)."""
    got = [r for r in found if r.proposal.kind == kind and r.proposal.signature.startswith(signature)]
    assert len(got) == 1, [r.proposal.title for r in found]
    return got[0].proposal, got[0].gate


@pytest.fixture(scope="module")
def runs(mined_warehouse_once):
    """Cold-start runs of knn_topk, kmeans_assign and gemm_bf16 (``harness_runs.mined_runs``: 4 generations
    of 8, the tactic table without drop_guards; made once per session, each test copies it): the agent's
    mma_sync children of the distance kernels fail to lower, its winners share the warp-specialized
    producer's TMA step, and retile-then-warp_specialize wins on more than one problem."""
    root = mined_warehouse_once
    n = Warehouse(root).query("select count(*) as n from attempts where stage = 'lower' "
                              "and error_rule = 'lower.acc_layout'").to_pylist()[0]["n"]
    assert n >= 3, n
    return root


def test_rule_from_a_real_failure_cluster_blocks_it_in_a_later_run(runs, tmp_path, gate_cache):
    root = _copy(runs, tmp_path)
    found, skipped = review(load_review_input(str(root)), HarnessSpec(), kinds=("rule",), cache=gate_cache)
    prop, gate = _one(found, "rule", "lower:compile_failed:lower.acc_layout")
    # any other rule the runs' failures suggest passes the gate, or the gate says why it refuses it
    for other in (r for r in found if r.proposal is not prop):
        assert other.gate["passed"] or other.gate["refusals"], other.gate
    # the lowering refuses an mma_sync accumulator that an ewise reads; gemm's mma_sync children (no ewise)
    # pass, so mma_sync alone does not separate the cluster
    atoms = prop.payload["predicate"]["all"]
    assert sorted(atoms, key=lambda a: a["feature"]) == [{"feature": "op.ewise", "op": ">", "value": 0},
                                                         {"feature": "op.mma.atom=mma_sync", "op": ">", "value": 0}]
    assert prop.signature.startswith("lower:compile_failed:lower.acc_layout")
    assert "none passed" in prop.payload["message"] and "lower.acc_layout" in prop.payload["hint"]
    sync_passed = Warehouse(root).query("select count(*) as n from attempts where outcome = 'checked' "
                                        "and ir_text like '%mma_sync%'").to_pylist()[0]["n"]
    assert sync_passed > 0
    assert gate["passed"] and gate["flips"] == [] and gate["corpus"]["hand-written"] >= 20
    assert gate["caught"]["cluster_caught"] == gate["caught"]["cluster_size"] >= 3
    assert gate["caught"]["passing_blocked"] == []
    # the clusters the verifier already rejects are not proposed as rules of their own
    assert any("restates a built-in rule" in s["why"] and s["signature"].startswith("verify:") for s in skipped)
    ev = json.loads(json.dumps(prop.evidence))                           # travels as plain data
    assert {"definition", "cluster", "examples", "separation", "gate"} <= set(ev)
    assert set(ev["separation"]["problems"]) <= {"knn_topk", "kmeans_assign"}
    assert "mma_sync" in ev["examples"][0]["excerpt"]
    assert _approve(root, prop, gate) == 1
    spec = load_harness(str(root))
    assert spec.learned_rules[0].id == prop.payload["id"]
    cpu_run(root, "knn_topk", "knn_topk_small", "knn-2", generations=3, population=8, seed=2, harness=spec,
            tactics=MINED_TACTICS)
    wh = Warehouse(root)
    later = wh.query("select stage, outcome, error_rule, signature from attempts where run_id = 'knn-2'").to_pylist()
    stopped = [r for r in later if r["error_rule"] == prop.payload["id"]]
    assert stopped and {r["stage"] for r in stopped} == {"verify"}          # before the lower stage
    assert not any(r["error_rule"] == "lower.acc_layout" for r in later)   # the cluster no longer reaches lower
    diag = wh.query("select message, hint from diagnostics where rule = ?", [prop.payload["id"]]).to_pylist()
    assert diag and diag[0]["message"] == prop.payload["message"] and diag[0]["hint"] == prop.payload["hint"]
    again, skipped = review(load_review_input(str(root)), spec, kinds=("rule",), cache=gate_cache)
    assert not any(r.proposal.signature == prop.signature for r in again)
    assert any(f"stopped by {prop.payload['id']} of harness v1" in s["why"] for s in skipped)


def test_primitive_from_winning_kernels_is_written_and_run_by_a_later_run(runs, tmp_path, gate_cache,
                                                                         monkeypatch):
    root = _copy(runs, tmp_path)
    found, _ = review(load_review_input(str(root)), HarnessSpec(), kinds=("primitive",), cache=gate_cache)
    prop, gate = _one(found, "primitive")
    comp = prop.payload["composite"]
    # a step of the warp-specialized producer the winners share (which one depends on what the runs won
    # with: the cp.async ring's wait-copy-arrive, or the TMA ring's wait-expect-load): several ops, one call
    assert len(comp["body"]) >= 3 and comp["name"].startswith("wait_")
    assert len(prop.evidence["cluster"]["problems"]) >= 2
    assert gate["passed"] and gate["flips"] == [] and gate["gained"]["kernels_with_pattern"] >= 2
    assert all(r["round_trip"] for r in gate["gained"]["kernels"])
    assert _approve(root, prop, gate) == 1
    spec = load_harness(str(root))
    # a problem the runs did not mine: the agent writes the composite where its rewrites make the pattern
    totals = cpu_run(root, "tinygemm", "tinygemm_small", "tiny-2", generations=3, population=8, seed=4,
                     harness=spec, tactics=MINED_TACTICS)
    rows = Warehouse(root).query("select ir_text, outcome from attempts where run_id = 'tiny-2'").to_pylist()
    calls = [r for r in rows if f"{comp['name']}(" in r["ir_text"]]
    assert calls and totals.get("checked", 0) >= 3
    assert any(r["outcome"] == "checked" for r in calls)
    assert parse_program(spec.expand(calls[0]["ir_text"]).text).text() != calls[0]["ir_text"]
    from cake_core.pipeline.generate import make_agent                # the LLM agent's reference lists it
    monkeypatch.setenv("CAKE_TEST_LLM_KEY", "not-a-key")                 # the client is made, never called
    llm = make_agent("llm", 0, spec, {"model": "m", "base_url": "http://127.0.0.1:9/v1",
                                          "api_key_env": "CAKE_TEST_LLM_KEY"})
    assert f"{comp['name']}(" in llm.reference


def test_calibration_from_measured_kernels_is_used_by_the_next_run(tmp_path, gate_cache):
    """The H200 measurements of the corpus (bench/results) land as attempts, each 1.8x slower than recorded: a
    device the GPU's data file overrates (as recorded, at 2026-12-03, every error class is within 1.5x and no
    one factor's refit gains 10 %, so the miner proposes nothing there). The miner refits the classes that cluster,
    the refit lowers the held-out error, the gate passes it, it is approved, and the next run ranks with it."""
    from cake_core.harness.review import samples
    from cake_core.model.analytic import AnalyticModel
    root = tmp_path / "warehouse"
    assert replay_measurements(root, slower=1.8) >= 60
    data = load_review_input(str(root))
    found, skipped = review(data, HarnessSpec(), kinds=("calibration",), cache=gate_cache)
    prop, gate = _one(found, "calibration")
    judged = prop.evidence["judged_on_held_out"]
    assert judged["after"]["median_abs_log_error"] < 0.9 * judged["before"]["median_abs_log_error"]
    assert judged["predictions_changed"] > 0 and gate["passed"] and gate["gained"]["predictions_changed"] > 0
    assert _approve(root, prop, gate) == 1
    spec = load_harness(str(root))
    assert dict(spec.cost_eff) == prop.payload["eff"]
    # the measured kernels at their real shapes are predicted differently by the approved model
    measured = samples(data.measured, HarnessSpec())
    v0, v1 = HarnessSpec().cost_model(), spec.cost_model()
    moved = [s for s in measured if abs(v1.estimate(s.program, s.shape).ms / v0.estimate(s.program, s.shape).ms - 1)
             > 0.01]
    assert moved
    cpu_run(root, "kmeans_update", "kmeans_update_small", "after", generations=1, population=2, seed=0,
            harness=spec)
    preds = Warehouse(root).query("""
        select p.model_version, p.model_kind, p.shape, p.predicted_ms, a.ir_text from predictions p
        join attempts a using (attempt_id) where a.run_id = 'after'""").to_pylist()
    assert preds and {r["model_version"] for r in preds} == {f"{AnalyticModel().version}+harness-v1"}
    shapes = {shape_key(s): s for s in get_problem("kmeans_update").shape_set("kmeans_update_small").cpu_shapes(
        get_problem("kmeans_update").cpu_limit)}
    for r in preds:                      # what it recorded is the refit model's prediction
        prog = parse_program(spec.expand(r["ir_text"]).text)
        assert r["predicted_ms"] == pytest.approx(v1.estimate(prog, shapes[r["shape"]]).ms)


def test_macro_tactic_from_winning_sequences_is_applied_by_a_later_run(runs, tmp_path, gate_cache):
    root = _copy(runs, tmp_path)
    found, _ = review(load_review_input(str(root)), HarnessSpec(), kinds=("tactic",), cache=gate_cache)
    prop, gate = _one(found, "tactic")
    macro = prop.payload["macro"]
    assert len(macro["steps"]) >= 2 and len(prop.evidence["cluster"]["problems"]) >= 2
    assert set(macro["steps"]) & set(STRUCTURAL)          # a structural step, after or before a knob
    assert prop.evidence["cluster"]["score_basis"] == ["predicted"]       # CPU wins: the cost model's time
    assert all(e["speedup"] > 1 for e in prop.evidence["examples"])
    assert gate["passed"] and gate["gained"]["children"] > 0
    assert _approve(root, prop, gate) == 1
    spec = load_harness(str(root))
    assert macro["name"] in spec.tactics(TACTICS)
    cpu_run(root, "gemm_bf16", "gemm_small", "gemm-2", generations=3, population=8, seed=7, harness=spec,
            tactics=MINED_TACTICS)
    used = Warehouse(root).query("select tactic, outcome from attempts where run_id = 'gemm-2' and "
                                 "tactic like ?", [f"%{macro['name']}%"]).to_pylist()
    assert used, "the agent never applied the macro"
    assert any(r["outcome"] == "checked" for r in used)


def test_a_rejected_pending_or_approved_change_is_never_proposed_again(runs, tmp_path, gate_cache):
    from flows.harness import decide_proposal
    root = _copy(runs, tmp_path)
    found, _ = review(load_review_input(str(root)), HarnessSpec(), kinds=("primitive", "tactic"), cache=gate_cache)
    prim, gp = _one(found, "primitive")
    tac, gt = _one(found, "tactic")
    decide_proposal(record_proposal(str(root), prim, gp, None), False, "not worth a name", "test", str(root))
    pending = record_proposal(str(root), tac, gt, None)
    again, skipped = review(load_review_input(str(root)), load_harness(str(root)), kinds=("primitive", "tactic"),
                            cache=gate_cache)
    assert {prim.key, tac.key}.isdisjoint(r.proposal.key for r in again)
    why = {s.get("key"): s["why"] for s in skipped}
    assert why[prim.key].startswith("the same change was proposed before (rejected as ")
    assert why[tac.key].startswith(f"the same change was proposed before (pending as {pending}")
    assert decide_proposal(pending, True, "wins on two problems", "test", str(root)) == 1
    later, _ = review(load_review_input(str(root)), load_harness(str(root)), kinds=("primitive", "tactic"),
                      cache=gate_cache)
    assert {prim.key, tac.key}.isdisjoint(r.proposal.key for r in later)
