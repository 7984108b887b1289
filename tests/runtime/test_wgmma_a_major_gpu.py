"""wgmma with an M-major a (a^T b) launched on the GPU against float64 (marked `gpu`: run on the GPU machine):
tile-multiple and ragged shapes, fresh random inputs, the output poisoned.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_wgmma_a_major_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_lowering = sibling.load(_here.parent / "lower" / "test_wgmma_a_major.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")


@pytest.mark.parametrize("shape", _lowering.SHAPES + [{"M": 1024, "N": 512, "K": 1000}],
                         ids=lambda s: "M{M}_N{N}_K{K}".format(**s))
def test_a_transposed_times_b(shape, tmp_path):
    x = _lowering.inputs(shape, shape["M"] + shape["K"])
    got = _gpu._launch(_lowering.ATB, shape, x, tmp_path)["c"].reshape(shape["M"], shape["N"])
    want = x["a"].T.astype(np.float64) @ x["b"].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
