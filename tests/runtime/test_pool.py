"""ActorPool on the CPU (real local Ray): per-job watchdogs, kill + replace, waiting for the killed process to exit."""
from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip("ray")

from tasks.processes import alive  # noqa: E402
from tasks.workers import ActorPool, Fault  # noqa: E402


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
    assert not alive(first_pid)                 # the hung process was waited for before the next job
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


def test_alive():
    assert alive(os.getpid())
    assert not alive(2 ** 22 + 12345)


@ray.remote(num_cpus=0)
class Runner:
    """Answers batches as tasks.workers.GpuRunner does: one verdict per job in order, stopping at a poison."""

    def ident(self):
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run_batch(self, jobs):
        out = []
        for key, what in jobs:
            if what == "hang":
                time.sleep(3600)
            if what == "die":
                os._exit(3)
            out.append((key, what, os.getpid()))
            if what == "poison":
                return {"verdicts": out, "restart": True}
        return {"verdicts": out, "restart": False}


def _units(spec, timeout=30.0):
    from tasks.workers import Unit
    return [Unit(key, (key, what), timeout, group=key[1]) for key, what in spec]


def test_units_spread_over_actors_in_batches_of_one_group(local_ray):
    pool = ActorPool(lambda: Runner.remote(), 2)
    spec = [((i, j), "ok") for j in range(3) for i in range(4)]
    got = pool.run_units("run_batch", _units(spec), batch=4)
    assert set(got) == {k for k, _ in spec} and all(v[1] == "ok" for v in got.values())
    by_pid = {}
    for (i, j), (_, _, pid) in got.items():
        by_pid.setdefault(pid, set()).add(j)
    assert len(by_pid) == 2 and pool.replaced == 0          # both actors worked
    pool.shutdown()


def test_a_poisoned_actor_is_replaced_and_the_rest_of_its_batch_runs_on_the_fresh_one(local_ray):
    pool = ActorPool(lambda: Runner.remote(), 1)
    spec = [((0, 0), "ok"), ((1, 0), "poison"), ((2, 0), "ok"), ((3, 0), "ok")]
    got = pool.run_units("run_batch", _units(spec), batch=4)
    assert [got[(i, 0)][1] for i in range(4)] == ["ok", "poison", "ok", "ok"]
    assert got[(0, 0)][2] == got[(1, 0)][2] != got[(2, 0)][2] == got[(3, 0)][2] and pool.replaced == 1
    pool.shutdown()


def test_a_death_or_a_hang_in_a_batch_is_found_alone_and_the_others_are_answered(local_ray):
    pool = ActorPool(lambda: Runner.remote(), 1)
    spec = [((0, 0), "ok"), ((1, 0), "die"), ((2, 0), "ok"), ((3, 1), "ok"), ((4, 1), "hang"), ((5, 1), "ok")]
    units = _units(spec)
    units[4].timeout_s = 2.0
    for u in units[3:]:
        u.timeout_s = 2.0
    got = pool.run_units("run_batch", units, batch=3)
    assert isinstance(got[(1, 0)], Fault) and got[(1, 0)].outcome == "runtime_fault"
    assert isinstance(got[(4, 1)], Fault) and got[(4, 1)].outcome == "timeout"
    assert all(got[k][1] == "ok" for k in [(0, 0), (2, 0), (3, 1), (5, 1)])
    pool.shutdown()


def test_skipped_units_are_not_run(local_ray):
    pool = ActorPool(lambda: Runner.remote(), 1)
    failed = set()
    spec = [((0, 0), "poison"), ((1, 0), "ok"), ((0, 1), "ok"), ((1, 1), "ok")]
    got = pool.run_units("run_batch", _units(spec), batch=1, skip=lambda k: k[0] in failed,
                         on_answer=lambda k, v: failed.add(k[0]) if v[1] == "poison" else None)
    assert set(got) == {(0, 0), (1, 0), (1, 1)}       # candidate 0's second shape was dropped
    pool.shutdown()


@ray.remote(num_cpus=0)
class NeverUp:
    """A replacement that never comes up (its GPU went with a lost node): it fails to start."""

    def __init__(self):
        raise RuntimeError("no GPU of the model left")

    def ident(self):
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run_batch(self, jobs):
        raise AssertionError("a worker that never came up must not be given work")


def _factory(good: int):
    made = []

    def make():
        made.append(1)
        return Runner.remote() if len(made) <= good else NeverUp.remote()
    return make


def test_a_replacement_that_never_comes_up_is_dropped_and_the_others_take_its_work(local_ray):
    from tasks.workers import PoolExhausted
    pool = ActorPool(_factory(3), 2)     # the second death gets a NeverUp
    spec = [((0, 0), "ok"), ((1, 0), "die"), ((2, 0), "ok"), ((0, 1), "ok"), ((1, 1), "ok"), ((2, 1), "ok")]
    got = pool.run_units("run_batch", _units(spec), batch=3)
    assert pool.dropped == 1 and pool.size == 1
    assert isinstance(got[(1, 0)], Fault)
    survivor = {got[k][2] for k in got if k != (1, 0)}
    assert len(survivor) <= 2 and all(got[k][1] == "ok" for k in got if k != (1, 0))
    assert {w.key for w in pool.lost} >= {(0, 0), (1, 0), (2, 0)} and {w.cause for w in pool.lost} == {"died"}
    pool.shutdown()
    alone = ActorPool(_factory(1), 1)
    with pytest.raises(PoolExhausted, match="every worker of the pool was lost and a new one did not start"):
        alone.run_units("run_batch", _units([((0, 0), "die"), ((1, 0), "ok")]), batch=2)
    alone.shutdown()
