"""Process bodies for the concurrency tests (run in forked children of a preloaded forkserver)."""

from __future__ import annotations

import os
import sys
import time
import traceback

from wh_fixtures import attempt


def writer(root: str, name: str, batches: int, rows_per_batch: int, log_path: str, pause_s: float = 0.0) -> None:
    """Append batches of attempts; print one 'ack <batch> <rows>' line after each append returns."""
    from warehouse import Warehouse

    sys.stdout = open(log_path, "w", buffering=1)
    wh = Warehouse(root)
    for b in range(batches):
        rows = [attempt(b * rows_per_batch + i, run_id=name) for i in range(rows_per_batch)]
        n = wh.append("attempts", rows)
        print(f"ack {b} {n}", flush=True)
        if pause_s:
            time.sleep(pause_s)


def reader(root: str, stop_path: str, log_path: str) -> None:
    """Count attempts in a loop until ``stop_path`` exists; print 'count <n> <distinct>' or 'error ...'."""
    from warehouse import Warehouse

    sys.stdout = open(log_path, "w", buffering=1)
    wh = Warehouse(root)
    while not os.path.exists(stop_path):
        try:
            n = wh.query("select count(*) n, count(distinct attempt_id) d from attempts").to_pylist()[0]
            print(f"count {n['n']} {n['d']}", flush=True)
        except Exception:  # noqa: BLE001 - the test asserts there are none
            print("error " + traceback.format_exc().replace("\n", " | "), flush=True)
    os._exit(0)


def view_reader(root: str, stop_path: str, log_path: str) -> None:
    """Query every view in a loop until ``stop_path`` exists; print 'views <attempts>' or 'error ...'."""
    from warehouse import Warehouse

    sys.stdout = open(log_path, "w", buffering=1)
    wh = Warehouse(root)
    while not os.path.exists(stop_path):
        try:
            for view in wh.schema.views:
                wh.query(f"select count(*) from {view}")
            n = wh.query("select count(*) n from attempts").to_pylist()[0]["n"]
            print(f"views {n}", flush=True)
        except Exception:  # noqa: BLE001 - the test asserts there are none
            print("error " + traceback.format_exc().replace("\n", " | "), flush=True)
    os._exit(0)


def compactor(root: str, stop_path: str, log_path: str) -> None:
    """Compact attempts every 0.2 s until ``stop_path`` exists; print 'merged <files>'."""
    from warehouse import Warehouse

    sys.stdout = open(log_path, "w", buffering=1)
    wh = Warehouse(root)
    while not os.path.exists(stop_path):
        print(f"merged {wh.compact('attempts', grace_s=0.5)}", flush=True)
        time.sleep(0.2)
