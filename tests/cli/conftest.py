"""Every CLI test runs in an empty directory with no CAKE_* variables but CAKE_HOME."""
from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture(autouse=True)
def clean_cake_env(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("CAKE_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    yield tmp_path


@pytest.fixture
def free_port():
    """A function that returns a TCP port nothing listens on right now."""
    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    return pick


@pytest.fixture(autouse=True)
def logging_back_on():
    """`cake evolve` turns logging off once a stopped run has said what it recorded; undo it between tests."""
    import logging

    yield
    logging.disable(logging.NOTSET)
