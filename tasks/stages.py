"""Prefect tasks: one thin batch wrapper per stage of ``cake_core.pipeline.STAGES``.

Each task takes the run and the attempts still going on, runs its stage over all of them (per-candidate
stages on the CPU workers, every core busy; check and time on the runners), hands the attempts that stopped
to the run's recorder at once and returns the ones that go on. ``select`` waits until the generation's rows
have landed, marks the generation done and rebuilds the run's state from the warehouse.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from cake_core.agents.base import Candidate
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.pipeline.attempt import Attempt, attempt_id_for
from cake_core.pipeline.execute import GpuJob
from cake_core.pipeline.generate import generate_stage
from cake_core.pipeline.policy import (CPU_TIMEOUT_S, batch_size, cost_order, filter_counts, filter_seed,
                                       loser_cutoffs, strict_jobs)
from cake_core.pipeline.rows import CHILD_TABLES, now, refusal_rows, stage_time_row
from cake_core.pipeline.stages import cost_filter_stage, stages_for
from cake_core.pipeline.state import select_stage
from cake_core.pipeline.verdicts import ShapeVerdict, as_strict, fault, judge
from cake_core.problems.base import Shape, shape_key
from tasks.workers import Fault, LostWork, Unit
from warehouse.queries import recorded, recorded_candidates, search_best_ms, state_rows

if TYPE_CHECKING:
    from tasks.run import Run

_TASK = dict(cache_policy=NO_CACHE)
COMPACT_EVERY = 10        # generations between compactions of the warehouse's batch files


def _timed(run: "Run", stage: str, n_in: int, body: Callable[[], list[Attempt]], workers: int,
           work: Callable[[list[Attempt]], float] | None = None) -> list[Attempt]:
    t0 = time.monotonic()
    out = body()
    wall = time.monotonic() - t0
    run.stage_rows.append(stage_time_row(run.plan.run_id, run.plan.session, run.state.generation, stage, wall,
                                         work(out) if work else wall, n_in, len(out), workers))
    return out


def _stop(run: "Run", stage: str, attempts: list[Attempt]) -> list[Attempt]:
    """Record the attempts a stage stopped (debug: re-verify and dump the rest first); return those going on."""
    if run.debug is not None:
        run.debug.after(stage, attempts)
    stopped = [a for a in attempts if not a.going_on]
    run.recorder.attempts(stopped)
    run.finished += stopped
    return [a for a in attempts if a.going_on]


_FAULT_RULES = {"died": ("worker.died", "the worker was replaced; the rest of the batch went on"),
                "timeout": ("worker.timeout", "the worker was killed and replaced; the rest of the batch went on"),
                "raised": ("stage.raised", "a stage raised instead of returning its result: a bug in the stage")}


def _worker_fault(stage: str, f: Fault) -> StageResult:
    rule, hint = _FAULT_RULES[f.cause]
    return StageResult(stage, f.outcome, [Diagnostic(rule, Severity.ERROR, f.message, hint=hint)])


def on_cpu(run: "Run", stage: str, attempts: list[Attempt], args: Callable[[Attempt], tuple],
           timeout_s: float) -> None:
    """Run one per-candidate stage over ``attempts`` on the CPU workers and record each result on its attempt."""
    if not attempts:
        return
    results = run.cpu.map("stage", [(stage, *args(a)) for a in attempts], timeout_s)
    for a, r, held in zip(attempts, results, run.cpu.elapsed):
        if isinstance(r, Fault):
            a.record(_worker_fault(stage, r), held)
        else:
            a.record(*r)


# ---------------------------------------------------------------- the stages

def _as_recorded(a: Attempt, landed: dict[str, dict[str, Any]]) -> Attempt:
    """``a`` with the candidate its slot recorded before the crash, where it recorded one: the agent need not
    write the same text twice (its context may differ on another GPU, with other runs' results), and whatever
    the redone slot lands (a measurement the crash cut off) must belong to the recorded kernel."""
    row = landed.get(a.attempt_id)
    if row is None:
        return a
    a.candidate = Candidate(row["ir_text"], tuple(row["parents"] or ()), row["agent"], row["tactic"],
                            int(row["prompt_tokens"] or 0), int(row["completion_tokens"] or 0),
                            tuple(row["lineage"] or ()))
    return a


@task(name="generate", **_TASK)
def generate(run: "Run", _: list[Attempt]) -> list[Attempt]:
    """Ask the agent for this generation's candidates."""
    search = run.search_shapes
    bounds = {d: max(s[d] for s in search) for d in search[0]} if search else {}
    known = [] if run.plan.cold else run.problem.best_texts()
    ctx = run.state.context(run.plan, run.harness.version, bounds, known)
    # only the first generation a resumed job runs can have been cut short by a crash: what it landed then
    # is not recorded again
    skip: dict[str, set[str]] = {}
    landed: dict[str, dict[str, Any]] = {}
    if run.plan.session > 0 and run.generations_run == 0:
        ids = [attempt_id_for(run.plan.run_id, ctx.generation, i) for i in range(ctx.population)]
        skip = recorded(run.warehouse_root, ids, (*CHILD_TABLES, "attempts"))
        landed = recorded_candidates(run.warehouse_root, ids)
    run.recorder.skip = skip
    run.finished = []
    def body() -> list[Attempt]:
        out = [_as_recorded(a, landed) for a in
               generate_stage(run.agent, run.plan.run_id, run.plan.problem, run.harness.version, ctx)]
        refused = getattr(run.agent, "refusals", [])
        if refused and not skip:
            run.recorder.rows("tactic_refusals", refusal_rows(run.plan.run_id, ctx.generation, refused))
        return out
    return _timed(run, "generate", 0, body, 1)


@task(name="verify", **_TASK)
def verify(run: "Run", attempts: list[Attempt]) -> list[Attempt]:
    """Parse and verify every candidate (shape rules see the shapes it will run on)."""
    def body() -> list[Attempt]:
        on_cpu(run, "verify", attempts, lambda a: (a.candidate.text, run.harness, run.problem, run.run_shapes),
               CPU_TIMEOUT_S["verify"])
        return _stop(run, "verify", attempts)
    return _timed(run, "verify", len(attempts), body, run.cpu.size, _seconds("verify", attempts))


@task(name="lower", **_TASK)
def lower(run: "Run", attempts: list[Attempt]) -> list[Attempt]:
    """Lower every verified program to CUDA C++."""
    def body() -> list[Attempt]:
        on_cpu(run, "lower", attempts, lambda a: (a.program,), CPU_TIMEOUT_S["lower"])
        return _stop(run, "lower", attempts)
    return _timed(run, "lower", len(attempts), body, run.cpu.size, _seconds("lower", attempts))


@task(name="compile", **_TASK)
def compile(run: "Run", attempts: list[Attempt]) -> list[Attempt]:  # noqa: A001 - the stage's name
    """Compile with nvcc on every CPU core (cached by source hash)."""
    def body() -> list[Attempt]:
        on_cpu(run, "compile", attempts, lambda a: (a.lowered, run.cache_dir), CPU_TIMEOUT_S["compile"])
        return _stop(run, "compile", attempts)
    return _timed(run, "compile", len(attempts), body, run.cpu.size, _seconds("compile", attempts))


@task(name="cost-filter", **_TASK)
def cost_filter(run: "Run", attempts: list[Attempt]) -> list[Attempt]:
    """Rank by the cost model; the top k, a random few and a sampled few go on, in rank order (a run with
    ``--no-filter`` ranks and records the predictions but lets every candidate go on)."""
    def body() -> list[Attempt]:
        if not attempts:
            return []
        results = cost_filter_stage([a.program for a in attempts], run.search_shapes, run.model,
                                    *filter_counts(run.plan, len(attempts)),
                                    seed=filter_seed(run.plan, run.state.generation), problem=run.plan.problem)
        for a, r in zip(attempts, results):
            a.record(r)
        going = _stop(run, "cost_filter", attempts)
        return sorted(going, key=lambda a: a.result("cost_filter").metrics["rank"])
    return _timed(run, "cost_filter", len(attempts), body, 1)


@task(name="check", **_TASK)
def check(run: "Run", attempts: list[Attempt]) -> list[Attempt]:
    """Correctness on the CPU interpreter (the run's shapes, then the strict shapes of the candidates right on
    all of them), one candidate per core; nothing is timed."""
    seed = run.input_seed()

    def body() -> list[Attempt]:
        on_cpu(run, "check", attempts, lambda a: (a.program, run.problem,
                                                  [s for s in run.check_shapes if a.runs_on(shape_key(s))], seed),
               run.timeout_s)
        _stop(run, "check", attempts)
        return list(attempts)
    return _timed(run, "check", len(attempts), body, run.cpu.size, _seconds("check", attempts))


@task(name="time", **_TASK)
def time_(run: "Run", attempts: list[Attempt]) -> list[Attempt]:
    """The correctness gate and timing on the GPU runners, the shapes of each candidate spread over them; then
    the strict gate of the candidates right on every shape (:func:`gate_and_time`)."""
    seed = run.input_seed()

    def body() -> list[Attempt]:
        verdicts = gate_and_time(run, attempts, seed, search_cutoffs(run) if attempts else None)
        for i, a in enumerate(attempts):
            a.record(judge("time", verdicts[i]))
        _stop(run, "time", attempts)
        return list(attempts)
    return _timed(run, "time", len(attempts), body, run.gpu.size if run.gpu else 0,
                  lambda done: sum(a.gpu_seconds for a in done))


@task(name="select", **_TASK)
def select(run: "Run", _: list[Attempt]) -> list[Attempt]:
    """Wait for the generation's rows, mark it done, and rebuild the run's state from the warehouse."""
    t0 = time.monotonic()
    run.recorder.flush()
    g = run.state.generation
    rows = run.stage_rows + [stage_time_row(run.plan.run_id, run.plan.session, g, "select",
                                            time.monotonic() - t0, 0.0, len(run.finished), 0, 1)]
    run.recorder.rows("stage_times", rows)      # the select row marks the generation done: it lands last
    run.recorder.flush()
    run.stage_rows = []
    run.generations_run += 1
    run.state = select_stage(run.plan, **state_rows(run.warehouse_root, run.plan.run_id))
    if run.generations_run % COMPACT_EVERY == 0:
        run.compact()
    return []


STAGE_TASKS = {"generate": generate, "verify": verify, "lower": lower, "compile": compile,
               "cost_filter": cost_filter, "check": check, "time": time_, "select": select}


def stage_tasks(run: "Run") -> list[Any]:
    """The stage tasks of ``run``, in ``cake_core.pipeline.STAGES`` order (with or without the GPU's)."""
    return [STAGE_TASKS[s.name] for s in stages_for(run.timed)]


# ---------------------------------------------------------------- runners

def _seconds(stage: str, attempts: list[Attempt]) -> Callable[[list[Attempt]], float]:
    """Worker seconds a stage spent on ``attempts`` (summed: above the wall time when workers ran at once)."""
    return lambda _: sum(a.seconds.get(stage, 0.0) for a in attempts)


def search_cutoffs(run: "Run") -> dict[str, float]:
    """The cutoffs of this generation's time stage, from the run's search measurements in the warehouse."""
    return loser_cutoffs(search_best_ms(run.warehouse_root, run.plan.run_id))


def gate_and_time(run: "Run", attempts: list[Attempt], seed: int,
                  cutoffs: dict[str, float] | None = None) -> dict[int, list[ShapeVerdict]]:
    """The time stage's verdicts of each attempt: gate and timing on the search shapes (timing cut short above
    ``cutoffs``, per shape key: ``policy.loser_cutoffs``), then the strict gate (``policy.strict_jobs``: for a
    candidate right on all of them, the gate alone, untimed, on its strict shapes), verdicts of kind
    ``strict``. Cheap first: a candidate wrong on a search shape pays no strict shape."""
    verdicts = on_gpu(run, attempts, run.search_shapes, seed, drop_failed=True, cutoffs=cutoffs)
    strict, why, pairs = strict_jobs([a.program for a in attempts], verdicts, run.problem, run.search_shapes)
    if pairs:
        extra = on_gpu(run, attempts, strict, seed, drop_failed=True, pairs=pairs, timed=False, kind="strict")
        for i, vs in extra.items():
            verdicts[i] += [as_strict(v, why[v.shape]) for v in vs]
    return verdicts


def on_gpu(run: "Run", attempts: list[Attempt], shapes: list[Shape], seed: int, *, drop_failed: bool,
           pairs: set[tuple[int, int]] | None = None, timed: bool = True,
           kind: str = "search", cutoffs: dict[str, float] | None = None) -> dict[int, list[ShapeVerdict]]:
    """Every (attempt, shape) job (or only ``pairs`` of indices) on the GPU runners, timed unless ``timed`` is
    False; returns each attempt's verdicts in ``shapes``' order. With ``drop_failed``, the remaining shapes of
    a candidate that came out wrong or faulted are not run; a shape outside a candidate's domain never is. A
    job run again after its runner was lost lands a ``reruns`` row (``kind``: what the jobs measure, search |
    strict | confirm | held_out | baseline) through the run's recorder. ``cutoffs`` (shape key -> ms, the
    search's timing only: ``policy.LOSER_FACTOR``): a job timed above its shape's cutoff stops early; the jobs
    go cheapest shape first (``policy.cost_order``) in batches of ``policy.batch_size``.
    """
    if cutoffs and (kind != "search" or not timed):
        raise ValueError(f"a timing cutoff is for the search's timed jobs only (these: {kind}"
                         f"{'' if timed else ', untimed'}); confirm, held-out and baseline jobs time every rep")
    failed: set[int] = set()
    units = []
    for j in cost_order(run.problem, shapes):
        for i, a in enumerate(attempts):
            if pairs is not None and (i, j) not in pairs or not a.runs_on(shape_key(shapes[j])):
                continue        # not asked for, or outside the kernel's domain (refused before any launch)
            job = GpuJob((i, j), a.lowered, a.binary.cubin, a.binary.compiled.kernel_name, run.problem,
                         shapes[j], seed, run.reps, timed, (cutoffs or {}).get(shape_key(shapes[j])))
            units.append(Unit((i, j), job, run.timeout_s, group=j))
    n_batch = batch_size(len(units), run.gpu.size)

    def note(key, answer) -> None:
        if isinstance(answer, Fault) or not answer.correct:
            failed.add(key[0])

    answers = run.gpu.run_units("run_batch", units, batch=n_batch, on_answer=note,
                                skip=(lambda key: key[0] in failed) if drop_failed else (lambda key: False))
    if run.gpu.lost:
        run.recorder.rows("reruns", rerun_rows(run, attempts, shapes, run.gpu.lost, kind))
    out: dict[int, list[ShapeVerdict]] = {i: [] for i in range(len(attempts))}
    for (i, j), ans in sorted(answers.items(), key=lambda kv: kv[0][1]):
        if isinstance(ans, Fault):
            ans = fault(shape_key(shapes[j]), "gpu", ans.outcome, ans.message,
                        run.timeout_s if ans.outcome is Outcome.TIMEOUT else 0.0)
        out[i].append(ans)
    return out


def rerun_rows(run: "Run", attempts: list[Attempt], shapes: list[Shape], lost: list[LostWork],
               kind: str) -> list[dict]:
    """The ``reruns`` rows of the jobs keyed (attempt index, shape index) that went back to the queue."""
    generation = run.state.generation if kind == "search" else -1
    return [{"run_id": run.plan.run_id, "session": run.plan.session, "generation": generation, "kind": kind,
             "attempt_id": attempts[w.key[0]].attempt_id, "shape": shape_key(shapes[w.key[1]]), "cause": w.cause,
             "node_id": w.node_id, "pid": w.pid, "message": w.message[:500], "recorded_at": now()} for w in lost]


def build(run: "Run", attempts: list[Attempt], shapes: list[Shape]) -> list[Attempt]:
    """verify, lower and compile ``attempts`` on the CPU workers without recording them (the final stage's
    kernels: the best of earlier jobs of a resumed run, the hand-written baselines); returns those built."""
    on_cpu(run, "verify", attempts, lambda a: (a.candidate.text, run.harness, run.problem, shapes),
           CPU_TIMEOUT_S["verify"])
    going = [a for a in attempts if a.going_on]
    on_cpu(run, "lower", going, lambda a: (a.program,), CPU_TIMEOUT_S["lower"])
    going = [a for a in going if a.going_on]
    on_cpu(run, "compile", going, lambda a: (a.lowered, run.cache_dir), CPU_TIMEOUT_S["compile"])
    return [a for a in going if a.going_on]
