"""ActorPool on the CPU (real local Ray): per-job watchdogs, kill + replace, waiting for the killed process to exit."""
from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")

from tasks.workers import ActorPool, Fault, _gone  # noqa: E402


@ray.remote(num_cpus=1)
class Toy:
    def ident(self):
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def work(self, what: str):
        if what == "hang":
            time.sleep(3600)
        if what == "die":
            os._exit(3)
        if what == "poison":
            return {"restart": True, "pid": os.getpid()}
        return {"value": what, "pid": os.getpid()}


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():      # the flow tests' session Ray: share it
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_hang_die_and_poison_are_isolated_and_replaced(local_ray):
    pool = ActorPool(lambda: Toy.remote(), 1)
    first_pid = pool.idents[pool.actors[0]][1]
    jobs = [("a",), ("hang",), ("b",), ("die",), ("c",), ("poison",), ("d",)]
    t0 = time.monotonic()
    out = pool.map("work", jobs, [30, 2, 30, 30, 30, 30, 30])      # one watchdog per job
    assert time.monotonic() - t0 < 60
    assert out[0]["value"] == "a" and out[0]["pid"] == first_pid
    assert isinstance(out[1], Fault) and out[1].outcome == "timeout" and "killed" in out[1].message
    assert _gone(first_pid)                 # the hung process was waited for before the next job
    assert out[2]["value"] == "b" and out[2]["pid"] != first_pid
    assert isinstance(out[3], Fault) and out[3].outcome == "runtime_fault"
    assert out[4]["value"] == "c" and out[4]["pid"] != out[2]["pid"]
    assert out[6]["value"] == "d" and out[6]["pid"] != out[5]["pid"]     # restarted after the poison answer
    assert pool.replaced == 3
    # every job is charged the time it held its worker, the hang its whole watchdog bound
    assert len(pool.elapsed) == len(jobs) and 2.0 <= pool.elapsed[1] < 5.0
    assert all(0.0 < pool.elapsed[i] < 2.0 for i in (0, 2, 4, 6))
    pool.shutdown()


def test_timeouts_must_match_jobs(local_ray):
    pool = ActorPool(lambda: Toy.remote(), 1)
    with pytest.raises(ValueError):
        pool.map("work", [("a",), ("b",)], [1.0])
    pool.shutdown()


def test_gone():
    assert not _gone(os.getpid())
    assert _gone(2 ** 22 + 12345)
