"""mma(atom="mma_sync") on f32 operands (three tf32 products an m16n8k8 atom, 3xTF32) on the GPU: fp32-level
accuracy on random fp32 inputs (not bf16-rounded ones, whose small halves would be zero) at ragged shapes, and
the same accumulator layout as the 16-bit atom (marked `gpu`). The CPU checks are in tests/lower/test_lower_mma.py.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_mma_tf32_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.problems import get_problem
from test_role_compute_gpu import _launch

pytestmark = pytest.mark.gpu

SEED = get_problem("gemm_bf16").seed_text().replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')


def _kernel(consts: str, threads: int) -> str:
    return SEED.replace("bf16", "f32").replace('consts={"BK": 32, "BM": 64, "BN": 64}', f"consts={consts}") \
        .replace("threads=256", f"threads={threads}")


@pytest.mark.parametrize("consts,threads,shape", [
    ('{"BK": 16, "BM": 64, "BN": 64}', 256, {"M": 100, "N": 72, "K": 40}),
    ('{"BK": 8, "BM": 32, "BN": 64}', 128, {"M": 33, "N": 130, "K": 300}),
    ('{"BK": 32, "BM": 64, "BN": 24}', 128, {"M": 64, "N": 24, "K": 1000}),
], ids=["64x64x16", "32x64x8", "64x24x32"])
def test_f32_mma_sync_keeps_fp32_accuracy(consts, threads, shape, tmp_path):
    rng = np.random.default_rng(7)
    m, n, k = shape["M"], shape["N"], shape["K"]
    # magnitudes over 2^-4 .. 2^4 a row: a tf32-only product (10 mantissa bits) is off by about 1e-3 relative
    a = (rng.standard_normal((m, k)) * np.exp2(rng.uniform(-4, 4, (m, 1)))).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = _launch(_kernel(consts, threads), shape, {"a": a, "b": b}, tmp_path)["c"].reshape(m, n)
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)      # the products' magnitude per element
    err = np.abs(got - want) / scale
    assert np.isfinite(got).all(), "an output element was never written (NaN poison)"
    # fp32 accumulation of K products: about K * 2^-24 of the magnitude at worst; tf32 alone: about 2^-11
    assert err.max() < max(k, 16) * 2.0 ** -24 * 4, f"max error {err.max():.3g} of the products' magnitude"


def test_elementwise_ops_on_mma_sync_fragments_match_the_interpreter(tmp_path):
    # iota, compare, select with an smem scalar, a row-broadcast smem factor, a cast into smem and back: each
    # addresses the fragment's slots at cake::mma_layout::coord; an element at the wrong (row, column) is off by ~1
    from test_role_compute_gpu import _agree
    text = _kernel('{"BK": 16, "BM": 64, "BN": 64}', 256).replace(
        "    acc = rmem(f32, (BM, BN))\n",
        "    acc = rmem(f32, (BM, BN))\n    r_i = rmem(f32, (BM, BN))\n    c_j = rmem(f32, (BM, BN))\n"
        "    mask = rmem(f32, (BM, BN))\n    zero = smem(f32, (1, 1))\n    rowf = smem(f32, (BM, 1))\n"
        "    c_s = smem(f32, (BM, BN))\n    fill(zero)\n    iota(rowf, base=1, axis=0)\n").replace(
        "    store(c[",
        "    iota(r_i, base=0, axis=0)\n    iota(c_j, base=0, axis=1)\n    ewise(mask, r_i, c_j, fn=\"gt\")\n"
        "    select(acc, mask, acc, zero)\n    ewise(acc, acc, rowf, fn=\"mul\")\n    cast(c_s, acc)\n    sync()\n"
        "    ewise(acc, acc, c_s, fn=\"add\")\n    store(c[")
    rng = np.random.default_rng(3)
    shape = {"M": 100, "N": 72, "K": 40}
    inputs = {"a": rng.standard_normal((100, 40)).astype(np.float32),
              "b": rng.standard_normal((40, 72)).astype(np.float32)}
    # atol: the products are three tf32 products an atom (about 2^-21 relative each); the row factor (up to 64)
    # and the doubling scale a cancelling sum of 40 of them to errors near 2e-4 on this draw (the H100 run of
    # 2026-12-08); an element at the wrong (row, column) is off by ~1 or more
    _agree(text, shape, inputs, tmp_path, atol=2e-3)
