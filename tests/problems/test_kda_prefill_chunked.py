"""kda_prefill's chunked naive program (kernels/kda_prefill_chunked.cake): the chunked form of the gated delta
rule (chunks of BT = 64 tokens: the intra-chunk decayed products under iota masks, the UT transform (I + A)^-1 as
one triangular solve (`trisolve`) of the identity, the chunk's output and the state carried chunk to chunk), beside the
token-by-token seed. It verifies, is in canonical form, matches the fp64 oracle on the interpreter with T below,
at and past a chunk and not a multiple of it, is wrong for each planted mistake, and lowers and compiles."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

P = get_problem("kda_prefill")
FILE = "kda_prefill_chunked.cake"
TEXT = P.kernel_text(FILE)

# beyond the small set (T <= 9, one partial chunk): one whole chunk, a chunk and a tail, several chunks
CHUNKS = [{"B": 1, "T": 64, "H": 1, "DK": 128, "DV": 128}, {"B": 1, "T": 70, "H": 2, "DK": 32, "DV": 16},
          {"B": 2, "T": 150, "H": 1, "DK": 128, "DV": 96}]


def _small():
    return list(P.shape_set("kda_prefill_small").shapes)


def test_it_is_a_kernel_file_of_the_problem_beside_the_seed():
    assert FILE in P.kernel_files() and P.seed_file != FILE
    assert parse_program(TEXT, FILE).text() == TEXT
    assert check_text(TEXT, FILE) == []
    assert P.program_mismatch(parse_program(TEXT, FILE)) == ""


def test_it_matches_the_oracle_below_at_and_past_a_chunk():
    result = check_stage(parse_program(TEXT, FILE), P, _small() + CHUNKS, seed=4, strict=True)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert len(result.value) > len(_small() + CHUNKS)        # the strict shapes ran too
    assert all(v.max_error < 1e-5 for v in result.value), [(v.shape, v.max_error) for v in result.value]


@pytest.mark.parametrize("case", ["no_ut_transform", "solve_reads_the_diagonal", "output_mask_drops_the_diagonal",
                                  "no_chunk_decay_of_the_state",
                                  "ignores_the_initial_state", "no_beta_on_the_values"])
def test_a_planted_mistake_is_wrong(case):
    old, new = {
        # (I + A)^-1 taken as I: the UT transform left out
        "no_ut_transform": ("        trisolve(t_s, m_s)\n", ""),
        # the solve told to read A's diagonal, which the strict mask zeroed: (I + A) is not what it inverts
        "solve_reads_the_diagonal": ("        trisolve(t_s, m_s)\n", "        trisolve(t_s, m_s, unit=False)\n"),
        # the output's causal mask without the diagonal (q_i . k_i, token i's own term, dropped)
        "output_mask_drops_the_diagonal": ('        ewise(mask, r_i, c_j, fn="ge")\n',
                                           '        ewise(mask, r_i, c_j, fn="gt")\n'),
        "no_chunk_decay_of_the_state": ('        ewise(acc_s, s_t, gl_c, fn="mul")\n', "        cast(acc_s, s_t)\n"),
        "ignores_the_initial_state": ("    load(s_t, s[bid.y, bid.x, tile(0, TK), tile(0, TV)])\n", "    fill(s_t)\n"),
        "no_beta_on_the_values": ('        ewise(t_s, t_s, beta_r, fn="mul")\n', ""),
    }[case]
    assert old in TEXT
    text = TEXT.replace(old, new, 1)
    assert check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, CHUNKS, seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    # wrong by far more than the tolerance, or not finite at all (a division by the zeroed diagonal)
    assert any((v.max_error is not None and v.max_error > 1e-3) or "non-finite" in v.message
               for v in result.value if not v.correct), \
        [(v.shape, v.message) for v in result.value]


def test_it_lowers_and_compiles_for_sm_90a(tmp_path):
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel, lower

    lr = lower(parse_program(TEXT, FILE), FILE)
    assert lr.ok, [d.format(FILE) for d in lr.diagnostics]
    if compile_mod.nvcc_path() is None:
        pytest.skip("nvcc not installed")
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.smem_bytes <= 232448
