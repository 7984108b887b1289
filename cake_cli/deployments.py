"""Register the deployments of ``prefect.yaml`` and run them with a worker, against this home's server.

``cake deploy`` makes the ``cake`` work pool (a process pool) when the server
lacks it, then runs ``prefect deploy --all`` on the file with ``CAKE_HOME``
set to the home, which the file's parameters name (``{{ $CAKE_HOME }}``); the
file has no pull step, so Prefect records the repository's directory as the
worker's working directory. ``cake worker`` starts a worker on that pool.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cake_cli.config import Settings
from cake_cli.services import ServiceError, prefect_command

WORK_POOL = "cake"
WORK_POOL_TYPE = "process"       # flow runs in subprocesses of the worker, on its machine
DEPLOY_TIMEOUT_S = 600.0
REPO_PREFECT_FILE = Path(__file__).resolve().parents[1] / "prefect.yaml"


def ensure_work_pool(name: str = WORK_POOL) -> bool:
    """Create the work pool ``name`` (type process) unless it exists; True if created here."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            pass
        try:
            client.create_work_pool(WorkPoolCreate(
                name=name, type=WORK_POOL_TYPE,
                base_job_template=ProcessWorker.get_default_base_job_template(),
                description="Cake flows: `cake worker` runs them"))
        except ObjectAlreadyExists:   # made meanwhile by another `cake deploy`
            return False
    return True


def deployment_names(prefect_file: Path) -> list[str]:
    """The ``name:`` of every deployment the file declares, in file order."""
    import yaml

    doc = yaml.safe_load(prefect_file.read_text()) or {}
    return [d["name"] for d in doc.get("deployments") or [] if isinstance(d, dict) and d.get("name")]


def register(prefect_file: Path, settings: Settings) -> list[str]:
    """Run ``prefect deploy --all`` on ``prefect_file``; returns ``flow/deployment`` names registered.

    Raises
    ------
    ServiceError
        Prefect refused a deployment; the full output is in ``home/logs/prefect-deploy.log``.
    """
    log = settings.logs_dir / "prefect-deploy.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CAKE_HOME": str(settings.home)}
    try:
        p = subprocess.run([*prefect_command(), "--no-prompt", "deploy", "--all",
                            "--prefect-file", str(prefect_file)],
                           cwd=prefect_file.parent, env=env, capture_output=True, text=True,
                           timeout=DEPLOY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"`prefect deploy` did not finish within {DEPLOY_TIMEOUT_S:.0f} s") from None
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        lines = [ln.strip() for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        last = lines[-1] if lines else f"exit code {p.returncode}"
        raise ServiceError(f"`prefect deploy` failed: {last} (full output in {log})")
    wanted = set(deployment_names(prefect_file))
    return _registered(wanted)


def _registered(wanted: set[str]) -> list[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        found = [f"{flows.get(d.flow_id, '?')}/{d.name}" for d in client.read_deployments() if d.name in wanted]
    return sorted(found)


def worker_command(pool: str = WORK_POOL) -> list[str]:
    """The command that starts a worker on ``pool``."""
    return [*prefect_command(), "worker", "start", "--pool", pool, "--type", WORK_POOL_TYPE]


def request_problems(prefect_file: Path) -> list[str]:
    """What is wrong with the run requests of the file's evolve deployments, one line each: a parameter that is
    not a field of the run request (``cake_core.pipeline.request.RunRequest``, the evolve flow's parameters), or
    a value no run can take (``request.check_values``, the check ``cake evolve`` and the flow make)."""
    import yaml

    from cake_core.errors import CakeError
    from cake_core.pipeline.request import check_values, params

    doc = yaml.safe_load(prefect_file.read_text()) or {}
    out = []
    for d in doc.get("deployments") or []:
        if not isinstance(d, dict) or not str(d.get("entrypoint", "")).endswith("evolve.py:evolve_flow"):
            continue
        given = d.get("parameters") or {}
        unknown = sorted(set(given) - set(params()))
        if unknown:
            out.append(f"deployment {d.get('name')}: {', '.join(unknown)} is not a parameter of a run "
                       f"(`cake evolve --help` lists them)")
            continue
        try:
            check_values(given)
        except CakeError as e:
            out.append(f"deployment {d.get('name')}: {e}")
    return out


def unfilled_templates(prefect_file: Path) -> list[str]:
    """``{{ $VAR }}`` placeholders of the file other than CAKE_HOME (which `cake deploy` sets)."""
    names = re.findall(r"\{\{\s*\$(\w+)\s*\}\}", prefect_file.read_text())
    return sorted(set(names) - {"CAKE_HOME"})
