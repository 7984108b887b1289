"""The scheduling of the time stage on a Ray with fake GPUs, run in a process of its own by test_multi_gpu.py.

A local Ray, started as Cake starts one (``tasks.ray_runtime.start_ray``: on 127.0.0.1), offers 6 fake GPUs:
4 advertised as ``gpu_model:H200`` and 2 as ``gpu_model:H100``. The GPU runners are :class:`FakeRunner`
(GpuRunner's interface, no CUDA): each job's verdict is deterministic, and every execution is logged to a file of the runner's process, so the test sees which actor ran which unit,
including executions whose answer was lost with their actor. The real code does the rest:
``tasks.gpus.gpu_runners`` (how many runners), ``tasks.workers.gpu_runner_factory`` (what each asks for),
``ActorPool.run_units`` (spread, batches, re-runs) and ``tasks.stages.on_gpu`` (units, the reruns rows
through the run's recorder into a real warehouse).

Usage: ``python multi_gpu_driver.py OUT_DIR``; writes ``OUT_DIR/result.json``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import ray

from cake_core.outcome import Outcome
from cake_core.pipeline.verdicts import ShapeVerdict
from cake_core.problems.base import shape_key

SHAPES = [dict(M=64 * (j + 1), N=64, K=32) for j in range(4)]


@ray.remote(num_gpus=1, num_cpus=0)
class FakeRunner:
    """GpuRunner's interface; ``refs_dir`` names the control folder: ``die_once.json`` lists unit keys whose
    first execution (by any runner) kills the process, ``log/PID`` gets one line per execution."""

    def __init__(self, kernel_timeout_s: float | None = None, refs_dir: str | None = None):
        self.ctl = Path(refs_dir)
        (self.ctl / "log").mkdir(parents=True, exist_ok=True)
        self.log = self.ctl / "log" / str(os.getpid())
        with self.log.open("a") as f:
            f.write(json.dumps({"assigned": ray.get_runtime_context().get_assigned_resources()}) + "\n")

    def ident(self) -> tuple[str, int]:
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run_batch(self, jobs: list) -> dict:
        die = {tuple(k) for k in json.loads((self.ctl / "die_once.json").read_text())} \
            if (self.ctl / "die_once.json").exists() else set()
        out = []
        for job in jobs:
            key = tuple(job.key)
            with self.log.open("a") as f:
                f.write(json.dumps({"ran": list(key)}) + "\n")
            if key in die:
                marker = self.ctl / f"died-{key[0]}-{key[1]}"
                try:
                    marker.open("x").close()       # the first runner to see it dies; later ones run it
                    os._exit(3)
                except FileExistsError:
                    pass
            writer = any(m in sys.modules for m in ("warehouse", "duckdb", "tasks.record"))
            out.append(ShapeVerdict(shape_key(job.shape), "gpu", Outcome.CHECKED, max_error=0.0,
                                    message=json.dumps({"pid": os.getpid(), "writer": writer})))
        return {"verdicts": out, "restart": False, "pid": os.getpid()}

    def peer(self, problem: str, peer: str, shape: dict, seed: int, reps: int) -> dict:
        return {"verdict": None, "restart": False}

    def gpu_model(self) -> str | None:
        return None


def _attempts(n: int) -> list[SimpleNamespace]:
    binary = SimpleNamespace(cubin=b"", compiled=SimpleNamespace(kernel_name="fake"))
    return [SimpleNamespace(attempt_id=f"mg-att-{i}", lowered=None, binary=binary, runs_on=lambda key: True)
            for i in range(n)]


def _executions(ctl: Path) -> dict:
    """pid -> {"assigned": resources, "ran": [keys in order]} from the runners' logs."""
    out = {}
    for log in sorted((ctl / "log").glob("*")):
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        out[log.name] = {"assigned": next((x["assigned"] for x in lines if "assigned" in x), {}),
                         "ran": [x["ran"] for x in lines if "ran" in x]}
    return out


def scenario(name: str, out: Path, wh_root: str, model: str, candidates: int, die_once: list, *,
             node_lost: bool = False) -> dict:
    """One time stage over ``candidates`` x SHAPES on the runners of ``model``; what happened, as data."""
    import tasks.workers as workers
    from tasks.gpus import gpu_runners
    from tasks.record import Recorder
    from tasks.stages import on_gpu
    from tasks.workers import ActorPool, Fault, gpu_runner_factory

    ctl = out / name
    ctl.mkdir(parents=True)
    (ctl / "die_once.json").write_text(json.dumps(die_once))
    resource, n = gpu_runners(model, ray.cluster_resources())
    pool = ActorPool(gpu_runner_factory(resource, None, str(ctl), FakeRunner), n, start_timeout_s=300.0)
    if node_lost:
        workers._node_alive = lambda node_id: False      # every death looks like its node went away
    recorder = Recorder(wh_root)
    from cake_core.problems import get_problem
    run = SimpleNamespace(plan=SimpleNamespace(problem="gemm_bf16", run_id=f"mg-{name}", session=0),
                          problem=get_problem("gemm_bf16"), timeout_s=120.0, reps=1, gpu=pool, recorder=recorder,
                          state=SimpleNamespace(generation=0))
    try:
        verdicts = on_gpu(run, _attempts(candidates), SHAPES, 7, drop_failed=False)
        recorder.close()
    finally:
        pool.shutdown()
    answers = {}
    for i, vs in verdicts.items():
        for j, v in enumerate(vs):
            answers[f"{i},{j}"] = {"fault": isinstance(v, Fault) or not v.correct, "outcome": v.outcome.value,
                                   **(json.loads(v.message) if v.correct else {"message": v.message})}
    from warehouse import Warehouse
    rows = Warehouse(wh_root).query("select * from reruns where run_id = ?", [f"mg-{name}"]).to_pylist()
    return {"runners": n, "resource": resource, "replaced": pool.replaced, "answers": answers,
            "per_shape": {str(i): len(v) for i, v in verdicts.items()},
            "lost": [{"key": list(w.key), "cause": w.cause, "node_id": w.node_id, "pid": w.pid} for w in pool.lost],
            "reruns": [{k: (str(v) if k == "recorded_at" else v) for k, v in r.items()} for r in rows],
            "executions": _executions(ctl), "driver_pid": os.getpid()}


def main(out: Path) -> None:
    from cake_core.errors import CakeError
    from tasks.gpus import gpu_runners, offered
    from tasks.ray_runtime import start_ray

    resources = start_ray(None, num_gpus=6, resources={"gpu_model:H200": 4, "gpu_model:H100": 2})
    wh_root = str(out / "warehouse")
    result = {"gcs": ray.get_runtime_context().gcs_address, "offered": offered(resources),
              "spread": scenario("spread", out, wh_root, "NVIDIA H200", 8, []),
              "killed": scenario("killed", out, wh_root, "H200", 8, [[2, 1]]),
              "h100": scenario("h100", out, wh_root, "NVIDIA H100 80GB HBM3", 2, []),
              "alone_blamed": scenario("alone_blamed", out, wh_root, "H200", 1, [[0, 2]]),
              "alone_node_lost": scenario("alone_node_lost", out, wh_root, "H200", 1, [[0, 2]], node_lost=True)}
    try:
        gpu_runners("NVIDIA B200", ray.cluster_resources(), where="the Ray cluster (1 node)")
        result["missing"] = None
    except CakeError as e:
        result["missing"] = str(e)
    result["limited"] = gpu_runners("H200", ray.cluster_resources(), limit=2)[1]
    ray.shutdown()
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
