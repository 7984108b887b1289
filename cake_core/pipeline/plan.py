"""What a run is: its parameters, for a new run or read back from the warehouse to resume one.

A :class:`RunPlan` is everything that decides a run's course: the recorded fields of
:class:`~cake_core.pipeline.request.RunRequest` (problem, shape set, seed, population, cold start, harness
version, budgets, ...), resolved, recorded on the run's row when it starts, so that ``--resume`` continues
exactly the run that was interrupted. :func:`plan_run` is the one check of a request, for the command line and
the flow alike; :func:`resume_plan` checks a resume against what was recorded. Both say in one line what is
wrong, read nothing but their arguments and write nothing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from cake_core.errors import CakeError
from cake_core.pipeline.request import (EXTEND, FIXED, RequestError, RunRequest, check_values, default_of,
                                        fields_of, name_of, recorded_fields)


class ResumeRefused(CakeError):
    """A ``--resume`` that cannot continue the run asked for; nothing was recorded or changed."""


@dataclass(frozen=True)
class RunPlan:
    """A run's parameters, resolved: the recorded fields of ``RunRequest`` (their help: ``cake evolve --help``),
    with the run's identity and job count. ``tests/core/test_request.py`` holds the two to the same fields."""

    run_id: str
    problem: str
    shape_set: str
    seed: int = default_of("seed")
    generations: int = default_of("generations")
    population: int = default_of("population")
    agent: str = default_of("agent")
    cold: bool = default_of("cold")
    harness_version: int | None = None       # None: the newest approved, resolved when the run starts
    budget_candidates: int | None = None
    budget_gpu_minutes: float | None = None
    patience: int | None = None
    check_shape_set: str | None = None       # CPU only: check on this set's rows, rank by the model
    cost_filter: bool = default_of("cost_filter")    # False: every compiled candidate is timed (--no-filter)
    filter_keep: int | None = None           # candidates the filter keeps by rank (None: half the population)
    session: int = 0                         # 0 for a new run; +1 per resume
    started_at: Any = None                   # when the run first started (kept across resumes)

    def __post_init__(self) -> None:
        check_values({n: getattr(self, n) for n in recorded_fields()})


# A recorded column that an older warehouse lacks reads as NULL: such a row asks for the field's default.
_FROM_ROW = {"seed": int, "generations": int, "population": int, "harness_version": int, "filter_keep": int,
             "budget_candidates": int, "patience": int, "budget_gpu_minutes": float, "cold": bool,
             "cost_filter": bool}


def plan_from_row(row: Mapping[str, Any]) -> RunPlan:
    """The plan recorded on a run's row (``runs_latest``)."""
    values: dict[str, Any] = {}
    for name in recorded_fields():
        v = row.get(name)
        if v is None:
            v = default_of(name)
        values[name] = v if v is None else _FROM_ROW.get(name, lambda x: x)(v)
    return RunPlan(run_id=row["run_id"], session=int(row.get("session") or 0), started_at=row.get("started_at"),
                   **values)


def resume_plan(run_id: str, rows: list[dict[str, Any]], versions: set[int], *, where: str,
                asked: dict[str, Any], timed: bool) -> RunPlan:
    """The plan of the next job of run ``run_id``, or :class:`ResumeRefused` saying why there is none.

    Parameters
    ----------
    rows: the run's row in ``runs_latest`` (zero or one).
    versions: the harness versions the warehouse holds (0, the built-in one, always exists).
    where: the warehouse, as the messages name it.
    asked: what the request gives (``None`` for not given): ``problem`` always; a field whose
        ``Param.resume`` is ``FIXED`` must equal the recorded one, an ``EXTEND`` one replaces it.
    timed: whether this machine times on a GPU: a run continues where it can be judged the same way.
    """
    if not rows:
        raise ResumeRefused(f"no run `{run_id}` in {where}; list the runs with "
                            f"`cake sql \"select run_id, problem, status from runs_latest\"`")
    row = rows[0]
    plan = plan_from_row(row)
    if asked.get("problem") is not None and asked["problem"] != plan.problem:
        raise ResumeRefused(f"run `{run_id}` evolves {plan.problem}, not {asked['problem']}; resume it with "
                            f"`cake evolve {plan.problem} --resume {run_id}`")
    for name in fields_of(FIXED):
        given = asked.get(name)
        if given is not None and name != "problem" and given != getattr(plan, name):
            raise ResumeRefused(f"run `{run_id}` was started with {name_of(name)} {getattr(plan, name)!r}, and a "
                                f"resumed run keeps it; drop {name_of(name)} {given!r} (only "
                                f"{', '.join(name_of(e) for e in fields_of(EXTEND))} may change)")
    if plan.harness_version not in versions | {0}:
        raise ResumeRefused(f"run `{run_id}` used harness version {plan.harness_version}, which {where} no longer "
                            f"holds; `cake harness versions` lists the versions there")
    was_timed = row.get("gpu_model") is not None
    if was_timed != timed:
        raise ResumeRefused(f"run `{run_id}` was {'timed on ' + str(row['gpu_model']) if was_timed else 'checked on the CPU'}"
                            f" and can only continue the same way; resume it "
                            f"{'on a machine with that GPU' if was_timed else 'with CAKE_GPU=off'}")
    newer = asked.get("harness_version")
    if newer is not None and newer < plan.harness_version:
        raise ResumeRefused(f"run `{run_id}` went on under harness version {plan.harness_version}; a resumed run "
                            f"may move to a newer version, not back to {newer}; drop --harness {newer} or start a "
                            f"new run with it")
    if newer is not None and newer not in versions | {0}:
        raise ResumeRefused(f"--harness {newer}: {where} holds no harness version {newer}; `cake harness versions` "
                            f"lists the versions there")
    changes = {k: asked[k] for k in fields_of(EXTEND) if asked.get(k) is not None}
    return replace(plan, session=plan.session + 1, **changes)


@dataclass(frozen=True)
class Facts:
    """What :func:`plan_run` needs from the world, read by its caller (``tasks/opening.py``).

    recorded: the run's row in ``runs_latest`` (zero or one): of ``resume``, or of a new run's id.
    versions: the harness versions the warehouse holds (0, the built-in one, always exists).
    where: the warehouse, as the messages name it.
    timed: whether this job times on a GPU.
    nvcc: whether nvcc is on PATH (a timed run builds cubins with it).
    api_key: whether the llm agent's key is in its environment variable.
    shape_sets: the problem's declared shape sets (the first is a new run's default).
    problem: the problem's name (the request may name it by a reference).
    """

    recorded: Sequence[Mapping[str, Any]] = ()
    versions: frozenset[int] = frozenset({0})
    where: str = "the warehouse"
    timed: bool = False
    nvcc: bool = True
    api_key: bool = True
    shape_sets: tuple[str, ...] = ()
    problem: str = ""


def plan_run(request: RunRequest, facts: Facts, started_at: Any = None) -> RunPlan:
    """The plan of the job ``request`` asks for, or the one-line reason there is none.

    The one check of a run's request: the command line calls it before any service starts, the flow when it
    opens the run, on the same request and the same facts, so both refuse the same way. Pure: it reads nothing
    but its arguments.

    Raises
    ------
    RequestError
        A value no run can take, a harness version the warehouse lacks, the llm agent without a model or a key.
    CakeError
        A timed run on a machine without nvcc.
    ResumeRefused
        A resume the recorded run cannot continue (:func:`resume_plan`), or a new run whose id is taken.
    """
    check_values({f.name: getattr(request, f.name) for f in fields(request)})
    if facts.timed and not facts.nvcc:
        raise CakeError("a GPU run builds cubins with nvcc, which is not on PATH; install the CUDA toolkit "
                           "(nvcc) or run with CAKE_GPU=off to check on the CPU")
    problem = facts.problem or request.problem
    if request.resume:
        plan = resume_plan(request.resume, list(facts.recorded), set(facts.versions), where=facts.where,
                           asked={**asked_of(request), "problem": problem}, timed=facts.timed)
    else:
        run_id = request.run_id or ""
        if facts.recorded:
            raise ResumeRefused(f"run `{run_id}` exists already; continue it with --resume {run_id}")
        shape_set = request.shape_set or (facts.shape_sets[0] if facts.shape_sets else None)
        if shape_set is None:
            raise RequestError(f"problem {problem} declares no shape set; pass {name_of('shape_set')}")
        hv = request.harness_version
        if hv is not None and hv not in facts.versions | {0}:
            raise RequestError(f"--harness {hv}: {facts.where} holds harness versions "
                                f"{', '.join(map(str, sorted(facts.versions | {0})))}; `cake harness versions` "
                                f"lists them")
        given = {k: v for k, v in asked_of(request).items() if v is not None}
        plan = RunPlan(run_id=run_id, problem=problem, started_at=started_at, **{**given, "shape_set": shape_set})
    if plan.agent == "llm":
        if not (request.llm or {}).get("model"):
            raise RequestError("the llm agent needs a model: set CAKE_LLM_MODEL (or llm_model in cake.toml)")
        if not facts.api_key:
            env = (request.llm or {}).get("api_key_env") or "OPENAI_API_KEY"
            raise RequestError(f"the llm agent needs an API key in ${env} (named by setting llm_api_key_env)")
    return plan


def asked_of(request: RunRequest) -> dict[str, Any]:
    """The recorded fields as the request gives them (None: not given), ``problem`` left out."""
    return {n: getattr(request, n) for n in recorded_fields() if n != "problem"}


@dataclass(frozen=True)
class RunShapes:
    """The shapes of a run, from its plan's shape sets: what it searches, checks and holds out."""

    shape_set: Any                  # cake_core.problems.base.ShapeSet of the plan's shape_set
    search: list[dict[str, int]]    # what selection ranks on: the cost model, and the GPU timing
    check: list[dict[str, int]]     # what the interpreter checks (CPU); the search shapes on a GPU
    held_out: list[dict[str, int]]  # measured (or checked) for the final best only, reported apart
    sweep: list[dict[str, int]] = field(default_factory=list)   # the finalists measured (checked) after the search

    @property
    def roles(self) -> dict[str, str]:
        """Shape key -> headline | tail | held_out, every shape of the run's set."""
        from cake_core.problems.base import shape_key

        return {shape_key(s): r for s, r in zip(self.shape_set.shapes, self.shape_set.roles)}


def run_shapes(prob: Any, plan: RunPlan, timed: bool) -> RunShapes:
    """Load the plan's shape sets for problem ``prob`` and split them for a run that is ``timed`` or not (a CPU
    run checks the rows small enough for the interpreter); a set that cannot serve is a ``CakeError`` saying
    what to pass instead. The command line and the flow both call it, so a set is refused the same way."""
    from cake_core.problems import load_shape_set
    from cake_core.problems.base import SEARCHED

    ss = load_shape_set(prob, plan.shape_set)
    search = [s for s, r in zip(ss.shapes, ss.roles) if r in SEARCHED]
    held = [s for s, r in zip(ss.shapes, ss.roles) if r == "held_out"]
    sweep = [s for s, r in zip(ss.shapes, ss.roles) if r == "sweep"]
    if not search:
        raise RequestError(f"shape set `{plan.shape_set}` has only held-out rows; selection needs headline or "
                           f"tail rows")
    small = lambda shapes: [s for s in shapes if max(s.values()) <= prob.cpu_limit]  # noqa: E731
    if timed:
        if plan.check_shape_set:
            raise RequestError("--check-shapes is for runs without a GPU (checked on the interpreter, ranked by "
                               "the cost model); on a GPU every candidate is checked and timed on --shapes")
        return RunShapes(ss, search, search, held, sweep)
    if plan.check_shape_set:
        cs = load_shape_set(prob, plan.check_shape_set)
        check = small([s for s, r in zip(cs.shapes, cs.roles) if r in SEARCHED])
        if not check:
            raise RequestError(f"--check-shapes {plan.check_shape_set} has no shape small enough for the CPU "
                               f"interpreter (every dimension ≤ {prob.cpu_limit})")
        return RunShapes(ss, search, check, small(held), small(sweep))
    check = small(search)
    if not check:
        first = prob.shape_sets[0]
        raise RequestError(f"shape set `{plan.shape_set}` has no shape small enough for the CPU interpreter "
                           f"(every dimension ≤ {prob.cpu_limit}); pick a smaller set such as {first}, run where "
                           f"a GPU is present, or pass --check-shapes {first} to check there and rank by the cost "
                           f"model on `{plan.shape_set}`")
    return RunShapes(ss, check, check, small(held), small(sweep))
