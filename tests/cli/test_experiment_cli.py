"""`cake experiment frozen-vs-evolving`: what it hands the flow, what it prints last, and its refusals."""
from __future__ import annotations

import contextlib

import cli_run
import pytest
from cli_run import one_error_line

from tasks.experiment import COLUMNS


def run(*args: str):
    return cli_run.run("experiment", "frozen-vs-evolving", *args)


@pytest.fixture
def no_services(monkeypatch):
    import cake_cli.services as services
    monkeypatch.setattr(services, "prefect_server", lambda settings: contextlib.nullcontext())
    monkeypatch.setattr(services, "ray_runtime", lambda settings, num_gpus=0, resources=None: contextlib.nullcontext())


@pytest.mark.parametrize("args, says", [
    (["kmeans_assign", "--cpu", "--budget-candidates", "8", "--approve", "everything"],
     "--approve 'everything' is not a policy; use one of gate-passing"),
    (["kmeans_assign", "--cpu"], "give the arms a budget"),
    (["kmeans_assign", "--cpu", "--budget-gpu-minutes", "1"], "--budget-gpu-minutes needs a GPU"),
    (["kmeans_assign", "--budget-candidates", "8"], "no GPU here (or CAKE_GPU=off): pass --cpu"),
    (["no_such_problem", "--cpu", "--budget-candidates", "8"], "no_such_problem"),
    (["kmeans_assign", "--cpu", "--budget-candidates", "8", "--shapes", "nope"], "nope"),
    (["kmeans_assign", "--cpu", "--budget-candidates", "8", "--gate-on-gpu"], "--gate-on-gpu needs a GPU"),
])
def test_bad_requests_get_one_line_before_anything_starts(monkeypatch, no_services, args, says):
    monkeypatch.setenv("CAKE_GPU", "off")
    import cake_cli.experiment_cli as fe

    def never(**kw):
        raise AssertionError("the experiment ran")
    monkeypatch.setattr(fe, "run_experiment", never)
    result = run(*args)
    assert result.exit_code != 0
    assert says in one_error_line(result)


def test_the_cpu_mode_hands_the_flow_its_arms_and_prints_the_table_last(monkeypatch, no_services, tmp_path):
    import cake_cli.experiment_cli as fe
    from tasks.experiment import POLICY_WORDS, summary
    got = {}
    rows = [{"arm": a, "seed": s, "attempts": 8, "converged": a == "evolving", "gpu_s_to_converge": 0.0,
             "gpu_s_failed": 0.0, "failed_candidates": 2} for a in ("frozen", "evolving") for s in (0, 1)]

    def flow(**kw):
        got.update(kw)
        return {"rows": rows, "summary": summary(rows), "converged_means": "a kernel at least 0.9x ...",
                "policy": {"name": kw["approve"], "meaning": POLICY_WORDS[kw["approve"]]}}
    monkeypatch.setattr(fe, "run_experiment", flow)
    result = run("kmeans_assign", "--cpu", "--seeds", "2", "--budget-candidates", "16", "--block", "1",
                 "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    assert got["seeds"] == [0, 1] and got["gpu_models"] == [] and got["budget_candidates"] == 16
    assert got["approve"] == "gate-passing" and got["block"] == 1 and got["out_dir"] == str(tmp_path / "o")
    lines = result.stdout.strip().splitlines()
    assert "policy of the evolving arm: gate-passing" in result.stdout
    assert lines[-len(rows) - 2] == "| " + " | ".join(COLUMNS) + " |" and lines[-1].startswith("| evolving | 1 | yes")
