"""Shared by the harness tests: one corpus-gate cache per test session (the corpus replays once)."""
import pytest


@pytest.fixture(scope="session")
def gate_cache():
    from tasks.harness import GATE_CACHE
    return GATE_CACHE
