"""What is left of a local Ray once it is shut down or abandoned — a worker's orphaned nvcc, a daemon's straggling
worker — is killed: every live process carrying the Ray's own environment entry, whoever its parent is now;
nothing else."""
from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

import tasks.ray_runtime as rr
from tasks.processes import alive, carrying, parents


def _orphan(env: dict[str, str], script: str) -> int:
    """Start ``script`` under a shell that exits at once, so that it is re-parented; its pid."""
    out = subprocess.run(["sh", "-c", f"({script}) >/dev/null 2>&1 & echo $!"], env=env, capture_output=True,
                         text=True, start_new_session=True, check=True)
    return int(out.stdout.strip())


@pytest.fixture
def tree(monkeypatch):
    entry = f"{rr.TREE_ENV}={uuid.uuid4().hex}"
    monkeypatch.setattr(rr, "_TREE", {"entry": entry.encode()})
    return {**os.environ, rr.TREE_ENV: entry.split("=", 1)[1]}


def test_marked_orphans_are_killed_and_unmarked_processes_are_not(tree):
    marked = _orphan(tree, "sleep 300")
    other = _orphan({k: v for k, v in tree.items() if k != rr.TREE_ENV}, "sleep 300")
    try:
        assert alive(marked) and alive(other)
        assert rr.sweep_local_ray() >= 1
        assert not alive(marked)
        assert alive(other)
        assert rr.sweep_local_ray() == 0     # swept once: the entry is gone with it
    finally:
        for p in (marked, other):
            subprocess.run(["kill", "-9", str(p)], capture_output=True)


def test_a_process_that_keeps_starting_others_leaves_none_behind(tree):
    """Each is stopped before any is killed, so none can start another in between."""
    _orphan(tree, "while :; do sleep 300 & sleep 0.02; done")
    time.sleep(0.3)
    assert len(carrying(rr._TREE["entry"])) >= 3
    entry = rr._TREE["entry"]
    assert rr.sweep_local_ray() >= 3
    time.sleep(0.3)
    assert carrying(entry) == set()


def test_a_child_without_the_entry_goes_with_its_marked_parent(tree):
    """Ray starts its agents with an environment of their own: below a marked process, they are Ray's too."""
    parent = _orphan(tree, f"env -u {rr.TREE_ENV} sleep 300 & wait")
    time.sleep(0.3)
    child = next(c for c, q in parents().items() if q == parent)
    assert child not in carrying(rr._TREE["entry"]) and child in rr.local_ray_processes()
    assert rr.sweep_local_ray() == 2
    assert not alive(parent) and not alive(child)


def test_what_was_seen_before_the_shutdown_is_swept_though_orphaned_since(tree):
    unmarked = _orphan({k: v for k, v in tree.items() if k != rr.TREE_ENV}, "sleep 300")
    assert rr.sweep_local_ray({unmarked}) == 1
    assert not alive(unmarked)


def test_without_a_local_ray_nothing_is_swept(monkeypatch):
    monkeypatch.setattr(rr, "_TREE", {})
    assert rr.sweep_local_ray() == 0
