"""Real CPU evolution runs for the harness tests, in this process (no Prefect server, no Ray).

``cpu_run`` is the evolve flow's generation loop with the same task bodies and pipeline stages: the
tactic agent proposes, ``tasks.stages.verify`` verifies under the harness, the cost filter predicts,
``pipeline.check_stage`` checks on the interpreter, ``tasks.stages.record`` lands every attempt, and
``flows.evolve._learn`` feeds the next generation. A cold start: the naive seed is the only program the
agent starts from (the hand-written kernels are the gate's corpus, never parents).

``replay_measurements`` lands attempts of kernels that were measured on an H200 (``bench/results``,
through ``tasks.measured``): the verify and predict stages run here, and the time stage's result is the
recorded measurement.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cake_core.agents.base import Context
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.agents.tactics import TACTICS
from cake_core.harness.version import HarnessSpec
from cake_core.pipeline import check_stage
from cake_core.problems import get_problem
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


def replay_measurements(wh_root, run_id: str = "h200-corpus", harness: HarnessSpec = HarnessSpec()) -> int:
    """Land the H200 measurements of the corpus kernels recorded under bench/results (verified and
    predicted here, timed as recorded). Returns the number of attempts landed."""
    from tasks.measured import bench_rows, land_bench_rows
    return land_bench_rows(str(wh_root), bench_rows(sorted(BENCH.glob("corpus-vs-peers-*.json"))), run_id, harness)
