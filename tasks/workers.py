"""Ray actors that run the stages, and a pool that survives their faults and hangs.

Every core busy: a :class:`CpuWorker` per CPU core runs the per-candidate stages (verify, lower, compile
with nvcc, cached by source hash) and the interpreter's check; a :class:`GpuRunner` per GPU only loads
cubins others compiled and runs them, taking batches of (candidate, shape) jobs, so the shapes of one
candidate spread over the GPUs of the machine or the cluster. A job that kills its actor (an illegal
address poisons the CUDA context) or outlives the watchdog is a :class:`Fault` (``runtime_fault`` /
``timeout``); the pool replaces the actor and the rest go on.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Sequence

import ray

from cake_core.errors import CakeError
from cake_core.outcome import Outcome
from tasks.processes import alive


@dataclass(frozen=True)
class Fault:
    """A job without an answer: its worker died or raised (``runtime_fault``), or outlived the watchdog
    (``timeout``). ``cause``: died | raised | timeout."""

    outcome: Outcome
    message: str
    cause: str = "died"


@dataclass(frozen=True)
class LostWork:
    """A unit that went back to the queue to run again on another actor, because the actor that held it was
    lost (``cause``: died, timeout -- outlived the watchdog --, raised, restart -- asked to be replaced after an
    earlier unit of its batch poisoned it --, node_lost -- alone on it, but its node went), on node
    ``node_id`` in process ``pid`` (None: it never answered)."""

    key: Hashable
    cause: str
    node_id: str | None
    pid: int | None
    message: str


class PoolExhausted(CakeError):
    """Every actor of a pool was lost and none could be started again."""


def _ident() -> tuple[str, int]:
    return ray.get_runtime_context().get_node_id(), os.getpid()


def _verify(text: str, harness, problem, shapes: list[dict]):
    from cake_core.pipeline.stages import verify_stage
    from cake_core.problems import get_problem
    return verify_stage(text, harness, get_problem(problem), shapes)


def _cpu_stage(name: str) -> Callable[..., Any]:
    from cake_core.pipeline import stages
    return {"verify": _verify, "lower": stages.lower_stage, "compile": stages.compile_stage,
            "check": stages.check_stage}[name]


# A quarter CPU each: several flows on one machine must all get workers (with 1 CPU each, a second
# flow's actors would wait for the first flow to end); the pool starts one per core.
@ray.remote(num_cpus=0.25)
class CpuWorker:
    """Runs one per-candidate stage at a time (``cake_core.pipeline.stages``): verify, lower, compile, check."""

    def stage(self, name: str, *args: Any) -> tuple[Any, float]:
        """``(StageResult, seconds)`` of stage ``name`` on ``args``."""
        t0 = time.monotonic()
        result = _cpu_stage(name)(*args)
        return result, time.monotonic() - t0

    def ident(self) -> tuple[str, int]:
        """(node id, pid): the pool waits on it for readiness and, after a kill, for the process to exit."""
        return _ident()


@ray.remote(num_gpus=1)
class GpuRunner:
    """Checks and times (candidate, shape) jobs on one GPU (``cake_core.pipeline.execute.GpuSession``).

    After a fault or a hang the CUDA context is unusable: a batch stops at that job and its answer says
    ``restart``; the session refuses any further work, and the pool replaces the actor. ``ident``
    initialises CUDA, so a ready actor has a live context.
    """

    def __init__(self, kernel_timeout_s: float | None = None, refs_dir: str | None = None):
        from cake_core.pipeline.execute import DEFAULT_KERNEL_TIMEOUT_S, GpuSession
        self.session = GpuSession(kernel_timeout_s or DEFAULT_KERNEL_TIMEOUT_S, refs_dir)

    def ident(self) -> tuple[str, int]:
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(0).use()
            cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(256))   # creates the context now, not mid-timing
        except Exception:  # noqa: BLE001 - no GPU: each job reports it
            pass
        return _ident()

    def run_batch(self, jobs: list) -> dict:
        """Run ``jobs`` (``GpuJob``) in order; ``{"verdicts", "restart", "pid"}``. After a job that poisoned
        the context, the rest are not run (fewer verdicts than jobs) and ``restart`` is set; a runner poisoned
        before the batch runs none of it."""
        out = []
        for job in jobs:
            if self.session.poisoned:
                break
            out.append(self.session.run(job))
        return {"verdicts": out, "restart": self.session.poisoned is not None, "pid": os.getpid()}

    def peer(self, problem, peer: str, shape: dict, seed: int, reps: int) -> dict:
        """One peer on one shape (``cake_core.pipeline.execute.GpuSession.peer``): ``{"verdict", "restart"}``."""
        if self.session.poisoned:
            return {"verdict": None, "restart": True}
        v = self.session.peer(problem, peer, shape, seed, reps)
        return {"verdict": v, "restart": self.session.poisoned is not None}

    def gpu_model(self) -> str | None:
        from cake_core.runtime.gpu import gpu_model
        return gpu_model()


MAX_NODE_LOSSES = 3      # times a unit alone on a lost node is run again before its Fault is its answer


def _node_alive(node_id: str | None) -> bool:
    """False once Ray marks node ``node_id`` dead (its actors died with it, not of their jobs)."""
    if node_id is None:
        return True
    try:
        return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
    except Exception:  # noqa: BLE001 - cannot tell: the job is blamed, as on one machine
        return True


@dataclass
class Unit:
    """One job of :meth:`ActorPool.run_units`: ``key`` names it, ``args`` is what the actor receives,
    ``group`` is kept together on an actor (a shape: its inputs and reference stay warm there)."""

    key: Hashable
    args: Any
    timeout_s: float
    group: Hashable = None


class ActorPool:
    """Runs jobs on a fixed number of actors with a per-job watchdog.

    A job whose actor dies, asks for a restart (``{"restart": True}``) or outlives its timeout
    gets its actor killed (``ray.kill``) and replaced. Before the replacement takes work, the pool
    waits for the killed process to exit when it ran on this node (its CUDA context, and any kernel
    still running in it, is gone only then: timings of later jobs must not share the GPU with it)
    and for the fresh actor to answer ``ident`` (for GpuRunner: CUDA initialised), so a job's
    watchdog clock never counts an actor's start. ``replaced`` counts the replacements. With
    ``should_stop``, every wait polls it and raises RunCancelled once it is true (a stopped run
    gives up its batch; its jobs' results would not be written anyway).
    """

    def __init__(self, factory: Callable[[], Any], size: int, *, start_timeout_s: float = 180.0,
                 exit_timeout_s: float = 60.0, should_stop: Callable[[], bool] | None = None):
        self.factory = factory
        self.should_stop = should_stop
        self.start_timeout_s, self.exit_timeout_s = start_timeout_s, exit_timeout_s
        self.replaced = 0
        self.dropped = 0                    # replacements that never came up: the pool went on without them
        self.lost: list[LostWork] = []      # the last run_units' units re-run after their actor was lost
        self.elapsed: list[float] = []
        self.idents: dict[Any, tuple[str, int] | None] = {}
        self.actors = [factory() for _ in range(max(size, 1))]
        for a in self.actors:
            self._ready(a)

    @property
    def size(self) -> int:
        return len(self.actors)

    def _ready(self, actor: Any) -> bool:
        """Wait until ``actor`` answers (if it has ``ident``); remember its node and pid. False: no answer."""
        try:
            method = actor.ident
        except AttributeError:
            self.idents[actor] = None
            return True
        ref, deadline = method.remote(), time.monotonic() + self.start_timeout_s
        self.idents[actor] = None
        while time.monotonic() < deadline:
            self._raise_if_stopped()
            ready, _ = ray.wait([ref], timeout=0.2)
            if ready:
                try:
                    self.idents[actor] = tuple(ray.get(ref))
                except Exception:  # noqa: BLE001 - at the start its first job's watchdog decides;
                    return False   # a replacement is dropped
                return True
        return False

    def _raise_if_stopped(self) -> None:
        """Raise RunCancelled once the run is asked to stop (the caller's finally shuts the pool down)."""
        if self.should_stop is not None and self.should_stop():
            from tasks.run_control import RunCancelled
            raise RunCancelled("stopped while workers were busy")

    def _replace(self, actor: Any) -> Any:
        """Kill ``actor`` and start its replacement; returns it, or None when it did not come up while other
        actors remain (its GPU went with a lost node, say): the pool goes on smaller and the others take the
        work. Raises :class:`PoolExhausted` when no actor is left."""
        ident = self.idents.pop(actor, None)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
        if ident is not None and ident[0] == ray.get_runtime_context().get_node_id():
            t0 = time.monotonic()
            while alive(ident[1]) and time.monotonic() - t0 < self.exit_timeout_s:
                time.sleep(0.05)
        fresh = self.factory()
        up = self._ready(fresh)
        self.replaced += 1
        if up:
            self.actors = [fresh if a is actor else a for a in self.actors]
            return fresh
        try:
            ray.kill(fresh, no_restart=True)
        except Exception:
            pass
        self.idents.pop(fresh, None)
        self.actors = [a for a in self.actors if a is not actor]
        self.dropped += 1
        if not self.actors:
            raise PoolExhausted(f"every worker of the pool was lost and a new one did not start within "
                                f"{self.start_timeout_s:g} s; check that the Ray cluster still offers the "
                                f"resources the workers ask for (`ray status`) and resume the run")
        return None

    def map(self, method: str, jobs: list[tuple], timeout_s: float | Sequence[float]) -> list[Any]:
        """Run ``actor.<method>(*job)`` for every job; returns results in job order, a :class:`Fault`
        for a job whose actor died or that ran past its timeout (``timeout_s``: one for all jobs,
        or one per job). ``self.elapsed[i]`` is the wall time job ``i`` held its worker (until its
        result, its worker's death or the watchdog), so failures are charged too."""
        limits = [float(timeout_s)] * len(jobs) if isinstance(timeout_s, (int, float)) else \
            [float(t) for t in timeout_s]
        if len(limits) != len(jobs):
            raise ValueError(f"{len(limits)} timeouts for {len(jobs)} jobs")
        results: list[Any] = [None] * len(jobs)
        self.elapsed = [0.0] * len(jobs)
        queue = list(enumerate(jobs))
        free = list(self.actors)
        pending: dict[Any, tuple[int, Any, float]] = {}
        while queue or pending:
            self._raise_if_stopped()
            while free and queue:
                i, args = queue.pop(0)
                actor = free.pop()
                pending[getattr(actor, method).remote(*args)] = (i, actor, time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                i, actor, t0 = pending.pop(ref)
                self.elapsed[i] = time.monotonic() - t0
                out, died = self._answer(ref)
                results[i] = out
                if died or (isinstance(out, dict) and out.get("restart")):
                    actor = self._replace(actor)
                if actor is not None:
                    free.append(actor)
            now = time.monotonic()
            for ref, (i, actor, t0) in list(pending.items()):
                if now - t0 > limits[i]:
                    pending.pop(ref)
                    self.elapsed[i] = now - t0
                    results[i] = Fault(Outcome.TIMEOUT, f"no result after {limits[i]:g} s; the worker was killed "
                                                        "and replaced", "timeout")
                    fresh = self._replace(actor)
                    if fresh is not None:
                        free.append(fresh)
        return results

    @staticmethod
    def _answer(ref) -> tuple[Any, bool]:
        """(result or Fault, whether the actor died)."""
        try:
            return ray.get(ref), False
        except ray.exceptions.RayActorError as e:
            return Fault(Outcome.RUNTIME_FAULT, f"worker died: {str(e).splitlines()[0][:300]}"), True
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            return Fault(Outcome.RUNTIME_FAULT, f"{type(cause).__name__}: {str(cause)[:300]}", "raised"), False

    def run_units(self, method: str, units: list[Unit], *, batch: int,
                  skip: Callable[[Hashable], bool] = lambda key: False,
                  on_answer: Callable[[Hashable, Any], None] = lambda key, answer: None) -> dict[Hashable, Any]:
        """Run ``units`` in batches: ``actor.<method>([u.args for u in a batch])`` answers ``{"verdicts": [...],
        "restart": bool}`` with one answer per unit in order, fewer when the actor stopped at a unit that
        poisoned it (the rest go back to the queue). Returns ``key -> answer`` (a :class:`Fault` for a unit
        without one); a unit for which ``skip(key)`` is true when its turn comes is not run and has no entry;
        ``on_answer(key, answer)`` is called as each answer arrives (so ``skip`` can follow them).

        A free actor takes up to ``batch`` units in queue order, those of the group it ran last first. A batch
        whose actor dies or that outlives the sum of its units' timeouts goes back to the queue unit by unit,
        so the unit that caused it is found alone and answered with the Fault; the others are run again, on the
        replacement or another actor. A unit alone on an actor whose node was lost is run again too. Each
        unit put back is a :class:`LostWork` in ``self.lost`` (reset per call).
        """
        queue: list[tuple[Unit, bool]] = [(u, False) for u in units]        # (unit, must run alone)
        answers: dict[Hashable, Any] = {}
        last_group: dict[Any, Hashable] = {}
        free = list(self.actors)
        pending: dict[Any, tuple[list[Unit], Any, float, float]] = {}

        def answer(key: Hashable, value: Any) -> None:
            answers[key] = value
            on_answer(key, value)

        def take(actor) -> list[Unit]:
            queue[:] = [(u, alone) for u, alone in queue if not skip(u.key)]
            if not queue:
                return []
            if queue[0][1]:
                return [queue.pop(0)[0]]
            want = last_group.get(actor, queue[0][0].group)
            if not any(u.group == want and not alone for u, alone in queue):
                want = queue[0][0].group
            picked = [i for i, (u, alone) in enumerate(queue) if u.group == want and not alone][:batch]
            got = [queue[i][0] for i in picked]
            for i in reversed(picked):
                queue.pop(i)
            return got

        def again(chosen: list[Unit], alone: bool, cause: str, ident, message: str) -> None:
            """Put units the lost actor held back at the front of the queue, and record each re-run."""
            queue[:0] = [(u, alone) for u in chosen]
            node, pid = ident if ident is not None else (None, None)
            self.lost += [LostWork(u.key, cause, node, pid, message) for u in chosen]

        def lost_node(chosen: list[Unit], ident) -> bool:
            """A unit alone on an actor whose node is gone did not kill it: run it again, a few times at most."""
            key = chosen[0].key
            if ident is None or _node_alive(ident[0]) or node_losses.get(key, 0) >= MAX_NODE_LOSSES:
                return False
            node_losses[key] = node_losses.get(key, 0) + 1
            return True

        node_losses: dict[Hashable, int] = {}
        self.lost = []
        while queue or pending:
            self._raise_if_stopped()
            while free:
                chosen = take(free[-1])
                if not chosen:
                    break
                actor = free.pop()
                last_group[actor] = chosen[0].group
                limit = sum(u.timeout_s for u in chosen)
                ref = getattr(actor, method).remote([u.args for u in chosen])
                pending[ref] = (chosen, actor, time.monotonic(), limit)
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                chosen, actor, t0, _ = pending.pop(ref)
                out, died = self._answer(ref)
                ident = self.idents.get(actor)
                if isinstance(out, Fault):
                    if len(chosen) > 1:
                        again(chosen, True, out.cause, ident, out.message)
                    elif died and lost_node(chosen, ident):
                        again(chosen, False, "node_lost", ident, out.message)
                    else:
                        answer(chosen[0].key, out)
                else:
                    done = list(out.get("verdicts", []))
                    for u, v in zip(chosen, done):
                        answer(u.key, v)
                    if len(done) < len(chosen):
                        again(chosen[len(done):], False, "restart", ident,
                              "the worker asked to be replaced after an earlier job of its batch")
                if died or (isinstance(out, dict) and out.get("restart")):
                    actor = self._replace(actor)
                if actor is not None:
                    free.append(actor)
            now = time.monotonic()
            for ref, (chosen, actor, t0, limit) in list(pending.items()):
                if now - t0 > limit:
                    pending.pop(ref)
                    message = f"no result after {limit:g} s; the worker was killed and replaced"
                    if len(chosen) == 1:
                        answer(chosen[0].key, Fault(Outcome.TIMEOUT, message, "timeout"))
                    else:
                        again(chosen, True, "timeout", self.idents.get(actor), message)
                    fresh = self._replace(actor)
                    if fresh is not None:
                        free.append(fresh)
        return answers

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass


def cpu_count() -> int:
    """CPU cores Ray offers (the whole cluster's when joined to one)."""
    return max(1, int(ray.cluster_resources().get("CPU", os.cpu_count() or 1)))


def gpu_runner_factory(resource: str | None, kernel_timeout_s: float | None = None, refs_dir: str | None = None,
                       runner: Any = None) -> Callable[[], Any]:
    """What starts one GPU runner: ``runner`` (default :class:`GpuRunner`; a test's stand-in has its
    interface) asking for one GPU and, with ``resource`` (``gpu_model:H200``), one unit of that GPU model."""
    cls = runner or GpuRunner
    options = {"resources": {resource: 1}} if resource else {}
    return lambda: cls.options(**options).remote(kernel_timeout_s, refs_dir)


@contextlib.contextmanager
def worker_pools(gpus: int, kernel_timeout_s: float | None = None, refs_dir: str | None = None, *,
                 gpu_resource: str | None = None, runner: Any = None,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[tuple[ActorPool, ActorPool | None]]:
    """The pools of a run: one CPU worker per core, and ``gpus`` GPU runners (None without GPUs), each on a
    GPU of the model ``gpu_resource`` names (``tasks.gpus.gpu_runners``) wherever the cluster has one; the GPU
    runners keep the gate's references under ``refs_dir`` (the Cake home's ``refs``). Every wait of both pools
    polls ``should_stop`` (a stopped run raises RunCancelled).

    ``cake evolve`` connects Ray first (``cake_cli.services.ray_runtime``); a flow run started otherwise (a
    deployment's worker) joins ``RAY_ADDRESS`` or starts a local Ray here (``tasks.ray_runtime.ensure_ray``)."""
    from tasks.ray_runtime import ensure_ray
    ensure_ray(gpus=bool(gpus))
    cpu = ActorPool(lambda: CpuWorker.remote(), cpu_count(), should_stop=should_stop)
    gpu = None
    try:
        if gpus:
            gpu = ActorPool(gpu_runner_factory(gpu_resource, kernel_timeout_s, refs_dir, runner), gpus,
                            should_stop=should_stop)
        yield cpu, gpu
    finally:
        cpu.shutdown()
        if gpu is not None:
            gpu.shutdown()
