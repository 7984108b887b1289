"""`cake deploy` refuses what it cannot register before any service starts."""
from typer.testing import CliRunner

import cake_cli.main as main
import cake_cli.service_cli as service_cli
from cake_cli.deployments import REPO_PREFECT_FILE, deployment_names, unfilled_templates

runner = CliRunner()


def _refuse(monkeypatch):
    def no_server(settings):
        raise AssertionError("no service may start")

    monkeypatch.setattr(service_cli, "prefect_server", no_server)


def test_missing_file_is_one_line(monkeypatch, tmp_path):
    _refuse(monkeypatch)
    result = runner.invoke(main.app, ["deploy", "--file", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: no deployment file at {tmp_path / 'nope.yaml'}; pass --file PREFECT.YAML"


def test_a_variable_cake_does_not_set_is_refused(monkeypatch, tmp_path):
    _refuse(monkeypatch)
    f = tmp_path / "prefect.yaml"
    f.write_text("deployments:\n  - name: x\n    parameters: {root: '{{ $CAKE_REPO }}', home: '{{ $CAKE_HOME }}'}\n")
    assert unfilled_templates(f) == ["CAKE_REPO"] and deployment_names(f) == ["x"]
    result = runner.invoke(main.app, ["deploy", "--file", str(f)])
    assert result.exit_code == 2 and "uses $CAKE_REPO, which `cake deploy` does not set" in result.stderr


def test_the_repository_file_needs_nothing_but_the_home():
    text = REPO_PREFECT_FILE.read_text()
    assert "pull:" not in text and "CAKE_REPO" not in text   # the deploy records the repository itself
    assert unfilled_templates(REPO_PREFECT_FILE) == []
    assert deployment_names(REPO_PREFECT_FILE) == ["nightly-gemm", "weekly-harness-review", "sweep", "portfolio"]


def test_an_evolve_deployment_asks_only_for_what_a_run_request_takes(monkeypatch, tmp_path):
    from cake_cli.deployments import request_problems

    _refuse(monkeypatch)
    assert request_problems(REPO_PREFECT_FILE) == []
    f = tmp_path / "prefect.yaml"
    f.write_text("deployments:\n"
                 "  - {name: typo, entrypoint: flows/evolve.py:evolve_flow, parameters: {problem: p, generation: 3}}\n"
                 "  - {name: none, entrypoint: flows/evolve.py:evolve_flow, parameters: {problem: p, population: 0}}\n")
    result = runner.invoke(main.app, ["deploy", "--file", str(f)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "deployment typo: generation is not a parameter of a run" in result.stderr
    assert "deployment none: --population must be at least 1, got 0" in result.stderr
