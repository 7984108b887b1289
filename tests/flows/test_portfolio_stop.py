"""Ctrl-C on a real `cake portfolio`: the region in flight stops, the stop is said in one line (no traceback, no
Prefect error lines), what the region recorded is kept, and the same command would go on from there. The
interrupt could be swallowed (raised inside a DuckDB query) and the region's run went on after the Ctrl-C (1 run
of 4, 2026-12-07): the stop is now also asked of every run of the process (run_control.request_stop_all)."""
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import sibling

pytestmark = pytest.mark.services

_stop = sibling.load(Path(__file__).parent / "test_stop.py")
# the stop unwinds the region's flow, then Ray and the home's Prefect server shut down: seconds alone, minutes on a
# 2-core machine that runs the rest of the suite beside it; the bound is on an exit, not on its speed
STOP_WAIT_S = 360
ROWS = ["16,16,32", "24,16,40", "16,24,48", "96,96,96", "128,96,112", "112,128,128"]


def test_ctrl_c_stops_the_portfolio_in_one_line_and_keeps_what_it_recorded(tmp_path, share_compile_cache):
    marker = f"CAKE_TEST_MARK={uuid.uuid4().hex}"
    share_compile_cache(tmp_path / "home")
    csv = tmp_path / "mine.csv"
    csv.write_text("M,N,K,role\n" + "".join(f"{r},headline\n" for r in ROWS))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAKE_", "PREFECT_"))}
    env.update({"CAKE_HOME": str(tmp_path / "home"), "CAKE_GPU": "off", "CAKE_PREFECT_PORT": str(_stop._free_port()),
                marker.split("=")[0]: marker.split("=")[1]})
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    proc = subprocess.Popen([_stop.CAKE, "portfolio", "gemm_bf16", "--shapes", str(csv), "--regions", "2",
                             "--generations", "40", "--population", "4"],
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out.open("w"), stderr=err.open("w"),
                            start_new_session=True, preexec_fn=_stop._as_from_a_terminal)
    root = tmp_path / "home" / "warehouse"
    try:
        _stop._wait_for_attempts(proc, root, tmp_path, 4)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(STOP_WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = out.read_text() + err.read_text()
    assert rc != 0, said
    assert "Traceback" not in said and "| ERROR" not in said, said
    stops = [ln for ln in said.splitlines() if "stopped" in ln and "run the same command again" in ln]
    assert len(stops) == 1, said
    assert _stop._attempts(root) >= 4
    deadline = time.monotonic() + 30
    while _stop.marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _stop.marked(marker) == [], "processes left behind: " + _stop.described(_stop.marked(marker))
