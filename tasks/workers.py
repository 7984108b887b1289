"""Ray actors that run candidates, and a pool that survives their faults and hangs.

A GPU actor holds one GPU (``num_gpus=1``) and loads cubins others compiled;
a CPU actor runs the interpreter's correctness gate. A candidate that kills
its actor (an illegal address poisons the CUDA context) or outlives the
watchdog is recorded as ``runtime_fault`` / ``timeout``; the pool replaces
the actor and the batch goes on.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import ray


@dataclass(frozen=True)
class Fault:
    outcome: str          # runtime_fault | timeout
    message: str


DEFAULT_KERNEL_TIMEOUT_S = 30.0     # GpuRunner's own watchdog per wait on the GPU (see runtime.gpu)


def _ident() -> tuple[str, int]:
    return ray.get_runtime_context().get_node_id(), os.getpid()


# A quarter CPU each: checks are short numpy runs, and several flows on one machine must all get
# workers (with 1 CPU each, a second flow's actors wait for the first flow to end).
@ray.remote(num_cpus=0.25)
class CpuChecker:
    """Checks candidates on the CPU interpreter."""

    def check(self, text: str, problem: str, shapes: list[dict], seed: int):
        from cake_core.ir.text import parse_program
        from cake_core.pipeline import check_stage
        from cake_core.problems import get_problem
        return check_stage(parse_program(text), get_problem(problem), shapes, seed)

    def pid(self) -> int:
        return os.getpid()

    def ident(self) -> tuple[str, int]:
        """(node id, pid): the pool waits on it for readiness and, after a kill, for the process to exit."""
        return _ident()


@ray.remote(num_gpus=1)
class GpuRunner:
    """Checks and times candidates on one GPU.

    A CUDA fault (illegal address, trap) or a kernel that outlives the watchdog leaves this
    process's CUDA context unusable: the result then says ``restart`` and the actor refuses any
    further work (``poisoned``) so that nothing runs on a dead context by mistake; the pool kills
    it and starts a fresh one. ``ident`` initialises CUDA, so a ready actor has a live context.
    """

    def __init__(self):
        self.poisoned: str | None = None

    def ident(self) -> tuple[str, int]:
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
            cupy.cuda.Device(0).use()
            cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(256))   # creates the context now, not mid-timing
        except Exception:  # noqa: BLE001 - no GPU: run() reports it per candidate
            pass
        return _ident()

    def run(self, lowered: Any, cubin: bytes, kernel_name: str, problem: str, shapes: list[dict],
            seed: int, reps: int, timeout_s: float | None = None) -> dict:
        """Gate and time one candidate; ``timeout_s`` is the in-actor watchdog per GPU wait
        (default ``DEFAULT_KERNEL_TIMEOUT_S``). Returns ``{"runs", "restart", "pid"}`` or
        ``{"fault", "restart", "pid"}``."""
        import tempfile

        from cake_core.lower.compile import Compiled
        from cake_core.problems import get_problem
        from cake_core.runtime.gpu import check_and_time
        if self.poisoned:
            return {"fault": f"worker refused: its CUDA context is unusable after {self.poisoned}",
                    "restart": True, "pid": os.getpid()}
        fd, path = tempfile.mkstemp(suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        try:
            compiled = Compiled(path, kernel_name, None, "", 0.0, True)
            runs = check_and_time(compiled, lowered, get_problem(problem), shapes, seed=seed, time=True, reps=reps,
                                  timeout_s=timeout_s or DEFAULT_KERNEL_TIMEOUT_S)
            # after a fault or a hang the CUDA context is unusable: this actor must be replaced
            broken = next((r for r in runs if r.outcome in ("runtime_fault", "timeout")), None)
            if broken is not None:
                self.poisoned = f"{broken.outcome}: {broken.message}"
            return {"runs": runs, "restart": broken is not None, "pid": os.getpid()}
        except Exception as e:  # a CUDA error leaves the context unusable: report and get replaced
            self.poisoned = f"{type(e).__name__}: {e}"
            return {"fault": f"{type(e).__name__}: {e}", "restart": True, "pid": os.getpid()}
        finally:
            os.unlink(path)

    def gpu_model(self) -> str | None:
        from cake_core.runtime.gpu import gpu_model
        return gpu_model()


def _gone(pid: int) -> bool:
    """True once process ``pid`` has exited (a zombie has already closed its files and GPU context)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


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
        self.elapsed: list[float] = []
        self.idents: dict[Any, tuple[str, int] | None] = {}
        self.actors = [factory() for _ in range(max(size, 1))]
        for a in self.actors:
            self._ready(a)

    def _ready(self, actor: Any) -> None:
        """Wait until ``actor`` answers (if it has ``ident``); remember its node and pid."""
        try:
            method = actor.ident
        except AttributeError:
            self.idents[actor] = None
            return
        ref, deadline = method.remote(), time.monotonic() + self.start_timeout_s
        self.idents[actor] = None
        while time.monotonic() < deadline:
            self._raise_if_stopped()
            ready, _ = ray.wait([ref], timeout=0.2)
            if ready:
                try:
                    self.idents[actor] = tuple(ray.get(ref))
                except Exception:  # noqa: BLE001 - it may still come up; its first job's watchdog decides
                    pass
                return

    def _raise_if_stopped(self) -> None:
        """Raise RunCancelled once the run is asked to stop (the caller's finally shuts the pool down)."""
        if self.should_stop is not None and self.should_stop():
            from tasks.run_control import RunCancelled
            raise RunCancelled("stopped while workers were busy")

    def _replace(self, actor: Any) -> Any:
        ident = self.idents.pop(actor, None)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
        if ident is not None and ident[0] == ray.get_runtime_context().get_node_id():
            t0 = time.monotonic()
            while not _gone(ident[1]) and time.monotonic() - t0 < self.exit_timeout_s:
                time.sleep(0.05)
        fresh = self.factory()
        self._ready(fresh)
        self.replaced += 1
        self.actors = [fresh if a is actor else a for a in self.actors]
        return fresh

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
                try:
                    out = ray.get(ref)
                    results[i] = out
                    if isinstance(out, dict) and out.get("restart"):
                        actor = self._replace(actor)
                except ray.exceptions.RayActorError as e:
                    results[i] = Fault("runtime_fault", f"worker died: {str(e).splitlines()[0][:300]}")
                    actor = self._replace(actor)
                except ray.exceptions.RayTaskError as e:
                    cause = e.cause if getattr(e, "cause", None) is not None else e
                    results[i] = Fault("runtime_fault", f"{type(cause).__name__}: {str(cause)[:300]}")
                free.append(actor)
            now = time.monotonic()
            for ref, (i, actor, t0) in list(pending.items()):
                if now - t0 > limits[i]:
                    pending.pop(ref)
                    self.elapsed[i] = now - t0
                    results[i] = Fault("timeout", f"no result after {limits[i]:g} s; the worker was killed "
                                                  "and replaced")
                    free.append(self._replace(actor))
        return results

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
