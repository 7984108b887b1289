"""What a run reports when it ends: outcomes, its best beside the hand-written best and the peer, held-out rows,
the winners that came out wrong when the final stage confirmed them."""
from __future__ import annotations

from typing import Any

from cake_core.pipeline.progress import RunProgress
from tasks.run import Run
from warehouse.queries import progress_rows

KINDS = {"measured": "measured geomean ms", "predicted": "predicted geomean ms (CPU: not timed)"}


def summarize(run: Run, stop: str | None) -> dict[str, Any]:
    """The run's summary from the warehouse (every job of it, for a resumed run): its :class:`RunProgress`, as
    the live display shows it, and what the job was."""
    p = RunProgress(run.plan.run_id).apply(progress_rows(run.warehouse_root, run.plan.run_id, final=True))
    b = p.best
    return {"run_id": p.run_id, "session": run.plan.session, "outcomes": p.by_outcome(), "timed": run.timed,
            "shapes": len(run.search_shapes), "held_out_shapes": len(run.held_out),
            "harness_version": run.harness.version, "cold": run.plan.cold, "stop_reason": stop,
            "generations": run.state.generation, "attempts": p.total(),
            "best_score": p.best_ms,
            "best_score_kind": KINDS[p.best_basis or ("measured" if run.timed else "predicted")],
            "best_attempt": b["attempt_id"] if b else None, "best_ir_hash": b["ir_hash"] if b else None,
            "baselines": p.baselines, "held_out": p.held_out, "confirm_failed": p.confirm_failed}
