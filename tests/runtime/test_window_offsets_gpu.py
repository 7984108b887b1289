"""Windows at any offset (``tile(i, n, base=, limit=)``) launched on the GPU (marked `gpu`: run on the GPU machine):
per-segment chunk sums and an in-place scale over ragged segments, fresh random inputs, outputs poisoned, against
numpy.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_window_offsets_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_cpu = sibling.load(_here.parent / "ir" / "test_window_offsets.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")


def _segments(seed: int, n: int, t: int) -> np.ndarray:
    cuts = np.sort(np.random.default_rng(seed).integers(0, t, n - 1))
    return np.concatenate([[0], cuts, [t]]).astype(np.int32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunk_sums_of_ragged_segments(seed, tmp_path):
    T, N = 1000, 7
    cu = _segments(seed, N, T)
    C = int(-(-np.diff(cu).max() // 64))
    x = np.random.default_rng(100 + seed).standard_normal((T, 64)).astype(np.float32)
    y = _gpu._launch(_cpu.SEG_SUMS, {"T": T, "N": N, "C": C}, {"x": x, "cu": cu}, tmp_path)["y"].reshape(N, C, 64)
    for s in range(N):
        lo, hi = cu[s], cu[s + 1]
        for c in range(C):
            if c * 64 < hi - lo:
                np.testing.assert_allclose(y[s, c], x[lo + c * 64:min(hi, lo + c * 64 + 64)].sum(0),
                                           rtol=1e-4, atol=1e-4)
            else:
                assert np.isnan(y[s, c]).all()


def test_a_store_stops_at_the_limit(tmp_path):
    T, N = 1000, 5
    cu = np.array([0, 3, 3, 200, 517, 900], np.int32)          # rows 900.. belong to no segment
    x = np.random.default_rng(7).standard_normal((T, 64)).astype(np.float32)
    y = _gpu._launch(_cpu.SEG_SCALE, {"T": T, "N": N}, {"x": x, "cu": cu}, tmp_path)["y"].reshape(T, 64)
    np.testing.assert_allclose(y[:900], 2 * x[:900], rtol=1e-6)
    assert np.isnan(y[900:]).all()
