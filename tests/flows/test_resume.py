"""Evolution at real scale on the CPU: kill -9 and resume, cold starts, held-out rows, budgets, bad --resume."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from warehouse import Warehouse
from cake_core.problems import corpus_file

CAKE = str(Path(sys.executable).parent / "cake")
HOLD = Path(__file__).parent / "hold"      # a sitecustomize that holds a run where the kill test wants it
EVOLVE = ["evolve", "gemm_bf16", "--shapes", "gemm_small", "--generations", "3", "--population", "5",
          "--seed", "21"]     # the same run as test_a_run_killed_and_resumed_ends_as_the_uninterrupted_one's in-process one


def _env(home, services=None, session_ray=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update({"CAKE_HOME": str(home), "CAKE_GPU": "off"})
    if services:
        env["CAKE_PREFECT_API_URL"] = services["api_url"]
    if session_ray:       # join the session's Ray rather than start one
        import ray
        env["CAKE_RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return env


def _cake(args, home, services=None, timeout=600, session_ray=False):
    return subprocess.run([CAKE, *args], capture_output=True, text=True, timeout=timeout,
                          env=_env(home, services, session_ray), cwd=home)


def _journey(root):
    """What a run did, attempt by attempt, and where it ended."""
    wh = Warehouse(root)
    (run,) = wh.query("select run_id, status, stop_reason, session from runs_latest").to_pylist()
    attempts = wh.query("select generation, slot, ir_hash, tactic, outcome, predicted_ms from attempts "
                        "order by generation, slot").to_pylist()
    best = wh.query("select ir_hash, score_ms, generation, slot from run_best").to_pylist()
    ids = wh.query("select count(*) as n, count(distinct attempt_id) as d from attempts").to_pylist()[0]
    return run, attempts, best, ids


@pytest.mark.services
def test_a_run_killed_and_resumed_ends_as_the_uninterrupted_one(services, tmp_path, share_compile_cache):
    from flows.evolve import evolve_flow

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    share_compile_cache(cut)          # the session's cubins: the killed run compiles what the whole one did
    evolve_flow(problem="gemm_bf16", shape_set="gemm_small", generations=3, population=5, seed=21, run_id="whole",
                warehouse_root=str(whole / "warehouse"), cache_dir=str(services["home"] / "cache"))
    run_w, attempts_w, best_w, _ = _journey(whole / "warehouse")
    assert run_w["status"] == "completed" and run_w["stop_reason"] == "generations" and best_w

    hold = cut / "held"             # tests/flows/hold: the run stops for good once generation 1 has landed an attempt
    env = {**_env(cut, services), "CAKE_TEST_HOLD_FILE": str(hold), "CAKE_TEST_HOLD_GENERATION": "1",
           "PYTHONPATH": os.pathsep.join([str(HOLD), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([CAKE, *EVOLVE], cwd=cut, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(cut / "stderr.txt", "w"), start_new_session=True)
    deadline = time.monotonic() + 900           # generous: a busy machine; the run waits there, it cannot pass
    while time.monotonic() < deadline and proc.poll() is None and not hold.exists():
        time.sleep(0.2)
    assert hold.exists(), "the run never reached generation 1: " + (cut / "stderr.txt").read_text()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    root = cut / "warehouse"
    wh = Warehouse(root)
    done = wh.query("select count(*) as n from stage_times where stage = 'select'").to_pylist()[0]["n"]
    assert wh.query("select count(*) as n from attempts where generation = 1").to_pylist()[0]["n"]
    (killed,) = Warehouse(root).query("select run_id, status from runs_latest").to_pylist()
    assert killed["status"] == "running" and 1 <= done < 3

    p = _cake(["evolve", "gemm_bf16", "--resume", killed["run_id"]], cut, services, session_ray=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"resuming run {killed['run_id']}" in p.stdout
    run_c, attempts_c, best_c, ids = _journey(root)
    assert (run_c["status"], run_c["stop_reason"], run_c["session"]) == ("completed", "generations", 1)
    assert ids["n"] == ids["d"] == len(attempts_w), "attempts lost or recorded twice"
    assert attempts_c == attempts_w
    assert best_c == best_w


def _hashes_of_hand_written(problem):
    return {parse_program(corpus_file(f).read_text()).hash for f in get_problem(problem).best_files}


@pytest.mark.services
def test_a_cold_run_never_offers_a_hand_written_kernel_and_measures_them_beside_its_best(services, tmp_path):
    from flows.evolve import evolve_flow

    root = tmp_path / "warehouse"
    out = evolve_flow(problem="gemm_bf16", shape_set="gemm_small", generations=2, population=6, seed=5, cold=True,
                      run_id="cold-1", warehouse_root=str(root), cache_dir=str(services["home"] / "cache"))
    wh = Warehouse(root)
    rows = wh.query("select ir_hash, tactic, parents from attempts where run_id = 'cold-1'").to_pylist()
    assert len(rows) == out["attempts"] >= 8 and out["cold"]
    assert not _hashes_of_hand_written("gemm_bf16") & {r["ir_hash"] for r in rows}
    assert "best-known" not in {r["tactic"] for r in rows}
    seed = parse_program(corpus_file("gemm_bf16.cake").read_text()).hash
    known = {r["ir_hash"] for r in rows} | {seed}
    assert all(set(r["parents"]) <= known for r in rows), "a parent that is not the seed or an attempt of the run"
    assert wh.query("select cold from runs_latest where run_id = 'cold-1'").to_pylist() == [{"cold": True}]
    names = {r["name"] for r in wh.query("select name from baselines where run_id = 'cold-1' and "
                                         "source = 'hand_written'").to_pylist()}
    assert names == set(get_problem("gemm_bf16").best_files)


@pytest.mark.services
def test_held_out_rows_never_decide_selection(services, tmp_path, monkeypatch):
    from flows.evolve import evolve_flow

    shapes = tmp_path / "shapes"
    shapes.mkdir()
    plain = (get_problem("gemm_bf16").shapes_dir / "gemm_small.csv").read_text().splitlines()
    searched = [ln for ln in plain if not ln.endswith("held_out")]
    # two ragged held-out rows: searched, they would stop kernels that drop their tail guards
    (shapes / "gemm_held.csv").write_text("\n".join(searched + ["31,47,13,held_out", "150,3,77,held_out"]) + "\n")
    (shapes / "gemm_searched.csv").write_text("\n".join(searched) + "\n")
    # each run in its own warehouse: the agent reads the problem's earlier runs (tactic records), so a shared
    # warehouse would make the second run differ from the first for a reason that is not the held-out rows
    runs, whs = {}, {}
    for run_id, shape_set in (("with-held", str(shapes / "gemm_held.csv")), ("without", str(shapes / "gemm_searched.csv"))):
        root = tmp_path / run_id
        runs[run_id] = evolve_flow(problem="gemm_bf16", shape_set=shape_set, generations=2, population=5, seed=9,
                                   run_id=run_id, warehouse_root=str(root), cache_dir=str(services["home"] / "cache"))
        whs[run_id] = Warehouse(root)

    def journey(run_id):
        return whs[run_id].query("select generation, slot, ir_hash, outcome, predicted_ms from attempts "
                                 "where run_id = ? order by generation, slot", [run_id]).to_pylist()

    assert journey("with-held") == journey("without")            # the held-out rows changed nothing
    wh = whs["with-held"]
    held = {"M=31,N=47,K=13", "M=150,N=3,K=77"}
    seen = {r["shape"] for r in wh.query("select c.shape from checks c join attempts a using (attempt_id) "
                                          "where a.run_id = 'with-held' and c.kind = 'search' union all "
                                          "select p.shape from predictions p join attempts a using (attempt_id) "
                                          "where a.run_id = 'with-held'").to_pylist()}
    assert not seen & held
    best = wh.query("select attempt_id from run_best where run_id = 'with-held'").to_pylist()[0]["attempt_id"]
    reported = wh.query("select attempt_id, shape from checks where kind = 'held_out'").to_pylist()
    assert {r["shape"] for r in reported} == held and {r["attempt_id"] for r in reported} == {best}
    assert {r["shape"] for r in runs["with-held"]["held_out"]} == held and runs["without"]["held_out"] == []


@pytest.mark.services
def test_a_candidate_budget_stops_the_run_and_says_why(services, tmp_path):
    from flows.evolve import evolve_flow

    out = evolve_flow(problem="gemm_bf16", shape_set="gemm_small", generations=10, population=4, seed=2,
                      budget_candidates=7, run_id="budget-1", warehouse_root=str(tmp_path / "warehouse"),
                      cache_dir=str(services["home"] / "cache"))
    assert out["attempts"] == 7 and out["stop_reason"] == "budget_candidates" and out["generations"] == 2
    row = Warehouse(tmp_path / "warehouse").query("select status, stop_reason, budget_candidates from runs_latest"
                                                  ).to_pylist()
    assert row == [{"status": "completed", "stop_reason": "budget_candidates", "budget_candidates": 7}]


# ---------------------------------------------------------------- a --resume that cannot be: one line, nothing touched

def _warehouse_with_runs(home):
    wh = Warehouse(home / "warehouse")
    base = dict(shape_set="kmeans_assign_small", agent="tactic", seed=0, generations=3, population=4, host="h",
                started_at=datetime(2026, 12, 1), status="running", session=0)
    wh.append("runs", [dict(base, run_id="km-1", problem="kmeans_assign", harness_version=0),
                       dict(base, run_id="gone-1", problem="gemm_bf16", shape_set="gemm_small", harness_version=4)])
    return wh


def _files(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("args, message", [
    (["evolve", "gemm_bf16", "--resume", "nope-1"], "no run `nope-1` in the warehouse"),
    (["evolve", "gemm_bf16", "--resume", "km-1"], "run `km-1` evolves kmeans_assign, not gemm_bf16"),
    (["evolve", "gemm_bf16", "--resume", "gone-1"], "run `gone-1` used harness version 4, which the warehouse"),
    (["evolve", "kmeans_assign", "--resume", "km-1", "--seed", "3"], "was started with --seed 0, and a resumed run"),
    (["evolve", "gemm_bf16", "--harness", "7"], "--harness 7: the warehouse"),
])
def test_a_resume_that_cannot_be_is_one_line_and_touches_nothing(tmp_path, args, message):
    _warehouse_with_runs(tmp_path)
    before = _files(tmp_path / "warehouse")
    p = _cake(args, tmp_path, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode in (1, 2) and len(lines) == 1 and "Traceback" not in p.stderr + p.stdout, p.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert _files(tmp_path / "warehouse") == before


def test_resuming_a_run_that_another_process_runs_is_refused(tmp_path):
    from tasks.run_control import RunLock

    _warehouse_with_runs(tmp_path)
    held = RunLock(tmp_path / "warehouse", "km-1")       # as the process running it holds it
    try:
        p = _cake(["evolve", "kmeans_assign", "--resume", "km-1"], tmp_path, timeout=120)
    finally:
        held.release()
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "run `km-1` is being run right now (by pid" in lines[0], p.stderr
    RunLock(tmp_path / "warehouse", "km-1").release()       # released: it could be resumed now
