"""A run's life: open it (new, or resumed from the warehouse), hold its workers, close it with its status.

:func:`open_run` checks everything that can be wrong with the request before it records anything (an
unknown problem or shape set, a pinned harness version that does not exist, a ``--resume`` of an unknown
run, of another problem's run, of a run whose harness version is gone, or of a run another process is
running), then records the run's row and rebuilds its state from the warehouse.
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
from cake_core.pipeline.rows import now, run_row, shape_rows
from cake_core.pipeline.stages import nvcc_available, stages_for
from cake_core.pipeline.state import RunState, select_stage
from cake_core.problems import get_problem, load_shape_set, shape_key
from cake_core.problems.base import Shape
from tasks.harness import load_harness
from tasks.history import plan_resume, run_lock, run_rows, state_rows
from tasks.record import Recorder, compact
from tasks.run_control import end_run, mark_crashed, status_for, stop_requested
from tasks.stages import STAGE_TASKS
from tasks.workers import worker_pools

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
    roles: dict[str, str]           # shape key -> headline | tail | held_out, every shape of the run
    model: CostModelBase
    agent: Any
    timeout_s: float
    reps: int
    flow_run_id: str | None
    recorder: Recorder
    state: RunState
    debug: Debug | None = None
    lock: Any = None
    cpu: Any = None                 # tasks.workers.ActorPool of CpuWorker
    gpu: Any = None                 # tasks.workers.ActorPool of GpuRunner (None: no GPU)
    gpu_resource: str | None = None  # the Ray resource of the GPU model asked for (gpu_model:H200)
    gpu_runners: int = 0            # GPU runners: one per GPU of that model the cluster offers, at most gpu_count
    stage_rows: list[dict[str, Any]] = field(default_factory=list)
    finished: list[Any] = field(default_factory=list)     # the generation's attempts that stopped
    generations_run: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def timed(self) -> bool:
        return bool(self.gpus)

    @property
    def run_shapes(self) -> list[Shape]:
        """The shapes a candidate runs on during the search (its shape rules are checked against them)."""
        return self.search_shapes if self.timed else self.check_shapes

    @property
    def stages(self) -> list[Any]:
        """The stage tasks of this run, in ``cake_core.pipeline.STAGES`` order."""
        return [STAGE_TASKS[s.name] for s in stages_for(self.timed)]

    def input_seed(self) -> int:
        """The seed of this generation's fresh random inputs."""
        return self.plan.seed + self.state.generation

    def compact(self) -> None:
        try:
            compact.fn(self.warehouse_root)
        except Exception:  # noqa: BLE001 - the rows are in; merging their files is housekeeping
            pass


def _shapes(problem: str, shape_set: str, check_shape_set: str | None, timed: bool):
    prob = get_problem(problem)
    ss = load_shape_set(prob, shape_set)
    search = [s for s, r in zip(ss.shapes, ss.roles) if r != "held_out"]
    held = [s for s, r in zip(ss.shapes, ss.roles) if r == "held_out"]
    roles = {shape_key(s): r for s, r in zip(ss.shapes, ss.roles)}
    if not search:
        raise CakeError(f"shape set `{shape_set}` has only held-out rows; selection needs headline or tail rows")
    small = lambda shapes: [s for s in shapes if max(s.values()) <= prob.cpu_limit]  # noqa: E731
    if timed:
        if check_shape_set:
            raise CakeError("--check-shapes is for runs without a GPU (checked on the interpreter, ranked by the "
                            "cost model); on a GPU every candidate is checked and timed on --shapes")
        return ss, search, search, held
    if check_shape_set:
        cs = load_shape_set(prob, check_shape_set)
        check = small([s for s, r in zip(cs.shapes, cs.roles) if r != "held_out"])
        if not check:
            raise CakeError(f"--check-shapes {check_shape_set} has no shape small enough for the CPU interpreter "
                            f"(every dimension ≤ {prob.cpu_limit})")
        return ss, search, check, small(held)
    check = small(search)
    if not check:
        raise CakeError(f"shape set `{shape_set}` has no shape small enough for the CPU interpreter (every "
                        f"dimension ≤ {prob.cpu_limit}); pick a smaller set such as {prob.shape_sets[0]}, run "
                        f"where a GPU is present, or pass --check-shapes {prob.shape_sets[0]} to check there and "
                        f"rank by the cost model on `{shape_set}`")
    return ss, check, check, small(held)


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
def open_run(*, problem: str, run_id: str, warehouse_root: str, cache_dir: str,
             gpu_models: list[str], timeout_s: float, reps: int, asked: dict[str, Any], resume: str | None,
             llm: dict[str, Any] | None, debug: bool, cost_model: str | None = None,
             gpu_count: int | None = None) -> Run:
    """Check the request, record the run's row (and its shapes, for a new run), rebuild its state.

    ``cost_model``: a model file (``cake model fit``) to rank with instead of the harness's analytic model; one
    that does not load, is for another GPU or (learned) did not beat the analytic model on held-out data falls
    back to the harness's model, and the run's log says why. A timed run gets one GPU runner per GPU of the
    model ``gpu_models[0]`` names that the Ray cluster offers (at most ``gpu_count``); a model the cluster
    lacks is refused here, before anything is recorded."""
    from warehouse import Warehouse

    Warehouse(warehouse_root)
    mark_crashed(warehouse_root)          # runs whose process died while running (kill -9) are crashed
    gpus = list(gpu_models or [])
    if gpus and not nvcc_available():
        raise CakeError("a GPU run builds cubins with nvcc, which is not on PATH; install the CUDA toolkit "
                        "(nvcc) or run with CAKE_GPU=off to check on the CPU")
    gpu_resource, runners = _gpu_runners(gpus, gpu_count)
    if resume:
        plan = plan_resume(warehouse_root, resume, {"problem": problem, **asked}, timed=bool(gpus))
    else:
        if run_rows(warehouse_root, run_id):
            raise CakeError(f"run `{run_id}` exists already; continue it with --resume {run_id}")
        if asked.get("shape_set") is None:
            raise CakeError(f"a new run needs a shape set; pass --shapes (see `cake problems` for {problem}'s)")
        plan = RunPlan(run_id=run_id, problem=problem, started_at=now(),
                       **{k: v for k, v in asked.items() if v is not None})
    ss, search, check, held = _shapes(plan.problem, plan.shape_set, plan.check_shape_set, bool(gpus))
    harness = load_harness(warehouse_root, plan.harness_version)
    plan = replace(plan, harness_version=harness.version)
    lock = run_lock(warehouse_root, plan.run_id)
    try:
        state = select_stage(plan, **state_rows(warehouse_root, plan.run_id))
        if resume and state.stop and run_rows(warehouse_root, plan.run_id)[0]["status"] == "completed":
            hint = STOP_HINTS[state.stop].format(**vars(plan))
            raise ResumeRefused(f"run `{plan.run_id}` already stopped ({state.stop.replace('_', ' ')} after "
                                f"{state.attempts} attempts); {hint} to continue it")
        gpu = gpu_for_name(gpus[0] if gpus else None)
        model = harness.cost_model(gpu)
        if cost_model is not None:
            model, why = model_for_run(cost_model, gpu, fallback=model, problem=plan.problem)
            get_run_logger().info(why)
        run = Run(plan, warehouse_root, cache_dir, harness, gpus, search, check, held,
                  {shape_key(s): r for s, r in zip(ss.shapes, ss.roles)}, model,
                  make_agent(plan.agent, plan.seed, harness, llm), timeout_s, reps,
                  str(flow_run.id) if flow_run.id else None, Recorder(warehouse_root, plan.run_id), state, lock=lock)
        if debug:
            run.debug = Debug(Path(warehouse_root).parent / "debug", harness, plan.problem, run.run_shapes)
        run.gpu_resource, run.gpu_runners = gpu_resource, runners
        run.recorder.rows("runs", [run_row(plan, "running", harness_version=harness.version,
                                           gpu_model=gpus[0] if gpus else None, flow_run_id=run.flow_run_id)])
        if not resume:
            run.recorder.rows("shapes", shape_rows(ss.name, plan.problem, ss.shapes, ss.roles))
        run.recorder.flush()
        return run
    except BaseException:
        lock.close()
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
            run.lock.close()
    if error is not None:
        raise error
