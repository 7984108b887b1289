"""@kernel(ctas_per_sm=N): the header keyword (parsed, printed, refused when malformed), the
resources.ctas_per_sm rule (a passing program and one failing for each reason), and the lowering's
__launch_bounds__(threads, N) with the register cap ptxas then keeps."""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse, parse_program
from cake_core.ir.verify import verify
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file

RED4 = corpus_file("kmeans_update_red4.cake").read_text()
D3 = corpus_file("kmeans_update_red4_d3.cake").read_text()


def _with(text: str, n: int) -> str:
    return text.replace("threads=256, consts", f"threads=256, ctas_per_sm={n}, consts", 1)


def _rules(text: str) -> list[str]:
    return sorted({d.rule for d in verify(parse_program(text)) if d.is_error})


def test_the_keyword_round_trips_and_a_program_without_it_prints_as_before():
    p = parse_program(_with(RED4, 3))
    assert p.ctas_per_sm == 3 and "threads=256, ctas_per_sm=3, consts=" in p.text()
    assert parse_program(p.text()) == p
    assert parse_program(RED4).ctas_per_sm == 0 and parse_program(RED4).text() == RED4


@pytest.mark.parametrize("value", ["0", "-2", '"3"', "2.5", "N"])
def test_a_malformed_value_is_refused_at_the_header(value):
    r = parse(RED4.replace("threads=256, consts", f"threads=256, ctas_per_sm={value}, consts", 1), "x.cake")
    assert not r.ok and any(d.rule == "parse.kernel" and "ctas_per_sm" in d.message for d in r.diagnostics)


def test_a_program_that_fits_passes():
    assert _rules(_with(RED4, 4)) == [] and _rules(D3) == []


def test_more_threads_than_an_sm_holds_are_refused():
    text = _with(RED4, 9)                                           # 9 x 256 = 2304 > 2048
    assert _rules(text) == ["resources.ctas_per_sm"]
    msg = next(d.message for d in verify(parse_program(text)) if d.rule == "resources.ctas_per_sm")
    assert "2304 threads" in msg


def test_more_shared_memory_than_an_sm_has_is_refused():
    smem = corpus_file("kmeans_update_smem.cake").read_text()          # ~210 KB per CTA
    head, rest = smem.split("\n", 1)
    text = head.replace(", consts=", ", ctas_per_sm=2, consts=", 1) + "\n" + rest
    assert "ctas_per_sm=2" in text and "resources.ctas_per_sm" not in _rules(smem)
    msg = next(d.message for d in verify(parse_program(text)) if d.rule == "resources.ctas_per_sm")
    assert "B of shared memory" in msg


def test_setmaxnreg_roles_are_refused_with_more_than_one_cta():
    ws = corpus_file("gemm_bf16_ws.cake").read_text()
    head, rest = ws.split("\n", 1)
    two = head.replace(", consts=", ", ctas_per_sm=2, consts=", 1) + "\n" + rest
    one = head.replace(", consts=", ", ctas_per_sm=1, consts=", 1) + "\n" + rest
    assert "resources.ctas_per_sm" in _rules(two) and "resources.ctas_per_sm" not in _rules(one)
    r = lower(parse_program(two), "ws.cake")                          # the lowering refuses it on its own too
    assert r.outcome is Outcome.COMPILE_FAILED and any(d.rule == "lower.ctas_per_sm" for d in r.diagnostics)


def test_register_tiles_above_the_cap_are_refused():
    big = RED4.replace('"BN": 16, "TPC": 32', '"BN": 128, "TPC": 4')    # two (128, 128) bf16 tiles: 128 regs
    assert _rules(_with(big, 1)) == []
    assert _rules(_with(big, 4)) == ["resources.ctas_per_sm"]         # 65536 / 1024 threads = 64 per thread


def test_the_lowering_emits_the_bound():
    src = lower(parse_program(_with(RED4, 4)), "r.cake").value.source
    assert "__launch_bounds__(256, 4) kmeans_update_red4(" in src
    assert "__launch_bounds__(256) kmeans_update_red4(" in lower(parse_program(RED4), "r.cake").value.source


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_ptxas_keeps_the_cap_that_lets_three_ctas_share_an_sm(tmp_path):
    # without the bound ptxas gives the three-buffer update 190 registers: one CTA of 256 threads per SM
    free = D3.replace("threads=256, ctas_per_sm=3, consts", "threads=256, consts", 1)
    capped = compile_kernel(lower(parse_program(D3), "d3.cake").value, arch="sm_90a", cache_dir=tmp_path).value
    uncapped = compile_kernel(lower(parse_program(free), "d3.cake").value, arch="sm_90a", cache_dir=tmp_path).value
    assert capped.resources.registers <= 65536 // (3 * 256) and capped.resources.spill_bytes == 0
    assert uncapped.resources.registers > 65536 // (3 * 256)


def test_a_cta_of_no_threads_is_resources_threads_not_a_crash():
    # the per-thread register cap divides by the CTA's threads: a CTA of none is reported, not divided by
    text = _with(RED4, 2).replace("threads=256, ctas_per_sm", "threads=0, ctas_per_sm", 1)
    assert "threads=0" in text
    assert "resources.threads" in _rules(text)
