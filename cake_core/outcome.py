"""Typed stage results: every stage of the pipeline returns one of these.

A stage never lets an exception escape and never encodes a failure as a metric
value. It returns a :class:`StageResult` whose :class:`Outcome` says where the
candidate stopped, with the diagnostics that explain why and the artifacts
(generated source, logs) that a person or an agent may want to read.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    """Where a candidate stopped. The warehouse stores the value string."""

    OK = "ok"                            # stage passed; the pipeline goes on
    VERIFY_FAILED = "verify_failed"      # parse, type or verifier rule error
    COMPILE_FAILED = "compile_failed"    # lowering, nvcc or ptxas error
    FILTERED = "filtered"                # cost model ranked it out of the top-k
    WRONG = "wrong"                      # ran, but disagrees with the oracle
    RUNTIME_FAULT = "runtime_fault"      # illegal address, out-of-bounds, worker died
    TIMEOUT = "timeout"                  # watchdog ended it (a hang)
    CHECKED = "checked"                  # correct on every shape, not timed (no GPU)
    MEASURED = "measured"                # correct and timed on a GPU

    @property
    def failed(self) -> bool:
        return self in _FAILED


_FAILED = {Outcome.VERIFY_FAILED, Outcome.COMPILE_FAILED, Outcome.WRONG,
           Outcome.RUNTIME_FAULT, Outcome.TIMEOUT}


class Severity(str, enum.Enum):
    ERROR = "error"      # blocks the candidate
    WARNING = "warning"  # reported, does not block
    HINT = "hint"        # a suggestion toward a faster kernel


@dataclass(frozen=True)
class Diagnostic:
    """One finding about a candidate, at the IR location that caused it.

    ``rule`` is a stable id (``resources.smem``, ``parse.syntax``,
    ``nvcc.error``, ``harness.L3``...); ``path`` names the IR node
    (``for[kt].mma``); ``witness`` carries checker evidence.
    """

    rule: str
    severity: Severity
    message: str
    line: int = 0
    col: int = 0
    path: str = ""
    hint: str = ""
    witness: tuple[str, ...] = ()

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def format(self, filename: str = "<ir>", source: str | None = None) -> str:
        """Compiler-style text: ``file:line:col: error[rule]: message``, source line, caret, hint."""
        out = [f"{filename}:{self.line}:{self.col}: {self.severity.value}[{self.rule}]: {self.message}"]
        if source is not None and 0 < self.line <= len(source.splitlines()):
            text = source.splitlines()[self.line - 1]
            out += [f"    {text}", "    " + " " * max(self.col - 1, 0) + "^"]
        for w in self.witness:
            out.append(f"    witness: {w}")
        if self.hint:
            out.append(f"    hint: {self.hint}")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "severity": self.severity.value, "message": self.message,
                "line": self.line, "col": self.col, "path": self.path, "hint": self.hint,
                "witness": list(self.witness)}


@dataclass
class StageResult:
    """What a stage returns: an outcome, diagnostics, metrics and artifacts."""

    stage: str
    outcome: Outcome
    diagnostics: list[Diagnostic] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    value: Any = None        # the stage's product (a Program, a cubin path...), not stored

    @property
    def ok(self) -> bool:
        return not self.outcome.failed and self.outcome is not Outcome.FILTERED

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    def first_error(self) -> Diagnostic | None:
        errs = self.errors
        return errs[0] if errs else None
