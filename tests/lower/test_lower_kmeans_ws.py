"""Lowering kmeans_assign_ws: K-major wgmma b, argmin_bias on the accumulator fragment and its quad-merged
store; compiled for sm_90a with nvcc (no GPU)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from ptx import ptx_of
from cake_core.problems import corpus_file

SEED = corpus_file("kmeans_assign_ws.cake").read_text()
# variants of the best-known program: persistent CTAs (x double-buffered across tiles); two consumer warpgroup
# roles taking turns on the tensor cores (ping-pong); and that with centroid tiles multicast to a 2-CTA cluster;
# and the one for D up to 512 (x resident in 8 slots, centroids streamed in 64-column chunks)
VARIANTS = ["kmeans_assign_ws", "kmeans_assign_persistent", "kmeans_assign_pingpong", "kmeans_assign_pingpong_mc",
            "kmeans_assign_ws_deep"]
C_B = "c_b = smem(bf16, (BN, BK), stages=4, swizzle=128)"


def _lower(text: str = SEED):
    return lower(parse_program(text, "kmeans_assign_ws.cake"), "kmeans_assign_ws.cake")


def test_kmeans_ws_lowers_with_k_major_b_and_the_fused_argmin():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    lk = r.value
    assert [(m.gmem, m.box, m.swizzle) for m in lk.tensor_maps] == [
        ("x", (1, 128, 64), 128), ("c", (1, 128, 64), 128), ("c_sq", (1, 128), 0)]
    src = lk.source
    # K-major b: descriptor like a's, transpose-b immediate 0; accumulate=False: scale-d 0 on the first k step
    assert "cake_db = cake::wgmma_desc(cake_b + cake_k * 16, 16, 1024, 1);  // K-major, 128B: 128 rows of 64" in src
    assert src.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 4
    assert src.count("p, 1, 1, 0, 0;") == 4 and "p, 1, 1, 0, 1;" not in src
    assert src.count('"r"((int)(cake_k > 0)));') == 2
    assert "float best[2];" in src and "int arg[2];" in src
    assert src.count("cake::argmin_bias_rmem_wgmma_acc<128>(best, arg, acc") == 2
    assert "cake::store_gmem_rowstate<1>(" in src
    assert lk.smem_bytes == 166016        # x 2 x 16 KiB, c 8 x 16 KiB, c_sq 4 x 512 B, mbarriers


def test_n_major_b_keeps_the_transpose_flag():
    src = lower(parse_program(corpus_file("gemm_bf16_ws.cake")
                              .read_text())).value.source
    assert "p, 1, 1, 0, 1;" in src and "p, 1, 1, 0, 0;" not in src


def test_k_major_b_of_two_spans_is_refused_at_its_line():
    r = _lower(SEED.replace(C_B, C_B.replace("(BN, BK)", "(BN, 2 * BK)")))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.rule == "lower.unsupported_layout" and d.line == 39 for d in r.diagnostics), r.diagnostics


def test_row_state_of_the_wrong_shape_is_refused():
    r = _lower(SEED.replace("best = rmem(f32, (BM,), fill=inf)", "best = rmem(f32, (BM // 2,), fill=inf)"))
    assert any(d.rule == "lower.shape_mismatch" and d.line == 31 for d in r.diagnostics), r.diagnostics


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", VARIANTS)
def test_kmeans_ws_compiles_for_sm_90a_with_the_wgmma_pipeline_intact(tmp_path, name):
    lowered = lower(parse_program(corpus_file(f"{name}.cake").read_text(), f"{name}.cake"), f"{name}.cake")
    assert lowered.outcome is Outcome.OK, lowered.diagnostics
    r = compile_kernel(lowered.value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log
    # setmaxnreg honoured; wgmma not serialised (C7514: the epilogue reads an accumulator in flight)
    for code in ("C7508", "C7510", "C7514", "C7515"):
        assert code not in log, log
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(r.value.cubin_path)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass and "UTMALDG" in sass and "SHFL.BFLY" in sass


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_kmeans_ws_ptx_holds_the_quad_merge(tmp_path):
    ptx = ptx_of(_lower().value.source, tmp_path)
    for needle in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "cp.async.bulk.tensor.3d",
                   "cp.async.bulk.tensor.2d", "shfl.sync.bfly.b32", "wgmma.wait_group.sync.aligned 2"):
        assert needle in ptx, needle


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_kmeans_unaligned_compiles_with_cp_async_on_the_mbarrier(tmp_path):
    # the TMA-free producer (rows not 16-byte aligned): cp.async chunks into the swizzled slots, completing on
    # the stage's mbarrier; consumers fence the async proxy after their waits
    lowered = lower(parse_program(corpus_file("kmeans_assign_unaligned.cake").read_text(), "u.cake"), "u.cake")
    assert lowered.outcome is Outcome.OK, lowered.diagnostics
    assert not lowered.value.tensor_maps
    src = lowered.value.source
    assert src.count("cake::cp_async_bar_smem_gmem<64, 64, true, 128, 1>(") == 4
    assert src.count("cake::cp_async_bar_smem_gmem<128, 64, true, 128, 1>(") == 4
    assert src.count("cake::cp_async_bar_smem_gmem<1, 128, false, 128, 1>(") == 2
    assert src.count("cake::fence_async();") == 6
    res = _compiled_clean(lowered.value, tmp_path)
    assert res.spill_bytes == 0 and res.stack_bytes == 0


def _compiled_clean(lowered, tmp_path):
    """The resources of a kernel that compiles for sm_90a with setmaxnreg honoured and wgmma not serialised."""
    r = compile_kernel(lowered, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    for code in ("C7508", "C7510", "C7514", "C7515"):
        assert code not in log, log
    return r.value.resources


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_256_point_tile_seed_compiles_with_four_accumulators_per_consumer_and_no_spills(tmp_path):
    lowered = lower(parse_program(corpus_file("kmeans_assign_unaligned_m256.cake").read_text(), "m.cake"), "m.cake")
    assert lowered.outcome is Outcome.OK, lowered.diagnostics
    src = lowered.value.source
    assert src.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 16   # 2 roles x 4 acc x 2 halves
    assert src.count("cake::wgmma_wait<6>();") == 2 and src.count("cake::cp_async_bar_smem_gmem<64, 64, true, 128, 1>(") == 12
    res = _compiled_clean(lowered.value, tmp_path)
    assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.smem_bytes <= 232448
