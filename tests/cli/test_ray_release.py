"""How a stopped run lets go of Ray: disconnect once the flow thread has ended; under a flow thread still alive,
kill the local Ray's processes and leave the connection (a disconnect under a thread inside a Ray call ends the
process from inside Ray); nothing for a Ray it joined. After that, the runtime's own shutdown does nothing."""
from __future__ import annotations

import sys
import types

import pytest

from cake_cli import evolve_run, services


@pytest.fixture
def calls(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(services, "_ABANDONED", services.threading.Event())
    import tasks.ray_runtime as rr
    monkeypatch.setattr(rr, "_TREE", {})     # the session's own Ray (tests/conftest.py) is not swept
    node = types.SimpleNamespace(kill_all_processes=lambda **kw: seen.append(f"kill {sorted(kw.items())}"))
    worker = types.SimpleNamespace(_global_node=node)
    private = types.SimpleNamespace(worker=worker)
    fake_ray = types.SimpleNamespace(shutdown=lambda **kw: seen.append("shutdown"), _private=private)
    for name, mod in (("ray", fake_ray), ("ray._private", private), ("ray._private.worker", worker)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(evolve_run, "abandon_ray", services.abandon_ray)
    monkeypatch.setattr(evolve_run, "shutdown_ray", services.shutdown_ray)
    return seen


def test_an_ended_flow_thread_lets_ray_disconnect(calls):
    evolve_run._releaser(True)(False)
    assert calls == ["shutdown"]


def test_a_live_flow_thread_gets_the_processes_killed_and_no_disconnect_ever(calls):
    evolve_run._releaser(True)(True)
    assert calls == ["kill [('allow_graceful', False), ('check_alive', False), ('wait', True)]"]
    services.shutdown_ray()              # the ray_runtime context's own exit, later
    assert calls == ["kill [('allow_graceful', False), ('check_alive', False), ('wait', True)]"]


def test_a_ray_this_process_joined_is_left_alone(calls):
    evolve_run._releaser(False)(True)
    evolve_run._releaser(False)(False)
    assert calls == []
