"""Processes left behind by a test: every live process whose environment carries the test's marker."""
from __future__ import annotations

import os
from pathlib import Path


def marked(marker: str) -> list[int]:
    """Pids of the live (not zombie) processes whose environment holds ``marker`` (``NAME=value``)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    with open(f"/proc/{d}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                            pids.append(int(d))
            except OSError:
                continue
    return pids


def described(pids: list[int]) -> str:
    """Each pid with its command line, for a failure message that says what was left."""
    out = []
    for p in pids:
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "(gone)"
        out.append(f"{p}: {cmd[:200]}")
    return "; ".join(out)
