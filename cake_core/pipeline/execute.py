"""Every call from the pipeline into the runtime, in one place: the interpreter's gate, the GPU's gate and
timing, and the peers.

Workers (Ray actors in ``tasks/workers.py``) call these and nothing else of ``cake_core.runtime``, so a change
of how references are computed or cached, or of the timing protocol, is wired in here. Each function answers
with :class:`~cake_core.pipeline.verdicts.ShapeVerdict` values, never raises for a candidate's own faults, and
keeps the runtime's protocol: fresh seeded inputs, poisoned outputs, the fp64 oracle, the perturbation check,
CUDA events after warm-up with L2 flushed. A shape too large for the fp64 oracle on a CPU is checked on a
seeded random subset of its output rows (:func:`gate_problem`).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cake_core.errors import CakeError
from cake_core.outcome import Outcome
from cake_core.pipeline.verdicts import ShapeVerdict, Timing, fault, from_cpu_check, from_gpu_run
from cake_core.problems import get_problem
from cake_core.problems.base import Shape, shape_key

DEFAULT_KERNEL_TIMEOUT_S = 30.0   # the runtime's own watchdog per wait on the GPU (see runtime.gpu)
# Above these a shape's fp64 oracle takes long on a CPU: the gate checks a random subset of output rows
# against the oracle of those rows alone (``problems.peers.row_subset_problem``), as bench/corpus_vs_peers.py.
FULL_ORACLE_FLOPS = 2e10
FULL_ORACLE_BYTES = 2.5e8
SUBSET_ROWS = {"kmeans_assign": 4096}    # rows checked on a large shape; 256 for the other problems


@dataclass(frozen=True)
class GpuJob:
    """One candidate on one shape, as a GPU worker receives it: the lowering, the cubin's bytes (a worker
    on another node cannot read this machine's cache) and what to run it for."""

    key: Any                     # the caller's handle (attempt index, shape index)
    lowered: Any                 # cake_core.lower.cuda.LoweredKernel
    cubin: bytes
    kernel_name: str
    problem: str
    shape: Shape
    seed: int
    reps: int
    time: bool = True


def check_on_interpreter(program, problem: str, shapes: list[Shape], seed: int) -> list[ShapeVerdict]:
    """The CPU correctness gate (``runtime.cpu.check_on_cpu``) on ``shapes``, one verdict per shape."""
    from cake_core.runtime.cpu import check_on_cpu

    t0 = time.monotonic()
    checks = check_on_cpu(program, get_problem(problem), shapes, seed)
    per = (time.monotonic() - t0) / max(len(checks), 1)
    return [from_cpu_check(c, per) for c in checks]


def gate_problem(problem: str, shape: Shape, seed: int):
    """The problem the GPU gate judges ``shape`` by: the problem itself, or for a shape too large for the
    full fp64 oracle on a CPU, the problem restricted to a seeded random subset of its output rows."""
    from cake_core.problems.peers import pick_rows, row_subset_problem

    prob = get_problem(problem)
    if prob.rows is None or (prob.flops(shape) <= FULL_ORACLE_FLOPS and prob.bytes(shape) <= FULL_ORACLE_BYTES):
        return prob
    return row_subset_problem(prob, pick_rows(prob, shape, SUBSET_ROWS.get(problem, 256), seed))


class GpuSession:
    """What one GPU worker keeps between jobs: the cubins it wrote to disk (by content hash), the inputs of the
    current seed (by problem and shape) and the GPU's name.

    Every candidate of a generation is checked on the same seeded inputs, and drawing a large shape's inputs
    takes longer than timing a kernel on it: the session draws them once per (problem, shape, seed) and hands
    the same arrays, with the generator left exactly where drawing them leaves it, to every later job (the
    runtime never writes into them; the perturbation check copies). A new seed drops the old inputs.

    A fault or a hang leaves the process's CUDA context unusable: :meth:`run` then sets ``poisoned`` and
    refuses every later job, and the worker must be replaced.
    """

    def __init__(self, timeout_s: float = DEFAULT_KERNEL_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.poisoned: str | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="cake-gpu-"))
        self._model: str | None = None
        self._inputs: dict[tuple[str, str, int], tuple[dict, dict]] = {}
        self.drawn = 0                      # input sets drawn (the rest came from the memo)

    def _with_inputs_memo(self, prob, job: GpuJob):
        key = (job.problem, shape_key(job.shape), job.seed)

        def make_inputs(shape, rng):
            hit = self._inputs.get(key)
            if hit is not None:
                x, state = hit
                rng.bit_generator.state = state
                return x
            x = prob.make_inputs(shape, rng)
            self._inputs = {k: v for k, v in self._inputs.items() if k[2] == job.seed}
            self._inputs[key] = (x, rng.bit_generator.state)
            self.drawn += 1
            return x

        return replace(prob, make_inputs=make_inputs)

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
            prob = self._with_inputs_memo(gate_problem(job.problem, job.shape, job.seed), job)
            (run,) = check_and_time(compiled, job.lowered, prob, [job.shape], seed=job.seed,
                                    time=job.time, reps=job.reps, timeout_s=self.timeout_s)
        except CakeError as e:     # refused before any launch (wrong GPU, compile-only target): not a fault
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, str(e), time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a CUDA error leaves the context unusable: report and get replaced
            self.poisoned = f"{type(e).__name__}: {e}"
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, self.poisoned, time.monotonic() - t0)
        v = from_gpu_run(key, run, self.gpu_model, time.monotonic() - t0)
        if v.outcome in (Outcome.RUNTIME_FAULT, Outcome.TIMEOUT):
            self.poisoned = f"{v.outcome.value}: {v.message}"
        return v

    def peer(self, problem: str, peer: str, shape: Shape, seed: int, reps: int) -> ShapeVerdict:
        """One peer on one shape, on the problem's own inputs (the session's, for this seed), checked against
        the oracle and timed with the same protocol as our kernels (``problems.peers.time_peer``). A peer that
        cannot run here (no torch, no flash-kmeans) is a ``runtime_fault`` verdict saying what is missing."""
        import numpy as np

        from cake_core.problems.peers import PeerUnavailable, make_peer, time_peer

        key = shape_key(shape)
        job = GpuJob(None, None, b"", "", problem, shape, seed, reps)
        prob = self._with_inputs_memo(gate_problem(problem, shape, seed), job)
        t0 = time.monotonic()
        try:
            inputs = prob.make_inputs(shape, np.random.default_rng(seed))
            run = make_peer(problem, peer, inputs)
            t = time_peer(run, reps=reps)
            ok, err, msg = prob.compare(run.fetch(), prob.oracle(inputs))
            run.release()
        except PeerUnavailable as e:
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, str(e), time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a peer failing on a shape is reported, not raised
            # a CUDA error in the peer's library may leave the context unusable, as one of ours does
            self.poisoned = f"peer {peer}: {type(e).__name__}: {e}"
            return fault(key, "gpu", Outcome.RUNTIME_FAULT, f"{type(e).__name__}: {e}", time.monotonic() - t0)
        timing = Timing(t["median_ms"], t["p10_ms"], t["p90_ms"], t["runs"], t["timer"], t["l2"], self.gpu_model)
        return ShapeVerdict(key, "gpu", Outcome.MEASURED if ok else Outcome.WRONG,
                            err if np.isfinite(err) else None, msg, timing, seconds=time.monotonic() - t0)
