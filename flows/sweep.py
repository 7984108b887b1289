"""The sweep flow: evolve a problem on each of its shape sets, or re-time its best kernels on them.

``mode="evolve"`` runs the evolution flow once per shape set (a subflow each).
``mode="retime"`` takes the best kernels the warehouse holds for the problem
and checks them again, on fresh inputs, on every shape of each set (timed on the
GPU when there is one) as a new run whose attempts name the kernels they
re-time as parents. Both start (or join) Ray themselves, as a worker runs them
in a bare process.
"""
from __future__ import annotations

import datetime as dt
import math
import secrets
import socket
from typing import Any

import ray
from prefect import flow, get_run_logger
from prefect.states import Cancelled

from cake_core.agents.base import Candidate
from cake_core.errors import CakeError
from cake_core.model.cost import CostModel, gpu_for_name
from cake_core.outcome import Outcome
from cake_core.problems import get_problem, load_shape_set
from flows.evolve import evolve_flow
from tasks.harness import load_harness
from tasks.ray_runtime import ensure_ray
from tasks.record import Attempt, now
from tasks.run_control import begin_run, end_run, status_for, stop_requested
from tasks.stages import check_cpu, compile_one, cost_filter, record, time_gpu, verify
from tasks.sweep import best_kernels
from tasks.workers import ActorPool, CpuChecker, GpuRunner

MODES = ("evolve", "retime")


def _run_id(problem: str, mode: str, shape_set: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{problem}-{mode}-{shape_set.rsplit('/', 1)[-1].removesuffix('.csv')}-{stamp}-{secrets.token_hex(2)}"


@flow(name="sweep", log_prints=True, validate_parameters=False)
def sweep_flow(problem: str, shape_sets: list[str] | None = None, mode: str = "evolve", generations: int = 3,
               population: int = 8, seed: int = 0, top: int = 3, warehouse_root: str = ".cake/warehouse",
               cache_dir: str = ".cake/cache", gpu_models: list[str] | None = None) -> dict[str, Any]:
    """Evolve ``problem`` on each shape set (default: all it declares), or re-time its ``top`` best kernels."""
    if mode not in MODES:
        raise CakeError(f"sweep mode `{mode}` is not known; use {' or '.join(MODES)}")
    prob = get_problem(problem)
    sets = list(shape_sets or prob.shape_sets)
    for name in sets:
        load_shape_set(prob, name)   # every set is checked before the first run starts
    runs: dict[str, Any] = {}
    for name in sets:
        run_id = _run_id(problem, mode, name)
        if mode == "evolve":
            runs[name] = evolve_flow(problem=problem, shape_set=name, generations=generations,
                                     population=population, seed=seed, run_id=run_id,
                                     warehouse_root=warehouse_root, cache_dir=cache_dir, gpu_models=gpu_models)
        else:
            runs[name] = retime_flow(problem=problem, shape_set=name, top=top, seed=seed, run_id=run_id,
                                     warehouse_root=warehouse_root, cache_dir=cache_dir, gpu_models=gpu_models)
    return {"problem": problem, "mode": mode, "runs": runs}


@flow(name="retime", log_prints=True, validate_parameters=False)
def retime_flow(problem: str, shape_set: str, top: int = 3, seed: int = 0, run_id: str | None = None,
                warehouse_root: str = ".cake/warehouse", cache_dir: str = ".cake/cache",
                gpu_models: list[str] | None = None, timeout_s: float = 120.0, reps: int = 20) -> dict[str, Any]:
    """Check (and on a GPU time) the ``top`` best recorded kernels of ``problem`` on every shape of ``shape_set``."""
    log = get_run_logger()
    prob = get_problem(problem)
    ss = load_shape_set(prob, shape_set)
    gpus = list(gpu_models or [])
    shapes = list(ss.shapes) if gpus else ss.cpu_shapes(prob.cpu_limit)
    if not shapes:
        raise CakeError(f"shape set `{shape_set}` has no shape small enough for the CPU interpreter; "
                        f"re-time it where a GPU is present")
    kernels = best_kernels(warehouse_root, problem, top)
    if not kernels:
        raise CakeError(f"the warehouse holds no kernel of {problem} that passed its checks; run "
                        f"`cake evolve {problem}` first")
    ensure_ray(gpus=bool(gpus))
    run_id = run_id or _run_id(problem, "retime", shape_set)
    harness = load_harness(warehouse_root)
    row = {"run_id": run_id, "problem": problem, "shape_set": shape_set, "harness_version": harness.version,
           "agent": "retime", "seed": seed, "generations": 1, "population": len(kernels),
           "host": socket.gethostname(), "gpu_model": gpus[0] if gpus else None,
           "started_at": now()}
    hold = begin_run(warehouse_root, row)
    stop = lambda: stop_requested(run_id)  # noqa: E731 - the pool polls it
    if gpus:
        pool = ActorPool(lambda: GpuRunner.remote(), len(gpus), should_stop=stop)
    else:
        pool = ActorPool(lambda: CpuChecker.remote(), min(max(1, int(ray.cluster_resources().get("CPU", 1))), 4),
                         should_stop=stop)
    status, done = "failed", []
    try:
        attempts = [Attempt(run_id, 0, problem, harness.version,
                            Candidate(k["ir_text"], parents=(k["ir_hash"],), agent="retime")) for k in kernels]
        passed, stopped = verify(attempts, harness, shapes)
        record(warehouse_root, stopped)
        compiled = [f.result() for f in compile_one.map(passed, cache_dir)] if passed else []
        record(warehouse_root, [a for a in compiled if a.outcome is Outcome.COMPILE_FAILED])
        ok = [a for a in compiled if a.outcome is not Outcome.COMPILE_FAILED]
        model = CostModel(gpu_for_name(gpus[0] if gpus else None))
        ok, _ = cost_filter(ok, shapes, len(ok), 0, seed, model) if ok else ([], [])   # predictions, none dropped
        if ok:
            done = (time_gpu(pool, ok, problem, shapes, seed, timeout_s, gpus[0], reps) if gpus
                    else check_cpu(pool, ok, problem, shapes, seed, timeout_s))
            record(warehouse_root, done)
        status = "completed"
    except BaseException as e:
        status = status_for(e, run_id)
        if status != "cancelled":
            raise
        return Cancelled(message=f"run {run_id} was stopped")
    finally:
        pool.shutdown()
        end_run(warehouse_root, hold, {**row, "finished_at": now()}, status)
    outcomes: dict[str, int] = {}
    for a in attempts:
        outcomes[a.outcome.value] = outcomes.get(a.outcome.value, 0) + 1
    scores = [math.exp(sum(math.log(m["median_ms"]) for m in a.measurements) / len(a.measurements))
              for a in done if a.outcome is Outcome.MEASURED]
    log.info(f"retime {run_id}: {len(kernels)} kernels on {len(shapes)} shapes of {shape_set}: {outcomes}")
    return {"run_id": run_id, "kernels": len(kernels), "shapes": len(shapes), "outcomes": outcomes,
            "timed": bool(gpus), "best_measured_ms": min(scores) if scores else None}
