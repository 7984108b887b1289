"""The embedded default services: a local Prefect server, a local Ray, the GPU policy.

One machine needs nothing running beforehand: :func:`prefect_server` reuses a
Prefect server already answering on the configured port or starts one (and
stops only what it started); :func:`ray_runtime` starts a local Ray or joins
``ray_address``. Both fail fast with one line that says what to change.

Order matters: ``PREFECT_API_URL`` must be in the environment before any flow
runs and before Ray starts workers, or every worker starts its own temporary
Prefect server. So enter ``prefect_server`` first, then ``ray_runtime``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from cake_cli.config import Settings
from cake_core.errors import CakeError

HEALTH_TIMEOUT_S = 3.0        # an external Prefect API must answer /health within this
STARTUP_TIMEOUT_S = 90.0      # the embedded server must be healthy within this
STOP_TIMEOUT_S = 15.0         # after SIGTERM, wait this long before SIGKILL
RAY_CONNECT_TIMEOUT_S = 3.0   # a Ray address must accept a TCP connection within this

# Set in every process Cake starts (the Prefect server, Ray workers).
QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no telemetry errors offline
    "RAY_AUTH_MODE": "disabled",                  # no token file written by Ray
    "RAY_USAGE_STATS_ENABLED": "0",               # no usage-stats prompt or upload
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",         # workers use this interpreter as is
}


class ServiceError(CakeError):
    """A service Cake needs (Prefect, Ray, a GPU) is missing or cannot start."""


@dataclass(frozen=True)
class PrefectServer:
    """Where the Prefect API is, and whether this process started the server."""

    api_url: str     # http://H:P/api, also in os.environ["PREFECT_API_URL"]
    ui_url: str      # http://H:P
    started: bool    # True: stopped when the context exits


@dataclass(frozen=True)
class RayRuntime:
    """The Ray this process is connected to."""

    address: str | None   # None: a local Ray started here
    started: bool         # True: this process called ray.init (and calls ray.shutdown)
    resources: dict[str, float]


# ---------------------------------------------------------------- Prefect


def _prefect_healthy(api_url: str, timeout: float) -> bool:
    """True if ``api_url/health`` answers 200 (Prefect answers the JSON ``true``)."""
    try:
        r = httpx.get(f"{api_url}/health", timeout=timeout)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _port_in_use(host: str, port: int) -> bool:
    """True if something accepts TCP connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _free_port_near(host: str, port: int) -> int | None:
    """The first port above ``port`` that nothing listens on (to suggest in a message)."""
    for p in range(port + 1, min(port + 50, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, p))
            except OSError:
                continue
            return p
    return None


def _prefect_command() -> list[str]:
    """``prefect`` next to this interpreter if there is one, else ``python -m prefect``."""
    beside = Path(sys.executable).parent / "prefect"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("prefect")
    return [found] if found else [sys.executable, "-m", "prefect"]


@contextlib.contextmanager
def _api_url_in_environment(api_url: str) -> Iterator[None]:
    """Set PREFECT_API_URL for this process and its children; restore it on exit."""
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    _refresh_prefect_settings()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
        _refresh_prefect_settings()


def _refresh_prefect_settings() -> None:
    # Prefect reads its settings once, at import; if it is already imported, make it re-read.
    if "prefect.context" in sys.modules:
        sys.modules["prefect.context"].refresh_global_settings_context()


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server we started: its whole process group (it runs uvicorn as a child)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_server(host: str, port: int, api_url: str, log_path: Path) -> subprocess.Popen:
    """Start ``prefect server start`` and wait until ``api_url`` is healthy; raise ServiceError if not."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **QUIET_ENV}
    env.pop("PREFECT_API_URL", None)  # the server must not think it is a client of another
    with log_path.open("ab") as log:
        log.write(f"\n--- cake: prefect server start --host {host} --port {port} "
                  f"({time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [*_prefect_command(), "server", "start", "--host", host, "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)  # own process group: stopped as a whole, immune to our Ctrl-C
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _prefect_healthy(api_url, timeout=1.0):
            if proc.poll() is not None:
                raise ServiceError(f"the Prefect server exited with code {proc.returncode} while "
                                   f"starting; see the end of {log_path}")
            if time.monotonic() > deadline:
                raise ServiceError(f"the Prefect server did not become healthy within "
                                   f"{STARTUP_TIMEOUT_S:.0f} s; see the end of {log_path}")
            time.sleep(0.25)
    except BaseException:
        _stop(proc)
        raise
    return proc


@contextlib.contextmanager
def prefect_server(settings: Settings) -> Iterator[PrefectServer]:
    """Make a Prefect API available and point this process (and its children) at it.

    With ``settings.prefect_api_url`` set, check that it answers and use it.
    Otherwise reuse a Prefect server already answering on
    ``prefect_host:prefect_port`` or start one there, logging to
    ``home/logs/prefect-server.log``, and stop it on exit (only if started here).

    Raises
    ------
    ServiceError
        The configured API does not answer, the port is taken by another
        program, or the embedded server does not start.
    """
    if settings.prefect_api_url:
        url = settings.prefect_api_url
        if not _prefect_healthy(url, timeout=HEALTH_TIMEOUT_S):
            raise ServiceError(f"Prefect API at {url} does not answer: {url}/health gave no "
                               f"reply within {HEALTH_TIMEOUT_S:.0f} s; unset "
                               f"CAKE_PREFECT_API_URL to use the embedded server")
        ui_url = url[:-len("/api")] if url.endswith("/api") else url
        with _api_url_in_environment(url):
            yield PrefectServer(api_url=url, ui_url=ui_url, started=False)
        return

    host, port = settings.prefect_host, settings.prefect_port
    # A server listening on every interface is reached through the loopback address.
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    api_url, ui_url = f"http://{reach}:{port}/api", f"http://{reach}:{port}"
    proc = None
    if not _prefect_healthy(api_url, timeout=1.0):
        if _port_in_use(reach, port):
            free = _free_port_near(host, port)
            raise ServiceError(f"port {port} is in use by another program; stop it or set "
                               f"CAKE_PREFECT_PORT={free if free else '<a free port>'}")
        proc = _start_server(host, port, api_url, settings.logs_dir / "prefect-server.log")
    try:
        with _api_url_in_environment(api_url):
            yield PrefectServer(api_url=api_url, ui_url=ui_url, started=proc is not None)
    finally:
        if proc is not None:
            _stop(proc)


# ---------------------------------------------------------------- Ray


def _check_ray_address(address: str) -> None:
    """Fail fast if a HOST:PORT or ray://HOST:PORT address takes no TCP connection."""
    if address in ("auto", "local"):
        return  # ray.init resolves these itself and says clearly when there is nothing
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise ServiceError(f"Ray at {address} does not answer ({e.strerror or e}); start the "
                           f"cluster or unset CAKE_RAY_ADDRESS to use a local Ray") from None


@contextlib.contextmanager
def ray_runtime(settings: Settings, num_gpus: int | None = None,
                resources: dict[str, float] | None = None) -> Iterator[RayRuntime]:
    """Connect to ``settings.ray_address`` or start a local Ray; shut down what we started.

    Enter it inside :func:`prefect_server`: workers get ``PREFECT_API_URL``
    through the runtime environment.

    Parameters
    ----------
    settings
        The configuration.
    num_gpus
        GPUs a local Ray offers (None: Ray counts them; 0: CPU only). Ignored
        when joining a cluster, which declares its own.
    resources
        Custom resources a local Ray offers (``tasks.gpus.local_resources``: the GPU models); ignored
        when joining a cluster.

    Raises
    ------
    ServiceError
        ``ray_address`` is set and cannot be reached.
    """
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    import ray  # late: importing Ray costs a second or two, and `cake sql` never needs it

    if ray.is_initialized():  # someone in this process already owns the connection
        yield RayRuntime(address=settings.ray_address, started=False,
                         resources=dict(ray.cluster_resources()))
        return

    env_vars = {k: v for k, v in QUIET_ENV.items()}
    if os.environ.get("PREFECT_API_URL"):
        env_vars["PREFECT_API_URL"] = os.environ["PREFECT_API_URL"]
    kwargs: dict = dict(include_dashboard=False, log_to_driver=False,
                        runtime_env={"env_vars": env_vars}, configure_logging=False)
    address = settings.ray_address
    if address:
        _check_ray_address(address)
    else:
        kwargs.update(num_cpus=os.cpu_count() or 1)
        if num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        if resources:
            kwargs["resources"] = dict(resources)
    # ray.init installs a native SIGTERM handler that exits on the spot; keep the caller's, so a
    # terminated `cake` still unwinds and stops the services it started
    prev_term = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(address=address or None, **kwargs)
        if threading.current_thread() is threading.main_thread() and callable(prev_term):
            signal.signal(signal.SIGTERM, prev_term)
    except (ConnectionError, TimeoutError, RuntimeError) as e:
        if address:
            raise ServiceError(f"Ray at {address} does not answer: {str(e).splitlines()[0]}; "
                               f"start the cluster or unset CAKE_RAY_ADDRESS to use a local "
                               f"Ray") from None
        raise ServiceError(f"a local Ray did not start: {str(e).splitlines()[0]}") from None
    try:
        yield RayRuntime(address=address, started=True, resources=dict(ray.cluster_resources()))
    finally:
        ray.shutdown()


# ---------------------------------------------------------------- GPUs


def detect_gpus() -> list[str]:
    """Names of the NVIDIA GPUs on this machine (``['NVIDIA H200']``); [] if none or no driver."""
    from tasks.gpus import local_gpu_names
    return local_gpu_names()


def gpu_policy(settings: Settings) -> list[str]:
    """The GPUs a run may use under ``settings.gpu``: off → [], auto → what is there, require → non-empty.

    Raises
    ------
    ServiceError
        ``gpu = 'require'`` and no NVIDIA GPU is found.
    """
    if settings.gpu == "off":
        return []
    gpus = detect_gpus()
    if settings.gpu == "require" and not gpus:
        raise ServiceError("no NVIDIA GPU found; run with CAKE_GPU=auto or off to check on the CPU")
    return gpus
