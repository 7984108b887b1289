"""kda_varlen: KDA prefill over sequences of different lengths packed into one token axis (cu_seqlens). The oracle
is the fixed-length prefill run per sequence; the offsets are a composition of T; the naive seed reads each
sequence's bounds with `scalar` and passes the gate (tails, one-token sequences, strict shapes and the held-out
row included) and compiles; planted mistakes at the bounds are wrong for that reason."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem
from cake_core.problems.base import as_sampler
from cake_core.problems.kda_varlen import seqlens_offsets

from seed_build import compiled_seed, lowered_seed

P = get_problem("kda_varlen")
FIXED = get_problem("kda_prefill")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("kda_varlen_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def test_the_oracle_is_the_fixed_length_prefill_of_each_sequence():
    x = P.make_inputs({"N": 3, "T": 11, "H": 2, "DK": 8, "DV": 5}, np.random.default_rng(1))
    got = P.oracle(x)
    cu = x["cu_seqlens"]
    for n in range(3):
        a, b = int(cu[n]), int(cu[n + 1])
        one = {name: x[name][a:b][None] for name in ("q", "k", "v", "g", "beta")}
        want = FIXED.oracle({**one, "s": x["s"][n:n + 1]})
        np.testing.assert_allclose(got["o"][a:b], want["o"][0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["s"][n], want["s"][0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("N, T", [(1, 1), (1, 7), (5, 5), (6, 8192), (3, 40)])
def test_the_offsets_split_every_token_into_n_nonempty_sequences(N, T):
    cu = seqlens_offsets(as_sampler(np.random.default_rng(N * T)), N, T)
    assert cu.dtype == np.int32 and cu.shape == (N + 1,) and cu[0] == 0 and cu[-1] == T
    assert (np.diff(cu) >= 1).all()


def test_the_lengths_differ_from_draw_to_draw():
    draws = {tuple(seqlens_offsets(as_sampler(np.random.default_rng(s)), 6, 8192)) for s in range(5)}
    assert len(draws) == 5


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "kda_varlen.cake") == []
    result = check_stage(parse_program(SEED, "kda_varlen.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 2e-6 for v in result.value)


def _planted(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new)


@pytest.mark.parametrize("case, wrong_in", [
    ("last_token_skipped", ("o", "s")), ("first_sequence_state", ("o", "s")),
    ("bounds_of_the_next_sequence", ("o", "s"))])
def test_a_planted_mistake_at_the_bounds_is_wrong(case, wrong_in):
    text = {
        "last_token_skipped": _planted("for t in range(eos - bos):", "for t in range(eos - bos - 1):"),
        "first_sequence_state": _planted("s[bid.y, bid.x, tile(0, TK), tile(0, TV)])\n    for",
                                         "s[0, bid.x, tile(0, TK), tile(0, TV)])\n    for"),
        "bounds_of_the_next_sequence": _planted("cu_seqlens[bid.y], max=T", "cu_seqlens[bid.y + 1], max=T"),
    }[case]
    assert text != SEED and check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG, [(v.shape, v.message) for v in result.value]
    wrong = [v for v in result.value if not v.correct]
    assert wrong and all(v.message.split(":")[0] in wrong_in for v in wrong), [v.message for v in wrong]


def test_a_sequence_read_from_the_pack_start_is_a_race_on_its_outputs():
    # every sequence's tokens taken from token 0: the sequences' CTAs store other values into the same rows of o
    text = _planted("tile(bos + t, 1)", "tile(t, 1)")
    assert check_text(text, "offset_ignored.cake") == []
    result = check_stage(parse_program(text, "offset_ignored.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.RUNTIME_FAULT, [(v.shape, v.message) for v in result.value]
    assert any("both store `o`" in v.message and "a race between CTAs" in v.message for v in result.value)


def test_an_end_read_past_its_declared_range_faults_at_the_scalar():
    text = _planted("cu_seqlens[bid.y + 1], max=T", "cu_seqlens[bid.y + 1], max=T - 1")
    result = check_stage(parse_program(text, "kda_varlen.cake"), P, _small("headline"), seed=4, strict=False)
    assert any("scalar `eos` read" in v.message and "outside its declared range" in v.message
               for v in result.value), [v.message for v in result.value]


def test_more_sequences_than_tokens_is_not_a_shape():
    assert "a sequence has at least one token" in P.shape_error({"N": 5, "T": 4, "H": 1, "DK": 8, "DV": 8})


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    source = lowered_seed(P).source
    assert "for (int t = 0; t < (eos - bos); ++t) {" in source
    compiled_seed(P, tmp_path)


def test_a_row_is_a_head_and_its_oracle_agrees_with_the_full_one():
    shape = {"N": 3, "T": 8, "H": 4, "DK": 8, "DV": 6}
    x = P.make_inputs(shape, np.random.default_rng(5))
    full, rows = P.oracle(x), np.array([1, 3])
    part = P.oracle_rows(x, rows)
    cut = P.take_rows(full, rows, shape)
    np.testing.assert_allclose(part["o"], cut["o"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(part["s"], cut["s"], rtol=1e-12, atol=1e-12)
    assert part["o"].shape == (2, 8, 6) and part["s"].shape == (2, 3, 8, 6)
    # element (t, h, i) of q feeds head h only
    flat = np.array([np.ravel_multi_index(idx, x["q"].shape) for idx in [(0, 1, 0), (5, 3, 7), (7, 1, 2)]])
    assert list(P.rows.rows_of_perturbed(x, flat)) == [1, 3]
