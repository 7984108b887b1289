"""Every read of a run from the warehouse, in one place: its recorded row, the rows its state is rebuilt from,
what it has already recorded, its best so far, its per-shape best and its progress.

"Best" is the warehouse's: ``kernel_scores`` scores a kernel, ``run_best`` ranks a run's kernels by it,
``shape_best`` picks per shape, ``baseline_scores`` scores the hand-written kernels and the peers the same way
(warehouse/schema/). Nothing here computes a score; the flow, its tasks, the live display, the summary and the
report all ask these functions. Each takes the warehouse (a :class:`~warehouse.Warehouse` or its root) and
returns plain rows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from warehouse.store import Warehouse

Rows = list[dict[str, Any]]
FAILED = ("verify_failed", "compile_failed", "wrong", "runtime_fault", "timeout")


def _wh(where: Warehouse | str | Path) -> Warehouse:
    return where if isinstance(where, Warehouse) else Warehouse(where)


# ---------------------------------------------------------------- a run's record

def harness_versions(where: Warehouse | str | Path) -> set[int]:
    """The harness versions a warehouse holds (0, the built-in one, always)."""
    rows = _wh(where).query("select distinct version from harness_versions").to_pylist()
    return {0} | {int(r["version"]) for r in rows}


def run_rows(where: Warehouse | str | Path, run_id: str) -> Rows:
    """The run's current row (``runs_latest``): zero or one."""
    return _wh(where).query("select * from runs_latest where run_id = ?", [run_id]).to_pylist()


def state_rows(where: Warehouse | str | Path, run_id: str) -> dict[str, Any]:
    """What ``cake_core.pipeline.state.select_stage`` rebuilds a run's state from (see its docstring)."""
    wh = _wh(where)
    done = {int(r["generation"]) for r in wh.query(
        "select distinct generation from stage_times where run_id = ? and stage = 'select'", [run_id]).to_pylist()}
    attempts = wh.query("select generation, slot, ir_hash, tactic, outcome, gpu_seconds, prompt_tokens, "
                        "completion_tokens from attempts where run_id = ?", [run_id]).to_pylist()
    scores = wh.query("select k.generation, k.slot, k.ir_hash, k.score_ms, a.ir_text, a.lineage, a.parents "
                      "from kernel_scores k join attempts a using (attempt_id) where k.run_id = ?",
                      [run_id]).to_pylist()
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


def recorded(where: Warehouse | str | Path, attempt_ids: list[str], tables: tuple[str, ...]) -> dict[str, set[str]]:
    """Which of ``attempt_ids`` each table already holds rows of (a generation cut short is redone without
    recording anything twice)."""
    if not attempt_ids:
        return {t: set() for t in tables}
    wh = _wh(where)
    marks = ", ".join("?" * len(attempt_ids))
    return {t: {r["attempt_id"] for r in wh.query(
        f"select distinct attempt_id from {t} where attempt_id in ({marks})", list(attempt_ids)).to_pylist()}
        for t in tables}


def recorded_candidates(where: Warehouse | str | Path, attempt_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The candidates recorded for those of ``attempt_ids`` that have an attempts row: attempt id -> its
    ``ir_text``, ``parents``, ``agent``, ``tactic``, ``lineage``, token counts (a redone generation runs these,
    not what the agent writes the second time)."""
    if not attempt_ids:
        return {}
    marks = ", ".join("?" * len(attempt_ids))
    return {r["attempt_id"]: r for r in _wh(where).query(
        "select attempt_id, ir_text, parents, agent, tactic, lineage, prompt_tokens, completion_tokens "
        f"from attempts where attempt_id in ({marks})", list(attempt_ids)).to_pylist()}


def final_recorded(where: Warehouse | str | Path, run_id: str) -> dict[str, Any]:
    """What the final stages of ``run_id``'s jobs have landed already (a later one does not measure it again):
    ``confirm``, the (attempt id, shape) pairs confirmed, right (a confirmatory measurement) or wrong (a failed
    ``confirm`` check); ``held_out``, the attempt ids with held-out rows (measured or checked); ``sweep``, the
    attempt ids with sweep rows; ``baselines``, how many baseline rows."""
    wh = _wh(where)
    confirmed = {(r["attempt_id"], r["shape"]) for r in wh.query(
        "select attempt_id, shape from measurements where run_id = ? and kind = 'confirm' union "
        "select c.attempt_id, c.shape from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'confirm'", [run_id, run_id]).to_pylist()}
    held = {r["attempt_id"] for r in wh.query(
        "select attempt_id from measurements where run_id = ? and kind = 'held_out' union "
        "select c.attempt_id from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'held_out'", [run_id, run_id]).to_pylist()}
    swept = {r["attempt_id"] for r in wh.query(
        "select attempt_id from measurements where run_id = ? and kind = 'sweep' union "
        "select c.attempt_id from checks c join attempts a using (attempt_id) where a.run_id = ? "
        "and c.kind = 'sweep'", [run_id, run_id]).to_pylist()}
    base = wh.query("select count(*) as n from baselines where run_id = ?", [run_id]).to_pylist()[0]["n"]
    return {"confirm": confirmed, "held_out": held, "sweep": swept, "baselines": base}


def peers_measured(where: Warehouse | str | Path, problem: str, run_id: str) -> set[tuple[str, str]]:
    """(peer, shape) pairs some run of ``problem`` timed correct on the GPU model(s) ``run_id``'s own peer baselines
    were timed on (a portfolio's region runs share their rows' peer figures: each is measured once)."""
    rows = _wh(where).query(
        "select distinct b.name, b.shape from baselines b left join runs_latest r using (run_id) "
        "where (b.run_id = ? or r.problem = ?) and b.source = 'peer' and b.correct and b.median_ms is not null "
        "and b.gpu_model in (select gpu_model from baselines where run_id = ? and source = 'peer' "
        "and gpu_model is not null)", [run_id, problem, run_id]).to_pylist()
    return {(r["name"], r["shape"]) for r in rows}


def portfolio_scores(where: Warehouse | str | Path, problem: str) -> list[dict[str, Any]]:
    """Per shape and GPU model of ``problem``, over every run: the fastest kernel measured correct there
    (``shape_best_any_run``) and the fastest peer timed correct there (``baselines``), either None where missing."""
    return _wh(where).query(
        "with peer as (select b.shape, b.gpu_model, min(b.median_ms) as peer_ms, arg_min(b.name, b.median_ms) as peer "
        "from baselines b left join runs_latest r using (run_id) where r.problem = ? and b.source = 'peer' "
        "and b.correct and b.median_ms is not null and b.gpu_model is not null and starts_with(b.l2, 'cold') "
        "group by b.shape, b.gpu_model), "
        "ours as (select shape, gpu_model, best_ms, attempt_id, run_id from shape_best_any_run where problem = ?) "
        "select coalesce(o.shape, p.shape) as shape, coalesce(o.gpu_model, p.gpu_model) as gpu_model, o.best_ms, "
        "o.attempt_id, o.run_id, p.peer, p.peer_ms from ours o full outer join peer p "
        "on o.shape = p.shape and o.gpu_model = p.gpu_model", [problem, problem]).to_pylist()


# ---------------------------------------------------------------- best so far

def portfolio_ids(where: Warehouse | str | Path, problem: str) -> list[str]:
    """The portfolios (``pf-...`` ids) whose region runs of ``problem`` the warehouse holds, sorted."""
    if not isinstance(where, Warehouse) and not (Path(where) / "SCHEMA_VERSION").exists():
        return []
    rows = _wh(where).query("select distinct run_id from runs where problem = ? and run_id like 'pf-%-region-%'",
                            [problem]).to_pylist()
    return sorted({r["run_id"].rsplit("-region-", 1)[0] for r in rows})


def run_best(where: Warehouse | str | Path, run_id: str, through: int | None = None) -> dict[str, Any] | None:
    """The run's best kernel (``run_best``: ``kernel_scores``' first), with its IR text and its predicted
    geomean; ``through``: the best among generations ``0 .. through`` only (the best so far at that
    generation). None: no kernel scored yet."""
    wh = _wh(where)
    if through is None:
        rows = wh.query("select b.*, a.predicted_ms from run_best b left join attempts a using (attempt_id) "
                        "where b.run_id = ?", [run_id]).to_pylist()
    else:
        rows = wh.query("""
            select k.*, a.ir_text, a.predicted_ms from kernel_scores k left join attempts a using (attempt_id)
            where k.run_id = ? and k.generation <= ?
            order by k.score_ms, k.generation, k.slot, k.ir_hash limit 1""", [run_id, through]).to_pylist()
    return rows[0] if rows else None


def ranked_kernels(where: Warehouse | str | Path, run_id: str) -> Rows:
    """The run's kernels measured correct on every searched shape (``kernel_scores``, basis measured), best score
    first, with what rebuilds them: attempt_id, generation, slot, score_ms, ir_text."""
    return _wh(where).query("""
        select k.attempt_id, k.generation, k.slot, k.score_ms, a.ir_text
        from kernel_scores k join attempts a using (attempt_id)
        where k.run_id = ? and k.basis = 'measured' and a.ir_text is not null
        order by k.score_ms, k.generation, k.slot, k.ir_hash""", [run_id]).to_pylist()


def shape_best(where: Warehouse | str | Path, run_id: str) -> Rows:
    """Per searched shape of the run, the kernel to dispatch on (``shape_best``), by shape."""
    return _wh(where).query("select * from shape_best where run_id = ? order by shape", [run_id]).to_pylist()


def search_best_ms(where: Warehouse | str | Path, run_id: str) -> dict[str, float]:
    """The run's fastest correct searched median so far on each shape key it has one (``shape_best``'s search
    figure: the generations before the one being timed)."""
    return {r["shape"]: float(r["search_ms"]) for r in shape_best(where, run_id)}


def fastest_so_far(where: Warehouse | str | Path, run_id: str, through: int) -> dict[str, float]:
    """Per shape, the fastest correct searched median of generations ``0 .. through``, kernels that failed their
    confirmation left out (``shape_best``'s figure, as it stood then)."""
    return {r["shape"]: r["ms"] for r in _wh(where).query("""
        select m.shape, min(m.median_ms) as ms from measurements m join attempts a using (attempt_id)
        where a.run_id = ? and a.generation <= ? and m.kind = 'search' and m.correct
          and a.attempt_id not in (select attempt_id from confirm_failures) group by 1""",
        [run_id, through]).to_pylist()}


def baseline_scores(where: Warehouse | str | Path, run_id: str) -> Rows:
    """The hand-written kernels and peers measured in the run, scored as its kernels are (``baseline_scores``):
    name, source, basis, score_ms, correct; by source, fastest first."""
    return _wh(where).query("select name, source, basis, score_ms, correct from baseline_scores where run_id = ? "
                            "order by source, score_ms nulls last, name", [run_id]).to_pylist()


def confirm_failures(where: Warehouse | str | Path, run_id: str) -> Rows:
    """The (kernel, shape) pairs of ``run_id`` that came out wrong when a final stage confirmed them."""
    return _wh(where).query("select attempt_id, shape, message from confirm_failures where run_id = ? "
                            "order by attempt_id, shape", [run_id]).to_pylist()


# ---------------------------------------------------------------- progress

def attempt_counts(where: Warehouse | str | Path, run_id: str) -> Rows:
    """Per generation and outcome: attempts, and the best predicted geomean among them (one query: each query
    lists every batch file)."""
    return _wh(where).query("select generation, outcome, count(*) as n, min(predicted_ms) as ms from attempts "
                            "where run_id = ? group by all order by all", [run_id]).to_pylist()


def held_out_rows(where: Warehouse | str | Path, run_id: str) -> Rows:
    """The held-out report of the run: per shape, whether its best was right there and its median."""
    return _wh(where).query("""
        select c.shape, c.correct, m.median_ms from checks c join attempts a using (attempt_id)
        left join measurements m on m.attempt_id = c.attempt_id and m.shape = c.shape and m.kind = 'held_out'
        where a.run_id = ? and c.kind = 'held_out' order by c.shape""", [run_id]).to_pylist()


def progress_rows(where: Warehouse | str | Path, run_id: str, *, final: bool = False) -> dict[str, Any]:
    """What ``cake_core.pipeline.progress.RunProgress`` is built from: the attempt counts, the best so far and
    the baselines; with ``final``, the held-out report and the failed confirmations too (a run that ended)."""
    wh = _wh(where)
    out: dict[str, Any] = {"counts": attempt_counts(wh, run_id), "best": run_best(wh, run_id),
                           "baselines": baseline_scores(wh, run_id)}
    if final:
        out.update(held_out=held_out_rows(wh, run_id), confirm_failed=confirm_failures(wh, run_id))
    return out


# ---------------------------------------------------------------- export

def export_rows(where: Warehouse | str | Path, problem: str, run_ids: list[str] | None = None) -> dict[str, Any]:
    """What ``cake_core.export.build.export_problem`` picks a package's kernels from, for ``problem`` (in
    ``run_ids`` only, when given): ``measurements`` (every measurement of the problem's kernels, with the kernel's
    ``ir_hash`` and ``ir_text``), ``failed`` (attempt ids a final stage found wrong: ``confirm_failures``),
    ``peers`` (the peers' baselines), ``roles`` (shape, role of the runs' shape sets; a held-out measurement
    counts as role held_out) and ``runs`` (the problem's run ids)."""
    wh = _wh(where)
    runs = [r["run_id"] for r in wh.query("select run_id from runs_latest where problem = ? order by run_id",
                                          [problem]).to_pylist()]
    picked = [r for r in runs if run_ids is None or r in run_ids]
    if not picked:
        return {"measurements": [], "failed": [], "peers": [], "roles": [], "runs": runs}
    marks = ", ".join("?" * len(picked))
    measurements = wh.query(f"""
        select m.attempt_id, m.run_id, m.shape, m.gpu_model, m.timer, m.l2, m.median_ms, m.correct, m.kind,
               a.ir_hash, a.ir_text
        from measurements m join attempts a using (attempt_id)
        where a.problem = ? and m.run_id in ({marks})""", [problem, *picked]).to_pylist()
    failed = [r["attempt_id"] for r in wh.query(
        f"select distinct attempt_id from confirm_failures where run_id in ({marks})", picked).to_pylist()]
    peers = wh.query(f"""
        select shape, gpu_model, name, median_ms, correct, timer, l2 from baselines
        where source = 'peer' and run_id in ({marks})""", picked).to_pylist()
    roles = wh.query(f"""
        select distinct s.shape, s.role from shapes s join runs_latest r
          on r.shape_set = s.shape_set and r.problem = s.problem
        where r.run_id in ({marks})
        union select distinct shape, 'held_out' as role from measurements
        where kind = 'held_out' and run_id in ({marks})""", [*picked, *picked]).to_pylist()
    return {"measurements": measurements, "failed": failed, "peers": peers, "roles": roles, "runs": runs}
