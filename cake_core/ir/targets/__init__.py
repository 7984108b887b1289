"""``load_target``: an architecture's data as a plain dict, for callers that read keys.

The data and its one loader live in :mod:`cake_core.targets` (typed, frozen :class:`~cake_core.targets.Arch`
records); new code asks for those. This keeps ``load_target(arch)["smem_per_cta_bytes"]`` working.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from cake_core.targets import find_arch, known_archs


def known_targets() -> list[str]:
    return known_archs()


def load_target(arch: str) -> dict[str, Any] | None:
    """The data of ``arch`` as the JSON file holds it (None for an unknown arch)."""
    a = find_arch(arch)
    if a is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(a).items()}
