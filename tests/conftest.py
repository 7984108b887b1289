"""Made once per test session, read by the tests of several folders (each copies what it would change).

BLAS runs on one thread in the tests and in every process they start (Ray workers, `cake` subprocesses):
the interpreter's products are small (a 128x64 tile by a 64x128 one), and OpenBLAS's threads spinning
against each other on a busy 2-core machine made one of them cost 1-15 ms instead of 0.04 ms.
Ray workers run on this interpreter as they are, never through `uv run`.

Python keeps its bytecode caches in the tests and in every process they start: with PYTHONDONTWRITEBYTECODE set
(as on the machines here) each Ray worker, `cake` subprocess, Prefect server and flow-run process compiled
every module it imports from source again, a third of the CPU a flow test used. The caches are written where
Python writes them (``__pycache__``, ignored by git; the venv's packages), atomically, by whichever process
imports a module first.
"""
import contextlib
import fcntl
import os
import shutil
import socket
import sys
import warnings
from pathlib import Path

import pytest

if "numpy" in sys.modules:   # too late for the variable to take effect here: say so rather than run slow
    warnings.warn("numpy was imported before tests/conftest.py could run BLAS on one thread; "
                  "set OPENBLAS_NUM_THREADS=1 for this run", stacklevel=1)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)     # for the processes the tests start
sys.dont_write_bytecode = False                     # for this one, from the test modules' imports on
# Every Ray the tests start runs as `cake` runs one (tasks.ray_runtime.RAY_ENV), set before anything imports
# Ray (collection does, and Ray reads some of these at import): under `uv run pytest` Ray would otherwise
# start each worker through `uv run` in a copy of the working tree with a venv of its own, and a bare
# ray.init (tests/runtime/test_pool.py) would turn on token auth in this process's environment, which every
# Ray and `cake` started after it in the same process inherited: their workers never started.
os.environ.update({k: os.environ.get(k, v) for k, v in {
    "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "RAY_ENABLE_AUTO_CONNECT": "0"}.items()})

sys.path.insert(0, str(Path(__file__).resolve().parent / "core"))   # harness_runs: real CPU runs


def _session_dir(tmp_path_factory, name: str) -> Path:
    """A folder of this test session that every pytest-xdist worker sees (the workers' temporary folders share a
    parent); without workers, one of this process's."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp(name)
    shared = tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    return shared


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (made if missing) across the session's processes."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """One nvcc cubin cache for every Cake home a test makes (entries are keyed by source hash and written
    atomically, so homes and processes share it safely); the same seeds are not compiled once per home, nor
    once per pytest-xdist worker. Its ``gate/`` is the corpus gate's store (``cake_core.harness.gate_store``)
    of every home whose ``cache/`` is this folder: the corpus replays once a session, not once a worker."""
    return _session_dir(tmp_path_factory, "cubin-cache")


@pytest.fixture(scope="session")
def corpus_gate_store(compile_cache) -> Path:
    """The corpus gate's store in the session's cache folder (``compile_cache/gate``) holding the replay of every
    kernel file of the corpus under the built-in harness: made once a session by whichever worker asks first,
    under a lock (the others wait, then read it rather than replay the corpus beside it). Also this process's
    ``tasks.harness.GATE_CACHE`` store, as a review of a home whose ``cache/`` is the session's makes it."""
    from cake_core.harness.gate import corpus, replay
    from cake_core.harness.gate_store import GateStore, code_fingerprint
    from cake_core.harness.version import HarnessSpec
    from tasks.harness import GATE_CACHE

    store = compile_cache / "gate"
    GATE_CACHE.store = GateStore(store)
    with _locked(compile_cache / "gate.lock"):
        done = store / f"replayed-{code_fingerprint()}"
        if not done.exists():
            replay(corpus(), HarnessSpec(), HarnessSpec(), GATE_CACHE)
            done.touch()
    return store


@pytest.fixture
def share_compile_cache(compile_cache):
    """A function that points a Cake home's ``cache/`` at the session's compile cache (before its first use)."""
    def share(home: Path) -> Path:
        home.mkdir(parents=True, exist_ok=True)
        (home / "cache").symlink_to(compile_cache, target_is_directory=True)
        return home
    return share


@pytest.fixture(scope="session")
def mined_warehouse_once(tmp_path_factory) -> Path:
    """The warehouse of ``harness_runs.mined_runs`` (cold-start CPU runs of knn_topk, kmeans_assign and
    gemm_bf16, 4 generations of 8): made once per session by whichever worker asks first (the others wait for
    it); a test copies it before it writes."""
    from harness_runs import mined_runs
    shared = _session_dir(tmp_path_factory, "mined-once")
    root, done = shared / "warehouse", shared / "made"
    with _locked(shared / "lock"):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)      # a worker that died while making it
            mined_runs(root)
            done.touch()
    return root


# ---------------------------------------------------------------- one Prefect server and one Ray per worker
# Every test that needs the services shares this one fixture (a second copy would start a second server and
# point PREFECT_API_URL at it under the first one's tests).
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def services(tmp_path_factory, compile_cache):
    from cake_cli.config import load_settings
    from cake_cli.services import prefect_server, ray_runtime

    home = tmp_path_factory.mktemp("cake-home")
    (home / "cache").symlink_to(compile_cache, target_is_directory=True)   # the session's cubins
    port = _free_port()
    env = {"CAKE_HOME": str(home), "CAKE_PREFECT_PORT": str(port), "CAKE_GPU": "off"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = load_settings()
    with prefect_server(settings) as server, ray_runtime(settings, num_gpus=0):
        yield {"home": home, "api_url": server.api_url, "port": port, "settings": settings}
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
