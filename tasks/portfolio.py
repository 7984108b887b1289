"""The portfolio flow's steps: the region plan (written as one shape set per region), each region run's
status, the table of the regions' bests, and the portfolio's rows against the peer (published as an artifact)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from cake_core.model.base import geomean
from cake_core.pipeline.regions import plan_regions
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from tasks.artifacts import artifact_key, md_table, ms, times


def portfolio_folder(warehouse_root: str, portfolio_id: str) -> Path:
    """Where a portfolio's region shape sets are written: beside the warehouse, under portfolios/."""
    return Path(warehouse_root).parent / "portfolios" / portfolio_id


PLAN_FILE = "plan.json"


def other_portfolios(warehouse_root: str, problem: str, shape_set: str, portfolio_id: str) -> list[str]:
    """The other portfolios of ``problem`` over ``shape_set`` that the home holds runs of, each with the options
    that continue it (``--regions 3 --per-region 3 --seed 0``; the region count alone where an older portfolio
    recorded no plan): a different option names a new portfolio, which is easy to start by mistake."""
    from warehouse.queries import portfolio_ids

    name = Path(shape_set).stem if shape_set.endswith(".csv") else shape_set
    out = []
    for pid in portfolio_ids(warehouse_root, problem):
        if pid == portfolio_id or not pid.startswith(f"pf-{name}-"):
            continue
        folder = portfolio_folder(warehouse_root, pid)
        plan_file = folder / PLAN_FILE
        if plan_file.exists():
            p = json.loads(plan_file.read_text())
            if p.get("shape_set") != shape_set:
                continue
            opts = (f"--regions {p['regions']} " if p["regions"] is not None else "") + \
                f"--per-region {p['per_region']} --seed {p['seed']}"
        else:
            opts = f"--regions {len(list(folder.glob('region-*.csv')))} (its --per-region and --seed not recorded)"
        out.append(f"{pid} ({opts})")
    return out


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
    # the options that name this portfolio, for `cake portfolio` to say how to go on with it (other_portfolios)
    (folder / PLAN_FILE).write_text(json.dumps({"problem": problem, "shape_set": shape_set, "regions": regions,
                                                "per_region": per_region, "seed": seed}, indent=1) + "\n")
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
def portfolio_table(warehouse_root: str, portfolio_id: str, plan: dict[str, Any],
                    report: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each region's run and its best (score over the region's representatives), and, given the portfolio's
    ``portfolio_report``, every row of the portfolio against the peer, published as a Markdown artifact
    ``<portfolio>-portfolio``; returns the regions' rows."""
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
    if report is not None:
        text += "\n\n" + portfolio_markdown(report)
    create_markdown_artifact(text, key=artifact_key(portfolio_id, "portfolio"),
                             description=f"portfolio {portfolio_id}: its regions and their bests")
    return rows


def portfolio_report(warehouse_root: str, problem: str, shape_set: str, gpu_model: str | None = None) -> dict[str, Any]:
    """Every row of the portfolio with the fastest kernel measured correct there by any run and the fastest peer
    timed there (``warehouse.queries.portfolio_scores``), on one GPU model (default: the one with most rows
    measured), and the summary: coverage (rows with a kernel), the geomean of peer / ours over the rows with both,
    searched and held-out rows apart, the rows below 1x and the rows no kernel serves."""
    from warehouse.queries import portfolio_scores

    prob = get_problem(problem)
    sset = prob.shape_set(shape_set)
    scores = portfolio_scores(warehouse_root, prob.name) if (Path(warehouse_root) / "SCHEMA_VERSION").exists() else []
    models: dict[str, int] = {}
    for r in scores:
        if r["best_ms"] is not None:
            models[r["gpu_model"]] = models.get(r["gpu_model"], 0) + 1
    model = gpu_model or (max(models, key=lambda m: models[m]) if models else None)
    by_shape = {r["shape"]: r for r in scores if r["gpu_model"] == model}
    rows = []
    for shape, role in zip(sset.shapes, sset.roles):
        key = shape_key(shape)
        r = by_shape.get(key, {})
        ours, peer = r.get("best_ms"), r.get("peer_ms")
        rows.append({"shape": key, "role": role, "flops": float(prob.flops(shape)), "ours_ms": ours,
                     "attempt_id": r.get("attempt_id"), "run_id": r.get("run_id"), "peer": r.get("peer"),
                     "peer_ms": peer, "speedup": peer / ours if ours and peer else None})

    def part(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rows": len(rs), "covered": sum(r["ours_ms"] is not None for r in rs),
                "with_peer": sum(r["speedup"] is not None for r in rs),
                "geomean": geomean(ups) if (ups := [r["speedup"] for r in rs if r["speedup"] is not None]) else None,
                "below_1x": [r["shape"] for r in rs if r["speedup"] is not None and r["speedup"] < 1],
                "uncovered": [r["shape"] for r in rs if r["ours_ms"] is None]}
    searched = [r for r in rows if r["role"] != "held_out"]
    held = [r for r in rows if r["role"] == "held_out"]
    return {"problem": prob.name, "shape_set": sset.name, "gpu_model": model, "rows": rows,
            "summary": {"all": part(rows), "searched": part(searched), "held_out": part(held)}}


def portfolio_markdown(report: dict[str, Any]) -> str:
    """The report's summary and rows as Markdown."""
    s = report["summary"]
    out = [f"## {report['problem']} · {report['shape_set']} against the peer"
           + (f" on {report['gpu_model']}" if report["gpu_model"] else ""), "",
           "Per row, the fastest kernel any run measured correct there (cold L2, CUDA events) against the fastest "
           "peer timed there; held-out rows were never searched.", "",
           md_table(["rows", "count", "served", "with a peer figure", "geomean peer / ours", "below 1x"],
                    [[k, s[k]["rows"], s[k]["covered"], s[k]["with_peer"], times(s[k]["geomean"]),
                      len(s[k]["below_1x"])] for k in ("all", "searched", "held_out")])]
    if s["all"]["uncovered"]:
        out += ["", f"{len(s['all']['uncovered'])} rows no measured kernel serves: "
                + "; ".join(s["all"]["uncovered"][:20]) + (" ..." if len(s["all"]["uncovered"]) > 20 else "")]
    out += ["", md_table(["shape", "role", "ours ms", "kernel", "peer", "peer ms", "peer / ours"],
                         [[r["shape"], r["role"], ms(r["ours_ms"]), (r["attempt_id"] or "–")[:12], r["peer"] or "–",
                           ms(r["peer_ms"]), times(r["speedup"])] for r in report["rows"]])]
    return "\n".join(out)
