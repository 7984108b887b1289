"""kda_varlen's chunked program (kernels/kda_varlen_chunked.cake): the chunked gated delta rule of kda_prefill's
chunked program over packed sequences, each chunk a window at the sequence's offset stopped at its end
(``tile(c, BT, base=bos, limit=eos)``, bos and eos read from cu_seqlens): past the end a load reads zeros (no
gate, key, value or beta: the chunk's state and outputs are those of its real tokens) and a store writes
nothing. Checked on the interpreter against the fp64 oracle over sequences below, at and past a chunk; each
planted mistake at the window's ends is wrong; it lowers and compiles."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

P = get_problem("kda_varlen")
FILE = "kda_varlen_chunked.cake"
TEXT = P.kernel_text(FILE)
# sequences of 1..9 tokens (the small set), and packs whose sequences span several 64-token chunks
LONG = [{"N": 2, "T": 64, "H": 1, "DK": 128, "DV": 128}, {"N": 3, "T": 150, "H": 1, "DK": 32, "DV": 48},
        {"N": 4, "T": 300, "H": 2, "DK": 64, "DV": 64}]
WINDOW = "tile(c, BT, base=bos, limit=eos)"


def test_it_is_a_kernel_file_of_the_problem_beside_the_seed():
    assert FILE in P.kernel_files() and P.seed_file != FILE
    assert parse_program(TEXT, FILE).text() == TEXT
    assert check_text(TEXT, FILE) == []
    assert P.program_mismatch(parse_program(TEXT, FILE)) == ""
    assert TEXT.count(WINDOW) == 6


def test_it_matches_the_oracle_over_short_and_multi_chunk_sequences():
    shapes = list(P.shape_set("kda_varlen_small").shapes) + LONG
    result = check_stage(parse_program(TEXT, FILE), P, shapes, seed=3, strict=True)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 1e-5 for v in result.value), [(v.shape, v.max_error) for v in result.value]


RACE = "a race between CTAs"


@pytest.mark.parametrize("case,outcome", [("gates_past_the_end", Outcome.WRONG),
                                          ("chunks_not_offset", Outcome.RUNTIME_FAULT),
                                          ("stores_past_the_end", Outcome.RUNTIME_FAULT)])
def test_a_planted_mistake_at_the_window_is_wrong_or_a_race(case, outcome):
    old, new, count = {
        # the next sequence's first gates read into a sequence's last chunk: its state decays by them too
        "gates_past_the_end": (f"g[{WINDOW}", "g[tile(c, BT, base=bos)", 1),
        # every sequence's chunks taken from the start of the pack: the sequences' CTAs store the same rows
        "chunks_not_offset": (WINDOW, "tile(c, BT, limit=eos)", 6),
        # a last chunk's padding rows stored over the next sequence's first outputs: right only when that
        # sequence's CTA happens to store after it
        "stores_past_the_end": (f"o[{WINDOW}", "o[tile(c, BT, base=bos)", 1),
    }[case]
    assert TEXT.count(old) == count
    text = TEXT.replace(old, new)
    assert check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, LONG, seed=3, strict=False)
    assert result.outcome is outcome, [(v.shape, v.message) for v in result.value]
    if outcome is Outcome.RUNTIME_FAULT:
        assert any(RACE in v.message and "store `o`" in v.message for v in result.value)


def test_it_lowers_and_compiles_for_sm_90a(tmp_path):
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel, lower

    lr = lower(parse_program(TEXT, FILE), FILE)
    assert lr.ok, [d.format(FILE) for d in lr.diagnostics]
    assert "min((cake::index_t)(T), (cake::index_t)(eos))" in lr.value.source
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.smem_bytes <= 232448
