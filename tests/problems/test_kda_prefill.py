"""kda_prefill: Kimi Delta Attention over T tokens from an initial state. Its oracle is the decode problem's step
applied token by token; the naive seed (the decode step in a loop over tokens) passes the gate and compiles; a
kernel that drops the gate, skips the last token or ignores the initial state is wrong for that reason."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem

from seed_build import compiled_seed

P = get_problem("kda_prefill")
DECODE = get_problem("kda_decode")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("kda_prefill_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def test_the_oracle_is_the_decode_step_token_by_token():
    x = P.make_inputs({"B": 2, "T": 4, "H": 3, "DK": 8, "DV": 5}, np.random.default_rng(1))
    got = P.oracle(x)
    state = x["s"]
    for t in range(4):
        step = DECODE.oracle({n: x[n][:, t] for n in ("q", "k", "v", "g", "beta")} | {"s": state})
        np.testing.assert_allclose(got["o"][:, t], step["o"], rtol=1e-12, atol=1e-12)
        state = step["s"]
    np.testing.assert_allclose(got["s"], state, rtol=1e-12, atol=1e-12)


def test_the_row_oracle_is_a_sequence():
    shape = {"B": 3, "T": 3, "H": 2, "DK": 8, "DV": 4}
    x = P.make_inputs(shape, np.random.default_rng(2))
    full, rows = P.oracle(x), np.array([0, 2])
    part = P.oracle_rows(x, rows)
    for n in ("o", "s"):
        np.testing.assert_array_equal(part[n], full[n][rows].reshape(2, -1))
        np.testing.assert_array_equal(P.take_rows(full, rows)[n], part[n])
    assert list(P.rows.rows_of_perturbed(x, np.array([0, 3 * 2 * 8 * 2 + 5]))) == [0, 2]


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "kda_prefill.cake") == []
    result = check_stage(parse_program(SEED, "kda_prefill.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 5e-6 for v in result.value)


@pytest.mark.parametrize("case", ["drops_the_gate", "skips_the_last_token", "ignores_the_initial_state"])
def test_a_planted_mistake_is_wrong(case):
    old, new = {
        "drops_the_gate": ('        ewise(s_t, s_t, a_c, fn="mul")\n', ""),
        # o of the last token stays poisoned and the final state misses its update
        "skips_the_last_token": ("    for t in range(T):\n", "    for t in range(T - 1):\n"),
        "ignores_the_initial_state": ("    load(s_t, s[bid.y, bid.x, tile(0, TK), tile(0, TV)])\n",
                                      "    fill(s_t)\n"),
    }[case]
    assert old in SEED
    text = SEED.replace(old, new, 1)
    assert check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert len(wrong) == len(_small("headline"))
    if case == "skips_the_last_token":
        assert all("non-finite" in v.message for v in wrong), [v.message for v in wrong]
    else:
        assert all(v.max_error > 1e-3 for v in wrong), [v.message for v in wrong]


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    compiled_seed(P, tmp_path)
