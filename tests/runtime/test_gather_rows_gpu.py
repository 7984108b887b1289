"""gather on the GPU (marked `gpu`): rows picked by index (padding rows and a ragged column tail included) and the
grouped GEMM over rows gathered by expert (an empty group, one with every row) agree with the interpreter on
random inputs.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_gather_rows_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling

from cake_core.ir import interp
from cake_core.ir.text import parse_program

pytestmark = pytest.mark.gpu


_here = Path(__file__).parent
_gpu = sibling.load(_here / "test_role_compute_gpu.py")
_ir = sibling.load(_here.parent / "ir" / "test_gather.py")


def test_picked_rows_match_the_interpreter(tmp_path):
    rng = np.random.default_rng(7)
    P, N, C, R = 60, 33, 77, 50
    perm = rng.integers(-2, N + 2, P).astype(np.int32)          # a few indices outside the tensor: zero rows
    inputs = {"perm": perm, "x": rng.normal(size=(N, C)).astype(np.float32)}
    _gpu._agree(_ir.PICK, {"P": P, "N": N, "C": C, "R": R}, inputs, tmp_path)


@pytest.mark.parametrize("sizes", [(0, 9, 20, 3), (20, 0, 0, 1), (17, 17, 5, 0)])
def test_the_grouped_gemm_over_gathered_rows_matches_the_interpreter(tmp_path, sizes):
    shape, inputs, want = _ir.grouped_case(np.random.default_rng(sum(sizes)), sizes=sizes)
    zero = np.zeros((shape["P"], shape["N"]), np.float32)
    # y accumulates (scatter_add): uploaded zeroed as an input, fetched back after the launch
    got = _gpu._launch(_ir.GROUPED, shape, {**inputs, "y": zero}, tmp_path, fetch=("y",))["y"]
    ref = interp.run(parse_program(_ir.GROUPED), shape, inputs, {"y": zero.copy()})["y"]
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-4)
