"""The CLI as the tests call it in-process: ``run(*args)`` (Typer's runner on the real app) and the one error line
a refusal must print."""
from __future__ import annotations

from typer.testing import CliRunner

from cake_cli.main import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def one_error_line(result) -> str:
    """The single stderr line of a refusal (``error: ...``), with no traceback anywhere."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]
