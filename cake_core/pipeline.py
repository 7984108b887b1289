"""The pipeline's stages as plain functions, each returning a StageResult.

    verify  → composite calls expanded + parse + built-in rules + the harness's learned rules
    compile → lower to CUDA C++ + nvcc/ptxas (skipped honestly when nvcc is absent)
    predict → the cost model's estimate per shape (ranks, filters)
    check   → correctness on the CPU interpreter (no GPU)   |  time → on a GPU (runtime.gpu)

Prefect tasks (``tasks/``) wrap these; nothing here knows about Prefect, Ray or DuckDB.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from cake_core.harness.version import HarnessSpec
from cake_core.ir.expr import symbols
from cake_core.ir.program import Program
from cake_core.ir.text import parse
from cake_core.ir.verify import verify
from cake_core.model.cost import CostModel
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.problems.base import Problem, Shape
from cake_core.runtime.cpu import check_on_cpu


def verify_stage(text: str, harness: HarnessSpec, problem: Problem, shapes: list[Shape] = ()) -> StageResult:
    """Parse (the harness's composite calls expanded first, line for line) and verify; the expanded text,
    when a composite was called, is ``artifacts["expanded_ir"]``: what the later stages read."""
    exp = harness.expand(text)
    r = parse(exp.text, "candidate.cake")
    diags = list(exp.diagnostics) + list(r.diagnostics)
    if r.program is not None:
        diags += verify(r.program, learned=harness.learned_rules, shapes=shapes)
        dims = {d for p in r.program.params for d in _syms(p)} - set(r.program.const_env)
        mismatch = problem.param_mismatch([p.name for p in r.program.params])
        if mismatch:
            diags.append(Diagnostic("problem.params", Severity.ERROR, mismatch, r.program.line, 1, "kernel",
                                    f"the kernel's parameters must be {', '.join(problem.inputs + problem.outputs)}"))
        unknown = dims - set(problem.dims)
        if unknown:
            diags.append(Diagnostic("problem.dims", Severity.ERROR,
                                    f"parameter shapes use {', '.join(sorted(unknown))}, not dimensions of "
                                    f"`{problem.name}`", r.program.line, 1, "kernel",
                                    f"its dimensions: {', '.join(problem.dims)}"))
    failed = r.program is None or any(d.is_error for d in diags)
    # value: the parsed program whenever it parsed (a failed one still has a hash and features)
    return StageResult("verify", Outcome.VERIFY_FAILED if failed else Outcome.OK, diags,
                       artifacts={"expanded_ir": exp.text} if exp.used else {}, value=r.program)


def _syms(p) -> set[str]:
    out: set[str] = set()
    for d in p.type.shape:
        out |= symbols(d)
    return out


def nvcc_available() -> bool:
    return shutil.which("nvcc") is not None


def compile_stage(program: Program, cache_dir: Path, arch: str | None = None) -> StageResult:
    """Lower and compile. Without nvcc the stage passes with ``metrics['skipped']`` set,
    so a CPU-only machine still checks candidates (and records that nothing was compiled)."""
    from cake_core.lower.compile import compile_kernel
    from cake_core.lower.cuda import lower

    low = lower(program, "candidate.cake")
    if low.outcome is not Outcome.OK:
        return low
    if not nvcc_available():
        return StageResult("compile", Outcome.OK, metrics={"skipped": "nvcc not found on PATH"},
                           artifacts={"cuda": low.value.source}, value=(low.value, None))
    comp = compile_kernel(low.value, arch=arch or program.target, cache_dir=cache_dir)
    comp.artifacts.setdefault("cuda", low.value.source)
    if comp.outcome is Outcome.OK:
        comp.value = (low.value, comp.value)
    return comp


def predict_stage(program: Program, shapes: list[Shape], model: CostModel) -> list[float]:
    return model.predict_ms(program, shapes)


def check_stage(program: Program, problem: Problem, shapes: list[Shape], seed: int) -> StageResult:
    """The CPU correctness gate over ``shapes`` (the interpreter)."""
    checks = check_on_cpu(program, problem, shapes, seed)
    fault = next((c for c in checks if c.fault), None)
    wrong = next((c for c in checks if not c.correct), None)
    if fault:
        d = Diagnostic("runtime.fault", Severity.ERROR, fault.message, fault.fault_line, 1, "",
                       "guard loads and stores on dimensions that are not tile multiples",
                       (f"shape {fault.shape}",))
        return StageResult("check", Outcome.RUNTIME_FAULT, [d], {"checks": checks})
    if wrong:
        d = Diagnostic("check.mismatch", Severity.ERROR, f"{wrong.shape}: {wrong.message}", 0, 0, "",
                       "compare the indexing of loads and stores with the problem's semantics")
        return StageResult("check", Outcome.WRONG, [d], {"checks": checks})
    return StageResult("check", Outcome.CHECKED, [], {"checks": checks})
