"""kda_decode: a Kimi Delta Attention decode step whose state is updated in place. The fp64 oracle is the step
written out per head; the naive seed passes the gate (tails and strict shapes included) and compiles; planted
mistakes (no decay, no beta, the output read with the key, the state never written back) are wrong for that
reason, on the state or on the output."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

from seed_build import compiled_seed, lowered_seed

P = get_problem("kda_decode")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("kda_decode_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def test_the_oracle_is_the_delta_rule_step_per_head():
    shape = {"B": 2, "H": 3, "DK": 8, "DV": 5}
    x = P.make_inputs(shape, np.random.default_rng(1))
    got = P.oracle(x)
    for b in range(2):
        for h in range(3):
            f = lambda n: np.asarray(x[n][b, h], np.float64)      # noqa: E731
            S = f("s") * np.exp(f("g"))[:, None]
            S = (np.eye(8) - f("beta") * np.outer(f("k"), f("k"))) @ S + f("beta") * np.outer(f("k"), f("v"))
            np.testing.assert_allclose(got["s"][b, h], S, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(got["o"][b, h], S.T @ f("q"), rtol=1e-12, atol=1e-12)


def test_the_inputs_are_unit_keys_decays_in_range_and_a_live_state():
    x = P.make_inputs({"B": 4, "H": 2, "DK": 64, "DV": 32}, np.random.default_rng(2))
    norms = np.sqrt((x["k"].astype(np.float64) ** 2).sum(-1))
    assert np.allclose(norms, 1.0, atol=1e-2) and np.allclose(np.sqrt((x["q"].astype(np.float64) ** 2).sum(-1)), 1,
                                                             atol=1e-2)
    assert (x["g"] < 0).all() and x["g"].min() < -0.9 and x["g"].max() > -0.05
    assert ((x["beta"] > 0) & (x["beta"] < 1)).all() and np.count_nonzero(x["s"]) == x["s"].size


def test_the_row_oracle_agrees_with_the_full_one():
    shape = {"B": 3, "H": 2, "DK": 16, "DV": 8}
    x = P.make_inputs(shape, np.random.default_rng(3))
    full, rows = P.oracle(x), np.array([0, 3, 5])
    part = P.oracle_rows(x, rows)
    np.testing.assert_array_equal(part["o"], full["o"].reshape(6, 8)[rows])
    np.testing.assert_array_equal(part["s"], full["s"].reshape(6, -1)[rows])
    np.testing.assert_array_equal(P.take_rows(full, rows, shape)["s"], part["s"])
    assert list(P.rows.rows_of_perturbed(x, np.array([0, 16 * 3 + 2, 16 * 5]))) == [0, 3, 5]


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "kda_decode.cake") == []
    result = check_stage(parse_program(SEED, "kda_decode.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 2e-6 for v in result.value)


def _planted(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


@pytest.mark.parametrize("case, wrong_in", [
    ("no_decay", ("s", "o")), ("no_beta", ("s", "o")), ("output_from_k", ("o",)), ("state_not_written", ("s",)),
    ("ignores_the_state", ("s", "o"))])
def test_a_planted_mistake_is_wrong_where_it_shows(case, wrong_in):
    text = {
        "no_decay": _planted('        ewise(s_t, s_t, a_c, fn="mul")\n', ""),
        "no_beta": _planted('        ewise(u, u, b_1, fn="mul")\n', ""),
        # the state is right, the output reads it with the key instead of the query
        "output_from_k": SEED[::-1].replace('        ewise(t, s_t, q_c, fn="mul")\n'[::-1],
                                            '        ewise(t, s_t, k_c, fn="mul")\n'[::-1], 1)[::-1],
        # the state is computed and dropped: s keeps its drawn value (finite: only the values tell)
        "state_not_written": _planted("        store(s[bid.y, bid.x, tile(0, TK), tile(vt, BV)], s_t)\n", ""),
        # starts from a zero state instead of the one it is given
        "ignores_the_state": _planted("        load(s_t, s[bid.y, bid.x, tile(0, TK), tile(vt, BV)])\n",
                                      "        fill(s_t)\n"),
    }[case]
    assert text != SEED and check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert len(wrong) == len(_small("headline"))
    assert all(v.message.split(":")[0] in wrong_in and v.max_error > 1e-3 for v in wrong), [v.message for v in wrong]


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    source = lowered_seed(P).source
    assert "float* __restrict__ s" in source and "const float* __restrict__ s" not in source
    compiled = compiled_seed(P, tmp_path)
    assert compiled.resources.spill_bytes == 0
