"""A run's history in the warehouse, read back: its recorded parameters, the rows its state is rebuilt from,
what it has already recorded. Reads only; no Prefect, so the CLI checks a ``--resume`` before starting any
service.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any

from cake_core.pipeline.plan import ResumeRefused, RunPlan, resume_plan
from warehouse import Warehouse

FAILED = ("verify_failed", "compile_failed", "wrong", "runtime_fault", "timeout")


def harness_versions(warehouse_root: str) -> set[int]:
    """The harness versions a warehouse holds (0, the built-in one, always)."""
    rows = Warehouse(warehouse_root).query("select distinct version from harness_versions").to_pylist()
    return {0} | {int(r["version"]) for r in rows}


def run_rows(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    return Warehouse(warehouse_root).query("select * from runs_latest where run_id = ?", [run_id]).to_pylist()


def plan_resume(warehouse_root: str, run_id: str, asked: dict[str, Any], timed: bool) -> RunPlan:
    """The plan of the next job of ``run_id``, checked against what was recorded and against a process running
    it now (``ResumeRefused`` if there is none)."""
    plan = resume_plan(run_id, run_rows(warehouse_root, run_id), harness_versions(warehouse_root),
                       where=f"the warehouse {warehouse_root}", asked=asked, timed=timed)
    run_lock(warehouse_root, run_id).close()
    return plan


def run_lock(warehouse_root: str, run_id: str) -> IO[str]:
    """An exclusive lock on run ``run_id`` (``locks/run-<id>.lock``; released when the returned file is closed
    or this process ends, however it ends), or ``ResumeRefused`` when another process holds it."""
    path = Path(warehouse_root) / "locks" / f"run-{run_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ResumeRefused(f"run `{run_id}` is being run right now (by {holder}); wait for it to end, or stop "
                            f"it before resuming") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    return f


def state_rows(warehouse_root: str, run_id: str) -> dict[str, Any]:
    """What ``cake_core.pipeline.state.select_stage`` rebuilds a run's state from (see its docstring)."""
    wh = Warehouse(warehouse_root)
    done = {int(r["generation"]) for r in wh.query(
        "select distinct generation from stage_times where run_id = ? and stage = 'select'", [run_id]).to_pylist()}
    attempts = wh.query("select generation, slot, ir_hash, tactic, outcome, gpu_seconds, prompt_tokens, "
                        "completion_tokens from attempts where run_id = ?", [run_id]).to_pylist()
    scores = wh.query("select k.generation, k.slot, k.ir_hash, k.score_ms, a.ir_text, a.lineage, a.parents "
                      "from kernel_scores k join attempts a using (attempt_id) where k.run_id = ?", [run_id]).to_pylist()
    # the tactics' records of the problem's runs that had finished when this run first started
    history = wh.query("""
        select k.run_id, k.ir_hash, k.score_ms, a.lineage, a.parents
        from kernel_scores k join attempts a using (attempt_id)
        join runs_latest r on r.run_id = k.run_id
        join (select run_id, problem, min(started_at) as started from runs where run_id = ? group by all) me
          on r.problem = me.problem
        where r.run_id <> ? and r.finished_at is not null and r.finished_at < me.started""",
                       [run_id, run_id]).to_pylist()
    shape_scores = wh.query("""
        select m.shape, a.generation, a.slot, a.ir_hash, m.median_ms as ms
        from measurements m join attempts a using (attempt_id)
        join run_headlines h on h.run_id = m.run_id and h.shape = m.shape
        where a.run_id = ? and m.kind = 'search' and m.correct""", [run_id]).to_pylist()
    failures = wh.query(f"""
        select a.generation, a.slot, a.ir_text, d.rule, d.severity, d.message, d.line, d.col, d.path, d.hint,
               d.witness
        from attempts a join diagnostics d on d.attempt_id = a.attempt_id and d.rule = a.error_rule
                                              and d.message = a.error_message
        where a.run_id = ? and a.outcome in ({", ".join(f"'{o}'" for o in FAILED)})""", [run_id]).to_pylist()
    return {"generations_done": done, "attempts": attempts, "scores": scores, "failures": failures,
            "history": history, "shape_scores": shape_scores}


def recorded(warehouse_root: str, attempt_ids: list[str], tables: tuple[str, ...]) -> dict[str, set[str]]:
    """Which of ``attempt_ids`` each table already holds rows of (a generation cut short is redone without
    recording anything twice)."""
    if not attempt_ids:
        return {t: set() for t in tables}
    wh = Warehouse(warehouse_root)
    marks = ", ".join("?" * len(attempt_ids))
    return {t: {r["attempt_id"] for r in wh.query(
        f"select distinct attempt_id from {t} where attempt_id in ({marks})", list(attempt_ids)).to_pylist()}
        for t in tables}


def final_recorded(warehouse_root: str, run_id: str) -> dict[str, Any]:
    """What the final stages of ``run_id``'s jobs have landed already (a later one does not measure it again):
    ``confirm``, the (attempt id, shape) pairs confirmed, right (a confirmatory measurement) or wrong (a failed
    ``confirm`` check); ``held_out``, the attempt ids with held-out rows (measured or checked); ``baselines``,
    how many baseline rows."""
    wh = Warehouse(warehouse_root)
    confirmed = {(r["attempt_id"], r["shape"]) for r in wh.query(
        "select attempt_id, shape from measurements where run_id = ? and kind = 'confirm' union "
        "select c.attempt_id, c.shape from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'confirm'", [run_id, run_id]).to_pylist()}
    held = {r["attempt_id"] for r in wh.query(
        "select attempt_id from measurements where run_id = ? and kind = 'held_out' union "
        "select c.attempt_id from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'held_out'", [run_id, run_id]).to_pylist()}
    base = wh.query("select count(*) as n from baselines where run_id = ?", [run_id]).to_pylist()[0]["n"]
    return {"confirm": confirmed, "held_out": held, "baselines": base}


def search_best_ms(warehouse_root: str, run_id: str) -> dict[str, float]:
    """The run's fastest correct searched median so far on each shape key it has one (``shape_best``'s search
    figure: the generations before the one being timed)."""
    rows = Warehouse(warehouse_root).query("select shape, search_ms from shape_best where run_id = ?",
                                           [run_id]).to_pylist()
    return {r["shape"]: float(r["search_ms"]) for r in rows}


def run_best(warehouse_root: str, run_id: str) -> dict[str, Any] | None:
    rows = Warehouse(warehouse_root).query("select * from run_best where run_id = ?", [run_id]).to_pylist()
    return rows[0] if rows else None


def confirm_failures(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    """The (kernel, shape) pairs of ``run_id`` that came out wrong when a final stage confirmed them."""
    return Warehouse(warehouse_root).query("select attempt_id, shape, message from confirm_failures where run_id = ? "
                                           "order by attempt_id, shape", [run_id]).to_pylist()


def shape_best(warehouse_root: str, run_id: str) -> list[dict[str, Any]]:
    return Warehouse(warehouse_root).query("select * from shape_best where run_id = ? order by shape",
                                           [run_id]).to_pylist()
