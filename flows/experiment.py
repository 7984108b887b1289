"""The frozen-vs-evolving experiment: the same tactic agent and budget, cold starts, a frozen and an evolving harness.

Per arm and seed one evolve run (``flows.evolve``) in blocks of generations, each block a resume of the run
that goes ``block`` generations further. The frozen arm pins harness v0; the evolving arm runs the
harness review (``flows.harness``) over its own warehouse between blocks, decided by the named approval
policy, and goes on under the newest version. The report (``tasks.experiment``) says per run whether it
converged and what it cost, and states the policy. Calling it again with the same ``out_dir`` continues
the runs where they stopped.
"""
from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from flows.evolve import evolve_flow
from flows.harness import harness_review_flow
from tasks.experiment import (experiment_plan, harness_for_block, next_block, run_progress, run_result,
                              write_report)

__all__ = ["frozen_vs_evolving_flow"]


@flow(name="frozen-vs-evolving", log_prints=True)
def frozen_vs_evolving_flow(problem: str, out_dir: str, seeds: list[int], shape_set: str | None = None,
                            population: int = 8, block: int = 2, generations: int | None = None,
                            budget_candidates: int | None = None, budget_gpu_minutes: float | None = None,
                            approve: str = "gate-passing", gpu_models: list[str] | None = None,
                            min_support: int = 3, timeout_s: float = 120.0, reps: int = 20) -> dict[str, Any]:
    """Run (or continue) both arms for every seed and write the report under ``out_dir``; returns it."""
    log = get_run_logger()
    plan = experiment_plan(problem, shape_set, list(seeds), out_dir, population, block, generations,
                           budget_candidates, budget_gpu_minutes, approve, bool(gpu_models))
    reviews: list[dict[str, Any]] = []
    for run in plan["runs"]:
        root, rid = run["warehouse_root"], run["run_id"]
        progress = run_progress(root, rid)
        while (target := next_block(plan, progress)) is not None:
            if run["arm"] == "evolving" and progress["generations"] > 0:
                t0 = time.monotonic()
                decided = harness_review_flow(warehouse_root=root, min_support=min_support,
                                              policy=plan["review_policy"])
                reviews.append({"arm": run["arm"], "seed": run["seed"], "after_generation": progress["generations"],
                                "decisions": decided, "seconds": round(time.monotonic() - t0, 1)})
            version = harness_for_block(run["arm"], root)
            log.info(f"{rid}: generations {progress['generations']} -> {target} under harness v{version}")
            evolve_flow(problem=plan["problem"], shape_set=plan["shape_set"], generations=target,
                        population=plan["population"], seed=run["seed"],
                        run_id=None if progress["exists"] else rid, resume=rid if progress["exists"] else None,
                        warehouse_root=root, cache_dir=plan["cache_dir"], gpu_models=list(gpu_models or []),
                        timeout_s=timeout_s, reps=reps, cold=True, harness_version=version,
                        budget_candidates=plan["budget_candidates"], budget_gpu_minutes=plan["budget_gpu_minutes"])
            before, progress = progress["generations"], run_progress(root, rid)
            if progress["generations"] <= before:        # the run stopped on its own (see its stop reason)
                log.warning(f"{rid}: the block ended at generation {before}; the run goes no further")
                break
    rows = [run_result(plan, run) for run in plan["runs"]]
    return write_report(plan, rows, reviews)
