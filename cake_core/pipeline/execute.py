"""Every call from the pipeline into the runtime, in one place: the interpreter's gate, the GPU's gate and
timing, and the peers.

Workers (Ray actors in ``tasks/workers.py``) call these and nothing else of ``cake_core.runtime``, so a change
of how references are computed or cached, or of the timing protocol, is wired in here. Each function answers
with :class:`~cake_core.pipeline.verdicts.ShapeVerdict` values, never raises for a candidate's own faults, and
keeps the runtime's protocol: fresh seeded inputs, poisoned outputs, the fp64 oracle, the perturbation check,
CUDA events after warm-up with L2 flushed. On a GPU the inputs are drawn and the references computed on the
device, cached under the Cake home (``runtime.references``); a very large shape is checked on a seeded random
subset of its output rows (:func:`gate_rows`). A candidate right on every shape of the run is then checked on
its own strict shapes (:func:`strict_check_shapes`), untimed. A peer is measured on the same device draw and
checked against the same (cached) reference as our kernels (:meth:`GpuSession.peer`).
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cake_core.errors import CakeError
from cake_core.outcome import Outcome
from cake_core.pipeline.verdicts import ShapeVerdict, Timing, as_strict, fault, from_cpu_check, from_gpu_run
from cake_core.problems import Problem, get_problem
from cake_core.problems.base import Shape, shape_key

DEFAULT_KERNEL_TIMEOUT_S = 30.0   # the runtime's own watchdog per wait on the GPU (see runtime.gpu)
# Above these a shape is checked on a random subset of its output rows (the reference of those rows alone, as
# bench/corpus_vs_peers.py does), our kernels and the peers alike: the fp64 reference of every row of the largest
# cells costs seconds, and a kernel's gate on the device does not need every row to catch a wrong index.
FULL_ORACLE_FLOPS = 2e10
FULL_ORACLE_BYTES = 2.5e8
# The strict gate of the check and time stages (runtime.strict): a candidate right on the run's shapes is checked
# on at most STRICT_SHAPES of its own strict shapes (the first wraps its rings and tiles every dimension with a
# tail, the next cross its thresholds), each under STRICT_MAX_WORK flops + bytes (the interpreter's budget).
STRICT_SHAPES = 2
STRICT_MAX_WORK = 4e8


@dataclass(frozen=True)
class GpuJob:
    """One candidate on one shape, as a GPU worker receives it: the lowering, the cubin's bytes (a worker
    on another node cannot read this machine's cache) and what to run it for. ``cutoff_ms``: stop timing
    after a few launches whose median is above it (the search's clear losers; ``runtime.gpu.check_and_time``);
    None, as for every job outside the search, times all ``reps``."""

    key: Any                     # the caller's handle (attempt index, shape index)
    lowered: Any                 # cake_core.lower.cuda.LoweredKernel
    cubin: bytes
    kernel_name: str
    problem: Problem | str       # the Problem (pickled to a worker as its reference), or its name
    shape: Shape
    seed: int
    reps: int
    time: bool = True
    cutoff_ms: float | None = None


def check_on_interpreter(program, problem: Problem | str, shapes: list[Shape], seed: int,
                         strict: bool = False) -> list[ShapeVerdict]:
    """The CPU correctness gate (``runtime.cpu.check_on_cpu``) on ``shapes``, one verdict per shape; with
    ``strict``, a candidate right on all of them is then checked on its strict shapes too
    (:func:`strict_check_shapes`), one verdict each of kind ``strict`` whose message says what the shape
    exercises. Cheap first: a candidate wrong on ``shapes`` pays nothing more."""
    from cake_core.runtime.cpu import check_on_cpu

    prob = get_problem(problem)
    t0 = time.monotonic()
    checks = check_on_cpu(program, prob, shapes, seed)
    per = (time.monotonic() - t0) / max(len(checks), 1)
    out = [from_cpu_check(c, per) for c in checks]
    if not strict or not all(v.correct for v in out):
        return out
    for shape, why in strict_check_shapes(program, prob, shapes):
        t0 = time.monotonic()
        (c,) = check_on_cpu(program, prob, [shape], seed)
        v = from_cpu_check(c, time.monotonic() - t0)
        out.append(as_strict(v, why))
        if not v.correct:
            break           # judged wrong already: the rest would cost without changing the verdict
    return out


def strict_check_shapes(program, problem, shapes: list[Shape]) -> list[tuple[Shape, str]]:
    """The strict shapes of ``program`` the check stage runs (``runtime.strict``), with what each exercises:
    at most ``STRICT_SHAPES`` of them, each under ``STRICT_MAX_WORK``, none of ``shapes``."""
    from cake_core.runtime.strict import strict_shapes

    given = [{d: int(s[d]) for d in problem.dims} for s in shapes]
    return strict_shapes(program, problem, STRICT_MAX_WORK).beyond(given)[:STRICT_SHAPES]


def gate_rows(problem, shape: Shape) -> int | None:
    """How many output rows the gate checks of ``shape`` (None: all of them; ``Problem.subset_rows`` above
    the full oracle's cost)."""
    prob = get_problem(problem)
    if prob.rows is None or (prob.flops(shape) <= FULL_ORACLE_FLOPS and prob.bytes(shape) <= FULL_ORACLE_BYTES):
        return None
    return prob.subset_rows


class GpuSession:
    """What one GPU worker keeps between jobs: the cubins it wrote to disk (by content hash), the reference
    cache (``refs_dir``: the Cake home's ``refs``; None: computed every time) and the GPU's name.

    Every candidate of a generation is checked on the same seeded inputs, drawn on the device per (problem,
    shape, seed); their references are computed once and cached (``runtime.references``).

    A fault or a hang leaves the process's CUDA context unusable: :meth:`run` then sets ``poisoned`` and
    refuses every later job, and the worker must be replaced.
    """

    def __init__(self, timeout_s: float = DEFAULT_KERNEL_TIMEOUT_S, refs_dir: str | Path | None = None):
        from cake_core.runtime.references import ReferenceCache

        self.timeout_s = timeout_s
        self.poisoned: str | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="cake-gpu-"))
        self._model: str | None = None
        self.refs = ReferenceCache(refs_dir) if refs_dir else None

    @property
    def gpu_model(self) -> str:
        if self._model is None:
            from cake_core.runtime.gpu import gpu_model
            self._model = gpu_model() or "unknown GPU"
        return self._model

    def _cubin(self, job: GpuJob) -> Path:
        path = self.dir / f"{hashlib.sha256(job.cubin).hexdigest()[:24]}.cubin"
        if not path.exists():
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(job.cubin)
            os.replace(tmp, path)
        return path

    def run(self, job: GpuJob) -> ShapeVerdict:
        """Gate (and time, with ``job.time``) one candidate on one shape."""
        from cake_core.lower.compile import Compiled
        from cake_core.runtime.gpu import check_and_time

        key = shape_key(job.shape)
        if self.poisoned:
            return fault(key, "gpu", Outcome.RUNTIME_FAULT,
                         f"worker refused: its CUDA context is unusable after {self.poisoned}")
        t0 = time.monotonic()
        try:
            compiled = Compiled(self._cubin(job), job.kernel_name, None, "", 0.0, True, job.lowered.target)
            (run,) = check_and_time(compiled, job.lowered, get_problem(job.problem), [job.shape], seed=job.seed,
                                    time=job.time, reps=job.reps, timeout_s=self.timeout_s, refs=self.refs,
                                    rows=gate_rows(job.problem, job.shape),
                                    cutoff_ms=job.cutoff_ms if job.time else None)
        except CakeError as e:     # refused before any launch (wrong GPU, compile-only target): not a fault
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, str(e), time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a CUDA error leaves the context unusable: report and get replaced
            self.poisoned = f"{type(e).__name__}: {e}"
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, self.poisoned, time.monotonic() - t0)
        v = from_gpu_run(key, run, self.gpu_model, time.monotonic() - t0)
        if v.outcome in (Outcome.RUNTIME_FAULT, Outcome.TIMEOUT):
            self.poisoned = f"{v.outcome.value}: {v.message}"
        return v

    def peer(self, problem: Problem | str, peer: str, shape: Shape, seed: int, reps: int) -> ShapeVerdict:
        """One peer on one shape, timed and checked as our kernels are (``runtime.peers.measure_peer``): on the
        device draw our kernels get for (``seed``, ``shape``), against the same reference (cached where the
        hand-written baselines were checked first at that seed), on the same rows of a very large shape
        (:func:`gate_rows`). A peer that cannot run here (no torch, no flash-kmeans, no GPU) is a
        ``runtime_fault`` verdict saying what is missing, and so is a reference that does not fit in GPU memory;
        any other failure also leaves the session refusing later jobs (the peer's library may have broken the
        context)."""
        from cake_core.runtime.peers import measure_peer

        key = shape_key(shape)
        t0 = time.monotonic()
        try:
            m = measure_peer(get_problem(problem), peer, shape, seed, reps=reps, refs=self.refs,
                             rows=gate_rows(problem, shape))
        except CakeError as e:       # PeerUnavailable, GPURefused (the reference does not fit): nothing launched
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, str(e), time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a peer failing on a shape is reported, not raised
            # a CUDA error in the peer's library may leave the context unusable, as one of ours does
            self.poisoned = f"peer {peer}: {type(e).__name__}: {e}"
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, f"{type(e).__name__}: {e}", time.monotonic() - t0)
        t, checked = m.timing, m.check.describe()
        timing = Timing(t["median_ms"], t["p10_ms"], t["p90_ms"], t["runs"], t["timer"], t["l2"], self.gpu_model)
        return ShapeVerdict(key, "gpu", Outcome.MEASURED if m.correct else Outcome.WRONG,
                            m.max_error if math.isfinite(m.max_error) else None,
                            f"correct; {checked}" if m.correct else f"wrong: {m.message}; {checked}", timing,
                            seconds=time.monotonic() - t0)
