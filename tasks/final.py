"""The final stage of a run: confirm the winners, report the held-out rows, measure the baselines, dispatch.

- confirm: each searched shape's winner (``shape_best``) re-measured on fresh inputs, stored apart (kind
  ``confirm``): the search picked the minimum of noisy medians, so its own figures flatter the winner. Every
  verdict lands as a ``checks`` row of kind ``confirm``; a winner wrong there (or faulting) on any shape passed
  the gate on one draw of inputs only, and the views drop it (``confirm_failures``): the shapes it won get new
  winners, confirmed in turn, for ``policy.CONFIRM_ROUNDS`` rounds at most (``policy.unconfirmed``).
- held-out: the run's best (``run_best``) on the held-out rows only, measured (or checked, without a GPU)
  and stored apart (kind ``held_out``); nothing chose it by them.
- baselines: the problem's hand-written kernels and its peers on every shape of the run, in the same run,
  so the run's best is always shown beside them. They are never attempts and never parents.
- sweep: the run's finalists (each searched shape's winner and the run's best) on the sweep rows, measured (or
  checked) and stored apart (kind ``sweep``): a portfolio region's run measures what it found on the portfolio's
  other rows, so every row gets kernels measured on it; nothing chose them by these rows. A row whose best-scored
  holder (the run's fastest kernel whose domain holds it) is no finalist gets that kernel measured there too
  (``pipeline.stand_ins``), so a finalist's narrow domain does not leave the row to a slow kernel. On a GPU the
  problem's peers are timed there too (role ``sweep``), on the rows no run of the problem timed them on yet on that GPU
  model, so each row of a portfolio gets its peer figure once, whichever region comes to it first.
- dispatch: per searched shape, the kernel to dispatch on (a GPU run's ``shape_best``).

A long run is several jobs (``cake evolve --resume``, an experiment's blocks of generations), each ending with
this stage, and a later job's search can change the winners. So each job confirms the (attempt, shape) pairs of
the current ``shape_best`` that no earlier job confirmed (right or wrong), and reports the current ``run_best`` on
the held-out rows unless an earlier job did; the baselines are measured once per run (the same kernels on the same
shapes and inputs, whatever the search found since). A final stage cut short redoes only what landed nothing: each
part lands before the next begins.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from cake_core.agents.base import Candidate
from cake_core.ir.text import IRSyntaxError, parse_program
from cake_core.pipeline.attempt import Attempt
from cake_core.pipeline.policy import (BASELINE_SEED, CONFIRM_ROUNDS, CONFIRM_SEED, CPU_TIMEOUT_S, HELD_OUT_SEED,
                                       SWEEP_SEED, unconfirmed)
from cake_core.pipeline.rows import baseline_rows, check_row, dispatch_rows, measurement_rows, stage_time_row
from cake_core.pipeline.stand_ins import stand_ins
from cake_core.pipeline.verdicts import ShapeVerdict, as_kind, fault
from cake_core.problems import get_problem
from cake_core.problems.base import shape_key
from tasks.record import append
from tasks.run import Run
from tasks.stages import build, on_cpu, on_gpu
from tasks.workers import Fault
from warehouse import Warehouse
from warehouse.queries import final_recorded, ranked_kernels, run_best, shape_best


def _kernel(run: Run, row: dict[str, Any]) -> Attempt:
    """An attempt of the run rebuilt from its row, to run again (it is not recorded again)."""
    return Attempt(run.plan.run_id, row["generation"], row["slot"] or 0, run.plan.problem, run.harness.version,
                   Candidate(row["ir_text"]), attempt_id=row["attempt_id"])


def _confirm(run: Run, picks: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """Each of ``picks`` (``shape_best`` rows) re-measured on fresh inputs: every verdict lands as a ``checks`` row
    of kind ``confirm``, the correct timed ones as measurements too. Returns the verdicts landed and the failed
    ones (attempt id, shape, message)."""
    rows = _attempt_rows(run, list(dict.fromkeys(p["attempt_id"] for p in picks)))
    kernels = build(run, [_kernel(run, r) for r in rows.values()], run.search_shapes)
    index = {a.attempt_id: i for i, a in enumerate(kernels)}
    keys = [shape_key(s) for s in run.search_shapes]
    pairs = {(index[p["attempt_id"]], keys.index(p["shape"])) for p in picks
             if p["attempt_id"] in index and p["shape"] in keys}
    verdicts = on_gpu(run, kernels, run.search_shapes, run.plan.seed + CONFIRM_SEED, drop_failed=False, pairs=pairs,
                      kind="confirm")
    n, failed = 0, []
    for i, a in enumerate(kernels):
        # a failure's row says what it was even where the runner gave no message
        confirmed = [v if v.correct or v.message else replace(v, message=v.outcome.value)
                     for v in as_kind(verdicts[i], "confirm")]
        run.recorder.rows("measurements", measurement_rows(a.attempt_id, run.plan.run_id, confirmed))
        run.recorder.rows("checks", [check_row(a.attempt_id, v) for v in confirmed])
        n += len(confirmed)
        failed += [{"attempt_id": a.attempt_id, "shape": v.shape, "message": v.message}
                   for v in confirmed if not v.correct]
    return n, failed


def _apart(run: Run, kernels: list[Attempt], shapes: list, seed: int, kind: str,
           on_gpu_as: Callable[[list[Attempt]], dict[int, list[ShapeVerdict]]]) -> int:
    """Each of ``kernels`` on every one of ``shapes``, measured (a timed run: ``on_gpu_as(built)``, the jobs of
    this kind) or checked, stored apart under ``kind`` (held_out, sweep); a kernel that does not verify (or
    build) for them is recorded as such on each: that is the report. Returns the verdicts landed."""
    if run.timed:
        built = build(run, kernels, shapes)
        answers = on_gpu_as(built) if built else {}
        got = {a.attempt_id: answers.get(i, []) for i, a in enumerate(built)}
    else:
        got = {k.attempt_id: _check(run, k, shapes, seed) for k in kernels}
    n = 0
    for k in kernels:
        verdicts = as_kind(got.get(k.attempt_id) or [
            ShapeVerdict(shape_key(s), "gpu" if run.timed else "interpreter", k.outcome, message=_why_not(k))
            for s in shapes], kind)
        run.recorder.rows("measurements", measurement_rows(k.attempt_id, run.plan.run_id, verdicts))
        run.recorder.rows("checks", [check_row(k.attempt_id, v) for v in verdicts])
        n += len(verdicts)
    return n


def _held_out(run: Run, best: dict[str, Any]) -> int:
    seed = run.plan.seed + HELD_OUT_SEED
    return _apart(run, [_kernel(run, best)], run.held_out, seed, "held_out",
                  lambda built: on_gpu(run, built, run.held_out, seed, drop_failed=False, kind="held_out"))


def _sweep(run: Run, done: set[str]) -> int:
    """The run's finalists (each searched shape's winner and the run's best) not swept before, each on every sweep
    row, kind ``sweep``."""
    best = run_best(run.warehouse_root, run.plan.run_id)
    ids = list(dict.fromkeys([p["attempt_id"] for p in shape_best(run.warehouse_root, run.plan.run_id)]
                             + ([best["attempt_id"]] if best else [])))
    rows = _attempt_rows(run, [i for i in ids if i not in done])
    seed = run.plan.seed + SWEEP_SEED
    n = _apart(run, [_kernel(run, r) for r in rows.values()], run.sweep, seed, "sweep",
               lambda built: on_gpu(run, built, run.sweep, seed, drop_failed=False, kind="sweep"))
    return n + _sweep_stand_ins(run, set(ids), done, seed)


def _sweep_stand_ins(run: Run, finalists: set[str], done: set[str], seed: int) -> int:
    """Per sweep row, the run's best-scored kernel whose domain holds it, measured there (kind ``sweep``) where it
    is not a finalist (``pipeline.stand_ins``): a row the finalists' domains leave to a slow kernel gets the run's
    fastest one that serves it."""
    rows, ranked = {}, []
    for r in ranked_kernels(run.warehouse_root, run.plan.run_id):
        try:
            ranked.append((r["attempt_id"], parse_program(r["ir_text"])))
        except IRSyntaxError:
            continue            # a text of an older grammar: it stands in nowhere
        rows[r["attempt_id"]] = r
    n = 0
    for aid, shapes in stand_ins(ranked, finalists, run.sweep).items():
        if aid not in done:
            n += _apart(run, [_kernel(run, rows[aid])], shapes, seed, "sweep",
                        lambda built, shapes=shapes: on_gpu(run, built, shapes, seed, drop_failed=False, kind="sweep"))
    return n


def _attempt_rows(run: Run, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The run's attempts ``ids`` (what ``_kernel`` rebuilds them from), by id, in the order given."""
    if not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    got = {r["attempt_id"]: r for r in Warehouse(run.warehouse_root).query(
        f"select attempt_id, generation, slot, ir_text from attempts where run_id = ? and attempt_id in ({marks})",
        [run.plan.run_id, *ids]).to_pylist()}
    return {i: got[i] for i in ids if i in got}


def _check(run: Run, kernel: Attempt, shapes: list, seed: int) -> list:
    """The interpreter's verdicts on ``kernel`` (verified for ``shapes`` first); [] if it does not verify."""
    on_cpu(run, "verify", [kernel], lambda a: (a.candidate.text, run.harness, run.problem, shapes),
           CPU_TIMEOUT_S["verify"])
    if not kernel.going_on:
        return []
    # the held-out rows alone: the best passed its strict shapes when it was checked in the search
    (answer,) = run.cpu.map("stage", [("check", kernel.program, run.problem, shapes, seed, False)],
                            run.timeout_s)
    if isinstance(answer, Fault):
        return [fault(shape_key(s), "interpreter", answer.outcome, answer.message) for s in shapes]
    return list(answer[0].value or [])


def _why_not(a: Attempt) -> str:
    err = next((d for d in a.diagnostics if d.is_error), None)
    return f"stopped at {a.stage} ({a.outcome.value})" + (f": {err.rule}: {err.message}" if err else "")


def _baselines(run: Run) -> int:
    prob = run.problem
    seed = run.plan.seed + BASELINE_SEED
    every = run.search_shapes + run.held_out if run.timed else run.check_shapes + run.held_out
    keys = list(dict.fromkeys(shape_key(s) for s in (every if run.timed else run.search_shapes + every)))
    roles = {**{k: "headline" for k in keys}, **run.roles}      # --check-shapes rows count as headline checks
    hand = [Attempt(run.plan.run_id, -1, i, prob.name, run.harness.version, Candidate(prob.kernel_text(f)),
                    attempt_id=f"hand-written:{f}") for i, f in enumerate(prob.best_files)]
    rows: list[dict[str, Any]] = []
    if run.timed:
        built = build(run, hand, every)
        verdicts = on_gpu(run, built, every, seed, drop_failed=False, kind="baseline")
        for i, a in enumerate(built):
            preds = dict(zip((shape_key(s) for s in every), run.model.predict_ms(a.program, every)))
            rows += baseline_rows(run.plan.run_id, prob.best_files[a.slot], "hand_written", keys, roles,
                                  {v.shape: v for v in verdicts[i]}, preds)
        for a in hand:
            if not a.going_on:
                rows += baseline_rows(run.plan.run_id, prob.best_files[a.slot], "hand_written", keys, roles, {},
                                      message=_why_not(a))
        from cake_core.runtime.peers import peer_names
        for peer in peer_names(prob):
            rows += baseline_rows(run.plan.run_id, peer, "peer", keys, roles, _peer_verdicts(run, peer, every, seed))
    else:
        for a in hand:
            verdicts = {v.shape: v for v in _check(run, a, every, seed)}
            preds = dict(zip((shape_key(s) for s in run.search_shapes),
                             run.model.predict_ms(a.program, run.search_shapes))) if a.program is not None else {}
            rows += baseline_rows(run.plan.run_id, prob.best_files[a.slot], "hand_written", keys, roles, verdicts,
                                  preds, "" if a.going_on or a.stage == "check" else _why_not(a))
    run.recorder.rows("baselines", rows)
    return len(rows)


def _peer_verdicts(run: Run, peer: str, shapes: list, seed: int) -> dict[str, Any]:
    """``peer`` timed on ``shapes`` by the GPU runners: each shape's verdict (or fault) by key."""
    got: dict[str, Any] = {}
    for _ in range(2):      # a runner that an earlier job left unusable refuses: the fresh one answers
        todo = [s for s in shapes if shape_key(s) not in got]
        answers = run.gpu.map("peer", [(run.problem, peer, s, seed, run.reps) for s in todo], run.timeout_s)
        for s, a in zip(todo, answers):
            if isinstance(a, Fault):
                got[shape_key(s)] = fault(shape_key(s), "gpu", a.outcome, a.message)
            elif a["verdict"] is not None:
                got[shape_key(s)] = a["verdict"]
    return got


def _sweep_peers(run: Run) -> int:
    """The problem's peers on the sweep rows (a portfolio's other rows) that no run of the problem timed them on yet
    on this GPU model, role ``sweep``: each row of a portfolio gets the peer figure its report sets the kernels
    against, once, in whichever region's run comes to it first."""
    from cake_core.runtime.peers import peer_names
    from warehouse.queries import peers_measured

    have = peers_measured(run.warehouse_root, run.problem.name, run.plan.run_id)
    seed = run.plan.seed + BASELINE_SEED
    rows: list[dict[str, Any]] = []
    for peer in peer_names(run.problem):
        todo = [s for s in run.sweep if (peer, shape_key(s)) not in have]
        if todo:
            keys = [shape_key(s) for s in todo]
            rows += baseline_rows(run.plan.run_id, peer, "peer", keys, {k: "sweep" for k in keys},
                                  _peer_verdicts(run, peer, todo, seed))
    run.recorder.rows("baselines", rows)
    return len(rows)


def record_dispatch(warehouse_root: str, run_id: str, problem: str, shape_set: str) -> int:
    """The run's dispatch table: per searched shape, ``shape_best``'s kernel and its (confirmed) median."""
    picks = shape_best(warehouse_root, run_id)
    return append(Warehouse(warehouse_root), "dispatch", dispatch_rows(problem, shape_set, picks)) if picks else 0


@task(name="final", cache_policy=NO_CACHE)
def final(run: Run) -> dict[str, Any]:
    """Confirm, held-out report, sweep (and the peers on the sweep rows), baselines, dispatch; returns what landed of each (rows) and, as
    ``confirm_failed``, the winners that came out wrong on fresh inputs (attempt id, shape, message)."""
    t0 = time.monotonic()
    run.recorder.flush()
    done = final_recorded(run.warehouse_root, run.plan.run_id)
    landed = {"confirm": 0, "held_out": 0, "sweep": 0, "sweep_peers": 0, "baselines": 0, "dispatch": 0}
    failed: list[dict[str, Any]] = []
    for _ in range(CONFIRM_ROUNDS if run.timed else 0):
        picks = unconfirmed(shape_best(run.warehouse_root, run.plan.run_id), done["confirm"])
        if not picks:
            break
        n, wrong = _confirm(run, picks)
        run.recorder.flush()
        landed["confirm"] += n
        failed += wrong
        if not wrong:                   # the winners stand: nothing new to confirm
            break
        done = final_recorded(run.warehouse_root, run.plan.run_id)
    if not done["baselines"]:          # right after the confirmation: on the inputs it drew
        landed["baselines"] = _baselines(run)
        run.recorder.flush()
    best = run_best(run.warehouse_root, run.plan.run_id)     # after the confirmation: a wrong winner is not it
    if run.held_out and best is not None and best["attempt_id"] not in done["held_out"]:
        landed["held_out"] = _held_out(run, best)
        run.recorder.flush()
    if run.sweep:
        landed["sweep"] = _sweep(run, done["sweep"])
        run.recorder.flush()
        if run.timed:
            landed["sweep_peers"] = _sweep_peers(run)
            run.recorder.flush()
    if run.timed:
        landed["dispatch"] = record_dispatch(run.warehouse_root, run.plan.run_id, run.plan.problem, run.plan.shape_set)
    run.recorder.rows("stage_times", [stage_time_row(run.plan.run_id, run.plan.session, -1, "final",
                                                     time.monotonic() - t0, 0.0, sum(landed.values()), 0,
                                                     run.gpu.size if run.gpu else run.cpu.size)])
    run.recorder.flush()
    return {**landed, "confirm_failed": failed}
