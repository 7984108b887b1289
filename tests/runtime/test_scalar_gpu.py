"""scalar on the GPU (marked `gpu`): a gathered row and a loop bounded by a count read from memory agree with
the interpreter element for element on random inputs; a value outside the declared range is clamped into it.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_scalar_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling

pytestmark = pytest.mark.gpu


_here = Path(__file__).parent
_gpu = sibling.load(_here / "test_role_compute_gpu.py")
_ir = sibling.load(_here.parent / "ir" / "test_scalar.py")


def test_a_gathered_row_matches_the_interpreter(tmp_path):
    rng = np.random.default_rng(3)
    M, N, C = 37, 50, 333
    inputs = {"ids": rng.integers(0, N, M).astype(np.int32), "x": rng.normal(size=(N, C)).astype(np.float32)}
    _gpu._agree(_ir.GATHER, {"M": M, "N": N, "C": C}, inputs, tmp_path)


def test_an_index_read_from_shared_memory_matches_the_interpreter(tmp_path):
    rng = np.random.default_rng(6)
    M, N, C = 21, 40, 100
    inputs = {"ids": rng.integers(0, N, (M, 2)).astype(np.int32), "x": rng.normal(size=(N, C)).astype(np.float32)}
    _gpu._agree(_ir.SMEM, {"M": M, "N": N, "C": C}, inputs, tmp_path)


def test_a_loop_bounded_by_counts_read_from_memory_matches_the_interpreter(tmp_path):
    rng = np.random.default_rng(4)
    S, R, C = 9, 11, 32
    cnt = rng.integers(0, R + 1, S).astype(np.int32)
    cnt[0], cnt[1] = 0, R
    inputs = {"cnt": cnt, "x": rng.normal(size=(S, R, C)).astype(np.float32)}
    _gpu._agree(_ir.RAGGED, {"S": S, "R": R, "C": C}, inputs, tmp_path)


def test_a_value_past_its_range_is_clamped_on_the_gpu(tmp_path):
    rng = np.random.default_rng(5)
    M, N, C = 4, 6, 40
    x = rng.normal(size=(N, C)).astype(np.float32)
    ids = np.array([0, N + 5, -3, 2], np.int32)
    got = _gpu._launch(_ir.GATHER, {"M": M, "N": N, "C": C}, {"ids": ids, "x": x}, tmp_path)["y"].reshape(M, C)
    np.testing.assert_array_equal(got, x[np.clip(ids, 0, N - 1)])
