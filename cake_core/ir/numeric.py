"""Number formats: bf16 values held as float32, as the interpreter, the problems and the runtime store them."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np


def bf16_round(x: Any) -> Any:
    """Round float32 values to the nearest bf16 (ties to even), returned as float32: a numpy array, or a CuPy
    array for a CuPy input (CuPy is never imported here; an input of its type means it is loaded)."""
    xp = sys.modules["cupy"] if type(x).__module__.split(".")[0] == "cupy" else np
    b = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = (b + xp.uint32(0x7FFF) + ((b >> xp.uint32(16)) & xp.uint32(1))) & xp.uint32(0xFFFF0000)
    return rounded.astype(xp.uint32).view(xp.float32)
