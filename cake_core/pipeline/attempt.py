"""The attempt: one candidate's journey through the stages, with every stage's typed result.

An attempt is made by the generate stage and stops at the first stage whose outcome is not ``ok`` (or at
the end: ``checked`` / ``measured``). Its identity is derived from (run, generation, slot), so the same
candidate of a resumed run is the same attempt: a generation cut short by a crash is redone without
recording anything twice. :func:`cake_core.pipeline.rows.attempt_rows` turns it into warehouse rows.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from cake_core.agents.base import Candidate
from cake_core.outcome import Diagnostic, Outcome, StageResult


def attempt_id_for(run_id: str, generation: int, slot: int) -> str:
    """The attempt id of slot ``slot`` of generation ``generation`` of run ``run_id`` (32 hex digits)."""
    return hashlib.sha256(f"{run_id}\0{generation}\0{slot}".encode()).hexdigest()[:32]


@dataclass
class Attempt:
    """One candidate of one generation, and what each stage made of it.

    ``results`` holds the stage results in order; ``stage`` and ``outcome`` are the last one's. The stages'
    products (the parsed program, the lowering, the cubin, the cost model's figures, the verdicts) are kept
    beside them for the later stages; only what the rows need is ever stored.
    """

    run_id: str
    generation: int
    slot: int
    problem: str
    harness_version: int
    candidate: Candidate
    attempt_id: str = ""
    results: list[StageResult] = field(default_factory=list)
    program: Any = None                  # cake_core.ir.program.Program once it parsed (failed ones too)
    ir_hash: str = ""
    features: dict[str, Any] = field(default_factory=dict)
    lowered: Any = None                  # cake_core.lower.cuda.LoweredKernel
    binary: Any = None                   # cake_core.pipeline.stages.Binary; None when nvcc is absent
    predictions: dict[str, float] = field(default_factory=dict)     # shape key -> ms, the search shapes
    model_version: str = ""
    model_kind: str = ""
    scores: dict[str, float] = field(default_factory=dict)          # shape key -> the model's ranking key
    decision: str | None = None          # the filter's: kept | explored | sampled | filtered
    verdicts: list[Any] = field(default_factory=list)               # pipeline.verdicts.ShapeVerdict
    seconds: dict[str, float] = field(default_factory=dict)         # worker seconds per stage
    outside: tuple[str, ...] = ()        # keys of the run's shapes outside the kernel's domain (never run)

    def __post_init__(self) -> None:
        if not self.attempt_id:
            self.attempt_id = attempt_id_for(self.run_id, self.generation, self.slot)

    @property
    def stage(self) -> str:
        return self.results[-1].stage if self.results else "generate"

    @property
    def outcome(self) -> Outcome:
        return self.results[-1].outcome if self.results else Outcome.OK

    @property
    def going_on(self) -> bool:
        """True while no stage has stopped it (``ok`` so far)."""
        return self.outcome is Outcome.OK

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [d for r in self.results for d in r.diagnostics]

    def result(self, stage: str) -> StageResult | None:
        return next((r for r in self.results if r.stage == stage), None)

    def record(self, result: StageResult, seconds: float = 0.0) -> None:
        """Add a stage's result and keep its product where the later stages look for it."""
        if not self.going_on:
            raise ValueError(f"attempt {self.attempt_id} already stopped at {self.stage} ({self.outcome.value}); "
                             f"stage {result.stage} must not run on it")
        self.results.append(result)
        self.seconds[result.stage] = self.seconds.get(result.stage, 0.0) + seconds
        product = result.value
        if result.stage == "verify" and product is not None:
            self.program, self.ir_hash = product, product.hash
            self.features = dict(result.metrics.get("features", {}))
            self.outside = tuple(result.metrics.get("outside", ()))
        elif result.stage == "lower" and result.outcome is Outcome.OK:
            self.lowered = product
        elif result.stage == "compile" and result.outcome is Outcome.OK:
            self.binary = product
        elif result.stage == "cost_filter":
            self.predictions = dict(result.metrics.get("predictions", {}))
            self.model_version = result.metrics.get("model_version", "")
            self.model_kind = result.metrics.get("model_kind", "")
            self.scores = dict(result.metrics.get("scores", {}))
            self.decision = result.metrics.get("decision")
        elif result.stage in ("check", "time") and product is not None:
            self.verdicts = list(product)

    def runs_on(self, shape_key: str) -> bool:
        """Whether the kernel is run on this shape (it lies inside its domain)."""
        return shape_key not in self.outside

    @property
    def predicted_ms(self) -> float | None:
        """The cost model's geometric mean over the search shapes (None before the filter)."""
        if not self.predictions:
            return None
        from cake_core.model.base import geomean
        return geomean(self.predictions.values())

    @property
    def gpu_seconds(self) -> float:
        """GPU time the attempt held its workers for (checks, warm-up and timing; a hang its watchdog bound)."""
        return sum(v.seconds for v in self.verdicts if v.backend == "gpu")
