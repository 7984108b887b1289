"""The persistent GEMM seeds through the runtime's correctness gate on the H200 (marked `gpu`; correctness only,
no timing assertions): gemm_bf16_persistent.cake, and gemm_bf16_persistent_mc.cake (2-CTA clusters, B multicast). CPU parts: the interpreter (tests/ir/test_persistent.py)
and compile-only nvcc (tests/lower/test_lower_persistent.py).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_gemm_persistent.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ("gemm_bf16_persistent.cake", "gemm_bf16_persistent_mc.cake")
GEMM = get_problem("gemm_bf16")
# ragged against 128 x 256 x 64 tiles (N, K multiples of 8 for TMA's 16-byte strides); few tiles (fewer CTAs
# than SMs) and many (several tiles per CTA, K / BK odd and even so ring phases cross tiles both ways)
RAGGED = [{"M": 128, "N": 256, "K": 64}, {"M": 64, "N": 8, "K": 8}, {"M": 200, "N": 72, "K": 136},
          {"M": 129, "N": 264, "K": 520}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72},
          {"M": 300, "N": 1000, "K": 24}, {"M": 4000, "N": 2056, "K": 200}]


def _aligned_shapes() -> list[dict]:
    """gemm_aligned.csv (held_out row included), 8192^3 left out (its fp64 CPU oracle alone takes minutes)."""
    s = GEMM.shape_set("gemm_aligned")
    shapes = [dict(x) for x in s.shapes if max(x.values()) < 8192]
    assert {"M": 3000, "N": 5000, "K": 2056} in shapes and {"M": 4096, "N": 4096, "K": 4096} in shapes
    return shapes


@pytest.fixture(scope="module", params=SEEDS)
def built(request, tmp_path_factory):
    text = corpus_file(request.param).read_text()
    lk = lower(parse_program(text, request.param), request.param)
    assert lk.ok, lk.diagnostics
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path_factory.mktemp("cubins"))
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.metrics["spill_bytes"] == 0
    return cr.value, lk.value


@pytest.mark.gpu
def test_persistent_seed_passes_the_gate_on_ragged_shapes(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = built
    runs = check_and_time(compiled, lk, GEMM, RAGGED, seed=21, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
def test_persistent_seed_passes_the_gate_on_the_aligned_set(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = built
    runs = check_and_time(compiled, lk, GEMM, _aligned_shapes(), seed=22, time=False, timeout_s=30)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.max_error < GEMM.rtol for r in runs)
