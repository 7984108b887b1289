"""The processes of this machine, read from /proc: whether one still runs, who started whom, killing a set."""
from __future__ import annotations

import os
import signal
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


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that is still there (and ours to kill)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
