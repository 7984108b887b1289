"""The processes of this machine, read from /proc: whether one still runs, who started whom, killing a set."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterable


def alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie has exited: it holds no port, file or GPU context any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def parents() -> dict[int, int]:
    """pid -> parent pid of every process on this machine."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                out[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(roots: int | Iterable[int]) -> set[int]:
    """Every process below ``roots`` (a pid or several), not the roots themselves."""
    frontier = {roots} if isinstance(roots, int) else set(roots)
    tree, found = parents(), set()
    while frontier:
        frontier = {c for c, p in tree.items() if p in frontier and c not in found}
        found |= frontier
    return found


def carrying(entry: bytes) -> set[int]:
    """Every live process of this user, other than this one, whose environment holds ``entry`` (``NAME=value``)."""
    found, me, uid = set(), os.getpid(), os.getuid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            if os.stat(f"/proc/{d}").st_uid == uid and entry in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                found.add(int(d))
        except OSError:
            continue
    return {p for p in found if alive(p)}


def send(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` that is still there (and ours to signal)."""
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that is still there (and ours to kill)."""
    send(pids, signal.SIGKILL)
