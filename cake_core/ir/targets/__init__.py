"""Architecture limits as data: one JSON file per arch (``sm_90a.json``, ``sm_100a.json``).

The verifier reads resource, TMA and MMA limits from here, never from literals;
``runs_here`` says whether this workplace can run (not only compile) the arch.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

_DIR = Path(__file__).resolve().parent


def known_targets() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


@lru_cache(maxsize=None)
def load_target(arch: str) -> dict[str, Any] | None:
    path = _DIR / f"{arch}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())
