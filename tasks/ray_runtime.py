"""Start a local Ray on the loopback interface, or join a cluster; used by `cake` and by flows a worker runs.

A local Ray is bound to 127.0.0.1: Ray resolves a loopback ``node_ip_address``
to the machine's outward address unless it is told this node is a single-node
cluster (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's switch for exactly
that), so both are set. A start that fails (under load Ray gives up after 30 s
with a bare ``Exception``) is cleaned up — every process it left is killed —
and retried; the last failure is one :class:`RayUnavailable` line.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from cake_core.errors import CakeError
from tasks.processes import alive, carrying, descendants, kill, send

LOOPBACK = "127.0.0.1"
START_ATTEMPTS = 3              # local starts tried before giving up
START_BACKOFF_S = 2.0           # wait before the second start; doubled for each further one (at most 10 s)
CONNECT_TIMEOUT_S = 3.0         # a cluster address must take a TCP connection within this
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": a loopback node IP stays loopback
TREE_ENV = "CAKE_RAY_TREE"      # set, to a value of its own, in the environment of every process of a local Ray
SWEEP_WAIT_S = 10.0             # after SIGKILL, wait at most this long for the swept processes to be gone

# Set in the environment of every Ray process Cake starts.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",                  # no token file written by Ray
    "RAY_USAGE_STATS_ENABLED": "0",               # no usage-stats prompt or upload
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",         # workers use this interpreter as is
    "RAY_ENABLE_AUTO_CONNECT": "0",               # a call after shutdown fails; it never starts a new Ray
}
# Passed on to Ray workers so that Prefect code there talks to this run's server.
FORWARDED_ENV = ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED")


class RayUnavailable(CakeError):
    """Ray could not be started or joined."""


class _StartFailed(Exception):
    """One failed local start (retried)."""


_TREE: dict[str, bytes] = {}   # "entry": the TREE_ENV entry of the local Ray this process started


def local_ray_processes() -> set[int]:
    """The live processes of the local Ray this process started: those carrying its ``TREE_ENV`` entry and
    every process below them (Ray starts its agents with an environment of their own)."""
    entry = _TREE.get("entry")
    if entry is None:
        return set()
    marked = carrying(entry)
    return {q for q in marked | descendants(marked) if alive(q)}


def sweep_local_ray(before: set[int] = frozenset()) -> int:
    """Kill every process left of the local Ray this process started; returns how many there were.

    Ray's own shutdown stops its daemons and workers, but not what a worker had
    started (an nvcc and its cicc and ptxas, orphaned when the worker is killed),
    and a killed daemon's workers may outlive it for a while. Every such process
    carries the ``TREE_ENV`` value the local Ray was started with, whoever its
    parent is now; ``before`` adds the processes :func:`local_ray_processes` saw
    before the shutdown (its agents, which do not carry it, orphaned since). They
    are first stopped (SIGSTOP) until no new one appears, so none can start
    another while they are killed, then killed (SIGKILL).
    """
    if _TREE.get("entry") is None:
        return 0
    stopped: set[int] = set()
    for _ in range(20):
        new = ({q for q in before if alive(q)} | local_ray_processes()) - stopped
        if not new:
            break
        send(new, signal.SIGSTOP)
        stopped |= new
    _TREE.pop("entry", None)
    kill(stopped)
    deadline = time.monotonic() + SWEEP_WAIT_S
    while any(alive(q) for q in stopped) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(stopped)


def check_address(address: str) -> None:
    """Fail fast, in one line, if a ``HOST:PORT`` or ``ray://HOST:PORT`` address takes no TCP connection."""
    if address in ("auto", "local"):
        return  # ray.init resolves these itself and says clearly when there is nothing
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise RayUnavailable(f"Ray at {address} does not answer ({e.strerror or e}); start the "
                             f"cluster or unset CAKE_RAY_ADDRESS to use a local Ray") from None


def _single_node() -> None:
    os.environ[SINGLE_NODE_ENV] = "0"
    # Ray reads the switch when it is first imported; a process that imported it earlier
    # (a test session, a flow module) gets the same value set where Ray looks it up.
    import ray._private.ray_constants as constants
    constants.ENABLE_RAY_CLUSTER = False


def _init(**kwargs: Any) -> None:
    import ray

    # ray.init installs a SIGTERM handler that exits on the spot; keep the caller's, so a
    # terminated `cake` still unwinds and stops the services it started.
    main = threading.current_thread() is threading.main_thread()
    prev_term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(**kwargs)
    finally:
        if main and callable(prev_term):
            signal.signal(signal.SIGTERM, prev_term)


def _start_local(kwargs: dict[str, Any]) -> None:
    """One local start; on failure kill whatever it started and raise _StartFailed."""
    import ray

    before = descendants(os.getpid())
    try:
        _init(**kwargs)
    except Exception as e:  # noqa: BLE001 - Ray raises bare Exception on a start-up time-out
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - nothing more to stop
            pass
        kill(descendants(os.getpid()) - before)
        raise _StartFailed(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    gcs = ray.get_runtime_context().gcs_address or ""
    if not gcs.startswith(f"{LOOPBACK}:"):
        ray.shutdown()
        raise RayUnavailable(f"the local Ray came up on {gcs}, not on {LOOPBACK}; it was stopped. "
                             f"Start a Ray yourself and point CAKE_RAY_ADDRESS at it")


def start_ray(address: str | None, num_gpus: int | None = None, attempts: int = START_ATTEMPTS,
              env_vars: dict[str, str] | None = None,
              resources: dict[str, float] | None = None) -> dict[str, float]:
    """Join ``address``, or start a local Ray on 127.0.0.1 with retries; returns the cluster's resources.

    Parameters
    ----------
    address
        A Ray address (``HOST:6379``, ``ray://HOST:10001``, ``auto``); None starts a local Ray.
    num_gpus
        GPUs a local Ray offers (None: Ray counts them; 0: CPU only).
    attempts
        Local starts to try.
    env_vars
        Extra environment for the workers (``PREFECT_API_URL`` and ``PREFECT_HOME`` are
        forwarded from this process).
    resources
        Custom resources a local Ray offers: the GPU models, ``{"gpu_model:H200": 2.0}``
        (``tasks.gpus.local_resources``). Ignored when joining a cluster, whose nodes declare theirs.

    Raises
    ------
    RayUnavailable
        The address does not answer, or no local start succeeded.
    """
    for k, v in RAY_ENV.items():
        os.environ.setdefault(k, v)
    import ray._private.auto_init_hook as auto_init

    # Read at Ray's import, which may have come first: a thread still using Ray after a stop
    # (an abandoned flow) must get an error, not a fresh Ray of its own on every interface.
    auto_init.enable_auto_connect = False
    workers_env = {**RAY_ENV, **{k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)},
                   **(env_vars or {})}
    kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                                  runtime_env={"env_vars": workers_env})
    import ray

    if address:
        check_address(address)
        try:
            _init(address=address, **kwargs)
        except Exception as e:  # noqa: BLE001 - one line whatever Ray raised
            raise RayUnavailable(f"Ray at {address} does not answer: {str(e).splitlines()[0]}; start "
                                 f"the cluster or unset CAKE_RAY_ADDRESS to use a local Ray") from None
        return dict(ray.cluster_resources())

    _single_node()
    kwargs.update(address="local", num_cpus=os.cpu_count() or 1, _node_ip_address=LOOPBACK)
    if num_gpus is not None:
        kwargs["num_gpus"] = num_gpus
    if resources:
        kwargs["resources"] = dict(resources)
    tries = Retrying(stop=stop_after_attempt(max(1, attempts)), wait=wait_exponential(multiplier=START_BACKOFF_S, max=10),
                     retry=retry_if_exception_type(_StartFailed), reraise=True)
    t0 = time.monotonic()
    # The raylet and GCS inherit the entry from this process, the workers from the raylet; this process
    # drops it once they have started, so that what it starts itself later is not taken for Ray's.
    os.environ[TREE_ENV] = f"{os.getpid()}.{time.time_ns()}"          # this process, this start
    _TREE["entry"] = f"{TREE_ENV}={os.environ[TREE_ENV]}".encode()
    try:
        for attempt in tries:
            with attempt:
                _start_local(kwargs)
    except _StartFailed as e:
        raise RayUnavailable(f"a local Ray did not start after {attempts} tries in "
                             f"{time.monotonic() - t0:.0f} s (last: {e}); the machine may be "
                             f"overloaded: try again, or point CAKE_RAY_ADDRESS at a running Ray") from None
    finally:
        os.environ.pop(TREE_ENV, None)
    return dict(ray.cluster_resources())


def ensure_ray(gpus: bool) -> bool:
    """For a flow: connect to Ray unless this process already is (a worker runs flows in a bare process).

    Joins ``CAKE_RAY_ADDRESS`` or ``RAY_ADDRESS`` when set, else starts a local Ray
    (with GPUs only if ``gpus``: this machine's, each declared with its model as
    ``tasks.gpus.local_resources`` names it), which ends with the process. Returns
    True if it connected here.
    """
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("CAKE_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or None
    if address or not gpus:
        start_ray(address, num_gpus=None if gpus else 0)
        return True
    from tasks.gpus import local_gpu_names, local_resources

    names = local_gpu_names()
    start_ray(None, num_gpus=len(names), resources=local_resources(names))
    return True
