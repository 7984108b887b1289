"""The evolution flow: per generation, the stages of ``cake_core.pipeline.STAGES`` as Prefect tasks, until the
run's state says stop; then the final stage (confirm, held-out report, baselines, dispatch).

The flow body only orchestrates: every step is a task of ``tasks/``. With GPUs, candidates and their shapes
are checked and timed on one GPU runner per GPU of the asked model that the Ray cluster offers; without,
checked on the CPU interpreter (one worker per core) and ranked by the cost model, recorded as ``checked``
(not timed). The flow run is named for what the run is (problem, shape set, harness version, cold or warm,
run id), each task run for its stage, generation and candidates; each generation publishes its table and the
end of the run its leaderboard (``tasks.artifacts``; one that cannot be published is a warning, never a
stopped run). Every attempt lands in the warehouse; a run killed at any point continues with
``resume=RUN_ID`` exactly where an uninterrupted run would have gone.
"""
from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled
from prefect.utilities.annotations import opaque

from tasks.artifacts import generation_artifact, leaderboard_artifact, name_flow_run, shown
from tasks.final import final
from tasks.opening import request_from
from tasks.run import close_run, open_run, workers
from tasks.run_control import raise_if_stopped, status_for
from tasks.stages import stage_tasks
from tasks.summary import summarize


def _asked_name() -> str:
    """The flow run's name from its parameters, until ``name_flow_run`` names it for the opened run."""
    p = dict(flow_run.parameters)
    p["problem"] = str(p["problem"]).rstrip("/").rsplit("/", 1)[-1].split(":")[0]   # a path or module reference
    if p.get("resume"):
        return f"{p['problem']} · resume {p['resume']}"
    hv = p.get("harness_version")
    return (f"{p['problem']} · {p.get('shape_set')} · harness {'newest' if hv is None else f'v{hv}'} · "
            f"{'cold' if p.get('cold') else 'warm'}")


def _outcomes(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"


@flow(name="evolve", flow_run_name=_asked_name, log_prints=True, validate_parameters=False)
def evolve_flow(problem: str, shape_set: str | None = None, generations: int | None = None,
                population: int | None = None, seed: int | None = None, agent: str | None = None,
                cold: bool | None = None, harness_version: int | None = None, budget_candidates: int | None = None,
                budget_gpu_minutes: float | None = None, patience: int | None = None,
                check_shape_set: str | None = None, cost_filter: bool | None = None, filter_keep: int | None = None,
                run_id: str | None = None, resume: str | None = None, debug: bool = False,
                cost_model: str | None = None, warehouse_root: str = ".cake/warehouse", cache_dir: str = ".cake/cache",
                gpu_models: list[str] | None = None, gpu_count: int | None = None, timeout_s: float = 120.0,
                reps: int = 20, llm: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evolve kernels for ``problem`` over the shapes of ``shape_set`` (or continue run ``resume``); returns a
    summary. The parameters are the fields of ``cake_core.pipeline.request.RunRequest`` (each one's help is
    there and in ``cake evolve --help``); left None, one takes the run's recorded value on a resume, its default
    on a new run. ``gpu_models[0]`` is the GPU model asked for: one runner per GPU of it on the Ray cluster (at
    most ``gpu_count``)."""
    request = request_from(locals())       # first: locals() are the parameters, nothing else yet
    log = get_run_logger()
    run = open_run(request)
    shown(log, "the run's name", name_flow_run(opaque(run), return_state=True))
    log.info(f"run {run.plan.run_id} (job {run.plan.session}): {run.plan.problem} on {run.plan.shape_set}, "
             f"harness v{run.harness.version}{', cold' if run.plan.cold else ''}, from generation "
             f"{run.state.generation}, "
             f"{f'{run.gpu_runners} x GPU {run.gpus[0]}' if run.gpus else 'CPU interpreter (not timed)'}")
    status, stop = "failed", None
    try:
        with workers(run):
            while run.state.stop is None:
                raise_if_stopped(run.plan.run_id)       # Ctrl-C, SIGTERM, a cancelled flow run: between stages
                gen, batch = run.state.generation, []
                for stage in stage_tasks(run):
                    raise_if_stopped(run.plan.run_id)
                    n = f"{run.state.population} asked" if stage.name == "generate" else f"{len(batch)} candidates"
                    # opaque: Prefect would walk every program of the batch looking for futures, per task
                    batch = stage.with_options(task_run_name=f"{stage.name} g{gen} ({n})")(opaque(run), opaque(batch))
                g = shown(log, f"generation {gen}'s table", generation_artifact(
                    run.warehouse_root, run.plan.run_id, gen, run.timed, return_state=True))
                if g is not None:
                    best = g["best"]
                    log.info(f"generation {gen}: {g['attempts']} candidates ({_outcomes(g['outcomes'])}); "
                             f"{run.state.attempts} attempts in the run; best so far "
                             + (f"{best['score_ms']:.4g} ms ({best['basis']}, {best['attempt_id']})" if best
                                else "none"))
                else:
                    log.info(f"generation {gen}: {run.state.attempts} attempts in the run")
            stop = run.state.stop
            for f in final(opaque(run))["confirm_failed"]:
                log.warning(f"confirm failed: {f['attempt_id']} on {f['shape']}: {f['message']} (not a winner)")
            shown(log, "the leaderboard", leaderboard_artifact(run.warehouse_root, run.plan.run_id,
                                                                return_state=True))
        status = "completed"
    except BaseException as e:
        status = status_for(e, run.plan.run_id)
        if status != "cancelled":
            raise
        log.info(f"run {run.plan.run_id} stopped in generation {run.state.generation}")
        return Cancelled(message=f"run {run.plan.run_id} was stopped")
    finally:
        close_run(opaque(run), status, stop)
    return summarize(run, stop)
