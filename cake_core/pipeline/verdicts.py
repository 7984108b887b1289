"""Right or wrong, decided once: per-shape verdicts and the outcome they add up to.

The CPU interpreter answers with ``runtime.cpu.ShapeCheck``, a GPU actor with ``runtime.gpu.ShapeRun``, a
worker pool with a fault of its own (the worker died, the watchdog fired). Each becomes one
:class:`ShapeVerdict` carrying an :class:`Outcome`; :func:`judge` turns a candidate's verdicts into the
stage's :class:`StageResult`: the first fault or timeout, else the first wrong shape, else ``checked``
(interpreter) or ``measured`` (GPU, timed on every shape). Nothing downstream compares strings or
reads ``inf`` as a failure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult

BACKENDS = ("interpreter", "gpu")
# what a verdict was run for: selection, re-measurement, held-out report, the strict gate (checked, never timed)
KINDS = ("search", "confirm", "held_out", "strict", "sweep")
BROKEN = (Outcome.RUNTIME_FAULT, Outcome.TIMEOUT)

TAIL_HINT = "guard loads and stores on dimensions that are not tile multiples"
WRONG_HINT = "compare the indexing of loads and stores with the problem's semantics"


@dataclass(frozen=True)
class Timing:
    """One shape's timing under the protocol of ``runtime.gpu`` (CUDA events, L2 flushed, median of runs)."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    runs: int
    timer: str
    l2: str
    gpu_model: str


@dataclass(frozen=True)
class ShapeVerdict:
    """A candidate on one shape: its outcome, the error against the oracle and, when timed, the timing.

    ``seconds`` is the wall time the shape held its worker (checks, warm-up and timing; a hang is
    charged its whole watchdog bound); ``fault_line`` is the IR line the interpreter faulted at;
    ``by_worker``: the worker, not the kernel, gave no answer (it died, or the pool's watchdog fired).
    """

    shape: str
    backend: str
    outcome: Outcome
    max_error: float | None = None
    message: str = ""
    timing: Timing | None = None
    kind: str = "search"
    seconds: float = 0.0
    fault_line: int = 0
    by_worker: bool = False

    @property
    def correct(self) -> bool:
        return self.outcome in (Outcome.CHECKED, Outcome.MEASURED)


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def from_cpu_check(check, seconds: float = 0.0) -> ShapeVerdict:
    """A ``runtime.cpu.ShapeCheck`` as a verdict."""
    outcome = Outcome.RUNTIME_FAULT if check.fault else Outcome.CHECKED if check.correct else Outcome.WRONG
    return ShapeVerdict(check.shape, "interpreter", outcome, _finite(check.max_error), check.message or "",
                        seconds=seconds, fault_line=check.fault_line if check.fault else 0)


def from_gpu_run(shape: str, run, gpu_model: str, seconds: float = 0.0) -> ShapeVerdict:
    """A ``runtime.gpu.ShapeRun`` as a verdict (the runtime names its outcome by value: read it once, here)."""
    outcome = Outcome(run.outcome)
    timing = None
    if outcome is Outcome.MEASURED and run.median_ms is not None:
        timing = Timing(run.median_ms, run.p10_ms, run.p90_ms, run.runs, run.timer, run.l2, gpu_model)
    elif outcome is Outcome.MEASURED:      # correct but no figure: not a measurement
        outcome = Outcome.CHECKED
    return ShapeVerdict(shape, "gpu", outcome, _finite(run.max_error), run.message or "", timing, seconds=seconds)


def fault(shape: str, backend: str, outcome: Outcome, message: str, seconds: float = 0.0) -> ShapeVerdict:
    """A shape that a worker could not answer: it died (``runtime_fault``) or outlived its watchdog (``timeout``)."""
    if outcome not in BROKEN:
        raise ValueError(f"a worker fault is runtime_fault or timeout, not {outcome.value}")
    return ShapeVerdict(shape, backend, outcome, None, message, seconds=seconds, by_worker=True)


def as_kind(verdicts: list[ShapeVerdict], kind: str) -> list[ShapeVerdict]:
    if kind not in KINDS:
        raise ValueError(f"verdict kind {kind!r}: one of {', '.join(KINDS)}")
    return [replace(v, kind=kind) for v in verdicts]


def as_strict(v: ShapeVerdict, why: str) -> ShapeVerdict:
    """``v`` as a verdict of the strict gate: kind ``strict``, its message led by what the shape exercises."""
    return replace(v, kind="strict", message=f"strict shape ({why})" + (f": {v.message}" if v.message else ""))


def judge(stage: str, verdicts: list[ShapeVerdict]) -> StageResult:
    """The outcome of a candidate's verdicts (``value``: the verdicts).

    The first fault or timeout wins (the CUDA context, or the interpreter's run, ended there), then
    the first wrong shape; otherwise ``checked`` on the interpreter, ``measured`` on a GPU when every
    shape but the strict ones (checked, never timed) was timed. No verdicts at all is a fault of the caller,
    not a pass.
    """
    if not verdicts:
        raise ValueError(f"{stage}: no shape was run; a candidate is judged on at least one shape")
    broken = next((v for v in verdicts if v.outcome in BROKEN), None)
    if broken is not None:
        rule = "runtime.timeout" if broken.outcome is Outcome.TIMEOUT else "runtime.fault"
        if broken.by_worker:
            d = Diagnostic(rule, Severity.ERROR, broken.message, witness=(f"shape {broken.shape}",))
        elif broken.backend == "interpreter":
            d = Diagnostic(rule, Severity.ERROR, broken.message, broken.fault_line, 1, "", TAIL_HINT,
                           (f"shape {broken.shape}",))
        else:
            d = Diagnostic(rule, Severity.ERROR, f"{broken.shape}: {broken.message}")
        return StageResult(stage, broken.outcome, [d], value=verdicts)
    wrong = next((v for v in verdicts if v.outcome is Outcome.WRONG), None)
    if wrong is not None:
        return StageResult(stage, Outcome.WRONG, [Diagnostic("check.mismatch", Severity.ERROR,
                                                             f"{wrong.shape}: {wrong.message}", 0, 0, "",
                                                             WRONG_HINT)], value=verdicts)
    timed = all(v.timing is not None for v in verdicts if v.kind != "strict")
    return StageResult(stage, Outcome.MEASURED if timed else Outcome.CHECKED, value=verdicts)
