"""A run's request checked against the world, the same way for the command line and the flow.

:func:`check_request` marks the runs whose process died as crashed, gathers what
``cake_core.pipeline.plan.plan_run`` needs (the warehouse's record of the run and its harness versions, nvcc,
the llm agent's key, the problem's shape sets), calls it, loads the plan's shape sets (``plan.run_shapes``) and
makes sure no process is running the run now. It writes nothing but the crashed runs' status and imports no
Prefect: ``cake evolve`` calls it before any service starts, and the flow's ``open-run`` calls it again on the
same request (a deployment's run has no command line before it), then takes the run's lock.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cake_core.problems as problems
from cake_core.pipeline.plan import Facts, RunPlan, RunShapes, plan_run, run_shapes
from cake_core.pipeline.request import RunRequest, check_values, with_run_id
from cake_core.pipeline.rows import now
from cake_core.pipeline.stages import nvcc_available
from tasks.run_control import RunLock, mark_crashed
from warehouse.queries import harness_versions, run_rows


@dataclass(frozen=True)
class Checked:
    """A request that can run: its plan, its shapes, its problem and the runs found crashed on the way."""

    request: RunRequest             # with its run id (minted here for a new run that has none) and shape set
    plan: RunPlan
    shapes: RunShapes
    problem: Any                    # cake_core.problems.base.Problem
    crashed: list[str]


def request_from(parameters: dict[str, Any]) -> RunRequest:
    """The request the evolve flow's parameters make (they are its fields: ``tests/core/test_request.py``), its
    values checked before anything starts (``request.check_values``: the message ``cake evolve`` gives)."""
    request = RunRequest(**parameters)
    check_values(parameters)
    return request


def check_request(request: RunRequest, *, timed: bool) -> Checked:
    """Check ``request`` for a job that times on a GPU (``timed``) or not; raises what ``plan_run`` and
    ``run_shapes`` raise, and ``ResumeRefused`` when another process runs the run now."""
    root = Path(request.warehouse_root)
    exists = (root / "SCHEMA_VERSION").exists()
    crashed = mark_crashed(root) if exists else []
    prob = problems.get_problem(request.problem)     # looked up when called: tests stand in for the corpus
    request = with_run_id(request, prob.name)
    llm = request.llm or {}
    facts = Facts(recorded=run_rows(root, request.run_id) if exists else [],
                  versions=frozenset(harness_versions(root) if exists else {0}), where=f"the warehouse {root}",
                  timed=timed, nvcc=not timed or nvcc_available(),
                  api_key=bool(os.environ.get(llm.get("api_key_env") or "OPENAI_API_KEY")),
                  shape_sets=tuple(prob.shape_sets), problem=prob.name)
    plan = plan_run(request, facts, started_at=now())
    shapes = run_shapes(prob, plan, timed)
    if request.resume and exists:
        RunLock(root, plan.run_id).release()
    if not request.resume:          # the set a new run resolved: the flow run's parameters name it
        request = replace(request, shape_set=plan.shape_set)
    return Checked(request, plan, shapes, prob, crashed)
