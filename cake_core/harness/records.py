"""What the miners read: attempts and measurements from the warehouse, as plain Python records.

The warehouse side (``tasks/harness.py``) fills these from SQL; everything here is a library over them,
so a notebook or a test can mine from any list of attempts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cake_core.harness.catalogue import Catalogue, catalogue
from cake_core.ir.program import Program

PASSED = ("checked", "measured")
FAILED = ("verify_failed", "compile_failed", "wrong", "runtime_fault", "timeout")


@dataclass(eq=False)
class AttemptRecord:
    attempt_id: str
    run_id: str
    problem: str
    ir_text: str
    outcome: str
    stage: str = ""
    generation: int = 0
    ir_hash: str = ""
    parents: tuple[str, ...] = ()
    tactic: str | None = None
    signature: str | None = None
    error_rule: str | None = None
    error_message: str | None = None
    gpu_seconds: float = 0.0
    score: float | None = None            # lower is better: measured geomean ms, else predicted geomean ms
    score_basis: str | None = None        # measured | predicted
    created_at: Any = None
    shapes: tuple[dict[str, int], ...] = ()     # the shapes of the attempt's run
    rules: frozenset[str] = frozenset()         # rule ids of its diagnostics (any severity)
    program: Program | None = field(default=None, repr=False)   # parsed (composites expanded); None if not

    @property
    def passed(self) -> bool:
        return self.outcome in PASSED

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED

    @cached_property
    def catalogue(self) -> Catalogue | None:
        return catalogue(self.program, self.shapes) if self.program is not None else None


@dataclass(frozen=True)
class ClusterRecord:
    signature: str
    stage: str
    rule: str | None
    n_attempts: int
    n_runs: int = 1
    n_problems: int = 1
    gpu_seconds: float = 0.0
    first_seen: Any = None
    last_seen: Any = None

    def to_data(self) -> dict[str, Any]:
        from cake_core.harness.evidence import cluster_summary
        return cluster_summary(self.__dict__)


@dataclass(frozen=True)
class MeasuredRecord:
    """One measured (attempt, shape) with the problem's dimensions, for calibration."""

    attempt_id: str
    problem: str
    ir_text: str
    shape: dict[str, int]
    measured_ms: float
