"""Ctrl-C and SIGTERM on a real `cake evolve`: it stops, says what it recorded, writes nothing after, leaves nothing.

Each run has its own home and its own embedded Prefect server and Ray, so that
"no process left behind" covers them. Every process the run starts inherits a
marker in its environment; none may be alive once `cake` has exited.
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
STOP_BOUND_S = 10.0    # from the signal to the exit of `cake`


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_from_a_terminal() -> None:
    # A test runner may run with SIGINT ignored (a background job), and an ignored SIGINT is
    # inherited, so Ctrl-C would never arrive; a command typed in a terminal has the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _attempts(root: Path) -> int:
    if not (root / "SCHEMA_VERSION").exists():
        return 0
    return Warehouse(root).query("select count(*) as n from attempts").to_pylist()[0]["n"]


def _start(tmp_path: Path, marker: str) -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAKE_", "PREFECT_"))}
    env.update({"CAKE_HOME": str(tmp_path / "home"), "CAKE_GPU": "off", "CAKE_PREFECT_PORT": str(_free_port()),
                marker.split("=")[0]: marker.split("=")[1]})
    out = tmp_path / "out.txt"
    proc = subprocess.Popen([CAKE, "evolve", "gemm_bf16", "--generations", "60", "--population", "6"],
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out.open("w"),
                            stderr=(tmp_path / "err.txt").open("w"), start_new_session=True,
                            preexec_fn=_as_from_a_terminal)
    return proc, out


def _wait_for_attempts(proc: subprocess.Popen, root: Path, tmp_path: Path, n: int) -> None:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and _attempts(root) < n:
        assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
        time.sleep(0.5)
    assert _attempts(root) >= n, "the run recorded too little: " + (tmp_path / "err.txt").read_text()[-3000:]


def _flow_run_states(home: Path, run_id: str) -> list[str]:
    """The Prefect states of the run's flow runs, as the home's own server recorded them in its database (read
    once `cake` and its server have exited; starting the server again to ask it costs ~20 s a test)."""
    import json
    import sqlite3
    from contextlib import closing

    db = home / "prefect" / "prefect.db"
    assert db.exists(), f"no Prefect database in {home}"
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("select state_type, tags from flow_run").fetchall()
    return [state for state, tags in rows if f"cake-run:{run_id}" in json.loads(tags or "[]")]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stop_is_prompt_final_recorded_and_leaves_nothing(tmp_path, how, share_compile_cache):
    marker = f"CAKE_TEST_MARK={uuid.uuid4().hex}"
    share_compile_cache(tmp_path / "home")     # its own home, server and Ray; the session's cubins
    proc, out = _start(tmp_path, marker)
    root = tmp_path / "home" / "warehouse"
    try:
        _wait_for_attempts(proc, root, tmp_path, 6)
        t0 = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)     # what a terminal sends: to the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGTERM)      # what a scheduler or `timeout` sends: to `cake` alone
        rc = proc.wait(120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stdout, stderr = out.read_text(), (tmp_path / "err.txt").read_text()
    print(f"{how}: exit {rc} after {took:.1f} s")
    assert rc == 130, stdout + stderr
    assert took <= STOP_BOUND_S, f"stopping took {took:.1f} s"
    said = [ln for ln in stdout.splitlines() if ln.startswith("stopped. recorded ")]
    assert len(said) == 1, stdout
    recorded = int(said[0].split()[2])
    assert recorded >= 6
    assert "Traceback" not in stderr and "Error logging" not in stderr, stderr
    assert len([ln for ln in stderr.splitlines() if ln.strip()]) <= 1, stderr   # at most "error: interrupted"
    deadline = time.monotonic() + 30
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)   # a process the kernel has not reaped yet
    assert marked(marker) == [], "processes left behind: " + described(marked(marker))
    assert _attempts(root) == recorded, "attempts were written after the count was printed"
    wh = Warehouse(root)
    (run,) = wh.query("select run_id, status, finished_at from runs_latest").to_pylist()
    assert run["status"] == "cancelled" and run["finished_at"] is not None
    assert run["run_id"] in said[0]
    assert _flow_run_states(tmp_path / "home", run["run_id"]) == ["CANCELLED"]
