"""Shared by the harness tests: one corpus-gate cache per test session (the corpus replays once), kept on disk in
the session's cache folder beside the reviews of the flow tests (``tests/conftest.py``: ``compile_cache``)."""
import pytest


@pytest.fixture(scope="session")
def gate_cache(compile_cache):
    from cake_core.harness.gate_store import GateStore
    from tasks.harness import GATE_CACHE
    GATE_CACHE.store = GateStore(compile_cache / "gate")
    return GATE_CACHE
