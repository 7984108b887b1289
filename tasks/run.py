"""A run's life: open it (new, or resumed from the warehouse), hold its workers, close it with its status.

:func:`open_run` checks everything that can be wrong with the request before it records anything
(``tasks.opening.check_request``: an unknown problem or shape set, a value out of range, a pinned harness
version that does not exist, a ``--resume`` of an unknown run, of another problem's run, of a run whose harness
version is gone, or of a run another process is running), then takes the run's lock, records the run's row and
rebuilds its state from the warehouse.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from cake_core.errors import CakeError
from cake_core.harness.version import HarnessSpec
from cake_core.model.artifact import model_for_run
from cake_core.model.base import CostModelBase
from cake_core.targets import gpu_for_name
from cake_core.pipeline.debug import Debug
from cake_core.pipeline.generate import make_agent
from cake_core.pipeline.plan import ResumeRefused, RunPlan
from cake_core.pipeline.request import RunRequest
from cake_core.pipeline.rows import now, run_row, shape_rows
from cake_core.pipeline.state import RunState, select_stage
from cake_core.problems import get_problem, load_shape_set
from cake_core.problems.base import Problem, Shape
from tasks.harness import load_harness
from tasks.opening import check_request
from tasks.record import Recorder, compact
from tasks.run_control import RunLock, end_run, status_for, stop_requested
from tasks.workers import worker_pools
from warehouse.queries import run_rows, state_rows

STOP_HINTS = {"generations": "pass --generations with more than {generations}",
              "budget_candidates": "pass --budget-candidates above {budget_candidates}",
              "budget_gpu_minutes": "pass --budget-gpu-minutes above {budget_gpu_minutes}",
              "no_improvement": "pass --patience above {patience}"}


@dataclass
class Run:
    """Everything the stages of one run share (one job of it: a resume is a new job of the same run)."""

    plan: RunPlan
    warehouse_root: str
    cache_dir: str
    harness: HarnessSpec
    gpus: list[str]
    search_shapes: list[Shape]      # what selection ranks on: the cost model, and the GPU timing
    check_shapes: list[Shape]       # what the interpreter checks (CPU); the search shapes on a GPU
    held_out: list[Shape]           # measured (or checked) for the final best only, reported apart
    roles: dict[str, str]           # shape key -> headline | tail | held_out | sweep, every shape of the run
    model: CostModelBase
    agent: Any
    timeout_s: float
    reps: int
    flow_run_id: str | None
    recorder: Recorder
    state: RunState
    debug: Debug | None = None
    lock: RunLock | None = None
    sweep: list[Shape] = field(default_factory=list)   # the finalists measured (checked) there after the search
    cpu: Any = None                 # tasks.workers.ActorPool of CpuWorker
    gpu: Any = None                 # tasks.workers.ActorPool of GpuRunner (None: no GPU)
    gpu_resource: str | None = None  # the Ray resource of the GPU model asked for (gpu_model:H200)
    gpu_runners: int = 0            # GPU runners: one per GPU of that model the cluster offers, at most gpu_count
    stage_rows: list[dict[str, Any]] = field(default_factory=list)
    finished: list[Any] = field(default_factory=list)     # the generation's attempts that stopped
    generations_run: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def problem(self) -> Problem:
        """The run's problem (sent to a worker as its importable reference, never as a name to look up)."""
        return get_problem(self.plan.problem)

    @property
    def timed(self) -> bool:
        return bool(self.gpus)

    @property
    def run_shapes(self) -> list[Shape]:
        """The shapes a candidate runs on during the search (its shape rules are checked against them)."""
        return self.search_shapes if self.timed else self.check_shapes

    def input_seed(self) -> int:
        """The seed of this generation's fresh random inputs."""
        return self.plan.seed + self.state.generation

    def compact(self) -> None:
        try:
            compact.fn(self.warehouse_root)
        except Exception:  # noqa: BLE001 - the rows are in; merging their files is housekeeping
            pass


@task(name="check-shape-sets", cache_policy=NO_CACHE)
def check_shape_sets(problem: str, shape_sets: list[str] | None) -> list[str]:
    """``shape_sets`` (default: every set ``problem`` declares), each loaded once so a bad one is refused now."""
    prob = get_problem(problem)
    sets = list(shape_sets or prob.shape_sets)
    if not sets:
        raise CakeError(f"problem {problem} declares no shape set; pass shape_sets")
    for name in sets:
        load_shape_set(prob, name)
    return sets


@task(name="open-run", cache_policy=NO_CACHE)
def open_run(request: RunRequest) -> Run:
    """Check the request (``tasks.opening.check_request``, as ``cake evolve`` did before any service started),
    take the run's lock, record the run's row (and its shapes, for a new run), rebuild its state.

    ``request.cost_model``: a model file (``cake model fit``) to rank with instead of the harness's analytic
    model; one that does not load, is for another GPU or (learned) did not beat the analytic model on held-out
    data falls back to the harness's model, and the run's log says why. A timed run gets one GPU runner per GPU
    of the model ``request.gpu_models[0]`` names that the Ray cluster offers (at most ``request.gpu_count``); a
    model the cluster lacks is refused here, before anything is recorded."""
    from warehouse import Warehouse

    root = request.warehouse_root
    Warehouse(root)
    gpus = list(request.gpu_models or [])
    checked = check_request(request, timed=bool(gpus))
    shapes = checked.shapes
    gpu_resource, runners = _gpu_runners(gpus, request.gpu_count)
    harness = load_harness(root, checked.plan.harness_version)
    plan = replace(checked.plan, harness_version=harness.version)
    lock = RunLock(root, plan.run_id)
    try:
        state = select_stage(plan, **state_rows(root, plan.run_id))
        if request.resume and state.stop and run_rows(root, plan.run_id)[0]["status"] == "completed":
            hint = STOP_HINTS[state.stop].format(**vars(plan))
            raise ResumeRefused(f"run `{plan.run_id}` already stopped ({state.stop.replace('_', ' ')} after "
                                f"{state.attempts} attempts); {hint} to continue it")
        gpu = gpu_for_name(gpus[0] if gpus else None)
        model = harness.cost_model(gpu)
        if request.cost_model is not None:
            model, why = model_for_run(request.cost_model, gpu, fallback=model, problem=plan.problem)
            get_run_logger().info(why)
        run = Run(plan, root, request.cache_dir, harness, gpus, shapes.search, shapes.check, shapes.held_out,
                  shapes.roles, model, make_agent(plan.agent, plan.seed, harness, request.llm), request.timeout_s,
                  request.reps, str(flow_run.id) if flow_run.id else None, Recorder(root, plan.run_id), state,
                  lock=lock, sweep=shapes.sweep)
        if request.debug:
            run.debug = Debug(Path(root).parent / "debug", harness, plan.problem, run.run_shapes)
        run.gpu_resource, run.gpu_runners = gpu_resource, runners
        run.recorder.rows("runs", [run_row(plan, "running", harness_version=harness.version,
                                           gpu_model=gpus[0] if gpus else None, flow_run_id=run.flow_run_id)])
        if not request.resume:
            ss = shapes.shape_set      # sweep rows are not the run's shapes: its measurements there say where
            kept = [(s, r) for s, r in zip(ss.shapes, ss.roles) if r != "sweep"]
            run.recorder.rows("shapes", shape_rows(ss.name, plan.problem, [s for s, _ in kept], [r for _, r in kept]))
        run.recorder.flush()
        return run
    except BaseException:
        lock.release()
        raise


def _gpu_runners(gpus: list[str], gpu_count: int | None) -> tuple[str | None, int]:
    """(resource, runners) of a run asking for GPU model ``gpus[0]`` (None, 0 without GPUs)."""
    if not gpus:
        return None, 0
    import ray

    from tasks.gpus import gpu_runners
    from tasks.ray_runtime import ensure_ray

    ensure_ray(gpus=True)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return gpu_runners(gpus[0], ray.cluster_resources(), limit=gpu_count,
                       where=f"the Ray cluster ({nodes} node{'s' if nodes != 1 else ''})")


@contextlib.contextmanager
def workers(run: Run) -> Iterator[Run]:
    """The run's CPU workers (one per core) and GPU runners (one per GPU of its model), shut down on the way
    out."""
    refs = str(Path(run.cache_dir).parent / "refs")      # the Cake home's: references outlive the run
    with worker_pools(run.gpu_runners, refs_dir=refs, gpu_resource=run.gpu_resource,
                      should_stop=lambda: stop_requested(run.plan.run_id)) as (cpu, gpu):
        run.cpu, run.gpu = cpu, gpu
        try:
            yield run
        finally:
            run.cpu = run.gpu = None


@task(name="close-run", cache_policy=NO_CACHE)
def close_run(run: Run, status: str, stop_reason: str | None = None) -> None:
    """Land what is left, record the run's final status row, compact the batch files and release the run.
    A run that failed gets its status row even when its last rows could not land (the error is raised after);
    a run asked to stop lands nothing more and ends ``cancelled``."""
    error: BaseException | None = None
    try:
        run.recorder.close()
    except BaseException as e:  # noqa: BLE001 - the status row goes in first
        status, stop_reason = status_for(e, run.plan.run_id), None
        error = None if status == "cancelled" else e
    try:
        # a run sealed by a stop (Ctrl-C, SIGTERM) has its status written by whoever sealed it
        end_run(run.warehouse_root, None, run_row(
            run.plan, status, harness_version=run.harness.version, gpu_model=run.gpus[0] if run.gpus else None,
            flow_run_id=run.flow_run_id, stop_reason=stop_reason, finished_at=now()), status)
        run.compact()
    finally:
        if run.lock is not None:
            run.lock.release()
    if error is not None:
        raise error
