"""A run's stop, seal, status and crash detection (tasks.run_control), without services."""
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime

import pytest

from tasks import run_control as rc
from warehouse import Warehouse


@pytest.fixture
def run_id():
    rid = f"r-{uuid.uuid4().hex[:8]}"
    yield rid
    rc.forget(rid)


def _row(run_id, status="running"):
    return {"run_id": run_id, "problem": "gemm_bf16", "shape_set": "gemm_small", "harness_version": 0,
            "agent": "tactic", "seed": 0, "generations": 1, "population": 2, "host": "h",
            "started_at": datetime(2026, 12, 1), "status": status}


def _status(root, run_id):
    rows = Warehouse(root).query("select status from runs_latest where run_id = ?", [run_id]).to_pylist()
    return rows[0]["status"] if rows else None


def test_a_stopped_run_writes_nothing_more_whatever_names_it(run_id):
    with rc.writing(iter([run_id, run_id])):      # a generator, as record() passes
        pass
    rc.request_stop(run_id)
    for ids in (iter([run_id]), [run_id], (r for r in ["other", run_id])):
        with pytest.raises(rc.RunCancelled):
            with rc.writing(ids):
                pytest.fail("a stopped run was written")
    with rc.writing(["another-run"]):              # other runs go on
        pass
    rc.forget("another-run")


def test_a_stop_of_every_run_reaches_runs_begun_before_and_after_it_until_cleared(run_id):
    later = f"{run_id}-later"
    try:
        rc.request_stop_all()
        for rid in (run_id, later):                 # one already known, one the process starts afterwards
            assert rc.stop_requested(rid)
            with pytest.raises(rc.RunCancelled):
                rc.raise_if_stopped(rid)
            with pytest.raises(rc.RunCancelled):
                with rc.writing([rid]):
                    pytest.fail("a run was written after every run was asked to stop")
    finally:
        rc.clear_stop_all()
        rc.forget(later)
    assert not rc.stop_requested(run_id)
    with rc.writing([run_id]):
        pass


def test_seal_waits_for_the_write_in_progress_and_blocks_the_next(run_id):
    order = []
    entered = threading.Event()

    def write():
        with rc.writing([run_id]):
            entered.set()
            time.sleep(0.3)
            order.append("write done")

    t = threading.Thread(target=write)
    t.start()
    entered.wait(10)
    rc.seal(run_id)
    order.append("sealed")
    t.join()
    assert order == ["write done", "sealed"]
    assert rc.sealed(run_id) and rc.stop_requested(run_id)
    with pytest.raises(rc.RunCancelled):
        with rc.writing([run_id]):
            pass


def test_end_run_records_the_status_unless_sealed(tmp_path, run_id):
    root = tmp_path / "wh"
    hold = rc.begin_run(root, _row(run_id))
    assert _status(root, run_id) == "running" and hold.path.exists()
    with pytest.raises(rc.ResumeRefused, match=f"run `{run_id}` is being run right now \\(by pid {os.getpid()}\\)"):
        rc.RunLock(root, run_id)                           # one lock: the run's process holds it
    rc.end_run(root, hold, _row(run_id), "completed")
    assert _status(root, run_id) == "completed"
    rc.RunLock(root, run_id).release()                    # released with the run

    other = f"{run_id}-b"
    hold = rc.begin_run(root, _row(other))
    rc.seal(other)
    rc.end_run(root, hold, _row(other), "cancelled")     # whoever sealed it records the status
    assert _status(root, other) == "running"
    assert rc.record_cancelled(root, other) is True and _status(root, other) == "cancelled"
    assert rc.record_cancelled(root, other) is False      # a final status is never overwritten
    rc.forget(other)


@pytest.mark.parametrize("exc, status", [(None, "completed"), (rc.RunCancelled("x"), "cancelled"),
                                         (KeyboardInterrupt(), "cancelled"), (ValueError("x"), "failed")])
def test_status_for(exc, status):
    assert rc.status_for(exc) == status


def test_any_end_of_a_run_asked_to_stop_is_a_cancellation(run_id):
    assert rc.status_for(RuntimeError("Ray has not been started"), run_id) == "failed"
    rc.request_stop(run_id)
    assert rc.status_for(RuntimeError("Ray has not been started"), run_id) == "cancelled"


def test_status_for_a_worker_cancellation():
    class TerminationSignal(Exception):   # what Prefect raises in a flow run its worker cancels
        pass

    assert rc.status_for(TerminationSignal()) == "cancelled"


_HOLDER = """
import sys, time
from tasks.run_control import begin_run
from datetime import datetime
hold = begin_run(sys.argv[1], {"run_id": sys.argv[2], "problem": "gemm_bf16", "shape_set": "s",
    "harness_version": 0, "agent": "tactic", "seed": 0, "generations": 1, "population": 1, "host": "h",
    "started_at": datetime(2026, 12, 1)})
print("ready", flush=True)
time.sleep(600)
"""


def test_a_run_whose_process_was_killed_is_marked_crashed_by_the_next_start(tmp_path, run_id):
    root = tmp_path / "wh"
    Warehouse(root)
    holders = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), rid], stdout=subprocess.PIPE,
                                text=True) for rid in (run_id, f"{run_id}-alive")]
    try:
        for h in holders:
            assert h.stdout.readline().strip() == "ready"
        assert rc.mark_crashed(root) == []                 # both alive: nothing to mark
        holders[0].kill()
        holders[0].wait()
        assert rc.mark_crashed(root) == [run_id]
        assert _status(root, run_id) == "crashed" and _status(root, f"{run_id}-alive") == "running"
        assert rc.mark_crashed(root) == []                 # once only
    finally:
        for h in holders:
            h.kill()
            h.wait()


@pytest.mark.services
def test_the_actor_pool_gives_up_a_batch_once_its_run_is_asked_to_stop(services):
    import os

    import ray

    from tasks.workers import ActorPool

    @ray.remote(num_cpus=0.25)
    class Slow:
        def ident(self):
            return ray.get_runtime_context().get_node_id(), os.getpid()

        def wait(self, seconds):
            time.sleep(seconds)
            return seconds

    stop = threading.Event()
    pool = ActorPool(lambda: Slow.remote(), 1, should_stop=stop.is_set)
    try:
        assert pool.map("wait", [(0.1,)], 60) == [0.1]
        threading.Timer(1.0, stop.set).start()
        t0 = time.monotonic()
        with pytest.raises(rc.RunCancelled):
            pool.map("wait", [(300,), (300,)], 600)
        assert time.monotonic() - t0 < 60, "the pool waited for its jobs instead of giving up"
    finally:
        pool.shutdown()
