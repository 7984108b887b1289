"""The debug switch (``cake evolve --debug``): after every stage, re-verify each attempt's
program and dump it, numbered, as tinygrad's SPEC/DEBUG do for its rewrites.

Dumps go to ``<folder>/<run>/g<generation>/<slot>-<stage number>-<stage>.cake`` (``.cu`` beside the lowering),
so ``ls`` lists an attempt's journey in order. A program that no longer verifies after a stage, or whose
identity changed although no stage may change a program after verify, stops its attempt with a
``debug.reverify`` error at that stage: a pipeline bug shows up where it happened, not on the GPU.
"""
from __future__ import annotations

from pathlib import Path

from cake_core.harness.version import HarnessSpec
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.pipeline.attempt import Attempt
from cake_core.pipeline.stages import STAGE_NAMES, verify_stage
from cake_core.problems import get_problem
from cake_core.problems.base import Shape

RULE = "debug.reverify"


class Debug:
    """Re-verification and numbered dumps after each stage of a run."""

    def __init__(self, folder: str | Path, harness: HarnessSpec, problem: str, shapes: list[Shape]):
        self.folder, self.harness, self.problem, self.shapes = Path(folder), harness, get_problem(problem), shapes

    def after(self, stage: str, attempts: list[Attempt]) -> int:
        """Dump and re-verify ``attempts`` after ``stage``; returns how many it stopped."""
        number = STAGE_NAMES.index(stage)
        stopped = 0
        for a in attempts:
            base = self.folder / a.run_id / f"g{a.generation:03d}" / f"{a.slot:03d}-{number:02d}-{stage}"
            base.parent.mkdir(parents=True, exist_ok=True)
            text = a.program.text() if a.program is not None else a.candidate.text
            base.with_suffix(".cake").write_text(text)
            if stage == "lower" and a.lowered is not None:
                base.with_suffix(".cu").write_text(a.lowered.source)
            if a.program is None or not a.going_on:
                continue
            problem = self._problem_after(a, stage, text)
            if problem:
                a.record(StageResult(stage, Outcome.VERIFY_FAILED, [Diagnostic(
                    RULE, Severity.ERROR, problem, a.program.line, 1, "kernel",
                    f"stage `{stage}` must leave the program as verify passed it; see {base.with_suffix('.cake')}")]))
                stopped += 1
        return stopped

    def _problem_after(self, a: Attempt, stage: str, text: str) -> str:
        if a.program.hash != a.ir_hash:
            return f"after stage {stage} the program is not the one verified (hash {a.ir_hash} became {a.program.hash})"
        r = verify_stage(text, self.harness, self.problem, self.shapes)
        errors = [d for d in r.diagnostics if d.is_error]
        if errors:
            return f"after stage {stage} the program no longer verifies: {errors[0].rule}: {errors[0].message}"
        return ""
