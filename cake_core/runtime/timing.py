"""The timing protocol, one for our kernels (``runtime.gpu``) and the peers (``runtime.peers``) alike.

Each timed region is: the untimed ``setup`` (a peer's accumulator reset), an L2 flush (a read of
:data:`L2_FLUSH_BYTES`, twice the largest L2 of the GPUs in the target data, so the timed run starts
cold and clean), the untimed ``before`` (a probe's hold), then the body between its own pair of CUDA events.
Medians, p10 and p90 of at least :data:`MIN_REPS` regions; with a cutoff, a run whose median over its first
:data:`CUTOFF_MIN_REPS` regions is above it stops there (the search's clear losers, ``tasks.stages``). Inputs smaller than :data:`ROTATE_BELOW_BYTES`
rotate among :data:`MAX_COPIES` device copies; under the graph timer, one replay of a CUDA graph runs
:func:`graph_launches` launches back to back, each on its own copy. A :class:`Clock` names the CUDA
events of the array library that times (CuPy for ours, torch for the peers); nothing here imports either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cake_core.targets import largest_l2_bytes

L2_FLUSH_BYTES = 2 * largest_l2_bytes()     # read before every timed region: 256 MiB for a 128 MiB L2
ROTATE_BELOW_BYTES = 64 << 20               # inputs smaller than this are rotated among copies
MAX_COPIES = 4
MIN_REPS = 20
CUTOFF_MIN_REPS = 3              # regions timed before a cutoff may stop a run: a median of 3 ignores one outlier
TIMERS = {"event": "cuda_event", "graph": "cuda_graph"}   # timer= -> the name recorded with the times
GRAPH_LAUNCHES = 8               # launches per replay under timer="graph", each on its own input copy
GRAPH_COPY_BYTES = 8 << 30       # at most this much in input copies: fewer launches per replay (>= 2) above
L2_STATE = "cold-clean"          # what every timed region starts from (recorded with the times)


@dataclass(frozen=True)
class Clock:
    """The CUDA events of one array library: ``event()`` makes one (its ``record(stream)`` marks the stream),
    ``elapsed_ms(start, end)`` reads a pair."""

    event: Callable[[], Any]
    elapsed_ms: Callable[[Any, Any], float]


def cupy_clock(cp: Any) -> Clock:
    return Clock(cp.cuda.Event, lambda s, e: float(cp.cuda.get_elapsed_time(s, e)))


def torch_clock(torch: Any) -> Clock:
    return Clock(lambda: torch.cuda.Event(enable_timing=True), lambda s, e: float(s.elapsed_time(e)))


def graph_launches(in_bytes: int) -> int:
    """How many launches (and input copies) one replay of the graph timer holds for inputs of ``in_bytes``."""
    return max(2, min(GRAPH_LAUNCHES, GRAPH_COPY_BYTES // max(in_bytes, 1)))


def input_copies(in_bytes: int, timer: str = "event") -> int:
    """How many device copies of inputs of ``in_bytes`` the timed runs rotate among."""
    if timer == "graph":
        return graph_launches(in_bytes)
    return MAX_COPIES if in_bytes < ROTATE_BELOW_BYTES else 1


def time_regions(clock: Clock, reps: int, stream: Any, flush: Callable[[Any], None], body: Callable[[int], None],
                 wait: Callable[[], None], before: Callable[[], None] | None = None,
                 setup: Callable[[], None] | None = None, cutoff_ms: float | None = None) -> list[float]:
    """ms of each of ``reps`` timed regions (see the module doc); ``wait`` waits for them all (under a
    watchdog where the caller has one).

    With ``cutoff_ms``, the first :data:`CUTOFF_MIN_REPS` regions are timed and waited for on their own; when
    their median is above ``cutoff_ms`` the others are not run, and only those times come back (fewer than
    ``reps``). Otherwise the rest follow and every time comes back, as without a cutoff."""
    if cutoff_ms is None or reps <= CUTOFF_MIN_REPS:
        return _regions(clock, range(reps), stream, flush, body, wait, before, setup)
    first = _regions(clock, range(CUTOFF_MIN_REPS), stream, flush, body, wait, before, setup)
    if float(np.median(first)) > cutoff_ms:
        return first
    return first + _regions(clock, range(CUTOFF_MIN_REPS, reps), stream, flush, body, wait, before, setup)


def _regions(clock: Clock, indices: range, stream: Any, flush: Callable[[Any], None], body: Callable[[int], None],
             wait: Callable[[], None], before: Callable[[], None] | None,
             setup: Callable[[], None] | None) -> list[float]:
    """The timed regions ``indices`` (``body`` gets the index: which input copy it runs on), all enqueued, then
    waited for once."""
    starts = [clock.event() for _ in indices]
    ends = [clock.event() for _ in indices]
    for i, r in enumerate(indices):
        if setup is not None:
            setup()
        flush(stream)
        if before is not None:
            before()
        starts[i].record(stream)
        body(r)
        ends[i].record(stream)
    wait()
    return [clock.elapsed_ms(s, e) for s, e in zip(starts, ends)]


def stats(ms: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of the times."""
    a = np.asarray(ms, dtype=np.float64)
    return float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90))
