"""Lowering Cake IR to CUDA C++: the op table, the generated source, lowering-time diagnostics."""
from __future__ import annotations

import pytest

from cake_core.ir.ops import REGISTRY, Op
from cake_core.ir.text import parse_program
from cake_core.lower import LOWERINGS, LoweredKernel, lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem

SEED = get_problem("gemm_bf16").seed_text()


def _seed(**replace: str):
    text = SEED
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return parse_program(text, "kernel.cake")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_every_op_has_a_lowering():
    missing = [op.value for op in REGISTRY if op not in LOWERINGS]
    assert not missing, f"ops without a lowering: {missing}"


def test_seed_lowers_to_a_kernel_with_the_ir_signature():
    r = lower(_seed())
    assert r.outcome is Outcome.OK, r.diagnostics
    lk: LoweredKernel = r.value
    src = lk.source
    assert lk.kernel_name == "gemm_bf16" and lk.threads == 256
    assert lk.dims == ("M", "K", "N")                 # order of first appearance in the param shapes
    assert lk.smem_bytes == 8192                      # (64x32 + 32x64) bf16, 128-byte aligned
    assert [a.written for a in lk.params] == [False, False, True]
    assert ('extern "C" __global__ void __launch_bounds__(256) gemm_bf16(const __nv_bfloat16* __restrict__ a, '
            'const __nv_bfloat16* __restrict__ b, float* __restrict__ c, int M, int K, int N)') in src
    assert "constexpr int BM = 64;" in src and "constexpr int THREADS = 256;" in src
    assert "extern __shared__ __align__(1024) unsigned char cake_smem[];" in src
    assert "for (int kt = 0; kt < cake_cdiv(K, BK); ++kt) {" in src
    assert "__syncthreads();" in src and "cake::mma_fma_rmem_smem<64, 64, 32, THREADS>(acc, a_s, b_s);" in src
    # every generated statement line is preceded by a #line directive naming its IR line
    lines = src.splitlines()
    mma_at = next(i for i, ln in enumerate(lines) if "mma_fma_rmem_smem" in ln)
    assert lines[mma_at - 1] == f'#line {_line_of(SEED, "mma(")} "kernel.cake"'
    assert lk.grid_for({"M": 130, "N": 70, "K": 50}) == (2, 3)


def test_unsupported_atom_is_reported_at_its_line():
    r = lower(_seed(**{"mma(acc, a_s, b_s)": 'mma(acc, a_s, b_s, atom="wgmma")'}))
    assert r.outcome is Outcome.COMPILE_FAILED
    (d,) = r.errors
    assert d.rule == "lower.unsupported_atom" and "not lowered yet" in d.message
    assert d.line == _line_of(SEED, "mma(") and d.path == "for[kt].mma"


def test_unknown_name_in_an_index_is_reported_at_its_line():
    r = lower(_seed(**{"a[tile(bid.y, BM), tile(kt, BK)]": "a[tile(bid.y, BQ), tile(kt, BK)]"}))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert [(d.rule, d.line) for d in r.errors] == [("lower.unknown_name", _line_of(SEED, "load(a_s"))]
    assert "BQ" in r.errors[0].message


def test_all_lowering_errors_are_collected():
    r = lower(_seed(**{"mma(acc, a_s, b_s)": 'mma(acc, a_s, b_s, atom="wgmma")',
                       "store(c[": "store(d["}))
    assert sorted(d.rule for d in r.errors) == ["lower.unknown_name", "lower.unsupported_atom"]


def test_rmem_that_does_not_split_over_threads_is_refused():
    r = lower(_seed(**{"acc = rmem(f32, (BM, BN))": "acc = rmem(f32, (BM, 3))"}))
    assert "lower.rmem_distribution" in [d.rule for d in r.errors]


def test_reserved_names_are_refused():
    r = lower(_seed(**{"acc": "int"}))
    assert "lower.reserved_name" in [d.rule for d in r.errors]


ROWS = '''@kernel(target="sm_90a", grid=(cdiv(N, 128), B), threads=128)
def rows(x: gmem[f32, (B, N)], y: gmem[bf16, (B, N)], z: gmem[f32, (B, N)]):
    r = rmem(f32, (128,), fill=ninf)
    load(r, x[bid.y, tile(bid.x, 128)])
    store(y[bid.y, tile(bid.x, 128)], r)
    s = smem(f32, (1, 128))
    load(s, x[bid.y, tile(bid.x, 128)], guard=False)
    sync()
    for i in range(2, unroll=2):
        store(z[bid.y, tile(bid.x, 128)], s, guard=False)
'''


def test_rank1_windows_dropped_dims_and_conversions_lower():
    r = lower(parse_program(ROWS, "rows.cake"), "rows.cake")
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert "cake::load_rmem_gmem<1, 128, THREADS, true>(r, x + ((cake::index_t)(((int)blockIdx.y))" in src
    assert "cake::store_gmem_rmem<1, 128, THREADS, true>(y" in src
    assert "cake::load_smem_gmem<1, 128, THREADS, false>(s" in src
    assert "cake::fill_rmem(r, __int_as_float(0xff800000));" in src
    assert "#pragma unroll 2" in src and '#line 4 "rows.cake"' in src
    assert r.value.dims == ("B", "N")
