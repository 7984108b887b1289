"""Shared by the harness tests: one corpus-gate cache per test session (the corpus replays once a session, kept
on disk in the session's cache folder: ``tests/conftest.py``, ``corpus_gate_store``)."""
import pytest


@pytest.fixture(scope="session")
def gate_cache(corpus_gate_store):
    from tasks.harness import GATE_CACHE
    return GATE_CACHE
