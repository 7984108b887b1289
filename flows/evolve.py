"""The evolution flow: per generation, the stages of ``cake_core.pipeline.STAGES`` as Prefect tasks, until the
run's state says stop; then the final stage (confirm, held-out report, baselines, dispatch).

The flow body only orchestrates: every step is a task of ``tasks/``. With GPUs, candidates and their shapes
are checked and timed on one GPU runner per GPU of the asked model that the Ray cluster offers; without,
checked on the CPU interpreter (one worker per core) and ranked by the cost model, recorded as ``checked``
(not timed). Every attempt lands in the warehouse; a run killed at any point continues with ``resume=RUN_ID``
exactly where an uninterrupted run would have gone.
"""
from __future__ import annotations

import uuid
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import opaque

from tasks.final import final
from tasks.run import close_run, open_run, workers
from tasks.summary import summarize


@flow(name="evolve", log_prints=True, validate_parameters=False)
def evolve_flow(problem: str, shape_set: str | None = None, generations: int | None = None,
                population: int | None = None, seed: int | None = None, run_id: str | None = None,
                warehouse_root: str = ".cake/warehouse", cache_dir: str = ".cake/cache",
                gpu_models: list[str] | None = None, timeout_s: float = 120.0, reps: int = 20, agent: str | None = None,
                llm: dict[str, Any] | None = None, cold: bool | None = None, resume: str | None = None,
                harness_version: int | None = None, budget_candidates: int | None = None,
                budget_gpu_minutes: float | None = None, patience: int | None = None,
                check_shape_set: str | None = None, debug: bool = False,
                gpu_count: int | None = None) -> dict[str, Any]:
    """Evolve kernels for ``problem`` over the shapes of ``shape_set`` (or continue run ``resume``); returns a
    summary. Parameters left None take the run's recorded value on a resume, the defaults on a new run.
    ``gpu_models[0]`` is the GPU model asked for: one runner per GPU of it on the Ray cluster (at most
    ``gpu_count``)."""
    log = get_run_logger()
    asked = dict(shape_set=shape_set, generations=generations, population=population, seed=seed, agent=agent,
                 cold=cold, harness_version=harness_version, budget_candidates=budget_candidates,
                 budget_gpu_minutes=budget_gpu_minutes, patience=patience, check_shape_set=check_shape_set)
    run = open_run(problem=problem, run_id=resume or run_id or uuid.uuid4().hex[:12], warehouse_root=warehouse_root,
                   cache_dir=cache_dir, gpu_models=gpu_models or [], timeout_s=timeout_s, reps=reps, asked=asked,
                   resume=resume, llm=llm, debug=debug, gpu_count=gpu_count)
    log.info(f"run {run.plan.run_id} (job {run.plan.session}): {run.plan.problem} on {run.plan.shape_set}, "
             f"harness v{run.harness.version}{', cold' if run.plan.cold else ''}, from generation "
             f"{run.state.generation}, "
             f"{f'{run.gpu_runners} x GPU {run.gpus[0]}' if run.gpus else 'CPU interpreter (not timed)'}")
    status, stop = "failed", None
    try:
        with workers(run):
            while run.state.stop is None:
                batch: list = []
                for stage in run.stages:
                    # opaque: Prefect would walk every program of the batch looking for futures, per task
                    batch = stage(opaque(run), opaque(batch))
                log.info(f"generation {run.state.generation - 1}: {run.state.attempts} attempts so far, best "
                         f"{run.state.best_score}")
            stop = run.state.stop
            final(opaque(run))
        status = "completed"
    finally:
        close_run(opaque(run), status, stop)
    return summarize(run, stop)
