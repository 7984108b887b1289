"""Lowering the warp-specialized GEMM: roles, mbarriers, TMA, wgmma; compiled for sm_90a with nvcc (no GPU)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from ptx import ptx_of
from cake_core.problems import corpus_file

SEED = corpus_file("gemm_bf16_ws.cake").read_text()


def _lower(text: str = SEED):
    return lower(parse_program(text, "gemm_bf16_ws.cake"), "gemm_bf16_ws.cake")


def test_ws_gemm_lowers_with_tensor_maps_and_roles():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    lk = r.value
    assert [(m.gmem, m.box, m.swizzle) for m in lk.tensor_maps] == [("a", (128, 64), 128), ("b", (64, 64), 128)]
    src = lk.source
    assert "__launch_bounds__(384, 1)" in src
    assert "const __grid_constant__ cake::tensor_map cake_tmap_a_0" in src
    assert re.search(r"if \(threadIdx.x < 128u\) \{  // role producer\n#line 7 .*\n\s+cake::setmaxnreg_dec<40>", src)
    assert "else if (threadIdx.x >= 128u && threadIdx.x < 384u) {  // role consumer" in src
    assert "cake::setmaxnreg_inc<232>();" in src
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in src
    assert "cake::mbarrier_wait_parity(&full[(kt % S)], ((kt / S) % 2));" in src
    assert lk.smem_bytes == 98432          # 4 x 16 KiB + 4 x 8 KiB + 8 mbarriers, 128-byte rounded


def test_every_tensor_map_is_prefetched_once_before_the_barriers_are_set_up():
    src = _lower().value.source
    line = "    if (threadIdx.x == THREADS - 1) { cake::prefetch_tensor_map(&cake_tmap_a_0); " \
           "cake::prefetch_tensor_map(&cake_tmap_b_1); }"
    assert src.count("prefetch_tensor_map(") == 2 and line in src
    assert src.index(line) < src.index("cake::mbarrier_init")
    # a kernel without TMA copies has nothing to prefetch
    plain = lower(parse_program(get_problem("gemm_bf16").seed_text(), "s.cake"), "s.cake").value
    assert not plain.tensor_maps and "prefetch_tensor_map" not in plain.source


def test_tcgen05_is_declared_but_not_lowered():
    text = SEED.replace("wgmma(acc,", "tcgen05_mma(acc,")
    r = _lower(text)
    assert r.outcome is Outcome.COMPILE_FAILED
    d = next(d for d in r.diagnostics if d.rule == "lower.unsupported_atom")
    assert d.line == 17


def test_v1_load_inside_a_role_is_refused_at_its_line():
    text = SEED.replace("        store(c[", "        x_s = smem(bf16, (BM, BK))\n        load(x_s, a[tile(bid.y, BM), tile(0, BK)])\n"
                                           "        store(c[")
    r = _lower(text)
    assert any(d.rule == "lower.unsupported_in_role" and d.line == 21 for d in r.diagnostics)


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_ws_gemm_compiles_for_sm_90a_with_wgmma(tmp_path):
    r = compile_kernel(_lower().value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log
    assert "C7508" not in log and "C7510" not in log     # setmaxnreg honoured, wgmma not serialised
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 168
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(r.value.cubin_path)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass and "UTMALDG" in sass


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_ws_gemm_ptx_holds_the_async_instructions(tmp_path):
    lk = _lower().value
    ptx = ptx_of(lk.source, tmp_path)
    for needle in ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d",
                   "mbarrier.try_wait.parity", "setmaxnreg.inc.sync.aligned.u32 232", "wgmma.wait_group.sync.aligned 0",
                   "prefetch.tensormap"):
        assert needle in ptx, needle


# ------------------------------------------------ the m64n256 seed: wide B, wgmma_wait(1), grouped raster

N256 = corpus_file("gemm_bf16_ws_n256.cake").read_text()


def _lower_n256(text: str = N256):
    return lower(parse_program(text, "gemm_bf16_ws_n256.cake"), "gemm_bf16_ws_n256.cake")


def test_n256_seed_splits_b_into_swizzle_span_boxes():
    r = _lower_n256()
    assert r.outcome is Outcome.OK, r.diagnostics
    lk = r.value
    # b's (64, 256) tile is four (64, 64) boxes: one 128-byte swizzle atom wide each
    assert [(m.gmem, m.box, m.swizzle) for m in lk.tensor_maps] == [("a", (128, 64), 128), ("b", (64, 64), 128)]
    src = lk.source
    b_loads = re.findall(r"cake::tma_load_2d\(\(b_s \+ \(\(kt % S\)\) \* 16384\)( \+ \d+)?, &cake_tmap_b_1, [^;]*\* 256"
                         r"( \+ \d+)?, \(kt\) \* 64\);", src)
    assert b_loads == [(" + 0", ""), (" + 4096", " + 64"), (" + 8192", " + 128"), (" + 12288", " + 192")]
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in src
    # N-major descriptor: K advances 16 rows of one 64-column block, LBO steps block to block (64 x 128 B)
    assert "cake::wgmma_desc(cake_b + cake_k * 1024, 8192, 1024, 1)" in src
    assert "float acc[128];" in src and "cake::wgmma_wait<1>();" in src
    # lazily zeroed accumulator: scale-d = 0 on the first wgmma, no fill in front of the pipeline
    assert "int cake_acc_fresh = 1;" in src and '"r"((int)(cake_k > 0 || !cake_acc_fresh))' in src
    assert "if (cake_acc_fresh) cake::fill_rmem(acc, 0.0f);" in src
    assert lk.smem_bytes == 4 * (16384 + 32768) + 128
    assert lk.grid_for({"M": 4096, "N": 4096, "K": 4096}) == (512,)


@pytest.mark.parametrize("bn, ok", [(128, True), (192, True), (96, False)])
def test_wide_b_needs_whole_swizzle_spans(bn, ok):
    r = _lower_n256(N256.replace('"BN": 256', f'"BN": {bn}'))
    assert r.ok is ok, r.diagnostics
    if not ok:
        assert any(d.rule in ("tma.swizzle_span", "lower.unsupported_layout") for d in r.diagnostics)


def test_wide_swizzled_a_is_still_refused_by_the_verifier():
    from cake_core.ir.check import check_text
    assert check_text(N256, "gemm_bf16_ws_n256.cake") == []
    diags = check_text(N256.replace('"BK": 64', '"BK": 128'), "x.cake")
    assert [d.line for d in diags if d.rule == "tma.swizzle_span"] == [11]     # a's load only, not b's
    assert not _lower_n256(N256.replace('"BK": 64', '"BK": 128')).ok


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("bn", [256, 128])
def test_n256_seed_compiles_with_the_wgmma_pipeline_intact(tmp_path, bn):
    lk = _lower_n256(N256.replace('"BN": 256', f'"BN": {bn}')).value
    r = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    # C7508: setmaxnreg ignored; C7510 / C7515: wgmma serialised (C7515 is what an up-front zero fill of the
    # accumulator caused once wgmma_wait(1) let the pipeline span loop trips)
    assert "C7508" not in log and "C7510" not in log and "C7515" not in log, log
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(r.value.cubin_path)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass and "UTMALDG" in sass and "LDL" not in sass
