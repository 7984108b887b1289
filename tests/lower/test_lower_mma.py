"""mma(acc, a, b, atom="mma_sync"): lowering to mma.sync m16n8k16 + ldmatrix, compile for sm_90a, HMMA in SASS,
and the preconditions as diagnostics at the IR line. (The GPU correctness test is tests/runtime/test_mma_gpu.py.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.lower.context import LowerError
from cake_core.lower.lower_tile import warp_grid
from cake_core.targets import get_arch

SM90 = get_arch("sm_90a")
from cake_core.problems import get_problem

SEED = get_problem("gemm_bf16").seed_text()
MMA_SEED = SEED.replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="mma_sync")')
needs_nvcc = pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")


def _variant(consts: str = '{"BK": 32, "BM": 64, "BN": 64}', threads: int = 256, dtype: str = "bf16",
             extra: str = "", acc_extra: str = "") -> str:
    t = MMA_SEED.replace('consts={"BK": 32, "BM": 64, "BN": 64}', f"consts={consts}")
    t = t.replace("threads=256", f"threads={threads}").replace("bf16", dtype)
    if acc_extra:
        t = t.replace("    acc = rmem(f32, (BM, BN))\n", "    acc = rmem(f32, (BM, BN))\n" + acc_extra)
    if extra:
        t = t.replace("    store(c[", extra + "    store(c[")
    return t


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def _cuobjdump() -> tuple[str | None, dict]:
    """cuobjdump (and an env whose PATH finds nvdisasm beside it), from PATH, the CUDA install or pip's nvidia-*."""
    cands = [shutil.which("cuobjdump")]
    nvcc = compile_mod.nvcc_path()
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent / "cuobjdump"))
    cands.append("/usr/local/cuda/bin/cuobjdump")
    cands += [str(p) for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/*/bin/cuobjdump")]
    for c in cands:
        if c and os.path.exists(c):
            env = {**os.environ, "PATH": f"{Path(c).parent}:{os.environ.get('PATH', '')}"}
            return c, env
    return None, {}


def test_seed_with_mma_sync_lowers_to_tensor_core_helpers():
    r = lower(parse_program(MMA_SEED, "kernel.cake"))
    assert r.ok, [d.message for d in r.diagnostics]
    src = r.value.source
    assert "cake::mma_sync_rmem_smem<64, 64, 32, THREADS, 4, 2>(acc, a_s, b_s)" in src
    assert "cake::store_gmem_mma_acc<64, 64, 64, 64, THREADS, 4, 2, true>" in src
    assert "float acc[16];  // (64, 64) mma_sync fragments, 4x2 warps" in src
    assert "mma_fma_rmem_smem" not in src


def test_warp_grid_choice_and_refusal():
    assert warp_grid((64, 64), 256, "acc", SM90) == (4, 2)          # 16x32 per warp: 1 + 2 ldmatrix per 16 of K
    assert warp_grid((128, 128), 256, "acc", SM90) == (4, 2)        # 32x64: 2 + 4 (vs 64x32: 4 + 2, fewer rows)
    assert warp_grid((64, 24), 128, "acc", SM90) == (4, 1)          # NI = 3: the ldmatrix.x2.trans tail
    assert warp_grid((16, 64), 256, "acc", SM90) == (1, 8)
    with pytest.raises(LowerError) as e:
        warp_grid((24, 64), 256, "acc", SM90)
    assert e.value.rule == "lower.mma_tiling"


@needs_nvcc
@pytest.mark.parametrize("variant", ["seed", "f16", "odd_ni", "fused_ewise", "load_acc"])
def test_mma_sync_compiles_for_sm_90a_with_hmma_in_sass(variant, tmp_path):
    text = {"seed": MMA_SEED,
            "f16": _variant(dtype="f16").replace("c: gmem[f16", "c: gmem[f32"),
            "odd_ni": _variant('{"BK": 16, "BM": 64, "BN": 24}', threads=128),
            "fused_ewise": _variant(extra='    ewise(acc, acc, acc, fn="add")\n'),
            "load_acc": _variant(acc_extra="    load(acc, c[tile(bid.y, BM), tile(bid.x, BN)])\n"),
            }[variant]
    r = lower(parse_program(text, "kernel.cake"))
    assert r.ok, [d.message for d in r.diagnostics]
    cr = compile_kernel(r.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.spill_bytes == 0
    tool, env = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (the GPU machine has it); compiled only")
    sass = subprocess.run([tool, "-sass", str(cr.value.cubin_path)], capture_output=True, text=True, env=env)
    if sass.returncode != 0 and "nvdisasm" in sass.stderr:
        pytest.skip("cuobjdump found but not nvdisasm")
    assert sass.returncode == 0, sass.stderr
    hmma = [ln for ln in sass.stdout.splitlines() if "HMMA.16816.F32" in ln]
    assert hmma, "no HMMA.16816.F32 in the SASS"
    assert all(("BF16" in ln) == (variant != "f16") for ln in hmma)
    assert "LDSM.16.MT88" in sass.stdout       # B through ldmatrix .trans


def _diag(text: str):
    r = lower(parse_program(text, "kernel.cake"))
    assert not r.ok
    return r.diagnostics


def test_k_not_a_multiple_of_16_is_a_diagnostic_at_the_mma_line():
    t = _variant('{"BK": 8, "BM": 64, "BN": 64}')
    (d,) = [d for d in _diag(t) if d.is_error]
    assert d.rule == "lower.mma_tiling" and "multiple of 16" in d.message
    assert d.line == _line_of(t, "mma(acc")


def test_untileable_accumulator_is_a_diagnostic_at_its_rmem_line():
    t = _variant('{"BK": 32, "BM": 24, "BN": 64}')
    ds = [d for d in _diag(t) if d.is_error]
    assert any(d.rule == "lower.mma_tiling" and d.line == _line_of(t, "acc = rmem") for d in ds), ds


def test_other_ops_on_a_fragment_accumulator_are_refused():
    t = _variant(extra="    mma(acc, a_s, b_s)\n")            # an fma mma into the same acc
    ds = [d for d in _diag(t) if d.is_error]
    assert [d.rule for d in ds] == ["lower.acc_layout"]
    assert ds[0].line == _line_of(t, "mma(acc, a_s, b_s)")       # the fma one, not the mma_sync one
    # a reduction reads other threads' slots: refused (store the fragment, or reduce from smem)
    t2 = _variant(acc_extra="    row_s = smem(f32, (BM, 1))\n", extra='    reduce(row_s, acc, axis=1)\n')
    ds2 = [d for d in _diag(t2) if d.is_error]
    assert [d.rule for d in ds2] == ["lower.acc_layout"] and ds2[0].line == _line_of(t2, "reduce(")


def test_elementwise_ops_address_a_fragment_and_smem_at_the_slots_coordinates():
    # smem operands of the fragment's shape are read at the slot's (row, column), broadcast ones at its row or
    # column, and iota writes the coordinates: all through cake::mma_layout::coord, where mma.sync put the slot
    t = _variant(acc_extra="    c_s = smem(f32, (BM, BN))\n    b_s2 = smem(f32, (BM, 1))\n    r_i = rmem(f32, (BM, BN))\n",
                 extra='    ewise(acc, acc, c_s, fn="add")\n    ewise(acc, acc, b_s2, fn="mul")\n'
                       '    iota(r_i, base=0, axis=0)\n    ewise(acc, acc, r_i, fn="add")\n    cast(c_s, acc)\n')
    r = lower(parse_program(t, "kernel.cake"))
    assert r.ok, [d.message for d in r.diagnostics]
    src = r.value.source
    assert src.count("cake::mma_layout<64, 64, THREADS, 4, 2>::coord(cake_s, cake_r, cake_c);") == 5
    assert "const auto cake_b = cake::to_f32(c_s[cake_e]);" in src                  # at the slot's element
    assert "const auto cake_b = cake::to_f32(b_s2[cake_r]);" in src                 # broadcast: its row
    assert "r_i[cake_s] = cake::convert<float>((int)(0) + cake_r);" in src
    assert "c_s[cake_e] = cake::convert<float>(acc[cake_s]);" in src                # smem written at the slot's


def test_f32_operands_lower_to_three_tf32_products_an_atom_and_step_k_by_8():
    t = _variant('{"BK": 8, "BM": 64, "BN": 64}', dtype="f32")
    r = lower(parse_program(t, "kernel.cake"))
    assert r.ok, [d.message for d in r.diagnostics]
    assert "cake::mma_sync_tf32x3_rmem_smem<64, 64, 8, THREADS, 4, 2>(acc, a_s, b_s);" in r.value.source
    assert "cake::mma_sync_rmem_smem<" not in r.value.source
    # f32 steps K by 8, not 16; mixed operand dtypes are still refused
    t12 = _variant('{"BK": 12, "BM": 64, "BN": 64}', dtype="f32")
    errs = [d for d in _diag(t12) if d.is_error]
    assert errs and all(d.rule in ("mma.sync_tiling", "lower.mma_tiling") for d in errs), errs
    assert any("multiple of 8" in d.message or "k8" in d.message for d in errs), errs
    mixed = _variant(dtype="f32").replace("b_s = smem(f32", "b_s = smem(bf16")
    ds = [d for d in _diag(mixed) if d.is_error]
    assert any(d.rule in ("mma.operand_dtype", "lower.unsupported_operand") for d in ds), ds


@needs_nvcc
def test_f32_operands_compile_to_tf32_mma_sync(tmp_path):
    t = _variant('{"BK": 16, "BM": 64, "BN": 64}', dtype="f32")
    from ptx import ptx_of
    lk = lower(parse_program(t, "kernel.cake")).value
    r = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert r.ok, [d.message for d in r.diagnostics]
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0
    ptx = ptx_of(lk.source, tmp_path)
    # per 8 of K: MI x NI atoms of 3 products (64 x 64 over 4 x 2 warps: MI = 1, NI = 4), 2 K-steps of 8
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == 3 * 4 * 2
    assert "cvt.rna.tf32.f32" in ptx


def test_swizzled_operands_are_refused():
    t2 = MMA_SEED.replace("a_s = smem(bf16, (BM, BK))", "a_s = smem(bf16, (BM, BK), swizzle=128)")
    ds2 = [d for d in _diag(t2) if d.is_error]
    assert any(d.rule == "lower.unsupported_layout" for d in ds2), ds2


def test_wgmma_atom_on_mma_is_still_refused():
    t = SEED.replace("mma(acc, a_s, b_s)", 'mma(acc, a_s, b_s, atom="wgmma")')
    ds = [d for d in _diag(t) if d.is_error]
    assert [d.rule for d in ds] == ["lower.unsupported_atom"]
