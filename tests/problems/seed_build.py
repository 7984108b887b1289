"""A problem's naive seed lowered and compiled, for the problem tests that check it builds (nvcc where present)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cake_core.ir.text import parse_program


def lowered_seed(problem: Any) -> Any:
    """The seed's LoweredKernel (the lowering must succeed)."""
    from cake_core.lower import lower

    name = problem.seed_file
    lr = lower(parse_program(problem.seed_text(), name), name)
    assert lr.ok, [d.format(name) for d in lr.diagnostics]
    return lr.value


def compiled_seed(problem: Any, cache_dir: Path) -> Any:
    """The seed compiled for sm_90a (skips the test where nvcc is not installed): its Compiled."""
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel

    lowered = lowered_seed(problem)
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    cr = compile_kernel(lowered, arch="sm_90a", cache_dir=cache_dir)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value
