"""Measuring a problem's peers (``Problem.peers``, written with ``cake_core.problems.peer``) on the GPU, on the
problem's own inputs, with the protocol our kernels are timed with.

``make_peer(problem, peer, inputs)`` takes the problem's inputs (``Problem.make_inputs``) onto the GPU through
the peer's factory and returns its :class:`PeerRun`: inputs drawn on the device (CuPy: the gate's own draw,
``problems.base.input_sampler(seed, shape, cupy)``, so a peer runs on the very values our kernels are checked
and timed on) are copied on the device, numpy inputs are uploaded. :func:`time_peer` times a peer with the
protocol our kernels are timed with (``runtime.timing``, as ``runtime.gpu.check_and_time`` uses it): CUDA events
around each run on one stream, warm-up first, a read of ``L2_FLUSH_BYTES`` before every timed run (cold, clean
L2), inputs rotated among up to 4 copies when they are small, median / p10 / p90 of at least 20 runs.
:func:`measure_peer` does both for one (seed, shape) as the gate does for our kernels: their device draw, their
(cached) reference, their check.

torch and the peers' libraries are imported only when a peer is made, so this module imports on a machine
with neither; a peer whose library is missing raises :class:`PeerUnavailable` with what to install.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cake_core.errors import CakeError
from cake_core.problems import get_problem
from cake_core.problems.base import Problem, Shape
from cake_core.problems.peer import PeerRun, PeerUnavailable, torch_cuda
from cake_core.runtime.gate import CheckInfo, compare_to, info_for
from cake_core.runtime.gpu import device_kind, device_reference
from cake_core.runtime.references import ReferenceCache
from cake_core.runtime.timing import (L2_FLUSH_BYTES, L2_STATE, MIN_REPS, TIMERS, input_copies, stats, time_regions,
                                      torch_clock)



def peer_names(problem: Problem | str) -> tuple[str, ...]:
    return tuple(get_problem(problem).peers)


def _factory(problem: Problem, peer: str):
    if not problem.peers:
        raise CakeError(f"problem `{problem.name}` names no peers (Problem.peers)")
    if peer not in problem.peers:
        raise CakeError(f"no peer `{peer}` for {problem.name}; its peers: {', '.join(problem.peers)}")
    return problem.peers[peer]


def require(problem: Problem | str, peer: str) -> None:
    """Raise :class:`PeerUnavailable` (saying what to install) unless ``peer`` can be made here (torch with a CUDA
    GPU; a peer's own library is checked when it is made); an unknown peer is a CakeError. A caller checks this
    before drawing any inputs."""
    _factory(get_problem(problem), peer)
    torch_cuda()


def make_peer(problem: Problem | str, peer: str, inputs: dict[str, Any], *, copies: int | None = None) -> PeerRun:
    """Take ``inputs`` (from ``Problem.make_inputs``: CuPy arrays, copied on the device, or numpy arrays, uploaded)
    onto the GPU and return the peer ready to run on those very values.

    ``copies``: how many device copies of the inputs to rotate among when timing; by default 4 when
    the inputs are under 64 MiB (as our kernels are timed), else 1. Raises :class:`PeerUnavailable`
    when the peer's library or a GPU is missing; an unknown peer is a CakeError.
    """
    problem = get_problem(problem)
    make = _factory(problem, peer)
    torch = torch_cuda()
    torch.cuda.synchronize()        # inputs drawn on another library's stream (CuPy's) are complete ...
    run = make(problem.name, inputs, copies if copies is not None else input_copies)
    torch.cuda.synchronize()        # ... and so are the peer's copies of them before time_peer's stream reads them
    return run


@dataclass(frozen=True)
class PeerMeasurement:
    """A peer on one shape: ``timing`` as :func:`time_peer` returns it, and the check of its last timed run's
    outputs (``correct``, ``max_error``, ``message``; ``check``: the rows and the reference it was checked on)."""

    timing: dict[str, Any]
    correct: bool
    max_error: float
    message: str
    check: CheckInfo


def measure_peer(problem: Problem, peer: str, shape: Shape, seed: int, *, reps: int,
                 refs: ReferenceCache | None = None, rows: int | None = None) -> PeerMeasurement:
    """Time ``peer`` on ``problem``'s inputs for (``seed``, ``shape``) and check it as the gate
    checks our kernels (``runtime.gpu.check_and_time``): the same input values, drawn on the device
    (``runtime.gpu.device_reference``); the same reference, from the cache ``refs`` when a kernel was checked
    there first (the hand-written baselines at the same seed); ``rows`` random output rows of a very large
    shape (the same rows); compared on the device, at the peer's own tolerance where it has one (a bf16 C).

    Raises :class:`PeerUnavailable` before drawing anything when the peer cannot run here, ``GPURefused`` when
    the reference does not fit in GPU memory; anything else a CUDA library raises is raised as it is."""
    require(problem, peer)               # before any draw: a missing torch or GPU costs nothing
    import cupy as cp  # noqa: PLC0415 - lazily: the module must import on CPU-only machines
    inputs, ref = device_reference(cp, problem, shape, seed, device_kind(), refs, rows)
    run = make_peer(problem, peer, inputs)
    try:
        t = time_peer(run, reps=reps)
        got = {n: cp.asarray(a) for n, a in run.fetch().items()}
        judged = problem if run.rtol is None else replace(problem, rtol=run.rtol)
        ok, err, msg = compare_to(judged, got, ref)
    finally:
        run.release()
    return PeerMeasurement(t, ok, err, msg, info_for(problem, shape, ref))


def time_peer(peer: PeerRun, *, reps: int = 20, warmup: int = 3, timer: str = "event") -> dict[str, Any]:
    """Median / p10 / p90 ms of ``peer.run`` with check_and_time's protocol (see the module doc).
    ``timer="graph"``: as check_and_time's graph timer, one CUDA graph (torch.cuda.CUDAGraph) of
    ``peer.copies`` back-to-back runs, each on its own input copy (make the peer with
    ``copies=cake_core.runtime.timing.graph_launches(...)``), its resets inside; ms per run.
    The last timed run's outputs stay in place for ``peer.fetch()``."""
    if timer not in TIMERS:
        raise ValueError(f"unknown timer {timer!r}: use one of {', '.join(TIMERS)}")
    torch = torch_cuda()
    reps = max(reps, MIN_REPS)
    stream = torch.cuda.Stream()
    l2 = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")   # read, as runtime.gpu.L2Flush

    def once(r: int) -> None:
        if peer.reset:
            peer.reset()
        peer.run(r)

    per = peer.copies if timer == "graph" else 1
    with torch.cuda.stream(stream):
        for r in range(max(warmup, per)):   # every copy once before a capture: lazy set-up stays outside
            once(r)
        stream.synchronize()
        run = once
        if timer == "graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for r in range(per):
                    once(r)
            for _ in range(warmup):
                graph.replay()
            stream.synchronize()
            run = lambda r: graph.replay()   # noqa: E731
        # the event timer also resets the accumulators outside the timed region, before the flush
        setup = peer.reset if timer == "event" else None
        ms = time_regions(torch_clock(torch), reps, stream, lambda s: l2.sum(), run, stream.synchronize,
                          setup=setup)
    med, p10, p90 = stats([m / per for m in ms])
    return {"median_ms": med, "p10_ms": p10, "p90_ms": p90, "runs": reps, "copies": peer.copies,
            "timer": f"{TIMERS[timer]} (torch)", "l2": L2_STATE}
