"""Warehouse rows, built here and nowhere else: plain dicts, one list per table, ready for Arrow.

``attempt_rows`` turns an attempt into its rows (the attempt, its diagnostics, compile report, predictions,
checks and measurements); the others make the rows of a run, its shapes, its final measurements, its
baselines, its stage times and its dispatch table. ``tasks/`` appends them; nothing here writes.
"""
from __future__ import annotations

import json
import socket
from datetime import datetime, timezone
from typing import Any, Iterable

from cake_core.harness.signature import signature
from cake_core.outcome import Outcome
from cake_core.pipeline.attempt import Attempt
from cake_core.pipeline.plan import RunPlan
from cake_core.pipeline.request import recorded_fields
from cake_core.pipeline.verdicts import ShapeVerdict
from cake_core.problems.base import Shape, shape_key

Rows = dict[str, list[dict[str, Any]]]
CHILD_TABLES = ("diagnostics", "compiles", "predictions", "checks", "measurements")   # land before "attempts"
LOG_CHARS = 4000            # the tail of an nvcc log kept with its compile row


def now() -> datetime:
    """Naive UTC, as every timestamp of the warehouse."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def attempt_rows(a: Attempt, created_at: datetime | None = None) -> Rows:
    """Every row of one attempt, by table, at whatever stage it stopped."""
    diags = a.diagnostics
    err = next((d for d in diags if d.is_error), None)
    failed = a.outcome.failed
    aid = a.attempt_id
    out: Rows = {"attempts": [{
        "attempt_id": aid, "run_id": a.run_id, "generation": a.generation, "slot": a.slot, "problem": a.problem,
        "ir_hash": a.ir_hash, "ir_text": a.candidate.text, "parents": list(a.candidate.parents),
        "agent": a.candidate.agent, "tactic": a.candidate.tactic, "harness_version": a.harness_version,
        "stage": a.stage, "outcome": a.outcome.value, "error_rule": err.rule if err else None,
        "error_message": err.message if err else None,
        "signature": signature(a.stage, a.outcome.value, err.rule if err else None,
                               err.message if err else None) if failed else None,
        "features": json.dumps(a.features, sort_keys=True),
        "prompt_tokens": a.candidate.prompt_tokens, "completion_tokens": a.candidate.completion_tokens,
        "predicted_ms": a.predicted_ms, "gpu_seconds": a.gpu_seconds, "created_at": created_at or now(),
        "lineage": list(a.candidate.lineage), "outside": list(a.outside)}]}
    out["diagnostics"] = [{"attempt_id": aid, **d.to_dict()} for d in diags]
    comp = a.result("compile")
    out["compiles"] = [compile_row(aid, comp)] if comp is not None and "skipped" not in comp.metrics else []
    out["predictions"] = [{"attempt_id": aid, "model_version": a.model_version, "model_kind": a.model_kind,
                           "shape": k, "predicted_ms": v, "score": a.scores.get(k), "decision": a.decision}
                          for k, v in a.predictions.items()]
    out["checks"] = [check_row(aid, v) for v in a.verdicts]
    out["measurements"] = measurement_rows(aid, a.run_id, a.verdicts) if a.outcome is Outcome.MEASURED else []
    return out


def refusal_rows(run_id: str, generation: int, refusals: Iterable) -> list[dict]:
    """The ``tactic_refusals`` rows of a generation: each tactic the agent drew that refused a parent, and why."""
    return [{"run_id": run_id, "generation": generation, "tactic": r.tactic, "parent_hash": r.parent,
             "reason": r.reason, "recorded_at": now()} for r in refusals]


def merge_rows(attempts: Iterable[Attempt]) -> Rows:
    """All rows of a batch of attempts, by table (one append per table)."""
    merged: Rows = {}
    for a in attempts:
        for table, rows in attempt_rows(a).items():
            merged.setdefault(table, []).extend(rows)
    return merged


def compile_row(attempt_id: str, r) -> dict[str, Any]:
    """The compile report of a compile stage result, passed or failed."""
    binary = r.value if r.outcome is Outcome.OK else None
    c = binary.compiled if binary is not None else None
    res = c.resources if c is not None else None
    return {"attempt_id": attempt_id, "source_hash": c.source_hash if c else "",
            "arch": c.arch if c else str(r.metrics.get("arch", "sm_90a")),
            "seconds": c.seconds if c else float(r.metrics.get("nvcc_s", 0.0)),
            "registers": res.registers if res else None, "spill_bytes": res.spill_bytes if res else None,
            "smem_bytes": res.smem_bytes if res else None, "barriers": res.barriers if res else None,
            "cached": bool(c.cached) if c else False, "ok": c is not None,
            "log": r.artifacts.get("nvcc.log", "")[-LOG_CHARS:]}


def check_row(attempt_id: str, v: ShapeVerdict) -> dict[str, Any]:
    return {"attempt_id": attempt_id, "shape": v.shape, "backend": v.backend, "correct": v.correct,
            "max_error": v.max_error, "message": v.message or None,
            "kind": v.kind if v.kind in ("held_out", "strict", "confirm", "sweep") else "search"}


def measurement_rows(attempt_id: str, run_id: str, verdicts: Iterable[ShapeVerdict],
                     measured_at: datetime | None = None) -> list[dict[str, Any]]:
    """The timed verdicts as measurement rows (their kind: search, confirm, held_out or sweep)."""
    t = measured_at or now()
    return [{"attempt_id": attempt_id, "run_id": run_id, "shape": v.shape, "gpu_model": v.timing.gpu_model,
             "timer": v.timing.timer, "l2": v.timing.l2, "median_ms": v.timing.median_ms, "p10_ms": v.timing.p10_ms,
             "p90_ms": v.timing.p90_ms, "runs": v.timing.runs, "correct": v.correct, "max_error": v.max_error,
             "kind": v.kind, "measured_at": t}
            for v in verdicts if v.timing is not None and v.correct]


def run_row(plan: RunPlan, status: str, *, harness_version: int, gpu_model: str | None, flow_run_id: str | None,
            stop_reason: str | None = None, finished_at: datetime | None = None) -> dict[str, Any]:
    """One status row of a run (append-only: ``runs_latest`` picks the current one): every recorded field of
    the plan (``request.recorded_fields``), the harness version it runs under, and where and how it stands."""
    return {"run_id": plan.run_id, **{n: getattr(plan, n) for n in recorded_fields()},
            "harness_version": harness_version, "host": socket.gethostname(), "gpu_model": gpu_model,
            "flow_run_id": flow_run_id, "started_at": plan.started_at, "status": status, "finished_at": finished_at,
            "session": plan.session, "stop_reason": stop_reason, "recorded_at": now()}


def shape_rows(shape_set: str, problem: str, shapes: Iterable[Shape], roles: Iterable[str]) -> list[dict[str, Any]]:
    return [{"shape_set": shape_set, "problem": problem, "shape": shape_key(s), "dims": json.dumps(s), "role": r}
            for s, r in zip(shapes, roles)]


def baseline_rows(run_id: str, name: str, source: str, shapes: Iterable[str], roles: dict[str, str],
                  verdicts: dict[str, ShapeVerdict], predictions: dict[str, float] | None = None,
                  message: str = "") -> list[dict[str, Any]]:
    """A hand-written kernel's or a peer's rows, one per shape key of ``shapes`` (``roles``: key -> role):
    its verdict where it was run (timed where correct and timed), the cost model's figure where predicted,
    ``message`` where neither says why it has none."""
    t = now()
    out = []
    for k in shapes:
        v = verdicts.get(k)
        timing = v.timing if v is not None and v.correct else None
        out.append({"run_id": run_id, "name": name, "source": source, "shape": k, "role": roles[k],
                    "gpu_model": timing.gpu_model if timing else None, "timer": timing.timer if timing else None,
                    "l2": timing.l2 if timing else None, "median_ms": timing.median_ms if timing else None,
                    "p10_ms": timing.p10_ms if timing else None, "p90_ms": timing.p90_ms if timing else None,
                    "runs": timing.runs if timing else None, "predicted_ms": (predictions or {}).get(k),
                    "correct": v.correct if v is not None else None,
                    "message": (v.message if v is not None else message) or None, "measured_at": t})
    return out


def stage_time_row(run_id: str, session: int, generation: int, stage: str, wall_s: float, work_s: float,
                   n_in: int, n_out: int, workers: int) -> dict[str, Any]:
    return {"run_id": run_id, "session": session, "generation": generation, "stage": stage, "wall_s": wall_s,
            "work_s": work_s, "n_in": n_in, "n_out": n_out, "workers": workers, "recorded_at": now()}


def dispatch_rows(problem: str, shape_set: str, picks: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dispatch table of a run from its ``shape_best`` rows."""
    t = now()
    return [{"problem": problem, "shape_set": shape_set, "shape": p["shape"], "attempt_id": p["attempt_id"],
             "ir_hash": p["ir_hash"] or "", "median_ms": p["median_ms"], "created_at": t} for p in picks]
