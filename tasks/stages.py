"""Prefect tasks: thin wrappers over cake_core stages and the warehouse.

Each task takes a batch of attempts of one generation and returns the ones
that go on; the attempts that stopped are recorded at once (so a crash later
loses none of them). Retries only on I/O (the warehouse append).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from cake_core.agents.base import Candidate, Context
from cake_core.harness.version import HarnessSpec
from cake_core.ir.features import features
from cake_core.model.cost import CostModel
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.pipeline import check_stage, compile_stage, predict_stage, verify_stage
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from tasks.record import Attempt, merge_rows, now
from tasks.run_control import writing
from tasks.workers import ActorPool, Fault
from warehouse import TABLES, Warehouse

_TASK = dict(cache_policy=NO_CACHE)
CHILD_TABLES = ("diagnostics", "compiles", "predictions", "checks", "measurements")


COMPACT_MIN_FILES = 8     # a table with this many batch files or more is merged at the end of a run


@task(name="compact", **_TASK)
def compact(warehouse_root: str, min_files: int = COMPACT_MIN_FILES) -> dict[str, int]:
    """Merge each table's batch files once it has ``min_files`` or more: every record() of a run
    lands its own small files, and queries slow down as they pile up. Returns files merged per table."""
    wh = Warehouse(warehouse_root)
    merged = {t: wh.compact(t, min_files=min_files) for t in TABLES}
    return {t: n for t, n in merged.items() if n}


@task(name="record", **_TASK)
def record(warehouse_root: str, attempts: list[Attempt]) -> int:
    """Land a batch of finished attempts: child rows first, the attempt rows last (the commit mark).

    Each append is atomic and retried alone on I/O errors, so nothing lands twice; a batch that
    fails validation is quarantined by the warehouse and not retried.
    """
    if not attempts:
        return 0
    wh = Warehouse(warehouse_root)
    rows = merge_rows(attempts)
    with writing(a.run_id for a in attempts):   # a stopped run raises RunCancelled, writing nothing
        for table in CHILD_TABLES:
            if rows.get(table):
                _append(wh, table, rows[table])
        return _append(wh, "attempts", rows["attempts"])


@retry(retry=retry_if_exception_type(OSError), stop=stop_after_attempt(4), wait=wait_exponential(0.2, max=2),
       reraise=True)
def _append(wh: Warehouse, table: str, rows: list[dict[str, Any]]) -> int:
    return wh.append(table, rows)


@task(name="generate", **_TASK)
def generate(agent: Any, problem: str, ctx: Context) -> list[Candidate]:
    """Ask the agent for this generation's candidates."""
    return agent.propose(get_problem(problem), ctx)


@task(name="verify", **_TASK)
def verify(attempts: list[Attempt], harness: HarnessSpec, shapes: list[dict]) -> tuple[list[Attempt], list[Attempt]]:
    """Parse and verify (shape rules see the run's shapes); returns (passed, stopped)."""
    problem = get_problem(attempts[0].problem) if attempts else None
    passed, stopped = [], []
    for a in attempts:
        r = verify_stage(a.candidate.text, harness, problem, shapes)
        if r.value is not None:
            a.program, a.ir_hash, a.features = r.value, r.value.hash, features(r.value)
        if r.outcome is Outcome.VERIFY_FAILED:
            a.stop(r)
            stopped.append(a)
        else:
            a.diagnostics += r.diagnostics     # warnings and hints travel with the attempt
            passed.append(a)
    return passed, stopped


@task(name="compile", **_TASK)
def compile_one(attempt: Attempt, cache_dir: str) -> Attempt:
    """Lower to CUDA C++ and compile with nvcc (cached by source hash)."""
    r = compile_stage(attempt.program, Path(cache_dir))
    if r.outcome is not Outcome.OK:
        attempt.stop(r)
        attempt.compile = _compile_row(r, ok=False)
        return attempt
    attempt.diagnostics += r.diagnostics     # warnings (nvcc, ptxas) of a kernel that compiled
    lowered, compiled = r.value
    attempt.lowered, attempt.compiled = lowered, compiled
    if compiled is not None:
        attempt.compile = _compile_row(r, ok=True)
    return attempt


def _compile_row(r: StageResult, ok: bool) -> dict[str, Any]:
    c = r.value[1] if ok and r.value else None
    res = c.resources if c is not None else None
    return {"source_hash": c.source_hash if c else r.metrics.get("source_hash", ""),
            "arch": c.arch if c else r.metrics.get("arch", "sm_90a"),
            "seconds": c.seconds if c else float(r.metrics.get("seconds", 0.0)),
            "registers": res.registers if res else None, "spill_bytes": res.spill_bytes if res else None,
            "smem_bytes": res.smem_bytes if res else None, "barriers": res.barriers if res else None,
            "cached": c.cached if c else False, "ok": ok,
            "log": r.artifacts.get("log", "")[-4000:]}


@task(name="cost-filter", **_TASK)
def cost_filter(attempts: list[Attempt], shapes: list[dict], keep: int, explore: int, seed: int,
                model: CostModel) -> tuple[list[Attempt], list[Attempt]]:
    """Rank by predicted time (geomean over shapes); keep the top ``keep`` plus ``explore``
    random others, so the model cannot starve a candidate it misjudges."""
    for a in attempts:
        a.predictions = {shape_key(s): ms for s, ms in zip(shapes, predict_stage(a.program, shapes, model))}
        a.model_version = model.version
    ranked = sorted(attempts, key=lambda a: a.predicted_ms)
    kept, rest = ranked[:keep], ranked[keep:]
    rng = np.random.default_rng(seed)
    picks = set(rng.choice(len(rest), size=min(explore, len(rest)), replace=False).tolist()) if rest else set()
    kept += [a for i, a in enumerate(rest) if i in picks]
    filtered = [a for i, a in enumerate(rest) if i not in picks]
    for a in filtered:
        a.stop(StageResult("cost_filter", Outcome.FILTERED))
    return kept, filtered


@task(name="check-cpu", **_TASK)
def check_cpu(pool: ActorPool, attempts: list[Attempt], problem: str, shapes: list[dict], seed: int,
              timeout_s: float) -> list[Attempt]:
    """Correctness on the CPU interpreter in Ray actors; nothing is timed."""
    results = pool.map("check", [(a.candidate.text, problem, shapes, seed) for a in attempts], timeout_s)
    for a, r in zip(attempts, results):
        if isinstance(r, Fault):
            a.stop(_fault_result("check", r))
            continue
        a.checks = [{"shape": c.shape, "backend": "interpreter", "correct": c.correct,
                     "max_error": c.max_error if c.max_error is not None and math.isfinite(c.max_error) else None,
                     "message": c.message or None} for c in r.metrics["checks"]]
        a.stop(r)
    return attempts


@task(name="time-gpu", **_TASK)
def time_gpu(pool: ActorPool, attempts: list[Attempt], problem: str, shapes: list[dict], seed: int,
             timeout_s: float, gpu_model: str, reps: int) -> list[Attempt]:
    """Correctness gate and CUDA-event timing on the GPU actors."""
    jobs = [(a.lowered, Path(a.compiled.cubin_path).read_bytes(), a.compiled.kernel_name, problem, shapes,
             seed, reps) for a in attempts]
    t0 = now()
    results = pool.map("run", jobs, timeout_s)
    for a, r, held in zip(attempts, results, pool.elapsed):
        # GPU time is what the candidate held the GPU worker for (checks, warm-up and timing
        # included), for every outcome: a hang costs its whole watchdog bound
        a.gpu_seconds = held
        if isinstance(r, Fault):
            a.stop(_fault_result("time", r))
            continue
        if "fault" in r:
            a.stop(_fault_result("time", Fault("runtime_fault", r["fault"])))
            continue
        runs = r["runs"]
        broken = next((s for s in runs if s.outcome in ("runtime_fault", "timeout")), None)
        if broken is not None:
            a.stop(_fault_result("time", Fault(broken.outcome, f"{shape_key(broken.shape)}: {broken.message}")))
            continue
        a.checks = [{"shape": shape_key(s.shape), "backend": "gpu", "correct": s.correct,
                     "max_error": s.max_error if math.isfinite(s.max_error) else None,
                     "message": s.message or None} for s in runs]
        bad = next((s for s in runs if not s.correct), None)
        if bad is not None:
            a.stop(StageResult("time", Outcome.WRONG, [Diagnostic(
                "check.mismatch", Severity.ERROR, f"{shape_key(bad.shape)}: {bad.message}", 0, 0, "",
                "compare the indexing of loads and stores with the problem's semantics")]))
            continue
        a.measurements = [{"shape": shape_key(s.shape), "gpu_model": gpu_model, "timer": s.timer, "l2": s.l2,
                           "median_ms": s.median_ms, "p10_ms": s.p10_ms, "p90_ms": s.p90_ms, "runs": s.runs,
                           "correct": True, "max_error": s.max_error, "kind": "search", "measured_at": t0}
                          for s in runs]
        a.stop(StageResult("time", Outcome.MEASURED))
    return attempts


@task(name="confirm-gpu", **_TASK)
def confirm_gpu(warehouse_root: str, pool: ActorPool, measured: list[Attempt], problem: str, shapes: list[dict],
                seed: int, timeout_s: float, gpu_model: str, reps: int) -> int:
    """Re-measure each shape's winner on fresh inputs and store those timings apart (kind 'confirm'):
    the search picked the minimum of noisy medians, so its own figures flatter the winner."""
    winners: dict[str, Attempt] = {}
    best: dict[str, float] = {}
    for a in measured:
        for m in a.measurements:
            if m["median_ms"] < best.get(m["shape"], float("inf")):
                best[m["shape"]], winners[m["shape"]] = m["median_ms"], a
    unique = list({a.attempt_id: a for a in winners.values()}.values())
    if not unique:
        return 0
    jobs = [(a.lowered, Path(a.compiled.cubin_path).read_bytes(), a.compiled.kernel_name, problem, shapes,
             seed + 7919, reps) for a in unique]
    t0 = now()
    rows = []
    for a, r in zip(unique, pool.map("run", jobs, timeout_s)):
        if isinstance(r, Fault) or "fault" in r:
            continue      # the search rows stand; a winner that fails to confirm gets no confirm rows
        rows += [{"attempt_id": a.attempt_id, "run_id": a.run_id, "shape": shape_key(s.shape),
                  "gpu_model": gpu_model, "timer": s.timer, "l2": s.l2, "median_ms": s.median_ms,
                  "p10_ms": s.p10_ms, "p90_ms": s.p90_ms, "runs": s.runs, "correct": True,
                  "max_error": s.max_error, "kind": "confirm", "measured_at": t0}
                 for s in r["runs"] if s.correct and s.median_ms is not None and shape_key(s.shape) in winners
                 and winners[shape_key(s.shape)] is a]
    return _append(Warehouse(warehouse_root), "measurements", rows) if rows else 0


def _fault_result(stage: str, f: Fault) -> StageResult:
    rule = "runtime.timeout" if f.outcome == "timeout" else "runtime.fault"
    return StageResult(stage, Outcome(f.outcome), [Diagnostic(rule, Severity.ERROR, f.message)])
