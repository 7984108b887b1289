"""``cake server``, ``cake deploy``, ``cake worker``: this home's Prefect server, its deployments, a worker.

    cake server                     # keep the Prefect server and UI up until Ctrl-C
    cake deploy [--file PREFECT.YAML]   # register the deployments and their work pool
    cake worker                     # run deployed flows (scheduled ones, and those started from the UI)

``cake_cli.main`` registers these commands.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import typer

from cake_cli.display import say as _say
from cake_cli.errors import UsageError, cli_errors
from cake_cli.invocation import settings as _settings
from cake_cli.services import preflight, prefect_server
from cake_core.errors import CakeError

WORKER_STOP_S = 20.0       # a stopped worker may finish handing back its flow runs this long


@cli_errors
def server() -> None:
    """Keep this home's Prefect server and UI up until Ctrl-C.

    Runs started meanwhile share it; it stops once the last of them ends.
    """
    settings = _settings()
    preflight(settings)
    try:
        with prefect_server(settings) as pf:
            if pf.note:
                _say(pf.note)
            _say(f"Prefect UI: {pf.ui_url}  (API {pf.api_url}, database in {settings.prefect_home})")
            _say("Ctrl-C to leave it; it stops once no run uses it any more")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        _say("left the Prefect server")


@cli_errors
def deploy(
    file: Path | None = typer.Option(None, "--file", metavar="PREFECT.YAML",
                                     help="Deployments to register (default: the repository's prefect.yaml)."),
) -> None:
    """Register prefect.yaml's deployments and their work pool.

    On this home's Prefect server; then `cake worker` runs them (scheduled
    ones, and those started from the UI).
    """
    settings = _settings()
    from cake_cli.deployments import (REPO_PREFECT_FILE, WORK_POOL, ensure_work_pool, register, request_problems,
                                      unfilled_templates)

    path = (file or REPO_PREFECT_FILE).expanduser()
    if not path.is_file():
        raise UsageError(f"no deployment file at {path}; pass --file PREFECT.YAML")
    unknown = unfilled_templates(path)
    if unknown:
        raise UsageError(f"{path} uses {', '.join('$' + v for v in unknown)}, which `cake deploy` does not "
                         f"set; write the values into the file")
    wrong = request_problems(path)
    if wrong:
        raise UsageError(f"{path}: {'; '.join(wrong)}")
    preflight(settings)
    with prefect_server(settings) as pf:
        if pf.note:
            _say(pf.note)
        created = ensure_work_pool()
        names = register(path, settings)
    _say(f"work pool {WORK_POOL}: {'created' if created else 'already there'}")
    for n in names:
        _say(f"registered {n}")
    _say("run them: cake worker  (scheduled runs, and runs started from the UI, wait for a worker)")


@cli_errors
def worker() -> None:
    """Run deployed flows: a Prefect worker on the cake work pool.

    Against this home's Prefect server; Ctrl-C stops it.
    """
    import subprocess

    from cake_cli.deployments import WORK_POOL, ensure_work_pool, worker_command

    settings = _settings()
    preflight(settings)
    with prefect_server(settings) as pf:
        if pf.note:
            _say(pf.note)
        ensure_work_pool()
        _say(f"worker on work pool {WORK_POOL}; flow runs start here; Prefect UI: {pf.ui_url}")
        env = {**os.environ, "CAKE_HOME": str(settings.home)}
        proc = subprocess.Popen(worker_command(), env=env, stdin=subprocess.DEVNULL)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the worker too (same process group); SIGTERM reached only us: pass it on.
            proc.terminate()
            try:
                proc.wait(WORKER_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _say("worker stopped")
            return
    if code:
        raise CakeError(f"the Prefect worker exited with code {code}")
