"""The embedded default services: a Prefect server per Cake home, a local Ray, the GPU policy.

One machine needs nothing running beforehand. :func:`prefect_server` gives
this home's Prefect server to every Cake process of the home: the first starts
it (``PREFECT_HOME=<home>/prefect``, its own database; the UI's API address
follows the port), later ones share it, each holding a lease (see
:mod:`cake_cli.leases`), and the last one out stops it. A server left by a
killed run is found through the home's record and reused knowingly; a record
whose server is gone or hung is replaced. :func:`ray_runtime` starts a local Ray
on 127.0.0.1 (with retries) or joins ``ray_address``. :func:`preflight` runs
every check that can fail before any service starts. All fail with one line
that says what to change.

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
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from cake_cli.config import Settings
from cake_cli.leases import Lease, Registry, ServerRecord
from cake_core.errors import CakeError
from tasks.processes import alive
from tasks.ray_runtime import RAY_ENV, RayUnavailable, check_address, start_ray

HEALTH_TIMEOUT_S = 3.0        # an external Prefect API must answer /health within this
STARTUP_TIMEOUT_S = 150.0     # the embedded server must be healthy within this (slow on a loaded machine)
STOP_TIMEOUT_S = 15.0         # after SIGTERM, wait this long before SIGKILL
STALE_CHECKS = 3              # a recorded server that misses this many health checks in a row is hung
LLM_CHECK_TIMEOUT_S = 5.0     # the LLM endpoint must answer within this

# Set in every process Cake starts (the Prefect server, Ray and its workers).
QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no telemetry errors offline
    **RAY_ENV,
}


class ServiceError(CakeError):
    """A service Cake needs (Prefect, Ray, a GPU) is missing or cannot start."""


@dataclass(frozen=True)
class PrefectServer:
    """Where the Prefect API is, and whether this process started the server."""

    api_url: str     # http://H:P/api, also in os.environ["PREFECT_API_URL"]
    ui_url: str      # http://H:P
    started: bool    # True: this process started it (the last user stops it, whoever that is)
    note: str | None = None   # what a person should know: shared, adopted, a stale one replaced


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


def _server_home(api_url: str) -> Path | None:
    """The PREFECT_HOME of the server at ``api_url`` (from its settings), or None if it does not say."""
    try:
        r = httpx.get(f"{api_url}/admin/settings", timeout=HEALTH_TIMEOUT_S)
        home = r.json().get("home") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return Path(home).expanduser().absolute() if isinstance(home, str) and home else None


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


def prefect_command() -> list[str]:
    """``prefect`` next to this interpreter if there is one, else ``python -m prefect``."""
    beside = Path(sys.executable).parent / "prefect"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("prefect")
    return [found] if found else [sys.executable, "-m", "prefect"]


@contextlib.contextmanager
def _prefect_environment(api_url: str, prefect_home: Path) -> Iterator[None]:
    """Set PREFECT_API_URL and PREFECT_HOME for this process and its children; restore them on exit."""
    wanted = {"PREFECT_API_URL": api_url, "PREFECT_HOME": str(prefect_home)}
    before = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    _refresh_prefect_settings()
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _refresh_prefect_settings()


def _refresh_prefect_settings() -> None:
    # Prefect reads its settings once, at import; if it is already imported, make it re-read.
    if "prefect.context" in sys.modules:
        sys.modules["prefect.context"].refresh_global_settings_context()


def _stop_group(pid: int) -> None:
    """Stop a server Cake started: its whole process group (it runs uvicorn as a child)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    proc = _STARTED.pop(pid, None)
    if proc is not None:
        proc.wait()  # reap our own child


_STARTED: dict[int, subprocess.Popen] = {}   # servers this process started, to be reaped


def _start_server(settings: Settings, api_url: str) -> subprocess.Popen:
    """Start ``prefect server start`` for this home and wait until it is healthy; ServiceError if not."""
    host, port = settings.prefect_host, settings.prefect_port
    log_path = settings.logs_dir / "prefect-server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    settings.prefect_home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **QUIET_ENV,
           "PREFECT_HOME": str(settings.prefect_home),       # this home's own database
           "PREFECT_SERVER_API_HOST": host, "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_UI_API_URL": api_url}             # the UI asks the port it is served on
    env.pop("PREFECT_API_URL", None)  # the server must not think it is a client of another
    env["PREFECT_UI_API_URL"] = api_url  # else the UI it serves asks 127.0.0.1:4200, whatever the port
    with log_path.open("ab") as log:
        log.write(f"\n--- cake: prefect server start --host {host} --port {port} "
                  f"({time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [*prefect_command(), "server", "start", "--host", host, "--port", str(port)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)  # own process group: stopped as a whole, immune to our Ctrl-C
    _STARTED[proc.pid] = proc
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _prefect_healthy(api_url, timeout=2.0):
            if proc.poll() is not None:
                raise ServiceError(f"the Prefect server exited with code {proc.returncode} while "
                                   f"starting; see the end of {log_path}")
            if time.monotonic() > deadline:
                raise ServiceError(f"the Prefect server did not become healthy within "
                                   f"{STARTUP_TIMEOUT_S:.0f} s; see the end of {log_path}")
            time.sleep(0.25)
    except BaseException:
        _stop_group(proc.pid)
        raise
    return proc


def _urls(host: str, port: int) -> tuple[str, str, str]:
    """(host to reach, API URL, UI URL); a server on every interface is reached through loopback."""
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return reach, f"http://{reach}:{port}/api", f"http://{reach}:{port}"


def _recorded_server(registry: Registry, others: list[int]) -> tuple[PrefectServer | None, str | None]:
    """The home's recorded server if it still serves; else clear the record and say what was replaced."""
    rec = registry.read()
    if rec is None:
        return None, None
    if rec.alive():
        for _ in range(STALE_CHECKS):
            if _prefect_healthy(rec.api_url, timeout=HEALTH_TIMEOUT_S):
                ui = rec.api_url[:-len("/api")]
                if others:
                    note = f"sharing this home's Prefect server (pid {rec.pid}) with {len(others)} other run(s)"
                elif rec.started_by != os.getpid() and alive(rec.started_by):
                    note = f"using this home's Prefect server (pid {rec.pid}); it stops when its last user ends"
                else:
                    note = (f"reusing this home's Prefect server (pid {rec.pid}) left running by an earlier "
                            f"run that was killed (pid {rec.started_by}); it stops when this run ends")
                return PrefectServer(rec.api_url, ui, started=False, note=note), None
        _stop_group(rec.pid)   # alive but not answering: hung
        why = f"replaced this home's Prefect server (pid {rec.pid}), which no longer answered"
    else:
        why = f"replaced the record of this home's Prefect server (pid {rec.pid}), which is gone"
    registry.clear()
    return None, why


def _join_or_start(settings: Settings, registry: Registry, others: list[int]) -> PrefectServer:
    """Under the registry lock: the home's server, an adopted one, or a new one."""
    server, replaced = _recorded_server(registry, others)
    if server is not None:
        return server
    host, port = settings.prefect_host, settings.prefect_port
    reach, api_url, ui_url = _urls(host, port)
    if _prefect_healthy(api_url, timeout=HEALTH_TIMEOUT_S):
        theirs = _server_home(api_url)
        if theirs == settings.prefect_home.absolute():
            return PrefectServer(api_url, ui_url, started=False,
                                 note=f"using the Prefect server already answering at {ui_url} for this "
                                      f"home (Cake did not start it and leaves it running)")
        free = _free_port_near(host, port)
        raise ServiceError(f"port {port} is held by a Prefect server of another home "
                           f"({theirs or 'unknown'}); set CAKE_PREFECT_PORT="
                           f"{free if free else '<a free port>'} to start this home's own, or "
                           f"CAKE_PREFECT_API_URL={api_url} to use that one knowingly")
    if _port_in_use(reach, port):
        free = _free_port_near(host, port)
        raise ServiceError(f"port {port} is in use by another program; stop it or set "
                           f"CAKE_PREFECT_PORT={free if free else '<a free port>'}")
    proc = _start_server(settings, api_url)
    registry.write(ServerRecord(pid=proc.pid, host=host, port=port, api_url=api_url,
                                started_by=os.getpid(), started_at=time.time()))
    return PrefectServer(api_url, ui_url, started=True, note=replaced)


@contextlib.contextmanager
def prefect_server(settings: Settings) -> Iterator[PrefectServer]:
    """Make a Prefect API available and point this process (and its children) at it.

    With ``settings.prefect_api_url`` set, check that it answers and use it.
    Otherwise use this home's server (see the module docstring): join the one
    recorded, adopt one answering on ``prefect_host:prefect_port`` with this
    home's ``PREFECT_HOME``, or start one there, logging to
    ``home/logs/prefect-server.log``. The last user of a server Cake started
    stops it on exit.

    Raises
    ------
    ServiceError
        The configured API does not answer, the port is taken by another
        program or another home's server, or the embedded server does not start.
    """
    if settings.prefect_api_url:
        url = settings.prefect_api_url
        if not _prefect_healthy(url, timeout=HEALTH_TIMEOUT_S):
            raise ServiceError(f"Prefect API at {url} does not answer: {url}/health gave no "
                               f"reply within {HEALTH_TIMEOUT_S:.0f} s; unset "
                               f"CAKE_PREFECT_API_URL to use the embedded server")
        ui_url = url[:-len("/api")] if url.endswith("/api") else url
        with _prefect_environment(url, settings.prefect_home):
            yield PrefectServer(api_url=url, ui_url=ui_url, started=False)
        return

    registry = Registry(settings.home)
    with _held(registry):
        others = registry.live_leases()
        lease = registry.take_lease()
        try:
            server = _join_or_start(settings, registry, others)
        except BaseException:
            lease.release()
            raise
    try:
        # Leave inside the environment: a Prefect client still at work (a flow thread being
        # abandoned) must keep talking to this server, never fall back to an ephemeral one.
        with _prefect_environment(server.api_url, settings.prefect_home):
            try:
                yield server
            finally:
                _drain_prefect_clients()
                _leave(registry, lease)
    except BaseException:
        lease.release()
        raise


@contextlib.contextmanager
def _held(registry: Registry) -> Iterator[Registry]:
    """The home's registry, held; a ServiceError if another process keeps it too long."""
    try:
        with registry.locked() as held:
            yield held
    except TimeoutError as e:
        raise ServiceError(f"{e}: another Cake process of this home is starting or stopping its Prefect "
                           f"server; try again (nothing waits on a lock of a process that died)") from None


def _leave(registry: Registry, lease: Lease) -> None:
    """Drop this process's lease; the last user of a server Cake started stops it."""
    with _held(registry):
        lease.release()
        rec = registry.read()
        if rec is not None and not registry.live_leases():
            _stop_group(rec.pid)
            registry.clear()


def _drain_prefect_clients() -> None:
    """Send the logs and events Prefect still holds while the server can take them.

    Otherwise they are sent at exit, to a server that is gone, and each batch
    prints ``--- Error logging to API ---``.
    """
    if "prefect.logging.handlers" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            service.drain_all(timeout=5)


# ---------------------------------------------------------------- Ray


@contextlib.contextmanager
def ray_runtime(settings: Settings, num_gpus: int | None = None,
                resources: dict[str, float] | None = None) -> Iterator[RayRuntime]:
    """Connect to ``settings.ray_address`` or start a local Ray on 127.0.0.1; shut down what we started.

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
        ``ray_address`` cannot be reached, or a local Ray does not start.
    """
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    import ray  # late: importing Ray costs a second or two, and `cake sql` never needs it

    if ray.is_initialized():  # someone in this process already owns the connection
        yield RayRuntime(address=settings.ray_address, started=False,
                         resources=dict(ray.cluster_resources()))
        return
    try:
        offered = start_ray(settings.ray_address, num_gpus=num_gpus, resources=resources)
    except RayUnavailable as e:
        raise ServiceError(str(e)) from None
    try:
        yield RayRuntime(address=settings.ray_address, started=True, resources=offered)
    finally:
        shutdown_ray()


_ABANDONED = threading.Event()   # set by abandon_ray: this process exits without disconnecting


def shutdown_ray() -> None:
    """Disconnect from Ray and wait until every process a local Ray started, and every process one of them
    started, has exited (idempotent; nothing once :func:`abandon_ray` ran)."""
    import ray

    from tasks.ray_runtime import local_ray_processes, sweep_local_ray

    if not _ABANDONED.is_set():
        tree = local_ray_processes()
        ray.shutdown(wait_for_processes=True)
        sweep_local_ray(tree)


def abandon_ray() -> None:
    """Kill every process the local Ray started, leaving this process's own connection as it is; for a process
    about to exit while another of its threads may still be inside a Ray call.

    Disconnecting (``ray.shutdown``) under such a thread is not safe: Ray's core worker ends the whole
    process (exit status 1) when a thread touches it after its shutdown. Killing the processes instead makes
    that thread's call fail, not the process."""
    import ray._private.worker as ray_worker

    from tasks.ray_runtime import local_ray_processes, sweep_local_ray

    _ABANDONED.set()
    tree = local_ray_processes()
    node = ray_worker._global_node
    if node is not None:
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    sweep_local_ray(tree)


# ---------------------------------------------------------------- checks before any service


def _check_home_writable(settings: Settings) -> None:
    """Create the home's folders and write a probe file in each; a ServiceError naming the first that fails."""
    for d in (settings.home, settings.warehouse_root, settings.cache_dir, settings.logs_dir,
              settings.prefect_home, settings.home / "services"):
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d, prefix=".cake-probe-"):
                pass
        except OSError as e:
            raise ServiceError(f"the Cake home {settings.home} is not writable ({d}: "
                               f"{e.strerror or e}); set CAKE_HOME to a writable directory") from None


def _check_llm_endpoint(settings: Settings) -> None:
    """The LLM endpoint must answer (any HTTP reply) and must not refuse the key."""
    base = settings.llm_base_url or "https://api.openai.com/v1"
    key = os.environ.get(settings.llm_api_key_env, "")
    try:
        r = httpx.get(f"{base}/models", headers={"Authorization": f"Bearer {key}"},
                      timeout=LLM_CHECK_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise ServiceError(f"the LLM endpoint {base} does not answer ({type(e).__name__}); check "
                           f"CAKE_LLM_BASE_URL and the network") from None
    if r.status_code in (401, 403):
        raise ServiceError(f"the LLM endpoint {base} refused the key in ${settings.llm_api_key_env} "
                           f"(HTTP {r.status_code}); set a valid key")


def preflight(settings: Settings, agent: str = "tactic") -> None:
    """Every check of the services that can fail before one starts: the home, the Ray address, the LLM's
    endpoint (the run's own checks, nvcc among them, are ``tasks.opening.check_request``'s).

    Raises
    ------
    ServiceError
        The first thing found wrong, in one line that says what to change.
    """
    _check_home_writable(settings)
    if settings.ray_address:
        try:
            check_address(settings.ray_address)
        except RayUnavailable as e:
            raise ServiceError(str(e)) from None
    if agent == "llm":
        _check_llm_endpoint(settings)


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
