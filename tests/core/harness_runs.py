"""Real CPU evolution runs for the harness tests, in this process (no Prefect server, no Ray).

``cpu_run`` is the evolve flow's generation loop with the pipeline's stages: the tactic agent proposes, the
verify stage verifies under the harness, the cost filter predicts, the check stage checks on the interpreter,
every attempt lands (``pipeline.rows``), and the scored kernels feed the next generation. A cold start: the
naive seed is the only program the agent starts from (the hand-written kernels are the gate's corpus, never
parents).

``replay_measurements`` lands attempts of kernels that were measured on an H200 (``bench/results``,
through ``tasks.measured``): the verify and predict stages run here, and the time stage's result is the
recorded measurement.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path


from cake_core.agents.base import Context, Scored
from cake_core.agents.search import tactic_record
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.agents.rewrite import refuse_unless
from cake_core.agents.tactics import TACTICS, THREAD_COUNTS, _has_roles
from cake_core.harness.version import HarnessSpec
from cake_core.pipeline import Attempt, check_stage, cost_filter_stage, lower_stage, verify_stage
from cake_core.pipeline.rows import CHILD_TABLES, merge_rows, now
from cake_core.problems import get_problem

BENCH = Path(__file__).resolve().parents[2] / "bench" / "results"


def land(wh_root, attempts: list[Attempt]) -> None:
    """Every row of ``attempts``: the child tables first, the attempt rows last (as the flow lands them)."""
    from warehouse import Warehouse
    rows = merge_rows(attempts)
    wh = Warehouse(wh_root)
    for table in CHILD_TABLES + ("attempts",):
        if rows.get(table):
            wh.append(table, rows[table])


def cpu_run(wh_root, problem: str, shape_set: str, run_id: str, *, generations: int, population: int, seed: int,
            harness: HarnessSpec = HarnessSpec(), tactics: dict | None = None) -> dict[str, int]:
    """One cold-start evolution run on the CPU with the pipeline's stages: the tactic agent proposes, the
    verify and lower stages run under ``harness``, the cost filter predicts (and keeps every candidate), the
    interpreter checks; every attempt lands. Returns the outcome counts."""
    from warehouse import Warehouse

    prob = get_problem(problem)
    PROBLEMS_COLD = replace(prob, best_files=())
    ss = prob.shape_set(shape_set)
    shapes = ss.cpu_shapes(prob.cpu_limit)
    Warehouse(wh_root).append("runs", [{
        "run_id": run_id, "problem": problem, "shape_set": shape_set, "harness_version": harness.version,
        "agent": "tactic", "seed": seed, "generations": generations, "population": population, "host": "test",
        "started_at": now(), "status": "completed", "finished_at": now(), "cold": True}])
    agent = TacticAgent(seed, harness.tactics(tactics or TACTICS), read=harness.read, write=harness.write)
    model = harness.cost_model()
    bounds = {d: max(s[d] for s in shapes) for d in prob.dims}
    totals: dict[str, int] = {}
    scored: list[Scored] = []
    score_of: dict[str, float] = {}
    seen: set[str] = set()
    for g in range(generations):
        ctx = Context(harness.version, g, population, scored=list(scored), bounds=bounds, cold=True, seed=seed,
                      seen=set(seen), tactic_stats=tactic_record(scored))
        attempts = [Attempt(run_id, g, i, problem, harness.version, c)
                    for i, c in enumerate(agent.propose(PROBLEMS_COLD, ctx))]
        for a in attempts:
            a.record(verify_stage(a.candidate.text, harness, prob, shapes))
            if a.going_on:
                a.record(lower_stage(a.program))
        going = [a for a in attempts if a.going_on]
        if going:
            for a, r in zip(going, cost_filter_stage([a.program for a in going], shapes, model, len(going), 0, 0,
                                                     seed=seed * 1_000_003 + g, problem=problem)):
                a.record(r)
        for a in [a for a in attempts if a.going_on]:
            a.record(check_stage(a.program, problem, [s for s in shapes if a.runs_on(_key(s))], seed + g))
        land(wh_root, attempts)
        for a in attempts:
            totals[a.outcome.value] = totals.get(a.outcome.value, 0) + 1
            seen.add(a.ir_hash)
            if a.outcome.value == "checked" and a.predicted_ms is not None and math.isfinite(a.predicted_ms):
                parent = next((score_of[h] for h in a.candidate.parents if h in score_of), None)
                score_of.setdefault(a.ir_hash, a.predicted_ms)
                scored.append(Scored(a.candidate.text, a.predicted_ms, a.candidate.lineage, parent))
        scored.sort(key=lambda s: s.score)
    return totals


# The runs the harness tests mine: the distance kernels, whose mma reads back into an ewise (the agent's
# mma_sync children of them fail to lower), and gemm, whose mma_sync children pass. drop_guards is left out
# of the table: its faults restate the built-in `shapes.tail_guard` warning and only thin out the rest.
MINED_RUNS = (("knn_topk", "knn_topk_small", 2), ("kmeans_assign", "kmeans_assign_small", 2),
              ("gemm_bf16", "gemm_small", 1))
# The tactic table of the mined runs, by name: the harness tests mine what these runs did (the lowering's
# refusals of mma_sync children, winning sequences shared by two problems), so a tactic added to the agent
# later changes every draw of these seeds and with them the data, not what the mining is tested on. drop_guards
# is left out (its children are wrong on the ragged CPU shapes, a cluster of another kind).
# rethread is the one these runs were drawn with: any other thread count. The agent's asks the verifier's
# resource rules first (ef8d71b); its children here still fail verification on them, the clusters the miner
# must recognise as restating a built-in rule.


def _rethread_as_drawn(p, rng, bounds=None):
    refuse_unless(not _has_roles(p), "warp roles fix the thread count")
    return replace(p, threads=int(rng.choice([t for t in THREAD_COUNTS if t != p.threads])))


MINED_TACTICS = {k: TACTICS[k] for k in (
    "mma_sync", "warp_specialize", "tma", "resident", "batch_wgmma", "pipeline_wgmma", "pingpong", "persistent",
    "split_k", "cluster_split", "multicast", "group_tiles", "retile", "restage", "retune", "rethread", "unroll",
    "occupancy")}
MINED_TACTICS["rethread"] = _rethread_as_drawn


def mined_runs(wh_root, generations: int = 4, population: int = 8) -> dict[str, dict[str, int]]:
    """The cold-start runs of :data:`MINED_RUNS` (run ids ``PROBLEM-1``) with :data:`MINED_TACTICS`; their
    outcome counts by problem."""
    return {p: cpu_run(wh_root, p, ss, f"{p}-1", generations=generations, population=population, seed=seed,
                       tactics=MINED_TACTICS) for p, ss, seed in MINED_RUNS}


def _key(shape):
    from cake_core.problems.base import shape_key
    return shape_key(shape)


def replay_measurements(wh_root, run_id: str = "h200-corpus", harness: HarnessSpec = HarnessSpec(),
                        slower: float = 1.0) -> int:
    """Land the H200 measurements of the corpus kernels recorded under bench/results (verified and
    predicted here, timed as recorded; ``slower``: every time that many times longer, a device the GPU's data
    file overrates). Returns the number of attempts landed."""
    from tasks.measured import bench_rows, land_bench_rows
    rows = [{**r, **{k: r[k] * slower for k in ("median_ms", "p10_ms", "p90_ms")}}
            for r in bench_rows(sorted(BENCH.glob("corpus-vs-peers-*.json")))]
    return land_bench_rows(str(wh_root), rows, run_id, harness)


# The approved changes of the source home the transfer tests carry: a rule that stops the unguarded children
# drop_guards writes (they fault on the CPU shapes' tails), a macro of two knob tactics, a calibration of the
# SIMT factor (the KDA kernels' unit): each a kind HarnessSpec.apply reads, approved as `cake harness approve`
# records it (tasks.harness.apply_decision: one new version each, exported).
SOURCE_CHANGES = (
    ("rule", "learned.unguarded_store", {"id": "learned.unguarded_store",
                                         "predicate": {"all": [{"feature": "op.store.guard=False", "op": ">",
                                                                "value": 0}]},
                                         "message": "a store without its bounds check faulted on a tail",
                                         "hint": "keep the guards where a dimension may not be a tile multiple"}),
    ("tactic", "macro_retune_unroll", {"macro": {"name": "macro_retune_unroll", "steps": ["retune", "unroll"],
                                                 "summary": "retune, then unroll"}}),
    ("calibration", "simt", {"eff": {"simt": 0.4}}),
)


def source_home(home, problems=("gemm_bf16", "kmeans_assign"), changes=SOURCE_CHANGES):
    """A Cake home (``home/warehouse``) with a run row of each of ``problems`` (the home's runs of the built-in
    problems a review read), then ``changes`` proposed and approved, one harness version each. Returns the
    warehouse root."""
    from cake_core.harness.proposal import Proposal
    from tasks.harness import apply_decision, record_proposal
    from warehouse import Warehouse
    root = home / "warehouse"
    Warehouse(root).append("runs", [{
        "run_id": f"{p}-1", "problem": p, "shape_set": "set", "harness_version": 0, "agent": "tactic", "seed": 0,
        "generations": 4, "population": 8, "host": "test", "started_at": now(), "status": "completed",
        "finished_at": now(), "cold": True} for p in problems])
    for kind, name, payload in changes:
        pid = record_proposal(str(root), Proposal(kind, f"test:{name}", f"{kind} {name}", payload), {"passed": True},
                              None)
        apply_decision(str(root), pid, True, "passed the corpus gate", "test")
    return root
