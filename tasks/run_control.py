"""A run's life in the warehouse: begun (and held), asked to stop, sealed, ended with a status.

- :class:`RunLock` is a run's one lock: an flock on ``locks/run-<id>.lock`` in
  the warehouse, held by the process that runs it and dropped by the kernel when
  that process dies, ``kill -9`` included; :func:`mark_crashed` marks the runs
  still ``running`` whose lock nobody holds as ``crashed``.
- :func:`begin_run` marks crashed runs, takes the run's lock and records it
  ``running``.
- :func:`request_stop` (Ctrl-C, SIGTERM) asks a run to stop: the next write of
  its attempts (:func:`writing`), the actor pool's next poll and the flow's
  next stage raise :class:`RunCancelled` instead of going on;
  :func:`request_stop_all` asks it of every run of the process.
- :func:`seal` ends every write of a run: after it returns nothing of that run
  is written any more, so a count taken then is final.
- :func:`end_run` records the final status (``completed``, ``failed``,
  ``cancelled``) unless the run was sealed, and releases the lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cake_core.errors import CakeError
from cake_core.pipeline.plan import ResumeRefused


class RunCancelled(CakeError):
    """The run was asked to stop (Ctrl-C, SIGTERM, a cancelled flow run)."""


@dataclass
class _Control:
    stop: threading.Event = field(default_factory=threading.Event)
    sealed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)   # held by each write and by seal


_CONTROLS: dict[str, _Control] = {}
_CONTROLS_LOCK = threading.Lock()
_STOP_ALL = threading.Event()      # every run of this process asked to stop (a command running several in turn)


def _control(run_id: str) -> _Control:
    with _CONTROLS_LOCK:
        return _CONTROLS.setdefault(run_id, _Control())


def request_stop(run_id: str) -> None:
    """Ask ``run_id`` to stop at its next write, poll or stage."""
    _control(run_id).stop.set()


def request_stop_all() -> None:
    """Ask every run of this process, those running and those it starts later, to stop (``cake portfolio``'s
    Ctrl-C: its regions run one after another, and an interrupt a caller swallowed must not let one go on)."""
    _STOP_ALL.set()


def clear_stop_all() -> None:
    """Forget :func:`request_stop_all` (a command starting its runs afresh in a process that ran others)."""
    _STOP_ALL.clear()


def stop_requested(run_id: str) -> bool:
    """True once :func:`request_stop` was called for ``run_id`` (or :func:`request_stop_all` for every run)."""
    return _STOP_ALL.is_set() or _control(run_id).stop.is_set()


def raise_if_stopped(run_id: str) -> None:
    """Raise :class:`RunCancelled` if ``run_id`` was asked to stop."""
    if stop_requested(run_id):
        raise RunCancelled(f"run {run_id} was stopped")


@contextlib.contextmanager
def writing(run_ids: Iterable[str]) -> Iterator[None]:
    """Hold the runs' write lock around one write; raise :class:`RunCancelled` (writing nothing) if stopped."""
    ids = sorted(set(run_ids))
    controls = [_control(r) for r in ids]
    with contextlib.ExitStack() as stack:
        for c in controls:
            stack.enter_context(c.lock)
        for r, c in zip(ids, controls):
            if c.stop.is_set() or c.sealed or _STOP_ALL.is_set():
                raise RunCancelled(f"run {r} was stopped; nothing more of it is written")
        yield


def seal(run_id: str) -> None:
    """Stop ``run_id`` and wait for a write in progress: afterwards nothing of it is written."""
    c = _control(run_id)
    c.stop.set()
    with c.lock:
        c.sealed = True


def sealed(run_id: str) -> bool:
    return _control(run_id).sealed


def forget(run_id: str) -> None:
    """Drop the run's stop state (a process that runs many flows, such as a test session)."""
    with _CONTROLS_LOCK:
        _CONTROLS.pop(run_id, None)


def status_for(exc: BaseException | None, run_id: str | None = None) -> str:
    """The warehouse status of a run that ended with ``exc`` (None: completed).

    A run asked to stop is ``cancelled`` whatever it ended with: its workers may
    have been shut down under it.
    """
    if exc is None:
        return "completed"
    # A worker's cancellation of a flow run arrives as Prefect's TerminationSignal (SIGTERM).
    if isinstance(exc, (RunCancelled, KeyboardInterrupt)) or type(exc).__name__ == "TerminationSignal":
        return "cancelled"
    return "cancelled" if run_id is not None and stop_requested(run_id) else "failed"


# ---------------------------------------------------------------- the run's lock and crashed runs


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class RunLock:
    """The lock of run ``run_id``: an exclusive flock on ``<warehouse>/locks/run-<run_id>.lock`` holding this
    process's pid, released by :meth:`release` or when the process ends, however it ends.

    Raises
    ------
    ResumeRefused
        Another process holds it: that process is running the run now.
    """

    def __init__(self, warehouse_root: str | Path, run_id: str):
        self.path = Path(warehouse_root) / "locks" / f"run-{run_id}.lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 100, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ResumeRefused(f"run `{run_id}` is being run right now (by {holder}); wait for it to end, or "
                                f"stop it before resuming") from None
        # the file stays when released: a process that opened it meanwhile must lock this file, not a new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None


def mark_crashed(warehouse_root: str | Path) -> list[str]:
    """Record ``crashed`` for every run still ``running`` whose process is gone; returns their ids.

    Only runs with a lock file are judged (their process took one); a lock file
    that can be locked has no living owner.
    """
    from warehouse import Warehouse

    locks = Path(warehouse_root) / "locks"
    orphans: list[tuple[str, int, Path]] = []
    for path in sorted(locks.glob("run-*.lock")) if locks.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        orphans.append((path.name[len("run-"):-len(".lock")], fd, path))
    if not orphans:
        return []
    try:
        wh = Warehouse(warehouse_root)
        ids = [r for r, _, _ in orphans]
        rows = wh.query("select * from runs_latest where status = 'running' and list_contains(?, run_id)",
                        [ids]).to_pylist()
        if rows:
            wh.append("runs", [{**{k: v for k, v in r.items() if k != "recorded_at"}, "status": "crashed",
                                "finished_at": _now()} for r in rows])
        return [r["run_id"] for r in rows]
    finally:
        for _, fd, path in orphans:
            path.unlink(missing_ok=True)
            os.close(fd)


def record_cancelled(warehouse_root: str | Path, run_id: str) -> bool:
    """After :func:`seal`: record ``cancelled`` unless the run already has a final status; True if recorded."""
    from warehouse import Warehouse

    root = Path(warehouse_root)
    if not (root / "SCHEMA_VERSION").exists():
        return False
    wh = Warehouse(root)
    rows = wh.query("select * from runs_latest where run_id = ? and status = 'running'", [run_id]).to_pylist()
    if not rows:
        return False
    wh.append("runs", [{**{k: v for k, v in rows[0].items() if k != "recorded_at"}, "status": "cancelled",
                        "finished_at": _now()}])
    return True


def begin_run(warehouse_root: str | Path, row: dict[str, Any]) -> RunLock:
    """Mark crashed runs, lock ``row['run_id']`` and record it ``running``; returns the lock."""
    from warehouse import Warehouse

    mark_crashed(warehouse_root)
    lock = RunLock(warehouse_root, row["run_id"])
    Warehouse(warehouse_root).append("runs", [{**row, "status": "running"}])
    return lock


def end_run(warehouse_root: str | Path, lock: RunLock | None, row: dict[str, Any], status: str) -> None:
    """Record the run's final ``status`` (nothing if it was sealed) and release its lock."""
    from warehouse import Warehouse

    c = _control(row["run_id"])
    try:
        with c.lock:
            if not c.sealed:   # sealed: whoever sealed it recorded the status
                Warehouse(warehouse_root).append("runs", [{**row, "status": status,
                                                           "finished_at": row.get("finished_at") or _now()}])
    finally:
        if lock is not None:
            lock.release()
