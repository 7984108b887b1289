"""trisolve launched on the GPU against the interpreter (and a float64 solve), in the geometries of
tests/lower/test_trisolve.py: a KDA chunk's 64 x 64 UT transform, more columns than threads, ragged sizes, a read
diagonal; fresh random inputs, the output poisoned (marked `gpu`: run on the GPU machine).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_trisolve_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

import sibling

pytestmark = pytest.mark.gpu

_here = Path(__file__).parent
_lowering = sibling.load(_here.parent / "lower" / "test_trisolve.py")
_gpu = sibling.load(_here / "test_role_compute_gpu.py")


@pytest.mark.parametrize("n,m,unit,threads", [(64, 64, True, 128), (64, 256, False, 128), (37, 5, True, 64),
                                              (5, 3, False, 32)])
def test_a_solve_matches_the_interpreter(n, m, unit, threads, tmp_path):
    text = _lowering.kernel(n, m, threads=threads, unit=unit)
    _gpu._agree(text, {}, _lowering.inputs(n, m, n * 7 + m, unit), tmp_path)
