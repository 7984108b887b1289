"""Why a kernel cannot run here at all: raised before any launch, so nothing is recorded as run."""
from __future__ import annotations

from cake_core.errors import CakeError


class GPURefused(CakeError):
    """The kernel cannot run on this machine (compile-only target, wrong GPU, no GPU)."""
