"""What a run reports when it ends: outcomes, its best beside the hand-written best and the peer, held-out rows,
the winners that came out wrong when the final stage confirmed them."""
from __future__ import annotations

from typing import Any

from tasks.history import confirm_failures
from tasks.run import Run
from warehouse import Warehouse


def summarize(run: Run, stop: str | None) -> dict[str, Any]:
    """The run's summary from the warehouse (every job of it, for a resumed run)."""
    wh = Warehouse(run.warehouse_root)
    rid = run.plan.run_id
    outcomes = {r["outcome"]: r["n"] for r in wh.query(
        "select outcome, count(*) as n from attempts where run_id = ? group by 1", [rid]).to_pylist()}
    best = wh.query("select attempt_id, ir_hash, basis, score_ms, generation from run_best where run_id = ?",
                    [rid]).to_pylist()
    baselines = wh.query("select name, source, basis, score_ms, correct from baseline_scores where run_id = ? "
                         "order by source, score_ms nulls last", [rid]).to_pylist()
    held = wh.query("""
        select c.shape, c.correct, m.median_ms from checks c join attempts a using (attempt_id)
        left join measurements m on m.attempt_id = c.attempt_id and m.shape = c.shape and m.kind = 'held_out'
        where a.run_id = ? and c.kind = 'held_out' order by c.shape""", [rid]).to_pylist()
    b = best[0] if best else None
    kind = {"measured": "measured geomean ms", "predicted": "predicted geomean ms (CPU: not timed)"}
    return {"run_id": rid, "session": run.plan.session, "outcomes": outcomes, "timed": run.timed,
            "shapes": len(run.search_shapes), "held_out_shapes": len(run.held_out),
            "harness_version": run.harness.version, "cold": run.plan.cold, "stop_reason": stop,
            "generations": run.state.generation, "attempts": sum(outcomes.values()),
            "best_score": b["score_ms"] if b else None,
            "best_score_kind": kind[b["basis"]] if b else
            ("measured geomean ms" if run.timed else "predicted geomean ms (CPU: not timed)"),
            "best_attempt": b["attempt_id"] if b else None, "best_ir_hash": b["ir_hash"] if b else None,
            "baselines": baselines, "held_out": held,
            "confirm_failed": confirm_failures(run.warehouse_root, rid)}
