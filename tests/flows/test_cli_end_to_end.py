"""The real `cake` command: bad input is one clear line; a killed run keeps what it recorded."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warehouse import Warehouse

CAKE = str(Path(sys.executable).parent / "cake")


def _run(args, home, extra=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update({"CAKE_HOME": str(home), "CAKE_GPU": "off", **(extra or {})})
    return subprocess.run([CAKE, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=home)


def _one_line(p):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return lines[0]


def test_unknown_problem(tmp_path):
    p = _run(["evolve", "gemm_fp9"], tmp_path)
    assert p.returncode == 2
    line = _one_line(p)
    assert "unknown problem `gemm_fp9`" in line and "gemm_bf16" in line


def test_missing_shape_set(tmp_path):
    p = _run(["evolve", "gemm_bf16", "--shapes", "nope"], tmp_path)
    assert p.returncode == 2
    assert "no shape set `nope`" in _one_line(p)


def test_bad_shape_file(tmp_path, monkeypatch):
    from cake_core.problems import base, get_problem
    (tmp_path / "broken.csv").write_text("M,N,K,role\n64,64,x,headline\n")
    (tmp_path / "short.csv").write_text("M,N,role\n64,64,headline\n")
    with pytest.raises(base.ShapeSetError, match=r"broken.csv:2: every dimension must be a positive integer"):
        base.load_shape_set(get_problem("gemm_bf16"), str(tmp_path / "broken.csv"))
    with pytest.raises(base.ShapeSetError, match=r"lacks column\(s\) K"):
        base.load_shape_set(get_problem("gemm_bf16"), str(tmp_path / "short.csv"))


def test_no_gpu_when_required(tmp_path):
    p = _run(["evolve", "gemm_bf16"], tmp_path, {"CAKE_GPU": "require"})
    assert p.returncode == 1
    assert "no NVIDIA GPU found" in _one_line(p)


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _run(["evolve", "gemm_bf16"], tmp_path, {"CAKE_PREFECT_PORT": str(port)})
    assert p.returncode == 1
    line = _one_line(p)
    assert f"port {port} is in use by another program" in line and "CAKE_PREFECT_PORT=" in line


def test_malformed_ir_file(tmp_path):
    f = tmp_path / "k.cake"
    f.write_text("@kernel(target=\"sm_90a\", grid=(1,), threads=128)\ndef k(a: gmem[bf16, (N,)]):\n    lod(a)\n")
    p = _run(["check", str(f)], tmp_path)
    assert p.returncode == 1
    assert "k.cake:3:5: error[parse.unknown_op]: unknown op `lod`" in p.stdout
    assert "hint:" in p.stdout and "Traceback" not in p.stdout + p.stderr


@pytest.mark.services
def test_killed_run_loses_nothing_it_recorded(tmp_path, services, share_compile_cache):
    share_compile_cache(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAKE_")}
    env.update({"CAKE_HOME": str(tmp_path), "CAKE_GPU": "off", "CAKE_PREFECT_API_URL": services["api_url"]})
    proc = subprocess.Popen([CAKE, "evolve", "gemm_bf16", "--generations", "30", "--population", "6"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "stderr.txt", "w"), start_new_session=True)
    wh_root = tmp_path / "warehouse"
    seen, deadline = 0, time.monotonic() + 600      # its own Ray and first generation, on a busy machine
    try:
        while time.monotonic() < deadline and seen < 8 and proc.poll() is None:
            time.sleep(0.5)
            if (wh_root / "SCHEMA_VERSION").exists():
                seen = Warehouse(wh_root).query("select count(*) as n from attempts").to_pylist()[0]["n"]
        assert seen >= 8, ("the run recorded too little before the kill: "
                           + (tmp_path / "stderr.txt").read_text()[-2000:])
    finally:        # killed whatever happened: a failed wait leaves no run behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    after = Warehouse(wh_root).query("select count(*) as n, count(distinct attempt_id) as d from attempts").to_pylist()[0]
    assert after["n"] >= seen and after["d"] == after["n"], "attempts lost or duplicated by the kill"
    # the warehouse still answers through the CLI, and the next run appends to it
    p = _run(["sql", "select outcome, count(*) from attempts group by 1"], tmp_path,
             {"CAKE_PREFECT_API_URL": services["api_url"]})
    assert p.returncode == 0, p.stderr
    (killed,) = Warehouse(wh_root).query("select run_id, status from runs_latest").to_pylist()
    log = tmp_path / "logs" / "cli.log"
    why = (tmp_path / "stderr.txt").read_text()[-2000:] + (log.read_text()[-3000:] if log.exists() else "")
    assert killed["status"] == "running", f"the run ended {killed['status']} before the kill: {why}"
    import ray
    p = _run(["evolve", "gemm_bf16", "--generations", "1", "--population", "3"], tmp_path,   # on the session's Ray
             {"CAKE_PREFECT_API_URL": services["api_url"], "CAKE_RAY_ADDRESS": ray.get_runtime_context().gcs_address},
             timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"marked 1 run(s) whose process died as crashed: {killed['run_id']}" in p.stdout
    final = Warehouse(wh_root).query("select count(*) as n from attempts").to_pylist()[0]["n"]
    assert final >= after["n"] + 3
    status = {r["run_id"]: r["status"] for r in
              Warehouse(wh_root).query("select run_id, status from runs_latest").to_pylist()}
    assert status[killed["run_id"]] == "crashed"
    assert sorted(status.values()) == ["completed", "crashed"]


def test_cake_run_on_the_cpu(tmp_path):
    from cake_core.problems import get_problem
    seed = get_problem("gemm_bf16").seed_text()
    good, wrong = tmp_path / "good.cake", tmp_path / "wrong.cake"
    good.write_text(seed)
    wrong.write_text(seed.replace("tile(kt, BK), tile(bid.x, BN)", "tile(kt, BK), tile(bid.y, BN)"))
    p = _run(["run", str(good), "--problem", "gemm_bf16", "--shape", "M=96,N=80,K=72", "--shape", "M=33,N=17,K=9"],
             tmp_path)
    assert p.returncode == 0 and p.stdout.count("yes") == 2, p.stdout + p.stderr
    p = _run(["run", str(wrong), "--problem", "gemm_bf16", "--shape", "M=96,N=80,K=72"], tmp_path)
    assert p.returncode == 1 and "NO" in p.stdout
    p = _run(["run", str(good), "--problem", "gemm_bf16", "--shape", "M=96"], tmp_path)
    assert p.returncode == 2 and "must give exactly M, N, K" in _one_line(p)


def test_cake_ops_prints_the_reference(tmp_path):
    p = _run(["ops"], tmp_path)
    assert p.returncode == 0
    assert "# Cake IR reference" in p.stdout and "`mma`" in p.stdout and "races.smem" in p.stdout


@pytest.mark.services
def test_harness_review_with_nothing_to_propose(tmp_path, services):
    Warehouse(tmp_path / "warehouse")
    p = _run(["harness", "review"], tmp_path, {"CAKE_PREFECT_API_URL": services["api_url"]})
    assert p.returncode == 0, p.stderr
    assert "no cluster yielded a proposal" in p.stdout
