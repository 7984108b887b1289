"""An rmem tile reduced by its owners first (``lower_axis._reduce_partials``), launched on the GPU against the
interpreter in every geometry of tests/lower/test_lower_reduce_rmem.py, for sum, max and min, into smem and rmem
results, on fresh random inputs with the output poisoned (marked `gpu`: run on the GPU machine).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_reduce_rmem_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_lowering = sibling.load(_here.parent / "lower" / "test_lower_reduce_rmem.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")


@pytest.mark.parametrize("dst_space", ["smem", "rmem"])
@pytest.mark.parametrize("fn", ["sum", "max", "min"])
@pytest.mark.parametrize("case", sorted(_lowering.CASES))
def test_a_reduced_rmem_tile_matches_the_interpreter(case, fn, dst_space, tmp_path):
    rows, cols, axis, threads = _lowering.CASES[case]
    if dst_space == "rmem" and (rows == 0 or (cols if axis == 0 else rows) % threads):
        pytest.skip("an rmem result must split evenly over the threads")
    text = _lowering.kernel(rows, cols, axis, threads, fn=fn, dst_space=dst_space)
    rng = np.random.default_rng(sorted(_lowering.CASES).index(case) * 7 + ("sum", "max", "min").index(fn))
    x = (rng.standard_normal((rows, cols) if rows else (cols,)) * 10).astype(np.float32)
    _gpu._agree(text, {}, {"x": x}, tmp_path)
