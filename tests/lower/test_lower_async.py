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

SEED = (Path(__file__).resolve().parents[2] / "cake_core/problems/seeds/gemm_bf16_ws.cake").read_text()


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
    cu = tmp_path / "k.cu"
    cu.write_text(lk.source)
    out = tmp_path / "k.ptx"
    subprocess.run([compile_mod.nvcc_path(), "-ptx", *compile_mod.arch_flags("sm_90a"), "-std=c++17", "-I",
                    str(compile_mod.HEADER_DIR), "-o", str(out), str(cu)], check=True, capture_output=True)
    ptx = out.read_text()
    for needle in ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d",
                   "mbarrier.try_wait.parity", "setmaxnreg.inc.sync.aligned.u32 232", "wgmma.wait_group.sync.aligned 0"):
        assert needle in ptx, needle
