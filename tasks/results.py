"""A run's results as plain rows, read from the warehouse: what the run's artifacts and ``cake report`` show.

Every figure comes from the warehouse's views (``kernel_scores`` scores a kernel, ``shape_best`` picks per
shape, ``baseline_scores`` scores the hand-written kernels and the peers), the best so far and per shape through
``warehouse.queries``, so the UI, the report, the live display and ``cake sql`` never disagree. A shape's figure is a measured median where the kernel was timed and correct
there, else the cost model's prediction; ``basis`` says which.
"""
from __future__ import annotations

from typing import Any

from warehouse import Warehouse
from warehouse.queries import baseline_scores, fastest_so_far, run_best, shape_best


def generation_rows(warehouse_root: str, run_id: str, generation: int) -> dict[str, Any]:
    """Generation ``generation`` of run ``run_id``: its candidates by outcome (this generation only), the best
    kernel so far (through this generation) with its predicted and measured geomean, and per shape that
    kernel's predicted, checked and measured figures beside the fastest correct median so far.

    Returns
    -------
    dict
        ``{"generation", "attempts", "outcomes": {outcome: n}, "best": row or None, "shapes": [row]}``.
    """
    wh = Warehouse(warehouse_root)
    outcomes = {r["outcome"]: r["n"] for r in wh.query(
        "select outcome, count(*) as n from attempts where run_id = ? and generation = ? group by 1 "
        "order by 2 desc, 1", [run_id, generation]).to_pylist()}
    best = run_best(wh, run_id, through=generation)
    b = None if best is None else {k: best[k] for k in ("attempt_id", "generation", "tactic", "basis", "score_ms",
                                                        "predicted_ms")}
    if b is not None:
        b["measured_ms"] = b["score_ms"] if b["basis"] == "measured" else None
    return {"generation": generation, "attempts": sum(outcomes.values()), "outcomes": outcomes, "best": b,
            "shapes": _best_shapes(wh, run_id, generation, b["attempt_id"] if b else None)}


def _best_shapes(wh: Warehouse, run_id: str, generation: int, attempt_id: str | None) -> list[dict[str, Any]]:
    fastest = fastest_so_far(wh, run_id, generation)
    rows: dict[str, dict[str, Any]] = {s: {"shape": s} for s in fastest}
    if attempt_id is not None:
        for r in wh.query("select shape, avg(predicted_ms) as ms from predictions where attempt_id = ? group by 1",
                          [attempt_id]).to_pylist():
            rows.setdefault(r["shape"], {"shape": r["shape"]})["predicted_ms"] = r["ms"]
        # the run's shapes only: the strict shapes are the kernel's own, and its outcome already says how it did
        for r in wh.query("select shape, bool_and(correct) as ok from checks where attempt_id = ? and "
                          "kind <> 'strict' group by 1", [attempt_id]).to_pylist():
            rows.setdefault(r["shape"], {"shape": r["shape"]})["correct"] = r["ok"]
        for r in wh.query("select shape, median(median_ms) as ms from measurements where attempt_id = ? and "
                          "kind = 'search' and correct group by 1", [attempt_id]).to_pylist():
            rows.setdefault(r["shape"], {"shape": r["shape"]})["measured_ms"] = r["ms"]
    for s, r in rows.items():
        r.setdefault("predicted_ms", None)
        r.setdefault("correct", None)
        r.setdefault("measured_ms", None)
        r["fastest_so_far_ms"] = fastest.get(s)
    return sorted(rows.values(), key=lambda r: r["shape"])


def leaderboard_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """The run's best kernel beside every hand-written kernel and peer measured in the run, fastest first,
    each with its speed-up over the run's best (above 1: the run's best is faster). Scores are geomeans
    over the searched shapes (``kernel_scores`` / ``baseline_scores``)."""
    wh = Warehouse(warehouse_root)
    rows = [{"name": r["attempt_id"], "source": "run best", "basis": r["basis"], "score_ms": r["score_ms"],
             "correct": True, "generation": r["generation"], "tactic": r["tactic"]}
            for r in [run_best(wh, run_id)] if r is not None]
    best = rows[0]["score_ms"] if rows else None
    rows += [{"name": r["name"], "source": r["source"].replace("_", "-"), "basis": r["basis"],
              "score_ms": r["score_ms"], "correct": r["correct"], "generation": None, "tactic": None}
             for r in baseline_scores(wh, run_id)]
    for r in rows:
        r["vs_run_best"] = r["score_ms"] / best if best and r["score_ms"] else None
    return sorted(rows, key=lambda r: (r["score_ms"] is None, r["score_ms"] or 0.0, r["source"], r["name"]))


def shape_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """Per shape of the run (searched and held-out): the run's figure (its ``shape_best`` kernel on a searched
    shape, its best kernel on a held-out one; the prediction where nothing was timed), the fastest
    hand-written kernel and the fastest peer there, and the run's speed-up over each (above 1: faster)."""
    wh = Warehouse(warehouse_root)
    out: dict[str, dict[str, Any]] = {}

    def row(shape: str, role: str | None = None) -> dict[str, Any]:
        r = out.setdefault(shape, {"shape": shape, "role": role, "run_ms": None, "run_basis": None,
                                   "hand_written": None, "hand_written_ms": None, "peer": None, "peer_ms": None})
        r["role"] = r["role"] or role
        return r

    for b in wh.query("""select name, source, shape, role,
                                case when median_ms is not null and coalesce(correct, false) then median_ms end
                                  as measured_ms, predicted_ms
                         from baselines where run_id = ? order by shape, name""", [run_id]).to_pylist():
        ms = b["measured_ms"] if b["measured_ms"] is not None else b["predicted_ms"]
        r = row(b["shape"], b["role"])
        col = "hand_written" if b["source"] == "hand_written" else "peer"
        if ms is not None and (r[col + "_ms"] is None or ms < r[col + "_ms"]):
            r[col], r[col + "_ms"] = b["name"], ms
    for s in shape_best(wh, run_id):
        row(s["shape"]).update(run_ms=s["median_ms"], run_basis="measured")
    best = run_best(wh, run_id)
    if best:
        aid = best["attempt_id"]
        for m in wh.query("select shape, median(median_ms) as ms from measurements where attempt_id = ? and "
                          "kind = 'held_out' and correct group by 1", [aid]).to_pylist():
            row(m["shape"], "held_out").update(run_ms=m["ms"], run_basis="measured")
        for p in wh.query("select shape, avg(predicted_ms) as ms from predictions where attempt_id = ? group by 1",
                          [aid]).to_pylist():
            r = row(p["shape"])
            if r["run_ms"] is None:
                r.update(run_ms=p["ms"], run_basis="predicted")
    for r in out.values():
        r["role"] = r["role"] or "headline"
        for col in ("hand_written", "peer"):
            r[f"vs_{col}"] = r[col + "_ms"] / r["run_ms"] if r["run_ms"] and r[col + "_ms"] else None
    return sorted(out.values(), key=lambda r: (r["role"] == "held_out", r["shape"]))


def convergence_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """Per generation: attempts, the generation's best score and the best so far (``convergence``), the best
    measured geomean so far and the best predicted geomean so far (every kernel the cost model let through)."""
    wh = Warehouse(warehouse_root)
    rows = wh.query("""
        with measured as (select generation, min(score_ms) as ms from kernel_scores
                          where run_id = ? and basis = 'measured' group by 1),
             predicted as (select generation, min(predicted_ms) as ms from attempts
                           where run_id = ? and predicted_ms is not null and outcome in ('checked', 'measured')
                           group by 1)
        select c.generation, c.attempts, c.best_ms_so_far,
               min(m.ms) over w as measured_so_far_ms, min(p.ms) over w as predicted_so_far_ms
        from convergence c left join measured m using (generation) left join predicted p using (generation)
        where c.run_id = ? and c.generation >= 0
        window w as (order by c.generation rows between unbounded preceding and current row)
        order by c.generation""", [run_id, run_id, run_id]).to_pylist()
    return rows


def failure_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """Per generation and failure cluster (stage and rule, as ``failure_clusters`` groups them): attempts."""
    return Warehouse(warehouse_root).query("""
        select generation, stage || ': ' || coalesce(error_rule, outcome) as cluster, count(*) as n
        from attempts where run_id = ? and signature is not null group by all order by 1, 3 desc""",
        [run_id]).to_pylist()


def prediction_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """Every (kernel, shape) of the run that was both predicted and measured (``cost_model_error``)."""
    return Warehouse(warehouse_root).query("""
        select attempt_id, shape, kind, predicted_ms, measured_ms from cost_model_error
        where run_id = ? and measured_ms > 0 and predicted_ms > 0 order by shape""", [run_id]).to_pylist()
