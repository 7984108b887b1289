"""Real CPU evolution runs for the harness tests, in this process (no Prefect server, no Ray).

``cpu_run`` is the evolve flow's generation loop with the same task bodies and pipeline stages: the
tactic agent proposes, ``tasks.stages.verify`` verifies under the harness, the cost filter predicts,
``pipeline.check_stage`` checks on the interpreter, ``tasks.stages.record`` lands every attempt, and
``flows.evolve._learn`` feeds the next generation. A cold start: the naive seed is the only program the
agent starts from (the hand-written kernels are the gate's corpus, never parents).

``replay_measurements`` lands attempts of kernels that were measured on an H200 (``bench/results``):
the verify and predict stages run here, and the time stage's result is the recorded measurement.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from cake_core.agents.base import Candidate, Context
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.agents.tactics import TACTICS
from cake_core.harness.version import HarnessSpec
from cake_core.outcome import Outcome, StageResult
from cake_core.pipeline import check_stage, predict_stage
from cake_core.problems import get_problem
from cake_core.problems.base import SEEDS_DIR, shape_key
from tasks.record import Attempt, now

BENCH = Path(__file__).resolve().parents[2] / "bench" / "results"


def cpu_run(wh_root, problem: str, shape_set: str, run_id: str, *, generations: int, population: int, seed: int,
            harness: HarnessSpec = HarnessSpec(), tactics: dict | None = None) -> dict[str, int]:
    """One cold-start evolution run on the CPU; returns the outcome counts."""
    from flows.evolve import _learn
    from tasks.stages import cost_filter, record, verify
    from warehouse import Warehouse

    prob = replace(get_problem(problem), best_files=())
    ss = prob.shape_set(shape_set)
    shapes = ss.cpu_shapes(prob.cpu_limit)
    Warehouse(wh_root).append("runs", [{
        "run_id": run_id, "problem": problem, "shape_set": shape_set, "harness_version": harness.version,
        "agent": "tactic", "seed": seed, "generations": generations, "population": population, "host": "test",
        "started_at": now(), "status": "completed", "finished_at": now()}])
    agent = TacticAgent(seed, harness.tactics(tactics or TACTICS), read=harness.read, write=harness.write)
    model = harness.cost_model()
    ctx = Context(harness.version, 0, population)
    totals: dict[str, int] = {}
    best: list = []
    for g in range(generations):
        ctx.generation = g
        attempts = [Attempt(run_id, g, problem, harness.version, c) for c in agent.propose(prob, ctx)]
        passed, _ = verify.fn(attempts, harness, shapes)
        kept, _ = cost_filter.fn(passed, shapes, len(passed), 0, seed + g, model) if passed else ([], [])
        for a in kept:
            r = check_stage(a.program, prob, shapes, seed + g)
            a.checks = [{"shape": c.shape, "backend": "interpreter", "correct": c.correct, "max_error": None,
                         "message": c.message or None} for c in r.metrics["checks"]]
            a.stop(r)
        record.fn(str(wh_root), attempts)
        _learn(ctx, attempts, kept, totals, best)
    return totals


def measured_kernels() -> list[tuple[str, dict, dict]]:
    """(kernel file, shape, measured figures) of every correct H200 measurement of a corpus kernel in
    bench/results, the first figures of each (kernel, shape)."""
    seen, out = set(), []
    for f in sorted(BENCH.glob("corpus-vs-peers-*.json")):
        for row in json.loads(f.read_text())["rows"]:
            for o in row.get("ours", []):
                name = f"{o.get('program')}.cake"
                key = (name, row["shape_key"])
                if o.get("correct") and o.get("median_ms") and (SEEDS_DIR / name).exists() and key not in seen:
                    seen.add(key)
                    out.append((name, row["shape"], {k: float(o[k]) for k in ("median_ms", "p10_ms", "p90_ms")}
                                | {"runs": int(o.get("runs", 20)), "timer": o.get("timer", "cuda_event")}))
    return out


def replay_measurements(wh_root, run_id: str = "h200-corpus", harness: HarnessSpec = HarnessSpec()) -> int:
    """Land one measured attempt per (kernel, recorded shape): verified and predicted here, timed on the H200
    as recorded. Returns the number of attempts landed."""
    from tasks.stages import record, verify
    from warehouse import Warehouse

    model = harness.cost_model()
    rows = measured_kernels()
    attempts = []
    for name, shape, m in rows:
        from cake_core.harness.gate import kernel_problem
        prob = get_problem(kernel_problem(name))
        shape = {d: int(shape[d]) for d in prob.dims}
        a = Attempt(run_id, 0, prob.name, harness.version, Candidate((SEEDS_DIR / name).read_text(), (), "bench",
                                                                      "reference"))
        passed, _ = verify.fn([a], harness, [shape])
        if not passed:
            continue
        a.predictions = {shape_key(shape): predict_stage(a.program, [shape], model)[0]}
        a.model_version = model.version
        a.measurements = [{"shape": shape_key(shape), "gpu_model": "NVIDIA H200", "timer": m["timer"],
                           "l2": "cold-clean", "median_ms": m["median_ms"], "p10_ms": m["p10_ms"],
                           "p90_ms": m["p90_ms"], "runs": m["runs"], "correct": True, "max_error": None,
                           "kind": "search", "measured_at": now()}]
        a.gpu_seconds = 0.0
        a.stop(StageResult("time", Outcome.MEASURED))
        attempts.append(a)
    Warehouse(wh_root).append("runs", [{
        "run_id": run_id, "problem": "corpus", "shape_set": "bench", "harness_version": harness.version,
        "agent": "bench", "seed": 0, "generations": 1, "population": len(attempts), "host": "h200",
        "gpu_model": "NVIDIA H200", "started_at": now(), "status": "completed", "finished_at": now()}])
    record.fn(str(wh_root), attempts)
    return len(attempts)


def geomean(xs) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))
