"""Lowering the activations, compares, select and iota (smem and rmem tiles, outside roles): the emitted math, an
nvcc compile without warnings, and what the lowering refuses."""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod

MASKED = '''@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=128, consts={"BM": 32, "BN": 64})
def masked(x: gmem[f32, (M, N)], v: gmem[f32, (N,)], o: gmem[f32, (M, N)], m: gmem[i32, (M, N)]):
    x_s = smem(f32, (BM, BN))
    v_s = smem(f32, (BN,))
    row = smem(i32, (BM, BN))
    col = smem(i32, (BM, BN))
    keep = smem(bool, (BM, BN))
    ninf = smem(f32, (BN,))
    t = rmem(f32, (BM, BN), fill=-inf)
    u = rmem(f32, (BM, BN))
    load(x_s, x[tile(bid.y, BM), tile(bid.x, BN)])
    load(v_s, v[tile(bid.x, BN)])
    fill(ninf, value=-inf)
    iota(row, base=bid.y * BM, axis=0)
    iota(col, base=bid.x * BN, axis=1)
    sync()
    ewise(keep, row, col, fn="ge")
    load(t, x[tile(bid.y, BM), tile(bid.x, BN)])
    unary(u, t, fn="sigmoid")
    unary(t, u, fn="silu")
    unary(u, t, fn="softplus")
    unary(t, u, fn="exp2")
    ewise(u, t, v_s, fn="lt")
    sync()
    select(t, keep, t, ninf)
    select(u, u, t, v_s)
    store(o[tile(bid.y, BM), tile(bid.x, BN)], t)
    ewise(row, x_s, v_s, fn="ne")
    sync()
    store(m[tile(bid.y, BM), tile(bid.x, BN)], row)
'''


def _lowered(text: str = MASKED):
    r = lower(parse_program(text, "masked.cake"), "masked.cake")
    assert r.ok, [d.format("masked.cake", text) for d in r.diagnostics]
    return r.value


def test_the_new_elementwise_math_lowers_to_the_header():
    src = _lowered().source
    for snippet in ("cake::sigmoid_f32(cake_x)", "cake::silu_f32(cake_x)", "cake::softplus_f32(cake_x)",
                    "exp2f(cake_x)",
                    "row[cake_e] = cake::convert<int>((int)((((int)blockIdx.y) * BM)) + cake_r);",
                    "col[cake_e] = cake::convert<int>((int)((((int)blockIdx.x) * BN)) + cake_c);",
                    "keep[cake_e] = cake::convert<bool>((cake_a >= cake_b));",
                    "u[cake_s] = cake::convert<float>((cake_a < cake_b));",
                    "t[cake_s] = cake::convert<float>(keep[cake_e] != 0 ? cake::to_f32(t[cake_s]) : "
                    "cake::to_f32(ninf[cake_c]));",
                    "cake::to_f32(u[cake_s]) != 0.0f ?",
                    "cake::fill_rmem(t, __int_as_float(0xff800000));",
                    "ninf[cake_e] = cake::convert<float>(__int_as_float(0xff800000));"):
        assert snippet in src, snippet
    # an f32 compare into an i32 tile compares floats
    assert "const auto cake_a = cake::to_f32(x_s[cake_e]);" in src


def test_a_minus_inf_fill_lowers_from_its_printed_text():
    again = parse_program(parse_program(MASKED).text(), "masked.cake")
    assert "fill=-inf" in again.text() and "value=-inf" in again.text()
    assert lower(again, "masked.cake").ok


def test_iota_into_an_mma_sync_fragment_writes_each_slots_own_coordinates():
    # the fragment layout keeps no element index; iota takes the slot's (row, column) from cake::mma_layout::coord
    # (where mma.sync put it) instead of the default distribution's e = s * THREADS + tid
    text = MASKED.replace("    t = rmem(f32, (BM, BN), fill=-inf)\n",
                          "    t = rmem(f32, (BM, BN), fill=-inf)\n    a_s = smem(bf16, (BM, 16))\n"
                          "    b_s = smem(bf16, (16, BN))\n    mma(t, a_s, b_s, atom=\"mma_sync\")\n"
                          "    iota(t, base=0, axis=1)\n")
    r = lower(parse_program(text, "masked.cake"), "masked.cake")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "iota(t," in ln)
    assert not [d for d in r.diagnostics if d.line == line and d.is_error], r.diagnostics
    src = r.value.source if r.value is not None else ""
    at = src.index("cake_c);", src.index("::coord(cake_s, cake_r, cake_c)"))
    assert "t[cake_s] = cake::convert<float>((int)(0) + cake_c);" in src[at:at + 400]


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_new_elementwise_math_compiles_without_warnings(tmp_path):
    c = compile_kernel(_lowered(), cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert "warning" not in c.artifacts["nvcc.log"].lower(), c.artifacts["nvcc.log"]
