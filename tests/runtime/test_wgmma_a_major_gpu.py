"""wgmma with an M-major a (a^T b) launched on the GPU against float64 (marked `gpu`: run on the GPU machine):
tile-multiple and ragged shapes, fresh random inputs, the output poisoned.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_wgmma_a_major_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling
from cake_core.runtime.tma import TMARefused

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_lowering = sibling.load(_here.parent / "lower" / "test_wgmma_a_major.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")


# TMA reads a and b: each global row a multiple of 16 B (M and N multiples of 8); the CPU tests' ragged
# M=200, N=100 becomes N=104 here, and N=100 itself is refused before launch (below)
GPU_SHAPES = ([s for s in _lowering.SHAPES if s["M"] % 8 == 0 and s["N"] % 8 == 0]
              + [{"M": 200, "N": 104, "K": 152}, {"M": 1024, "N": 512, "K": 1000}])


@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "M{M}_N{N}_K{K}".format(**s))
def test_a_transposed_times_b(shape, tmp_path):
    x = _lowering.inputs(shape, shape["M"] + shape["K"])
    got = _gpu._launch(_lowering.ATB, shape, x, tmp_path)["c"].reshape(shape["M"], shape["N"])
    want = x["a"].T.astype(np.float64) @ x["b"].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_a_row_stride_tma_cannot_copy_is_refused_before_launch(tmp_path):
    shape = {"M": 200, "N": 100, "K": 152}
    with pytest.raises(TMARefused, match=r"`b` \(bf16, \(152, 100\)\).*N % 8 == 0"):
        _gpu._launch(_lowering.ATB, shape, _lowering.inputs(shape, 1), tmp_path)
