"""The pipeline's stages, in order, each a plain function returning a typed :class:`StageResult`.

    generate     the agent proposes this generation's candidates          (once per generation)
    verify       parse + built-in rules + the harness's learned rules + problem fit   (per candidate)
    lower        IR -> CUDA C++ with #line directives                     (per candidate)
    compile      nvcc + ptxas, cached by source hash (skipped honestly without nvcc)  (per candidate)
    cost_filter  the cost model ranks; top-k plus random exploration go on            (once per generation)
    check        correctness on the CPU interpreter, then the candidate's strict shapes, nothing timed
                 |  time: gate + timing on GPUs
    select       the run's state from its rows: best so far, parents, tactic records, budget, stop

``STAGES`` is that list; Prefect tasks (``tasks/stages.py``) run it, one task per stage, over the batch of
a generation. Nothing here knows about Prefect, Ray or DuckDB.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cake_core.harness.version import HarnessSpec
from cake_core.ir.domain import domain_violations
from cake_core.ir.expr import symbols
from cake_core.ir.features import features
from cake_core.ir.program import Program
from cake_core.ir.text import parse
from cake_core.ir.verify import verify
from cake_core.model.base import CostModelBase
from cake_core.model.filter import cost_filter
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.pipeline.execute import check_on_interpreter
from cake_core.pipeline.verdicts import judge
from cake_core.problems.base import Problem, Shape, shape_key


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline.

    ``scope``: ``generation`` (once over the whole batch, in the flow's process), ``candidate`` (once per
    candidate, on the CPU workers, every core busy) or ``runner`` (per candidate and shape, on the check or
    timing workers).
    """

    name: str
    scope: str
    doc: str


STAGES: tuple[Stage, ...] = (
    Stage("generate", "generation", "the agent proposes this generation's candidates"),
    Stage("verify", "candidate", "parse, types, verifier rules (built-in and learned), protocol, problem fit"),
    Stage("lower", "candidate", "IR -> CUDA C++ with #line directives naming the IR"),
    Stage("compile", "candidate", "nvcc + ptxas resource report, cached by source hash"),
    Stage("cost_filter", "generation", "the cost model ranks: the top k and some random others go on"),
    Stage("check", "runner", "correctness on the CPU interpreter (no GPU: nothing timed)"),
    Stage("time", "runner", "correctness gate and CUDA-event timing on the GPU workers"),
    Stage("select", "generation", "the run's state from its rows: best so far, parents, stop or go on"),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def stages_for(timed: bool) -> tuple[Stage, ...]:
    """The stages of a run: ``time`` on a GPU, else ``check`` on the interpreter."""
    skip = "check" if timed else "time"
    return tuple(s for s in STAGES if s.name != skip)


# ---------------------------------------------------------------- verify

# the bounds that make a shape outside a kernel's domain
DOMAIN_BOUNDS = ("domain.extent", "domain.tma_stride", "domain.grid")

def verify_stage(text: str, harness: HarnessSpec, problem: Problem, shapes: list[Shape] = ()) -> StageResult:
    """Parse (the harness's composite calls expanded first) and verify ``text`` for ``problem`` (shape rules see
    the ``shapes`` inside its domain).

    ``value``: the parsed program whenever it parsed (a failed one still has a hash and features, in
    ``metrics['features']``); ``metrics['outside']``: the keys of the shapes outside its domain.
    """
    exp = harness.expand(text)          # the harness's composite calls, expanded line for line
    r = parse(exp.text, "candidate.cake")
    diags = list(exp.diagnostics) + list(r.diagnostics)
    metrics = {}
    if r.program is not None:
        # the kernel's domain: shapes outside it are refused before any launch, neither wrong nor measured;
        # the shape rules judge the others, and a kernel that handles none of the run's shapes fails here.
        # What a kernel is written for (TMA's strides, a bounded extent) is its domain; an unguarded tile on a
        # ragged shape is a defect the gate reports where it faults (DOMAIN_BOUNDS)
        outside = {shape_key(s): v for s in shapes
                   if (v := [d for d in domain_violations(r.program, s) if d.rule in DOMAIN_BOUNDS])}
        inside = [s for s in shapes if shape_key(s) not in outside]
        metrics["outside"] = sorted(outside)
        if shapes and not inside:
            diags += next(iter(outside.values()))
        diags += verify(r.program, learned=harness.learned_rules, shapes=inside)
        dims = {d for p in r.program.params for d in _syms(p)} - set(r.program.const_env)
        mismatch = problem.program_mismatch(r.program)
        if mismatch:
            diags.append(Diagnostic("problem.params", Severity.ERROR, mismatch, r.program.line, 1, "kernel",
                                    f"the kernel's parameters must be {', '.join(problem.params)}"))
        unknown = dims - set(problem.dims)
        if unknown:
            diags.append(Diagnostic("problem.dims", Severity.ERROR,
                                    f"parameter shapes use {', '.join(sorted(unknown))}, not dimensions of "
                                    f"`{problem.name}`", r.program.line, 1, "kernel",
                                    f"its dimensions: {', '.join(problem.dims)}"))
        metrics["features"] = features(r.program)
    failed = r.program is None or any(d.is_error for d in diags)
    return StageResult("verify", Outcome.VERIFY_FAILED if failed else Outcome.OK, diags, metrics,
                       artifacts={"expanded_ir": exp.text} if exp.used else {}, value=r.program)


def _syms(p) -> set[str]:
    out: set[str] = set()
    for d in p.type.shape:
        out |= symbols(d)
    return out


# ---------------------------------------------------------------- lower, compile

def nvcc_available() -> bool:
    """Whether nvcc is there, found as the compile stage finds it (``lower.compile.nvcc_path``)."""
    from cake_core.lower.compile import nvcc_path

    return nvcc_path() is not None


@dataclass(frozen=True)
class Binary:
    """A compiled kernel as the GPU workers need it: the compile report and the cubin's bytes."""

    compiled: object             # cake_core.lower.compile.Compiled
    cubin: bytes


def lower_stage(program: Program) -> StageResult:
    """IR -> CUDA C++ (stage ``lower``; ``value``: the LoweredKernel)."""
    from cake_core.lower.cuda import lower

    return lower(program, "candidate.cake")


def compile_stage(lowered, cache_dir: Path, arch: str | None = None) -> StageResult:
    """nvcc + ptxas (stage ``compile``; ``value``: a :class:`Binary`).

    Without nvcc the stage passes with ``metrics['skipped']`` and no binary, so a CPU-only machine still
    checks candidates (and records that nothing was compiled).
    """
    from cake_core.lower.compile import compile_kernel

    if not nvcc_available():
        return StageResult("compile", Outcome.OK, metrics={"skipped": "nvcc not found on PATH"},
                           artifacts={"cuda": lowered.source})
    comp = compile_kernel(lowered, arch=arch or lowered.target, cache_dir=Path(cache_dir))
    comp.artifacts.setdefault("cuda", lowered.source)
    if comp.outcome is Outcome.OK:
        comp.value = Binary(comp.value, Path(comp.value.cubin_path).read_bytes())
    return comp


# ---------------------------------------------------------------- cost filter

def cost_filter_stage(programs: list[Program], shapes: list[Shape], model: CostModelBase, keep: int, explore: int,
                      sample_out: int, seed: int, problem: str = "") -> list[StageResult]:
    """Rank by the model's mean score over ``shapes`` (the analytic model's: its geometric mean of predicted
    times); the top ``keep`` plus ``explore`` others go on (``ok``), the best placed on some one shape first,
    so a kernel predicted to win one shape is not starved by the mean; ``sample_out`` random ones of the rest go
    on too, marked ``sampled``, so every generation measures what the filter threw away (view
    ``cost_filter_recall``); the rest are ``filtered``.

    One result per program, in order; ``metrics``: ``predictions`` (shape key -> ms), ``scores``, ``decision``,
    ``rank`` (0: predicted fastest), ``model_version``, ``model_kind``. Deterministic under ``seed``; ties
    rank in the given order.
    """
    r = cost_filter(list(range(len(programs))), shapes, model, keep, explore, sample_out, seed,
                    program=programs.__getitem__, problem=problem)
    order = sorted(range(len(programs)), key=lambda i: (-r.scores[i], i))
    rank = {i: n for n, i in enumerate(order)}
    return [StageResult("cost_filter", Outcome.FILTERED if r.decisions[i] == "filtered" else Outcome.OK,
                        metrics={"predictions": r.predicted_ms[i], "scores": r.shape_scores[i],
                                 "decision": r.decisions[i], "rank": rank[i], "model_version": r.model_version,
                                 "model_kind": r.model_kind})
            for i in range(len(programs))]


def keep_count(population: int, asked: int | None = None) -> int:
    """How many candidates of a generation the filter keeps by rank: ``asked`` (``--keep``) when given, else
    half the population, at least 2."""
    return asked if asked is not None else max(2, -(-population // 2))


# ---------------------------------------------------------------- check

def check_stage(program: Program, problem: str, shapes: list[Shape], seed: int, strict: bool = True) -> StageResult:
    """The CPU correctness gate over ``shapes`` (the interpreter), then, for a candidate right on all of them,
    over its strict shapes (``strict``: ``execute.check_on_interpreter``); ``value``: the verdicts."""
    return judge("check", check_on_interpreter(program, problem, shapes, seed, strict))
