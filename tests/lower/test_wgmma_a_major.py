"""wgmma with an M-major a (``a_major="m"``): a is a (K, M) smem tile, rows along the reduction, and the product
is a^T b (a chunk's keys for K^T V, any A stored transposed). The interpreter computes a^T b; the lowering gives
each warpgroup its own 64-column block with an MN-major descriptor and the transpose-a immediate; the verifier
refuses an M-major a that is no such tile, and the TMA box of a wide one is split into span-wide blocks as for
an N-major b."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program
from cake_core.lower import compile as compile_mod
from cake_core.lower import compile_kernel, lower

ATB = """@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=384, consts={"BK": 64, "BM": 128, "BN": 64, "S": 3})
def gemm_atb(a: gmem[bf16, (K, M)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BK, BM), stages=3, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=3, swizzle=128)
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    with role("producer", warps=(0, 4), regs=40):
        for kt in range(cdiv(K, BK)):
            wait(empty[kt % S], phase=(kt // S + 1) % 2)
            expect_tx(full[kt % S], (BK * BM + BK * BN) * 2)
            tma_load(a_s[kt % S], a[tile(kt, BK), tile(bid.y, BM)], bar=full[kt % S])
            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x, BN)], bar=full[kt % S])
    with role("consumer", warps=(4, 12), regs=232):
        acc = rmem(f32, (BM, BN))
        for kt in range(cdiv(K, BK)):
            wait(full[kt % S], phase=kt // S % 2)
            wgmma(acc, a_s[kt % S], b_s[kt % S], a_major="m")
            wgmma_wait(0)
            arrive(empty[kt % S])
        store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)
"""
SHAPES = [{"M": 128, "N": 64, "K": 64}, {"M": 200, "N": 100, "K": 152}, {"M": 8, "N": 72, "K": 40}]


def inputs(shape: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": bf16_round(rng.normal(size=(shape["K"], shape["M"])).astype(np.float32)),
            "b": bf16_round(rng.normal(size=(shape["K"], shape["N"])).astype(np.float32))}


def test_the_kernel_checks_on_its_shapes():
    assert check_text(ATB, "atb.cake") == []


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "M{M}_N{N}_K{K}".format(**s))
def test_the_interpreter_computes_a_transposed_times_b(shape):
    x = inputs(shape, shape["K"])
    c = np.full((shape["M"], shape["N"]), np.nan, np.float32)
    out = interp.run(parse_program(ATB, "atb.cake"), shape, x, {"c": c})["c"]
    np.testing.assert_allclose(out, x["a"].T.astype(np.float64) @ x["b"], rtol=1e-4, atol=1e-3)


def test_each_warpgroup_reads_its_block_with_the_transpose_immediate():
    src = lower(parse_program(ATB, "atb.cake"), "atb.cake").value.source
    assert "cake_a = (a_s + ((kt % S)) * 8192) + cake_wg * 4096;" in src         # a (64, 128): blocks of 64 x 64
    assert "cake::wgmma_desc(cake_a + cake_k * 1024, 8192, 1024, 1);  // M-major" in src
    asm = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, %32, %33, p, 1, 1, "
                    r"(\d), (\d);", src)
    assert asm and asm.groups() == ("1", "1")                                   # transpose-a 1, N-major b 1
    assert src.count("cake::tma_load_2d(") == 3                                 # a in two span-wide boxes, b in one


@pytest.mark.parametrize("old,new,words", [
    # two warpgroups need 128 columns, one span each
    ('    a_s = smem(bf16, (BK, BM), stages=3, swizzle=128)\n', '    a_s = smem(bf16, (BK, 64), stages=3, swizzle=128)\n',
     ("128 columns", "2 warpgroup")),
    # no swizzle: the M-major descriptor reads 128-byte spans
    ('    a_s = smem(bf16, (BK, BM), stages=3, swizzle=128)\n', '    a_s = smem(bf16, (BK, BM), stages=3)\n',
     ("swizzle=0",)),
], ids=["columns", "unswizzled"])
def test_an_m_major_a_that_is_no_such_tile_is_refused_at_the_wgmma(old, new, words):
    text = ATB.replace(old, new, 1)
    hits = [d for d in check_text(text, "atb.cake") if d.rule == "wgmma.a_major"]
    assert hits and hits[0].line == next(i for i, ln in enumerate(text.splitlines(), 1) if "wgmma(acc" in ln)
    assert all(w in hits[0].message for w in words), hits[0].message


def test_a_register_a_is_read_in_its_own_layout_only():
    text = """@kernel(target="sm_90a", grid=(1,), threads=256)
def k(b: gmem[bf16, (64, 64)], c: gmem[f32, (64, 64)]):
    b_s = smem(bf16, (64, 64), swizzle=128)
    full = mbarrier(1)
    with role("producer", warps=(0, 4)):
        expect_tx(full[0], 64 * 64 * 2)
        tma_load(b_s, b[tile(0, 64), tile(0, 64)], bar=full[0])
    with role("consumer", warps=(4, 8)):
        acc = rmem(f32, (64, 64))
        p = rmem(bf16, (64, 64), fill=1.0)
        wait(full[0], phase=0)
        wgmma(acc, p, b_s, a_major="m")
        wgmma_wait(0)
        store(c[:, :], acc)
"""
    hits = [d for d in check_text(text, "k.cake") if d.rule == "wgmma.a_major"]
    assert hits and "register A is K-major" in hits[0].message


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_it_compiles_for_sm_90a(tmp_path):
    c = compile_kernel(lower(parse_program(ATB, "atb.cake"), "atb.cake").value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0
