"""Who uses the Prefect server of a Cake home: a record of the server and one lease per user.

Layout under ``<home>/services/``::

    registry.lock            held while a process reads or changes the registry
    prefect-server.json      the server Cake started for this home: pid, port, API URL, who started it
    leases/<pid>.lease       one per process using that server, flock-held for the process's life

A lease is alive while its file is locked: the kernel drops the lock when its
process exits, ``kill -9`` included, so a dead user is told apart from a live
one without trusting pids (which are reused). The last user to leave stops the
server; a server whose starter was killed keeps running until the next user
reuses it knowingly and, being last, stops it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REGISTRY_WAIT_S = 180.0    # another process may be starting the server while holding the registry


@dataclass(frozen=True)
class ServerRecord:
    """The Prefect server Cake started for a home."""

    pid: int            # the server's process (leader of its own process group)
    host: str
    port: int
    api_url: str
    started_by: int     # pid of the process that started it
    started_at: float   # time.time()

    def alive(self) -> bool:
        """True while the recorded process exists and is still a Prefect server (pids are reused)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(b"prefect" in part for part in cmdline) and b"server" in cmdline


class Lease:
    """This process's use of the home's server; :meth:`release` (or process exit) ends it."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None


class Registry:
    """The server record and leases of one Cake home.

    Parameters
    ----------
    home
        The Cake home; the registry lives in ``home/services``.
    """

    def __init__(self, home: Path):
        self.dir = Path(home) / "services"
        self.leases_dir = self.dir / "leases"
        self.record_path = self.dir / "prefect-server.json"

    @contextlib.contextmanager
    def locked(self) -> Iterator[Registry]:
        """Hold the registry (blocking: another process may be starting the server) for a change."""
        self.leases_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "registry.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            deadline = time.monotonic() + REGISTRY_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.dir / 'registry.lock'} stayed locked for "
                                           f"{REGISTRY_WAIT_S:.0f} s") from None
                    time.sleep(0.1)
            yield self
        finally:
            os.close(fd)

    def take_lease(self) -> Lease:
        """A lease for this process (call with the registry held)."""
        return Lease(self.leases_dir / f"{os.getpid()}-{time.monotonic_ns()}.lease")

    def live_leases(self, prune: bool = True) -> list[int]:
        """Pids of the processes whose lease is held; leases of dead processes are deleted."""
        alive = []
        for path in sorted(self.leases_dir.glob("*.lease")):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    alive.append(int(path.name.split("-", 1)[0]))
                    continue
                if prune:  # nobody holds it: its process is gone
                    path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return alive

    def read(self) -> ServerRecord | None:
        """The recorded server, or None (no record, or one that cannot be read)."""
        try:
            data = json.loads(self.record_path.read_text())
            return ServerRecord(**data)
        except (OSError, ValueError, TypeError):
            return None

    def write(self, record: ServerRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_name(f".{self.record_path.name}.tmp")
        tmp.write_text(json.dumps(asdict(record), indent=1) + "\n")
        os.replace(tmp, self.record_path)

    def clear(self) -> None:
        self.record_path.unlink(missing_ok=True)
