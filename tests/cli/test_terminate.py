"""The stop handler of Ctrl-C and SIGTERM: an interrupt that arrives while a finalizer runs is counted, not raised
(raised there, Python prints it as "Exception ignored" with a traceback and drops it); anywhere else it raises."""
from __future__ import annotations

import signal
import sys

import pytest

from cake_cli import evolve_run


@pytest.fixture
def handler(monkeypatch):
    monkeypatch.setattr(evolve_run, "_SIGNALS", [])
    monkeypatch.setattr(evolve_run, "_quiet_prefect_console", lambda level=None: None)
    return evolve_run.terminate


def test_inside_a_finalizer_the_signal_is_counted_and_the_finalizer_ends(handler):
    ended = []

    class Held:
        def __del__(self):
            handler(signal.SIGINT, sys._getframe())     # where the signal interrupted the main thread
            ended.append(True)

    held = Held()
    del held
    assert ended == [True] and evolve_run._SIGNALS == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        evolve_run._raise_if_signalled()                 # the run's next check stops it


def test_anywhere_else_it_raises(handler):
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGTERM, sys._getframe())
    assert evolve_run._SIGNALS == [signal.SIGTERM]
