"""Evidence pieces that travel with a proposal as plain data: IR excerpts, cluster summaries."""
from __future__ import annotations

from typing import Any, Sequence


def excerpt(text: str, lines: Sequence[int], context: int = 2, limit: int = 14) -> str:
    """The lines of ``text`` around ``lines`` (1-based), numbered, the marked ones flagged with ``>``."""
    src = text.splitlines()
    marked = {n for n in lines if 0 < n <= len(src)}
    if not marked:
        return "\n".join(f"  {i + 1:4d} | {s}" for i, s in enumerate(src[:limit]))
    keep = sorted({i for n in marked for i in range(max(1, n - context), min(len(src), n + context) + 1)})
    out, prev = [], None
    for i in keep[:limit]:
        if prev is not None and i != prev + 1:
            out.append("       ...")
        out.append(f"{'>' if i in marked else ' '} {i:4d} | {src[i - 1]}")
        prev = i
    return "\n".join(out)


def cluster_summary(c: dict[str, Any]) -> dict[str, Any]:
    """A failure cluster as evidence shows it (JSON-able: timestamps as ISO text)."""
    keep = ("signature", "stage", "rule", "n_attempts", "n_runs", "n_problems", "gpu_seconds", "first_seen",
            "last_seen")
    return {k: (c[k].isoformat() if hasattr(c.get(k), "isoformat") else c.get(k)) for k in keep if k in c}
