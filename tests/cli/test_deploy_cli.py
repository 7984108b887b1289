"""`cake deploy` refuses what it cannot register before any service starts."""
from typer.testing import CliRunner

import cake_cli.main as main
from cake_cli.deployments import REPO_PREFECT_FILE, deployment_names, unfilled_templates

runner = CliRunner()


def _refuse(monkeypatch):
    def no_server(settings):
        raise AssertionError("no service may start")

    monkeypatch.setattr(main, "prefect_server", no_server)


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
    assert deployment_names(REPO_PREFECT_FILE) == ["nightly-gemm", "weekly-harness-review", "sweep"]
