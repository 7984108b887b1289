"""One run request: everything that takes a run's parameters is the request's fields, and checks them one way.

``cake_core.pipeline.request.RunRequest`` is the one definition. ``cake evolve``'s options are generated from it;
the evolve flow's parameters, the sweep flow's, prefect.yaml's deployments, ``RunPlan``, the ``runs`` row and
the ``runs`` table are held to it here, so a field added in one place only fails a test that says where else.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cake_core.errors import CakeError
from cake_core.pipeline import request as req
from cake_core.pipeline.plan import Facts, RunPlan, plan_from_row, plan_run
from cake_core.pipeline.request import FIXED, JOB, RequestError, RunRequest, params, recorded_fields
from cake_core.pipeline.rows import run_row

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = ("run_id", "session", "started_at")      # a plan's fields that no request gives


def _flow_parameters(flow) -> list[inspect.Parameter]:
    return list(inspect.signature(flow.fn).parameters.values())


def _default(f: dataclasses.Field):
    return inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default


# ---------------------------------------------------------------- derived from the request, or held to it

def test_the_evolve_flow_takes_the_request_fields_in_order_with_their_defaults():
    from flows.evolve import evolve_flow

    got = [(p.name, p.default) for p in _flow_parameters(evolve_flow)]
    want = [(f.name, _default(f)) for f in dataclasses.fields(RunRequest)]
    assert got == want, "the evolve flow's parameters must be RunRequest's fields (cake_core/pipeline/request.py)"


def test_cake_evolve_has_an_option_per_request_field_with_a_flag_and_its_help():
    import typer.main

    from cake_cli.main import app

    command = typer.main.get_command(app).commands["evolve"]
    own = {"problem_path", "help"}          # the command's own: where problems are found; --help
    got = {p.name: p for p in command.params if p.name not in own}
    want = {n: p for n, p in params().items() if p.flag is not None}
    assert set(got) == set(want), "cake evolve's options are the request's fields with a flag"
    for name, p in want.items():
        opt = got[name]
        assert opt.help == p.help, name
        if p.flag == "":
            assert opt.param_type_name == "argument" and opt.required, name
        else:
            assert opt.opts == [p.flag], name
            assert opt.is_flag == (p.gives is not None), name


def test_every_field_not_on_the_command_line_is_a_setting_or_the_flows_own():
    settings = {n for n, p in params().items() if p.setting}
    assert settings == {"warehouse_root", "cache_dir", "gpu_models", "gpu_count", "llm"}
    left = {n for n, p in params().items() if p.flag is None and not p.setting}
    assert left == {"run_id", "timeout_s", "reps"}       # minted, or the flow's (cake experiment sets them)
    assert all(params()[n].resume == JOB for n in settings | left)


def test_the_sweep_flow_takes_request_fields_and_its_list_of_sets():
    from flows.sweep import sweep_flow

    fields = {f.name for f in dataclasses.fields(RunRequest)}
    names = [p.name for p in _flow_parameters(sweep_flow)]
    assert set(names) - {"shape_sets"} <= fields


PORTFOLIO_OWN = {"regions", "per_region", "portfolio_id"}      # the region plan's, not a run's


def test_the_portfolio_flow_takes_request_fields_and_its_region_plan():
    from flows.portfolio import portfolio_flow

    fields = {f.name for f in dataclasses.fields(RunRequest)}
    names = [p.name for p in _flow_parameters(portfolio_flow)]
    assert set(names) - PORTFOLIO_OWN <= fields and PORTFOLIO_OWN <= set(names)


def test_the_deployments_give_their_flows_parameters_and_values_a_run_can_take():
    from flows.evolve import evolve_flow
    from flows.portfolio import portfolio_flow
    from flows.sweep import sweep_flow

    flows = {"flows/evolve.py:evolve_flow": evolve_flow, "flows/sweep.py:sweep_flow": sweep_flow,
             "flows/portfolio.py:portfolio_flow": portfolio_flow}
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    seen = 0
    for d in doc["deployments"]:
        flow = flows.get(d["entrypoint"])
        if flow is None:
            continue
        seen += 1
        given = d.get("parameters") or {}
        assert set(given) <= {p.name for p in _flow_parameters(flow)}, d["name"]
        req.check_values({k: v for k, v in given.items() if k not in PORTFOLIO_OWN})
    assert seen >= 3


def test_a_plan_holds_the_recorded_fields_with_the_requests_defaults():
    plan_fields = [f.name for f in dataclasses.fields(RunPlan) if f.name not in IDENTITY]
    assert sorted(plan_fields) == sorted(recorded_fields()), "RunPlan's fields are RunRequest's recorded fields"
    for f in dataclasses.fields(RunPlan):
        if f.name in recorded_fields() and params()[f.name].default is not None:
            assert f.default == params()[f.name].default, f.name


def test_the_runs_table_has_a_column_for_every_recorded_field_and_a_row_round_trips():
    from warehouse.schema import load_schema

    columns = {c.name for c in load_schema().columns["runs"]}
    missing = set(recorded_fields()) - columns
    assert not missing, (f"add a migration under warehouse/schema/ adding nullable column(s) {sorted(missing)} to "
                         f"runs (older warehouses read them as NULL: plan_from_row takes the default)")
    plan = RunPlan("r", "gemm_bf16", "gemm_small", seed=4, cold=True, filter_keep=3, budget_gpu_minutes=1.5,
                   harness_version=2, session=1)
    row = run_row(plan, "running", harness_version=2, gpu_model=None, flow_run_id=None)
    assert set(row) <= columns
    assert plan_from_row(row) == plan
    old = {k: v for k, v in row.items() if k not in ("cold", "cost_filter", "filter_keep")}   # a row of before
    assert plan_from_row(old) == dataclasses.replace(plan, cold=False, filter_keep=None)


def test_resume_may_change_only_the_extend_fields():
    assert set(req.fields_of(req.EXTEND)) == {"generations", "budget_candidates", "budget_gpu_minutes", "patience",
                                              "harness_version"}
    assert set(req.fields_of(FIXED)) | set(req.fields_of(req.EXTEND)) == set(recorded_fields())


# ---------------------------------------------------------------- one check

def test_plan_run_checks_a_new_run():
    facts = Facts(shape_sets=("small", "large"), problem="gemm_bf16")
    plan = plan_run(RunRequest("gemm_bf16", run_id="r"), facts)
    assert (plan.shape_set, plan.generations, plan.population, plan.agent) == ("small", 3, 8, "tactic")
    with pytest.raises(CakeError, match="run `r` exists already"):
        plan_run(RunRequest("gemm_bf16", run_id="r"), dataclasses.replace(facts, recorded=[{"run_id": "r"}]))
    with pytest.raises(RequestError, match="--harness 4: the warehouse holds harness versions 0, 1"):
        plan_run(RunRequest("gemm_bf16", run_id="r", harness_version=4),
                 dataclasses.replace(facts, versions=frozenset({0, 1})))
    with pytest.raises(CakeError, match="nvcc, which is not on PATH"):
        plan_run(RunRequest("gemm_bf16", run_id="r"), dataclasses.replace(facts, timed=True, nvcc=False))
    with pytest.raises(RequestError, match="needs a model: set CAKE_LLM_MODEL"):
        plan_run(RunRequest("gemm_bf16", run_id="r", agent="llm"), facts)
    with pytest.raises(RequestError, match=r"needs an API key in \$MY_KEY"):
        plan_run(RunRequest("gemm_bf16", run_id="r", agent="llm", llm={"model": "m", "api_key_env": "MY_KEY"}),
                 dataclasses.replace(facts, api_key=False))


BAD = [  # (command line, flow parameters, what the message says)
    (["--no-filter", "--keep", "3"], {"cost_filter": False, "filter_keep": 3}, "give one or the other"),
    (["--generations", "0"], {"generations": 0}, "--generations must be at least 1, got 0"),
    (["--budget-gpu-minutes", "0"], {"budget_gpu_minutes": 0.0}, "--budget-gpu-minutes must be above 0"),
    (["--agent", "genius"], {"agent": "genius"}, "--agent 'genius' is not known; use tactic or llm"),
]


@pytest.mark.parametrize("argv, parameters, message", BAD)
def test_a_bad_request_gets_the_same_message_from_the_command_line_and_the_flow(argv, parameters, message,
                                                                                 tmp_path, monkeypatch):
    from cake_cli.main import app
    from flows.evolve import evolve_flow

    for name in [n for n in os.environ if n.upper().startswith("CAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CAKE_GPU", "off")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["evolve", "gemm_bf16", *argv])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    with pytest.raises(RequestError) as flow_error:
        evolve_flow.fn(problem="gemm_bf16", warehouse_root=str(tmp_path / "w"), **parameters)
    assert message in str(flow_error.value)
    assert lines[0] == f"error: {flow_error.value}"
    assert not (tmp_path / "w").exists() and not (tmp_path / "home" / "warehouse").exists()


# ---------------------------------------------------------------- one run id

def test_the_run_id_is_minted_in_one_place(monkeypatch):
    monkeypatch.setattr(req, "new_run_id", lambda problem: f"{problem}-minted")
    assert req.with_run_id(RunRequest("gemm_bf16"), "gemm_bf16").run_id == "gemm_bf16-minted"
    assert req.with_run_id(RunRequest("/some/where/my_problem"), "my_problem").run_id == "my_problem-minted"
    assert req.with_run_id(RunRequest("gemm_bf16", run_id="mine"), "gemm_bf16").run_id == "mine"
    assert req.with_run_id(RunRequest("gemm_bf16", resume="old", run_id="x"), "gemm_bf16").run_id == "old"
    # nothing else mints one: no random token or stamp is made where runs are started
    for folder in ("cake_cli", "flows", "tasks"):
        for path in (ROOT / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr in ("token_hex", "uuid4") and path.name not in ("harness.py",):
                        pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} makes an id; a run's is "
                                    f"cake_core.pipeline.request.new_run_id's")


def test_cake_evolve_hands_the_flow_the_run_id_it_minted(tmp_path, monkeypatch):
    """The command mints the id (it prints it before the flow starts); the flow keeps it."""
    import sys
    import types

    import cake_cli.main as main

    for name in [n for n in os.environ if n.upper().startswith("CAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CAKE_GPU", "off")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(req, "new_run_id", lambda problem: f"{problem}-minted")
    seen = {}
    monkeypatch.setattr(main, "run_evolution", lambda settings, problem, run_id, kwargs, *a: seen.update(
        run_id=run_id, kwargs=kwargs))
    monkeypatch.setitem(sys.modules, "flows.evolve", types.ModuleType("flows.evolve"))
    result = CliRunner().invoke(main.app, ["evolve", "gemm_bf16", "--generations", "2"])
    assert result.exit_code == 0, result.output
    assert seen["run_id"] == seen["kwargs"]["run_id"] == "gemm_bf16-minted"
    assert seen["kwargs"]["generations"] == 2 and seen["kwargs"]["shape_set"] == "gemm_small"
    assert {n for n, p in params().items() if p.setting and n != "gpu_count"} <= set(seen["kwargs"])
