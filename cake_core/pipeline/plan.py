"""What a run is: its parameters, for a new run or read back from the warehouse to resume one.

A :class:`RunPlan` is everything that decides a run's course (problem, shape set, seed, population, cold
start, harness version, budgets), recorded on the run's row when it starts, so that ``--resume`` continues
exactly the run that was interrupted. :func:`resume_plan` checks a resume request against what was recorded
and says, in one line, what is wrong with it; it reads nothing but the rows it is given and writes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cake_core.errors import CakeError

DEFAULT_GENERATIONS = 3
DEFAULT_POPULATION = 8


class ResumeRefused(CakeError):
    """A ``--resume`` that cannot continue the run asked for; nothing was recorded or changed."""


@dataclass(frozen=True)
class RunPlan:
    """A run's parameters (see ``cake evolve --help`` for each)."""

    run_id: str
    problem: str
    shape_set: str
    seed: int = 0
    generations: int = DEFAULT_GENERATIONS
    population: int = DEFAULT_POPULATION
    agent: str = "tactic"
    cold: bool = False
    harness_version: int | None = None       # None: the newest approved, resolved when the run starts
    budget_candidates: int | None = None
    budget_gpu_minutes: float | None = None
    patience: int | None = None
    check_shape_set: str | None = None       # CPU only: check on this set's rows, rank by the model
    cost_filter: bool = True                 # False: every compiled candidate is timed (--no-filter)
    filter_keep: int | None = None           # candidates the filter keeps by rank (None: half the population)
    session: int = 0                         # 0 for a new run; +1 per resume
    started_at: Any = None                   # when the run first started (kept across resumes)

    def __post_init__(self) -> None:
        for name, low in (("generations", 1), ("population", 1), ("budget_candidates", 1), ("patience", 1),
                          ("filter_keep", 1)):
            v = getattr(self, name)
            if v is not None and v < low:
                raise CakeError(f"{name.replace('_', '-')} must be at least {low}, got {v}")
        if self.budget_gpu_minutes is not None and not self.budget_gpu_minutes > 0:
            raise CakeError(f"budget-gpu-minutes must be above 0, got {self.budget_gpu_minutes}")
        if self.filter_keep is not None and not self.cost_filter:
            raise CakeError("--keep sets how many candidates the cost filter keeps; a run with --no-filter keeps "
                            "them all: give one or the other")


# what a resume may change: how far the run goes, and the harness it goes on under (a newer version only:
# a run whose harness evolves between blocks of generations). Everything else decides its course and must stay.
EXTENDABLE = ("generations", "budget_candidates", "budget_gpu_minutes", "patience", "harness_version")
FIXED = ("problem", "shape_set", "seed", "population", "agent", "cold", "check_shape_set",
         "cost_filter", "filter_keep")


def plan_from_row(row: dict[str, Any]) -> RunPlan:
    """The plan recorded on a run's row (``runs_latest``)."""
    return RunPlan(run_id=row["run_id"], problem=row["problem"], shape_set=row["shape_set"], seed=int(row["seed"]),
                   generations=int(row["generations"]), population=int(row["population"]), agent=row["agent"],
                   cold=bool(row.get("cold") or False), harness_version=int(row["harness_version"]),
                   budget_candidates=row.get("budget_candidates"), budget_gpu_minutes=row.get("budget_gpu_minutes"),
                   patience=row.get("patience"), check_shape_set=row.get("check_shape_set"),
                   cost_filter=row.get("cost_filter") is not False,
                   filter_keep=None if row.get("filter_keep") is None else int(row["filter_keep"]),
                   session=int(row.get("session") or 0), started_at=row.get("started_at"))


def resume_plan(run_id: str, rows: list[dict[str, Any]], versions: set[int], *, where: str,
                asked: dict[str, Any], timed: bool) -> RunPlan:
    """The plan of the next job of run ``run_id``, or :class:`ResumeRefused` saying why there is none.

    Parameters
    ----------
    rows: the run's row in ``runs_latest`` (zero or one).
    versions: the harness versions the warehouse holds (0, the built-in one, always exists).
    where: the warehouse, as the messages name it.
    asked: what the command line gave (``None`` for not given): ``problem`` always; a parameter in
        ``FIXED`` must equal the recorded one, one in ``EXTENDABLE`` replaces it.
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
    for name in FIXED:
        given = asked.get(name)
        if given is not None and name != "problem" and given != getattr(plan, name):
            raise ResumeRefused(f"run `{run_id}` was started with {name.replace('_', '-')} "
                                f"{getattr(plan, name)!r}, and a resumed run keeps it; drop "
                                f"--{name.replace('_', '-')} {given!r} (only {', '.join('--' + e.replace('_', '-') for e in EXTENDABLE)} "
                                f"may change)")
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
    changes = {k: asked[k] for k in EXTENDABLE if asked.get(k) is not None}
    return replace(plan, session=plan.session + 1, **changes)
