"""The timing protocol is one module, and the peers are timed by it as our kernels are."""
from __future__ import annotations

import contextlib
import types

import pytest

from cake_core.runtime import peers, timing
from cake_core.targets import get_gpu, known_gpus


def test_the_flush_is_twice_the_largest_l2_of_the_target_data():
    assert timing.L2_FLUSH_BYTES == 2 * max(get_gpu(g).l2_bytes for g in known_gpus()) == 256 << 20


def test_input_copies_rotate_small_inputs_and_fill_a_graph():
    assert timing.input_copies(1 << 20) == timing.MAX_COPIES == 4
    assert timing.input_copies(timing.ROTATE_BELOW_BYTES) == 1
    assert timing.input_copies(1 << 20, "graph") == timing.GRAPH_LAUNCHES
    assert timing.input_copies(timing.GRAPH_COPY_BYTES, "graph") == 2


class _Event:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def record(self, stream) -> None:
        self.log.append(self.name)


def _clock(log: list, reps: int) -> timing.Clock:
    """Events that log their recording: time_regions makes its ``reps`` start events, then its end events."""
    made = []

    def event() -> _Event:
        made.append(1)
        return _Event("start" if len(made) <= reps else "end", log)
    return timing.Clock(event, lambda s, e: 2.0)


def test_one_region_is_setup_flush_before_then_the_body_between_events():
    log: list[str] = []
    reps = 3
    ms = timing.time_regions(_clock(log, reps), reps, None, lambda s: log.append("flush"), lambda r: log.append(f"body {r}"),
                             lambda: log.append("wait"), before=lambda: log.append("before"),
                             setup=lambda: log.append("setup"))
    assert ms == [2.0] * reps
    assert log == [x for r in range(reps) for x in ("setup", "flush", "before", "start", f"body {r}", "end")] + ["wait"]


def _fake_torch(log: list, reps: int):
    made = {"n": 0}

    class Event:
        def __init__(self, enable_timing=True):
            made["n"] += 1
            self.name = "start" if made["n"] <= reps else "end"

        def record(self, stream):
            log.append(self.name)

        def elapsed_time(self, end):
            return 3.0

    class Stream:
        def synchronize(self):
            log.append("sync")

    class Buffer:
        def sum(self):
            log.append("flush")

    cuda = types.SimpleNamespace(Stream=Stream, Event=Event, stream=lambda s: contextlib.nullcontext(),
                                 is_available=lambda: True)
    return types.SimpleNamespace(cuda=cuda, zeros=lambda *a, **k: Buffer(), int32="int32")


def test_a_peer_is_timed_with_the_same_regions(monkeypatch):
    log: list[str] = []
    reps = timing.MIN_REPS
    monkeypatch.setattr(peers, "torch_cuda", lambda: _fake_torch(log, reps))
    run = peers.PeerRun("kmeans_update", "p", "lib", run=lambda i: log.append("run"), fetch=dict,
                        reset=lambda: log.append("reset"))
    t = peers.time_peer(run, reps=1, warmup=1)
    assert t["runs"] == reps and t["median_ms"] == 3.0 and t["timer"] == "cuda_event (torch)"
    assert t["l2"] == timing.L2_STATE
    timed = log[log.index("sync") + 1:]
    # the accumulators are reset outside the timed region, before the flush, and the run resets them again
    assert timed[:6] == ["reset", "flush", "start", "reset", "run", "end"]
    assert timed.count("flush") == reps and timed[-1] == "sync"


def test_an_unknown_timer_is_refused():
    with pytest.raises(ValueError, match="unknown timer"):
        peers.time_peer(peers.PeerRun("gemm_bf16", "p", "lib", run=lambda i: None, fetch=dict), timer="wall")


class _TimedEvent:
    def __init__(self, log: list):
        self.log = log

    def record(self, stream) -> None:
        self.log.append("event")


def _ms_clock(times: list[float], log: list) -> timing.Clock:
    """Events whose pairs read ``times`` in order, one per timed region."""
    left = list(times)
    return timing.Clock(lambda: _TimedEvent(log), lambda s, e: left.pop(0))


def _cut(times: list[float], reps: int, cutoff_ms: float | None) -> tuple[list[float], list]:
    log: list = []
    ms = timing.time_regions(_ms_clock(times, log), reps, None, lambda s: log.append("flush"),
                             lambda r: log.append(r), lambda: log.append("wait"), cutoff_ms=cutoff_ms)
    return ms, [x for x in log if x != "event"]


def test_a_cutoff_stops_the_timing_after_a_few_regions_whose_median_is_above_it():
    n = timing.CUTOFF_MIN_REPS
    assert n == 3
    ms, log = _cut([9.0, 1.0, 8.0] + [1.0] * 17, 20, cutoff_ms=5.0)
    assert ms == [9.0, 1.0, 8.0]                       # median 8 > 5: the other 17 regions are never run
    assert log == ["flush", 0, "flush", 1, "flush", 2, "wait"]


def test_a_cutoff_above_the_first_regions_median_times_every_rep_in_order():
    times = [9.0, 1.0, 2.0] + [float(r) for r in range(3, 20)]
    ms, log = _cut(times, 20, cutoff_ms=5.0)          # median 2 <= 5: the run goes on, copies rotate on
    assert ms == times
    assert [x for x in log if isinstance(x, int)] == list(range(20))
    assert log.index("wait") == 6 and log.count("wait") == 2
    assert _cut(times, 20, cutoff_ms=None) == (times, [x for r in range(20) for x in ("flush", r)] + ["wait"])
