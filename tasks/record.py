"""Rows for the warehouse: one attempt, at whatever stage it stopped, with everything it produced."""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from cake_core.agents.base import Candidate
from cake_core.harness.signature import signature
from cake_core.outcome import Diagnostic, Outcome, StageResult


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class Attempt:
    """One candidate's journey through the stages; ``rows()`` turns it into warehouse rows."""

    run_id: str
    generation: int
    problem: str
    harness_version: int
    candidate: Candidate
    ir_hash: str = ""
    features: dict[str, Any] = field(default_factory=dict)
    attempt_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    stage: str = "verify"
    outcome: Outcome = Outcome.OK
    diagnostics: list[Diagnostic] = field(default_factory=list)
    compile: dict[str, Any] | None = None
    predictions: dict[str, float] = field(default_factory=dict)     # shape key -> ms
    model_version: str = ""                                         # the cost model that predicted
    checks: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    gpu_seconds: float = 0.0
    expanded_text: str | None = None   # the text with the harness's composite calls expanded (line for line)
    program: Any = None       # the parsed Program once verified (not stored: ir_text is)
    lowered: Any = None       # LoweredKernel after compile
    compiled: Any = None      # Compiled (cubin) after compile; None when nvcc is absent

    def stop(self, result: StageResult) -> None:
        self.stage, self.outcome = result.stage, result.outcome
        self.diagnostics += result.diagnostics

    @property
    def predicted_ms(self) -> float | None:
        if not self.predictions:
            return None
        v = list(self.predictions.values())
        return math.exp(sum(math.log(x) for x in v) / len(v))

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        err = next((d for d in self.diagnostics if d.is_error), None)
        failed = self.outcome.failed
        attempt = {
            "attempt_id": self.attempt_id, "run_id": self.run_id, "generation": self.generation,
            "problem": self.problem, "ir_hash": self.ir_hash, "ir_text": self.candidate.text,
            "parents": list(self.candidate.parents), "agent": self.candidate.agent,
            "tactic": self.candidate.tactic, "harness_version": self.harness_version, "stage": self.stage,
            "outcome": self.outcome.value, "error_rule": err.rule if err else None,
            "error_message": err.message if err else None,
            "signature": signature(self.stage, self.outcome.value, err.rule if err else None,
                                   err.message if err else None) if failed else None,
            "features": json.dumps(self.features, sort_keys=True),
            "prompt_tokens": self.candidate.prompt_tokens, "completion_tokens": self.candidate.completion_tokens,
            "predicted_ms": self.predicted_ms, "gpu_seconds": self.gpu_seconds, "created_at": now(),
        }
        out: dict[str, list[dict[str, Any]]] = {"attempts": [attempt]}
        out["diagnostics"] = [{"attempt_id": self.attempt_id, **{k: v for k, v in d.to_dict().items()}}
                              for d in self.diagnostics]
        if self.compile:
            out["compiles"] = [{"attempt_id": self.attempt_id, **self.compile}]
        out["predictions"] = [{"attempt_id": self.attempt_id, "model_version": self.model_version, "shape": k,
                               "predicted_ms": v} for k, v in self.predictions.items()]
        out["checks"] = [{"attempt_id": self.attempt_id, **c} for c in self.checks]
        out["measurements"] = [{"attempt_id": self.attempt_id, "run_id": self.run_id, **m}
                               for m in self.measurements]
        return out


def merge_rows(attempts: list[Attempt]) -> dict[str, list[dict[str, Any]]]:
    """All rows of a batch of attempts, by table (one append per table)."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        for table, rows in a.rows().items():
            merged.setdefault(table, []).extend(rows)
    return merged
