"""A run's request: every parameter one job of a run takes, defined once.

Each field of :class:`RunRequest` carries, in its :class:`Param`, what the command line, the flow, the plan and
the warehouse need to know about it: its help text, its value on a new run when it is not given, whether a
resume may change it (``FIXED``: it decides the run's course and is recorded; ``EXTEND``: how far the run goes,
recorded, and a resume may change it; ``JOB``: this job's alone, never recorded), its option on ``cake evolve``
(or the setting the command fills it from) and the values it may take. From these:

- ``cake evolve``'s options are generated (``cake_cli/evolve_options.py``); the evolve flow's parameters, the
  sweep flow's and the deployments of ``prefect.yaml`` are checked against the fields by
  ``tests/core/test_request.py``;
- :class:`~cake_core.pipeline.plan.RunPlan` holds the recorded fields (``FIXED`` and ``EXTEND``), resolved;
  ``run_row`` and ``plan_from_row`` read them from :func:`recorded_fields`, and the ``runs`` table has a column
  for each (the same test says which migration is missing);
- :func:`check_values` refuses values no run can take; ``plan.plan_run``, the one validation of a request, calls
  it;
- :func:`new_run_id` mints a run's id: nothing else does.

A field given as None was not given: a new run takes its ``Param.default``, a resumed run its recorded value.
"""
from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from cake_core.errors import CakeError

FIXED, EXTEND, JOB = "fixed", "extend", "job"


class RequestError(CakeError):
    """A request that cannot run as asked, whatever the warehouse holds: a value out of range, two parameters
    that exclude each other (on the command line: bad usage, exit code 2)."""


@dataclass(frozen=True)
class Param:
    """What one parameter of a run is, for everything that derives from :class:`RunRequest`."""

    help: str
    resume: str                          # FIXED | EXTEND | JOB
    default: Any = None                  # a new run's value when the request leaves it None
    flag: str | None = None              # cake evolve's option; "" for its argument; None: not on the command line
    metavar: str | None = None
    setting: str | None = None           # the cake setting the command fills it from (cake_cli.config.Settings)
    gives: Any = None                    # a flag without a value: what giving it asks for (--cold: True)
    low: float | None = None             # the least value allowed
    above: float | None = None           # values must be above this
    choices: tuple[str, ...] = ()
    path: str | None = None              # "file", or "shapes" (a set's name or a file): a file the flow may read
                                         # elsewhere, whose absolute path the command hands on


def param(value: Any = None, *, required: bool = False, **meta: Any) -> Any:
    """A :class:`RunRequest` field: ``value`` is the flow's default (None: not given; ``required``: none),
    ``meta`` its :class:`Param`."""
    if required:
        return field(metadata={"param": Param(**meta)})
    return field(default=value, metadata={"param": Param(**meta)})


@dataclass(frozen=True)
class RunRequest:
    """What one job of a run is asked to do: every parameter of ``cake evolve`` and of the evolve flow."""

    problem: str = param(required=True, flag="", metavar="PROBLEM", resume=FIXED,
                         help="Problem to evolve a kernel for (see `cake problems`).")
    shape_set: str | None = param(
        flag="--shapes", metavar="SET", resume=FIXED, path="shapes",
        help="Shape set to tune on: a set of the problem (its shapes/ folder) or a path to a CSV file (default: "
             "the problem's first set). Its held-out rows are measured for the final best only, never selected "
             "on.")
    generations: int | None = param(flag="--generations", resume=EXTEND, default=3, low=1,
                                    help="Generations to run in all (default 3; a resumed run may raise it).")
    population: int | None = param(flag="--population", resume=FIXED, default=8, low=1,
                                   help="Candidates per generation (default 8).")
    seed: int | None = param(flag="--seed", resume=FIXED, default=0,
                             help="Seed (default 0): the tactic agent is deterministic under it.")
    agent: str | None = param(flag="--agent", resume=FIXED, default="tactic", choices=("tactic", "llm"),
                              help="tactic (offline, the default) or llm.")
    cold: bool | None = param(flag="--cold", gives=True, resume=FIXED, default=False,
                              help="Start from the problem's naive seed alone: its hand-written kernels are never "
                                   "offered, only measured beside the result.")
    harness_version: int | None = param(flag="--harness", metavar="N", resume=EXTEND, low=0,
                                        help="Harness version to run under (default: the newest approved; a resumed "
                                             "run may move to a newer one).")
    budget_candidates: int | None = param(flag="--budget-candidates", resume=EXTEND, low=1,
                                          help="Stop after this many attempts in all.")
    budget_gpu_minutes: float | None = param(flag="--budget-gpu-minutes", resume=EXTEND, above=0,
                                             help="Stop once the attempts held the GPUs this long.")
    patience: int | None = param(flag="--patience", resume=EXTEND, low=1,
                                 help="Stop when the best has not improved for this many generations.")
    check_shape_set: str | None = param(
        flag="--check-shapes", metavar="SET", resume=FIXED, path="shapes",
        help="Without a GPU: check on SET's rows (small enough for the interpreter) and rank by the cost model "
             "on --shapes.")
    cost_filter: bool | None = param(flag="--no-filter", gives=False, resume=FIXED, default=True,
                                     help="Time every candidate that compiled (the cost model still predicts, and "
                                          "is graded on all of them).")
    filter_keep: int | None = param(
        flag="--keep", metavar="N", resume=FIXED, low=1,
        help="Candidates per generation the cost filter passes by predicted rank (default: half the population); "
             "one more predicted best on some one shape and one sampled at random from those it drops are timed "
             "too.")
    run_id: str | None = param(resume=JOB, help="The new run's id (default: one minted by new_run_id).")
    resume: str | None = param(flag="--resume", metavar="RUN_ID", resume=JOB,
                               help="Continue run RUN_ID from the warehouse (after a kill, or a job split in "
                                    "several).")
    debug: bool = param(False, flag="--debug", gives=True, resume=JOB,
                        help="Re-verify after every stage and dump numbered IR under <home>/debug.")
    cost_model: str | None = param(flag="--cost-model", metavar="FILE", resume=JOB, path="file",
                                   help="Rank with this model file (cake model fit); a file that does not load, or "
                                        "a learned model that did not beat the analytic one on held-out runs, falls "
                                        "back to the analytic model.")
    warehouse_root: str = param(".cake/warehouse", setting="warehouse_root", resume=JOB,
                                help="The warehouse the run's rows land in.")
    cache_dir: str = param(".cake/cache", setting="cache_dir", resume=JOB,
                           help="The compile cache (cubins by source hash); references live beside it.")
    gpu_models: list[str] | None = param(setting="gpu_model", resume=JOB,
                                         help="The GPU model asked for, first (none: checked on the CPU, not "
                                              "timed).")
    gpu_count: int | None = param(setting="gpu_count", resume=JOB, low=1,
                                  help="At most this many GPU runners (default: one per GPU of the model).")
    timeout_s: float = param(120.0, resume=JOB, above=0, help="The watchdog of one job on a worker, in seconds.")
    reps: int = param(20, resume=JOB, low=1, help="Timed launches per (candidate, shape).")
    llm: dict[str, Any] | None = param(setting="llm_model", resume=JOB,
                                       help="The llm agent's endpoint: base_url, model, api_key_env.")


def params() -> dict[str, Param]:
    """Every field of :class:`RunRequest` and its :class:`Param`, in order."""
    return {f.name: f.metadata["param"] for f in fields(RunRequest)}


def recorded_fields() -> tuple[str, ...]:
    """The fields a run records on its ``runs`` row and a resume reads back (``FIXED`` and ``EXTEND``)."""
    return tuple(n for n, p in params().items() if p.resume in (FIXED, EXTEND))


def fields_of(resume: str) -> tuple[str, ...]:
    """The fields whose ``Param.resume`` is ``resume``."""
    return tuple(n for n, p in params().items() if p.resume == resume)


def default_of(name: str) -> Any:
    """A new run's value of field ``name`` when the request does not give it."""
    return params()[name].default


def name_of(name: str) -> str:
    """How a message names field ``name``: its option and, where they differ, the flow's parameter."""
    flag = params()[name].flag
    if not flag:
        return name
    return flag if flag.lstrip("-").replace("-", "_") == name else f"{flag} ({name})"


def new_run_id(problem: str) -> str:
    """A new run's id: ``problem-YYYYmmdd-HHMMSS-xxxx``, readable and sortable by when it started."""
    return f"{problem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def check_values(values: Mapping[str, Any]) -> None:
    """Refuse values no run can take (:class:`RequestError`, one line naming the parameter): out of range, not
    one of its choices, or ``filter_keep`` beside a switched-off filter. None is never refused here."""
    every = params()
    for name, v in values.items():
        p = every.get(name)
        if p is None or v is None:
            continue
        if p.low is not None and v < p.low:
            raise RequestError(f"{name_of(name)} must be at least {p.low:g}, got {v}")
        if p.above is not None and not v > p.above:
            raise RequestError(f"{name_of(name)} must be above {p.above:g}, got {v}")
        if p.choices and v not in p.choices:
            raise RequestError(f"{name_of(name)} {v!r} is not known; use {' or '.join(p.choices)}")
    if values.get("filter_keep") is not None and values.get("cost_filter") is False:
        raise RequestError(f"{name_of('filter_keep')} sets how many candidates the cost filter passes; "
                           f"{name_of('cost_filter')} passes them all: give one or the other")


def with_run_id(request: RunRequest, problem: str) -> RunRequest:
    """``request`` with the id of the run it opens: the resumed run's, the one given, or a new one named for
    ``problem`` (the problem's name: the request may name it by a path or a module)."""
    if request.resume:
        return replace(request, run_id=request.resume)
    if request.run_id:
        return request
    return replace(request, run_id=new_run_id(problem))


def flow_parameters(request: RunRequest) -> dict[str, Any]:
    """The evolve flow's parameters for ``request``: every field that differs from the flow's default."""
    return {f.name: getattr(request, f.name) for f in fields(request)
            if getattr(request, f.name) != (f.default if f.default is not dataclasses.MISSING else None)}
