"""tma_load(..., rows=R): only the first R rows of the box land, in the slot's first R rows, and only their
bytes count. The rule tma.rows passes and fails for the right reasons; expect_tx and the protocol checker count
R rows; the interpreter leaves the slot's other rows as they were, so tinygemm_rows (8 or 16 rows of A at small
M) matches the oracle and a version that cuts too many rows does not; the lowering cuts the tensor map's box."""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile as compile_mod
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

WS = corpus_file("gemm_bf16_ws.cake").read_text()
ROWS = corpus_file("tinygemm_rows.cake").read_text()
ROW_PROGRAMS = ("tinygemm_rows.cake", "tinygemm_cluster2_rows.cake")   # no split; split-K over clusters of 2
LOAD_A = "tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])"
EXPECT = "expect_tx(full[kt % S], (BM * BK + BK * BN) * 2)"
TINY = get_problem("tinygemm")


def _rules(text: str) -> list[str]:
    return [d.rule for d in check_text(text, "r.cake")]


def test_rows_with_matching_expect_tx_passes():
    text = WS.replace(LOAD_A, LOAD_A.replace("])", "], rows=64)")).replace(EXPECT, EXPECT.replace("BM * BK", "64 * BK"))
    assert _rules(text) == []


@pytest.mark.parametrize("attr, why", [("rows=12", "not a positive multiple of 8"),
                                       ("rows=128", "not below the slot's 128 rows"),
                                       ("rows=64, multicast=1", "rows with multicast")])
def test_the_rows_rule_says_what_is_wrong(attr, why):
    text = WS.replace(LOAD_A, LOAD_A.replace("])", f"], {attr})"))
    hits = [d for d in check_text(text, "r.cake") if d.rule == "tma.rows"]
    assert hits and why in hits[0].message, [d.message for d in check_text(text, "r.cake")]


def test_expect_tx_and_the_protocol_count_only_the_rows_that_land():
    # the whole box announced, 64 of its 128 rows copied: the barrier would never complete
    text = WS.replace(LOAD_A, LOAD_A.replace("])", "], rows=64)"))
    rules = _rules(text)
    assert "mbarrier.expect_tx" in rules and "protocol.tx_mismatch" in rules
    d = next(d for d in check_text(text, "r.cake") if d.rule == "mbarrier.expect_tx")
    assert "announces 24576 B" in d.message and "land 16384 B" in d.message   # 64 of a's 128 rows, and b


@pytest.mark.parametrize("name", ROW_PROGRAMS)
def test_the_rows_programs_match_the_oracle_at_every_branch_in_the_interpreter(name):
    text = corpus_file(name).read_text()
    assert check_text(text, name) == []
    # K = 200: 4 K tiles, the last ragged; split over 2 CTAs of a cluster, 2 tiles each
    shapes = [{"M": m, "N": 136, "K": 200} for m in (1, 8, 9, 16, 17, 64, 70)]     # N: TMA's 8-element rows
    checks = check_on_cpu(parse_program(text, name), TINY, shapes, seed=4)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_cutting_more_rows_than_m_leaves_unwritten_rows_in_the_result():
    # 8 rows of A for M up to 16: rows 8..M-1 of the slot hold what smem held (NaN in the interpreter)
    wrong = ROWS.replace("(16 * BK + BK * BN) * 2", "(8 * BK + BK * BN) * 2").replace("rows=16)", "rows=8)")
    assert wrong != ROWS and check_text(wrong, "w.cake") == []
    (ok,) = check_on_cpu(parse_program(wrong, "w.cake"), TINY, [{"M": 8, "N": 64, "K": 128}], seed=4)
    (bad,) = check_on_cpu(parse_program(wrong, "w.cake"), TINY, [{"M": 13, "N": 64, "K": 128}], seed=4)
    assert ok.correct and not bad.correct, bad.message


def test_the_lowering_cuts_the_tensor_maps_box():
    lr = lower(parse_program(ROWS, "t.cake"), "t.cake")
    assert lr.ok, [d.format("t.cake") for d in lr.diagnostics]
    boxes = sorted(m.box for m in lr.value.tensor_maps if m.gmem == "a")
    assert boxes == [(8, 64), (16, 64), (64, 64)]


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ROW_PROGRAMS)
def test_the_rows_programs_compile_for_sm_90a(name, tmp_path):
    lr = lower(parse_program(corpus_file(name).read_text(), name), name)
    c = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0


def test_the_protocol_checker_runs_the_branches_on_small_m():
    # the M <= 8 branch fills only b: the consumer's wgmma reads an a slot no copy filled. Every static rule
    # passes it (the branch's expect_tx matches its one box); only a simulation at M <= 8 sees it
    bad = ROWS.replace("""                expect_tx(full[i % S], (8 * BK + BK * BN) * 2)
                tma_load(a_s[i % S], a[tile(bid.y, BM), tile(i, BK)], bar=full[i % S], rows=8)
""", """                expect_tx(full[i % S], (BK * BN) * 2)
""")
    assert bad != ROWS
    d = [d for d in check_text(bad, "b.cake") if d.is_error]
    assert [x.rule for x in d] == ["protocol.read_before_ready"] and "a_s" in d[0].message
