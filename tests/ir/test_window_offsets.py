"""Windows at any offset: ``tile(i, n, base=b, limit=l)`` (elements [b + i*n, b + i*n + n), those at l or past
it outside the window): text, interpreter, checker, domain, lowering and nvcc."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.domain import domain_violations, extent_limit
from cake_core.ir.ops import Tile
from cake_core.ir.printer import print_program
from cake_core.ir.text import IRSyntaxError, parse_program
from cake_core.ir.verify import verify
from cake_core.lower import compile as compile_mod
from cake_core.lower import compile_kernel, lower
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file

# per segment of rows [cu[s], cu[s + 1]) of x, per chunk c of BT rows: the column sums of the chunk's rows
SEG_SUMS = """@kernel(target="sm_90a", grid=(cdiv(T, BT), N), threads=128, consts={"BT": 64, "D": 64})
def seg_sums(x: gmem[f32, (T, D)], cu: gmem[i32, (N + 1,)], y: gmem[f32, (N, C, D)]):
    x_s = smem(f32, (BT, D))
    part = smem(f32, (1, D))
    scalar(bos, cu[bid.y], max=T)
    scalar(eos, cu[bid.y + 1], max=T)
    if bid.x * BT < eos - bos:
        load(x_s, x[tile(bid.x, BT, base=bos, limit=eos), :])
        sync()
        reduce(part, x_s, axis=0)
        sync()
        store(y[bid.y, tile(bid.x, 1), :], part)
"""
# every row of each segment's chunks scaled by 2 in place
SEG_SCALE = """@kernel(target="sm_90a", grid=(cdiv(T, BT), N), threads=128, consts={"BT": 64, "D": 64})
def seg_scale(x: gmem[f32, (T, D)], cu: gmem[i32, (N + 1,)], y: gmem[f32, (T, D)]):
    x_s = smem(f32, (BT, D))
    scalar(bos, cu[bid.y], max=T)
    scalar(eos, cu[bid.y + 1], max=T)
    if bid.x * BT < eos - bos:
        load(x_s, x[tile(bid.x, BT, base=bos, limit=eos), :])
        sync()
        ewise(x_s, x_s, x_s)
        sync()
        store(y[tile(bid.x, BT, base=bos, limit=eos), :], x_s)
"""
CU = np.array([0, 5, 5, 70, 200], np.int32)     # an empty segment, one of 65 rows (a chunk and one row), 130
T, N, C = 200, 4, 4


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((T, 64)).astype(np.float32)


def _sums(text, x):
    y = np.full((N, C, 64), np.nan, np.float32)
    interp.run(parse_program(text), {"T": T, "N": N, "C": C}, {"x": x, "cu": CU}, {"y": y})
    return y


def test_the_text_round_trips_and_a_bad_keyword_is_refused_at_its_place():
    p = parse_program(SEG_SUMS)
    assert parse_program(print_program(p)) == p
    (t, _) = next(n for n in p.body if n.op.value == "if").body[0].args[1].index[:1] + (None,)
    assert isinstance(t, Tile) and t.offset and str(t.limit.name) == "eos"
    assert "tile(bid.x, BT, base=bos, limit=eos)" in print_program(p)
    for bad, what in (("limit=eos), :])", "limit=eos, start=0), :])"), ("limit=eos), :])", "limit=eos, limit=T), :])")):
        with pytest.raises(IRSyntaxError, match=r"parse\.attr.*tile takes base= and limit="):
            parse_program(SEG_SUMS.replace(bad, what, 1))


def test_a_load_reads_zeros_past_the_limit_and_the_chunks_start_at_the_base():
    x = _x()
    y = _sums(SEG_SUMS, x)
    for s in range(N):
        lo, hi = CU[s], CU[s + 1]
        for c in range(C):
            if c * 64 < hi - lo:
                np.testing.assert_allclose(y[s, c], x[lo + c * 64:min(hi, lo + c * 64 + 64)].sum(0), rtol=1e-5)
            else:
                assert np.isnan(y[s, c]).all()         # a chunk past the segment's end is never stored
    # without limit= the last chunk of segment 2 (rows 69..132) takes 63 rows of segment 3 as well
    loose = _sums(SEG_SUMS.replace(", limit=eos", ""), x)
    assert not np.allclose(loose[2, 1], y[2, 1])


def test_a_store_skips_the_rows_past_the_limit():
    x, cu = _x(1), np.array([0, 5, 5, 70, 150], np.int32)       # rows 150.. belong to no segment

    def scaled(text):
        y = np.full((T, 64), np.nan, np.float32)
        interp.run(parse_program(text), {"T": T, "N": N}, {"x": x, "cu": cu}, {"y": y})
        return y

    y = scaled(SEG_SCALE)
    np.testing.assert_allclose(y[:150], 2 * x[:150], rtol=1e-6)
    assert np.isnan(y[150:]).all()                               # the last chunk (rows 134..197) stopped at 150
    # without it a chunk's zeros land on the next segment's rows: a race with that segment's CTA, found as one
    loose = SEG_SCALE.replace("store(y[tile(bid.x, BT, base=bos, limit=eos)", "store(y[tile(bid.x, BT, base=bos)")
    with pytest.raises(interp.InterpFault, match=r"CTAs \(0, 0, 0\) and \(0, 2, 0\) both store `y`\[5, 0\].*"
                                                 r"a race between CTAs"):
        scaled(loose)


def test_the_checker_refuses_an_offset_window_where_the_op_cannot_honour_it():
    assert [d for d in verify(parse_program(SEG_SUMS)) if d.is_error] == []
    unguarded = SEG_SUMS.replace("limit=eos), :])", "limit=eos), :], guard=False)")
    (d,) = [d for d in verify(parse_program(unguarded)) if d.is_error]
    assert d.rule == "shapes.offset_window" and "guard=False drops" in d.message and d.line == 8
    ws = corpus_file("kmeans_assign_ws.cake").read_text().replace(
        "tma_load(x_s[0], x[bid.y, tile(bid.x, BM), tile(0, BK)]",
        "tma_load(x_s[0], x[bid.y, tile(bid.x, BM, limit=N), tile(0, BK)]")
    tma = [d for d in verify(parse_program(ws)) if d.rule == "shapes.offset_window"]
    assert len(tma) == 1 and "a TMA box cannot start at base= or stop at limit=" in tma[0].message
    (low,) = [d for d in lower(parse_program(ws)).diagnostics if d.is_error]
    assert low.rule == "lower.tma_window"


def test_a_window_offset_by_a_value_read_from_memory_bounds_no_dimension():
    p = parse_program(SEG_SUMS)
    assert extent_limit(p, "x", 0, {"T": 10**6, "N": 4, "C": 4}) is None
    assert domain_violations(p, {"T": 10**6, "N": 4, "C": 4}) == []
    # a static base and index: the window's static end (its second chunk after row 3), a bound past it
    static = parse_program(SEG_SUMS.replace("tile(bid.x, BT, base=bos", "tile(1, BT, base=3"))
    assert extent_limit(static, "x", 0, {"T": 500, "N": 4, "C": 4}) == 3 + 64 + 64
    (d,) = domain_violations(static, {"T": 500, "N": 4, "C": 4})
    assert d.rule == "domain.extent" and "T = 500 > 131" in d.message and "tile(1, BT, base=3, limit=eos)" in d.message


def test_the_lowering_starts_at_the_base_and_bounds_rows_by_the_limit_and_compiles():
    r = lower(parse_program(SEG_SUMS), "seg_sums.cake")
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    line = next(ln for ln in src.splitlines() if "cake::load_smem_gmem" in ln)
    assert "x + ((cake::index_t)(bos + (((int)blockIdx.x) * BT))" in line
    assert "(min((cake::index_t)(T), (cake::index_t)(eos)) - (bos + (((int)blockIdx.x) * BT)))" in line
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    c = compile_kernel(r.value, arch="sm_90a", cache_dir=None)
    assert c.outcome is Outcome.OK, [d.message for d in c.diagnostics]
