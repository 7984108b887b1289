"""The portfolio flow's steps: the region plan (written as one shape set per region), each region run's
status, and the table of the regions' bests (published as an artifact)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from cake_core.pipeline.regions import plan_regions
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from tasks.artifacts import artifact_key, md_table, ms


def portfolio_folder(warehouse_root: str, portfolio_id: str) -> Path:
    """Where a portfolio's region shape sets are written: beside the warehouse, under portfolios/."""
    return Path(warehouse_root).parent / "portfolios" / portfolio_id


@task(name="portfolio-plan", cache_policy=NO_CACHE)
def portfolio_plan(problem: str, shape_set: str, regions: int | None, per_region: int, seed: int,
                   portfolio_id: str, warehouse_root: str) -> dict[str, Any]:
    """The regions of ``shape_set``, each written as a shape set that its run evolves on: its representatives,
    its held-out rows, and every other searched row of the portfolio as a sweep row (the run's finalists are
    measured there after the search, so each row of the portfolio gets a kernel measured on it)."""
    prob = get_problem(problem)
    sset = prob.shape_set(shape_set)
    planned = plan_regions(sset, prob.dims, regions, per_region, seed)
    folder = portfolio_folder(warehouse_root, portfolio_id)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    searched = [s for r in planned for s in r.members]
    for r in planned:
        csv = folder / f"{r.name}.csv"
        reps = {shape_key(s) for s in r.representatives}
        # every searched row of the portfolio but the region's own representatives: its finalists' sweep
        text = r.csv(prob.dims, tuple(s for s in searched if shape_key(s) not in reps))
        if not csv.exists() or csv.read_text() != text:
            csv.write_text(text)
        out.append({"name": r.name, "run_id": f"{portfolio_id}-{r.name}", "csv": str(csv),
                    "members": len(r.members), "representatives": [shape_key(s) for s in r.representatives],
                    "held_out": [shape_key(s) for s in r.held_out]})
    return {"rows": len(sset.shapes), "held_out": sum(1 for x in sset.roles if x == "held_out"), "regions": out}


def region_status(warehouse_root: str, run_id: str) -> str | None:
    """The recorded status of a region's run (completed, failed, cancelled, running...), None if it never ran."""
    from warehouse.queries import run_rows

    if not (Path(warehouse_root) / "SCHEMA_VERSION").exists():
        return None
    rows = run_rows(warehouse_root, run_id)
    return rows[0]["status"] if rows else None


@task(name="portfolio-table", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def portfolio_table(warehouse_root: str, portfolio_id: str, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Each region's run and its best (score over the region's representatives), published as a Markdown
    artifact ``<portfolio>-portfolio``; returns the rows."""
    from warehouse.queries import run_best

    rows = []
    for r in plan["regions"]:
        best = run_best(warehouse_root, r["run_id"])
        rows.append({"region": r["name"], "run_id": r["run_id"], "rows": r["members"],
                     "representatives": len(r["representatives"]), "held_out": len(r["held_out"]),
                     "status": region_status(warehouse_root, r["run_id"]),
                     "best": best["attempt_id"] if best else None,
                     "score_ms": best["score_ms"] if best else None, "basis": best["basis"] if best else None})
    text = "\n".join([f"# Portfolio {portfolio_id}", "",
                      f"{plan['rows']} rows in {len(rows)} regions; {plan['held_out']} held out (never searched).",
                      "", md_table(["region", "run", "rows", "searched on", "held out", "status", "best",
                                    "score", "basis"],
                                   [[x["region"], x["run_id"], x["rows"], x["representatives"], x["held_out"],
                                     x["status"] or "–", x["best"] or "–", ms(x["score_ms"]), x["basis"] or "–"]
                                    for x in rows])])
    create_markdown_artifact(text, key=artifact_key(portfolio_id, "portfolio"),
                             description=f"portfolio {portfolio_id}: its regions and their bests")
    return rows
