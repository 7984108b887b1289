"""The portfolio flow: evolve a problem over a portfolio of shapes, one region of similar shapes at a time.

The portfolio's searched rows are split into regions (``cake_core.pipeline.regions``); each region is one
evolution run (the evolve flow as a subflow) on its representatives, with its own population and parents, and
the portfolio's held-out rows nearest to it as its held-out rows (never searched, measured for the region's
best and reported apart). The region runs' ids derive from the portfolio's (``portfolio_id``, by default from
the problem, the set, the region plan and the seed), so running the flow again continues it: a completed region
run is kept, an interrupted one resumes, the others start. The end publishes a table of the regions.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.evolve import evolve_flow
from tasks.portfolio import portfolio_plan, portfolio_report, portfolio_table, region_status


def portfolio_id_of(problem: str, shape_set: str, regions: int | None, per_region: int, seed: int) -> str:
    """The default id of a portfolio search: the same arguments, the same id (so a second call continues)."""
    digest = hashlib.sha256(f"{problem}|{shape_set}|{regions}|{per_region}|{seed}".encode()).hexdigest()[:8]
    name = Path(shape_set).stem if shape_set.endswith(".csv") else shape_set
    return f"pf-{name}-{digest}"


@flow(name="portfolio", log_prints=True, validate_parameters=False)
def portfolio_flow(problem: str, shape_set: str, regions: int | None = None, per_region: int = 3,
                   generations: int | None = None, population: int | None = None, seed: int = 0,
                   cold: bool | None = True, portfolio_id: str | None = None,
                   warehouse_root: str = ".cake/warehouse", cache_dir: str = ".cake/cache",
                   gpu_models: list[str] | None = None) -> dict[str, Any]:
    """Evolve ``problem`` over the portfolio ``shape_set`` in ``regions`` regions (default: ceil(sqrt(rows / 2)))
    of ``per_region`` representatives each; returns the portfolio id, each region's run and best, and the
    portfolio's rows against the peer (``tasks.portfolio.portfolio_report``)."""
    log = get_run_logger()
    pid = portfolio_id or portfolio_id_of(problem, shape_set, regions, per_region, seed)
    plan = portfolio_plan(problem, shape_set, regions, per_region, seed, pid, warehouse_root)
    log.info(f"portfolio {pid}: {plan['rows']} rows of {shape_set} in {len(plan['regions'])} regions "
             f"({plan['held_out']} held out, never searched)")
    for r in plan["regions"]:
        status = region_status(warehouse_root, r["run_id"])
        if status == "completed":
            log.info(f"{r['name']}: run {r['run_id']} completed earlier; kept")
        else:
            log.info(f"{r['name']}: {len(r['representatives'])} representatives of {r['members']} rows -> run "
                     f"{r['run_id']}" + (" (resumed)" if status else ""))
            evolve_flow(problem=problem, shape_set=None if status else r["csv"],
                        generations=generations, population=population, seed=seed, cold=None if status else cold,
                        run_id=None if status else r["run_id"], resume=r["run_id"] if status else None,
                        warehouse_root=warehouse_root, cache_dir=cache_dir, gpu_models=gpu_models)
    report = portfolio_report(warehouse_root, problem, shape_set)
    table = portfolio_table(warehouse_root, pid, plan, report)
    return {"portfolio_id": pid, "problem": problem, "shape_set": shape_set, "regions": table, "report": report}
