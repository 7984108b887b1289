"""The evolution flow: generate → verify → compile → cost-filter → check/time → record, per generation.

The flow body only orchestrates; every step is a task in ``tasks/``. With GPUs,
candidates are checked and timed in one Ray actor per GPU; without, they are
checked on the CPU interpreter in Ray actors and recorded as ``checked`` (not
timed). Every attempt lands in the warehouse as soon as its stage returns.
"""
from __future__ import annotations

import json
import math
import os
import socket
import uuid
from typing import Any

import ray
from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled

from cake_core.agents.base import Context
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.agents.tactics import TACTICS
from cake_core.errors import CakeError
from cake_core.model.cost import CostModel, gpu_for_name
from cake_core.outcome import Outcome
from cake_core.pipeline import nvcc_available
from cake_core.problems import get_problem, load_shape_set, shape_key
from tasks.harness import load_harness
from tasks.ray_runtime import ensure_ray
from tasks.record import Attempt, now
from tasks.run_control import begin_run, end_run, raise_if_stopped, status_for, stop_requested
from tasks.stages import (check_cpu, compact, compile_one, confirm_gpu, cost_filter, generate, record, time_gpu,
                          verify)
from tasks.workers import ActorPool, CpuChecker, GpuRunner
from warehouse import Warehouse


def _run_row(run_id: str, status: str, **kw: Any) -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "host": socket.gethostname(), "started_at": kw.pop("started_at"),
            **kw}


@flow(name="evolve", log_prints=True, validate_parameters=False)
def evolve_flow(problem: str, shape_set: str, generations: int = 3, population: int = 8, seed: int = 0,
                run_id: str | None = None, warehouse_root: str = ".cake/warehouse",
                cache_dir: str = ".cake/cache", gpu_models: list[str] | None = None,
                timeout_s: float = 120.0, reps: int = 20, agent: str = "tactic",
                llm: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evolve kernels for ``problem`` over the shapes of ``shape_set``; returns a summary."""
    log = get_run_logger()
    run_id = run_id or uuid.uuid4().hex[:12]
    prob = get_problem(problem)
    ss = load_shape_set(prob, shape_set)
    gpus = list(gpu_models or [])
    shapes = list(ss.shapes) if gpus else ss.cpu_shapes(prob.cpu_limit)
    if gpus and not nvcc_available():
        raise CakeError("a GPU run builds cubins with nvcc, which is not on PATH; install the CUDA toolkit "
                        "(nvcc) or run with CAKE_GPU=off to check on the CPU")
    if not shapes:
        raise CakeError(f"shape set `{shape_set}` has no shape small enough for the CPU interpreter (every "
                        f"dimension ≤ {prob.cpu_limit}); pick a smaller set such as "
                        f"{prob.shape_sets[0]} or run where a GPU is present")
    ensure_ray(gpus=bool(gpus))   # a worker runs the flow in a bare process
    wh = Warehouse(warehouse_root)
    harness = load_harness(warehouse_root)
    started = now()
    base = dict(problem=problem, shape_set=shape_set, harness_version=harness.version, agent=agent,
                seed=seed, generations=generations, population=population,
                gpu_model=gpus[0] if gpus else None, flow_run_id=str(flow_run.id) if flow_run.id else None,
                started_at=started)
    hold = begin_run(warehouse_root, _run_row(run_id, "running", **base))
    wh.append("shapes", [{"shape_set": shape_set, "problem": problem, "shape": shape_key(s),
                          "dims": json.dumps(s), "role": r} for s, r in zip(ss.shapes, ss.roles)])
    log.info(f"run {run_id}: {problem} on {len(shapes)} shapes of {shape_set}, harness v{harness.version}, "
             f"{'GPU ' + gpus[0] if gpus else 'CPU interpreter (not timed)'}")

    proposer = _make_agent(agent, seed, harness.disabled_tactics, llm)
    model = CostModel(gpu_for_name(gpus[0] if gpus else None))
    if harness.cost_eff:   # a calibrated model is another model: its predictions say so
        model.eff.update(dict(harness.cost_eff))
        model.version = f"{model.version}+harness-v{harness.version}"
    ctx = Context(harness.version, 0, population)
    if gpus:
        pool = ActorPool(lambda: GpuRunner.remote(), len(gpus), should_stop=lambda: stop_requested(run_id))
    else:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pool = ActorPool(lambda: CpuChecker.remote(), min(cpus, 4), should_stop=lambda: stop_requested(run_id))
    totals: dict[str, int] = {}
    best: list[tuple[float, str]] = []
    measured: list[Attempt] = []
    status = "failed"
    try:
        for g in range(generations):
            raise_if_stopped(run_id)
            ctx.generation = g
            cands = generate(proposer, problem, ctx)
            attempts = [Attempt(run_id, g, problem, harness.version, c) for c in cands]
            passed, stopped = verify(attempts, harness, shapes)
            record(warehouse_root, stopped)
            compiled = [f.result() for f in compile_one.map(passed, cache_dir)] if passed else []
            failed = [a for a in compiled if a.outcome is Outcome.COMPILE_FAILED]
            record(warehouse_root, failed)
            ok = [a for a in compiled if a.outcome is not Outcome.COMPILE_FAILED]
            keep = max(2, math.ceil(population / 2))
            kept, filtered = cost_filter(ok, shapes, keep, 1, seed + g, model) if ok else ([], [])
            record(warehouse_root, filtered)
            if kept:
                if gpus:
                    done = time_gpu(pool, kept, problem, shapes, seed + g, timeout_s, gpus[0], reps)
                else:
                    done = check_cpu(pool, kept, problem, shapes, seed + g, timeout_s)
                record(warehouse_root, done)
            else:
                done = []
            _learn(ctx, attempts, done, totals, best)
            measured += [a for a in done if a.outcome is Outcome.MEASURED]
            log.info(f"generation {g}: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
        if gpus:
            confirm_gpu(warehouse_root, pool, measured, problem, shapes, seed, timeout_s, gpus[0], reps)
        status = "completed"
    except BaseException as e:
        status = status_for(e, run_id)
        if status != "cancelled":
            raise
        log.info(f"run {run_id} stopped before generation {ctx.generation + 1} ended")
        return Cancelled(message=f"run {run_id} was stopped")
    finally:
        pool.shutdown()
        end_run(warehouse_root, hold, _run_row(run_id, status, **base, finished_at=now()), status)
    if gpus:
        _dispatch(wh, run_id, problem, shape_set)
    try:
        compact(warehouse_root)
    except Exception as e:  # noqa: BLE001 - the run's rows are in; merging them is housekeeping
        log.warning(f"warehouse compaction skipped: {e}")
    return {"run_id": run_id, "outcomes": totals, "timed": bool(gpus), "shapes": len(shapes),
            "harness_version": harness.version,
            "best_score": best[0][0] if best else None,
            "best_score_kind": ("measured geomean ms" if gpus else "predicted geomean ms (CPU: not timed)")}


def _learn(ctx: Context, attempts: list[Attempt], done: list[Attempt], totals: dict[str, int],
           best: list[tuple[float, str]]) -> None:
    """What the agent sees next generation: feedback of failures, tactic track records, the best so far."""
    for a in attempts:
        if a.outcome.failed and a.diagnostics:
            d = next((d for d in a.diagnostics if d.is_error), a.diagnostics[0])
            ctx.feedback.append(d.format("candidate.cake", a.candidate.text))
        totals[a.outcome.value] = totals.get(a.outcome.value, 0) + 1
        ctx.seen.add(a.ir_hash)
        for t in (a.candidate.tactic or "").split("+"):
            if t:
                tried, won = ctx.tactic_stats.get(t, (0, 0))
                ctx.tactic_stats[t] = (tried + 1, won + int(a.outcome in (Outcome.MEASURED, Outcome.CHECKED)))
    for a in done:
        if a.outcome is Outcome.MEASURED:
            best.append((math.exp(sum(math.log(m["median_ms"]) for m in a.measurements) / len(a.measurements)),
                         a.candidate.text))
        elif a.outcome is Outcome.CHECKED:
            best.append((a.predicted_ms or float("inf"), a.candidate.text))
    best.sort(key=lambda x: x[0])
    ctx.best = [(t, s) for s, t in best[:4]]


def _make_agent(kind: str, seed: int, disabled: tuple[str, ...], llm: dict[str, Any] | None):
    if kind == "tactic":
        return TacticAgent(seed, {k: v for k, v in TACTICS.items() if k not in disabled})
    if kind == "llm":
        from cake_core.agents.llm_agent import LLMAgent, LLMConfig
        from cake_core.ir.reference import render_reference
        cfg = dict(llm or {})
        if not cfg.get("model"):
            raise CakeError("the llm agent needs a model: set CAKE_LLM_MODEL")
        key = os.environ.get(cfg.pop("api_key_env", "OPENAI_API_KEY"), "")
        return LLMAgent(LLMConfig(api_key=key, **cfg), render_reference())
    raise CakeError(f"unknown agent `{kind}`; use tactic or llm")


def _dispatch(wh: Warehouse, run_id: str, problem: str, shape_set: str) -> None:
    """Per shape, this run's kernel for an inference engine to dispatch on: the confirmed winner with
    its confirmatory median (the fastest search figure where nothing was confirmed)."""
    rows = wh.query("""
        with u as (
            select shape, attempt_id, median_ms, case kind when 'confirm' then 0 else 1 end as pref
            from measurements where run_id = ? and correct
        ), chosen as (select shape, min(pref) as pref from u group by shape)
        select u.shape, arg_min(u.attempt_id, u.median_ms) as attempt_id, min(u.median_ms) as median_ms
        from u join chosen using (shape, pref) group by u.shape""", [run_id]).to_pylist()
    hashes = {r["attempt_id"]: r["ir_hash"] for r in wh.query(
        "select attempt_id, ir_hash from attempts where run_id = ?", [run_id]).to_pylist()}
    if rows:
        wh.append("dispatch", [{"problem": problem, "shape_set": shape_set, "shape": r["shape"],
                                "attempt_id": r["attempt_id"], "ir_hash": hashes.get(r["attempt_id"], ""),
                                "median_ms": r["median_ms"], "created_at": now()} for r in rows])
