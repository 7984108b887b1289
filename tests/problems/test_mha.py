"""mha: softmax(q k^T) v per head, two chained GEMMs with an online softmax between them. The oracle is the
formula; the naive seed (key tiles in a loop, a running max and sum, the probabilities rounded to bf16 for the
second product) passes the gate on the small set (ragged T and DH, one token, strict shapes and the held-out row
included) and compiles; planted mistakes of the chained form are wrong for that reason."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

from seed_build import compiled_seed

P = get_problem("mha")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("mha_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def test_the_oracle_is_the_formula_and_the_row_oracle_agrees():
    shape = {"H": 2, "T": 7, "DH": 5}
    x = P.make_inputs(shape, np.random.default_rng(1))
    o = P.oracle(x)["o"]
    for h in range(2):
        s = x["q"][h].astype(np.float64) @ x["k"][h].astype(np.float64).T
        p = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(o[h], p @ x["v"][h].astype(np.float64), rtol=1e-12)
    rows = np.array([0, 8, 13])
    np.testing.assert_allclose(P.oracle_rows(x, rows)["o"], o.reshape(14, 5)[rows], rtol=1e-12)
    assert list(P.rows.rows_of_perturbed(x, np.array([0, 8 * 5 + 2, 13 * 5 + 4]))) == [0, 8, 13]


def test_the_softmax_is_peaked_enough_to_show_a_dropped_rescale():
    x = P.make_inputs({"H": 1, "T": 256, "DH": 128}, np.random.default_rng(2))
    s = x["q"][0].astype(np.float64) @ x["k"][0].astype(np.float64).T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert np.median(p.max(axis=1)) > 0.05          # far from uniform (1/256)


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "mha.cake") == []
    result = check_stage(parse_program(SEED, "mha.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 2e-3 for v in result.value)


def _planted(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


@pytest.mark.parametrize("case", ["no_rescale", "no_mask", "unnormalised", "running_max_not_carried"])
def test_a_planted_mistake_in_the_chained_form_is_wrong(case):
    text = {
        "no_rescale": _planted('        ewise(acc, acc, alpha, fn="mul")\n', ""),
        "no_mask": _planted("        select(s, keep, s, ninf)\n", ""),
        "unnormalised": _planted('    ewise(acc, acc, l_i, fn="div")\n', ""),
        "running_max_not_carried": _planted("        cast(m_i, m_new)\n", ""),
    }[case]
    assert text != SEED and check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert wrong and all(v.message.startswith("o:") and v.max_error > 2e-2 for v in wrong), \
        [v.message for v in wrong]


def test_a_loop_cut_to_one_key_tile_is_outside_the_derived_domain():
    text = _planted("for j in range(cdiv(T, BN)):", "for j in range(1):")
    result = check_stage(parse_program(text, "cut.cake"), P, _small("headline"), seed=4, strict=False)
    assert all(v.message.startswith("refused:") and "T = " in v.message and "> 32" in v.message
               for v in result.value if int(v.shape.split("T=")[1].split(",")[0]) > 32)


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    compiled = compiled_seed(P, tmp_path)
    assert compiled.resources.spill_bytes == 0


# ------------------------------------------------------------------ the warp-specialised reference (mha_ws.cake)

WS = P.kernel_text("mha_ws.cake")


def test_the_warp_specialised_form_passes_the_gate_on_the_small_set():
    # TMA producer, wgmma S = Q K^T, the online softmax on S's fragments and row vectors, P in registers as the
    # register A of O += P V (tests/lower/test_lower_role_fragments.py has its layouts)
    assert check_text(WS, "mha_ws.cake") == []
    result = check_stage(parse_program(WS, "mha_ws.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 2e-3 for v in result.value)


@pytest.mark.parametrize("old,new", [
    ('            ewise(acc, acc, alpha, fn="mul")\n', ""),
    ("            select(s, kc, s, ninf)\n", ""),
    ('        ewise(acc, acc, l_i, fn="div")\n', ""),
    ("            cast(m_i, m_new)\n", ""),
    ('            reduce(rsum, s, axis=1)\n', '            reduce(rsum, s, axis=1, fn="max")\n'),
], ids=["no_rescale", "no_mask", "unnormalised", "running_max_not_carried", "max_for_sum"])
def test_a_planted_mistake_in_the_warp_specialised_form_is_wrong(old, new):
    assert old in WS
    text = WS.replace(old, new, 1)
    assert check_text(text, "planted.cake") == []
    shapes = [{"H": 2, "T": 200, "DH": 64}, {"H": 1, "T": 100, "DH": 128}]
    result = check_stage(parse_program(text, "planted.cake"), P, shapes, seed=4, strict=False)
    assert result.outcome is Outcome.WRONG, [(v.shape, v.message) for v in result.value]
