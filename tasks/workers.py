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
from typing import Any, Callable

import ray


@dataclass(frozen=True)
class Fault:
    outcome: str          # runtime_fault | timeout
    message: str


@ray.remote(num_cpus=1)
class CpuChecker:
    """Checks candidates on the CPU interpreter."""

    def check(self, text: str, problem: str, shapes: list[dict], seed: int):
        from cake_core.ir.text import parse_program
        from cake_core.pipeline import check_stage
        from cake_core.problems import get_problem
        return check_stage(parse_program(text), get_problem(problem), shapes, seed)

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_gpus=1)
class GpuRunner:
    """Checks and times candidates on one GPU. After a CUDA error it asks to be replaced."""

    def run(self, lowered: Any, cubin: bytes, kernel_name: str, problem: str, shapes: list[dict],
            seed: int, reps: int) -> dict:
        import tempfile

        from cake_core.lower.compile import Compiled
        from cake_core.problems import get_problem
        from cake_core.runtime.gpu import check_and_time
        fd, path = tempfile.mkstemp(suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        try:
            compiled = Compiled(path, kernel_name, None, "", 0.0, True)
            runs = check_and_time(compiled, lowered, get_problem(problem), shapes, seed=seed, time=True, reps=reps)
            # after a fault or a hang the CUDA context is unusable: this actor must be replaced
            return {"runs": runs, "restart": any(r.outcome in ("runtime_fault", "timeout") for r in runs)}
        except Exception as e:  # a CUDA error leaves the context unusable: report and get replaced
            return {"fault": f"{type(e).__name__}: {e}", "restart": True}
        finally:
            os.unlink(path)

    def gpu_model(self) -> str | None:
        from cake_core.runtime.gpu import gpu_model
        return gpu_model()


class ActorPool:
    """Runs jobs on a fixed number of actors with a per-job watchdog."""

    def __init__(self, factory: Callable[[], Any], size: int):
        self.factory = factory
        self.actors = [factory() for _ in range(max(size, 1))]

    def _replace(self, actor: Any) -> Any:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
        fresh = self.factory()
        self.actors = [fresh if a is actor else a for a in self.actors]
        return fresh

    def map(self, method: str, jobs: list[tuple], timeout_s: float) -> list[Any]:
        results: list[Any] = [None] * len(jobs)
        queue = list(enumerate(jobs))
        free = list(self.actors)
        pending: dict[Any, tuple[int, Any, float]] = {}
        while queue or pending:
            while free and queue:
                i, args = queue.pop(0)
                actor = free.pop()
                pending[getattr(actor, method).remote(*args)] = (i, actor, time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                i, actor, _ = pending.pop(ref)
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
                if now - t0 > timeout_s:
                    pending.pop(ref)
                    results[i] = Fault("timeout", f"no result after {timeout_s:.0f} s; the worker was ended")
                    free.append(self._replace(actor))
        return results

    def shutdown(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
