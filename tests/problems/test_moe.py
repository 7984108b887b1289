"""moe: a routed mixture-of-experts layer. The fp64 oracle routes and sums per token as the spec says; the inputs
plant the spread logits, a hot and a cold expert; the naive seed (routing, then one expert at a time through
`scalar`) passes the gate on the small set (tails, k = E and the held-out row included) and compiles; planted
mistakes are wrong for their reason, on the output they touch."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem
from cake_core.problems.moe import COLD, HOT, SPREAD, experts, route, routed_experts

from seed_build import compiled_seed, lowered_seed

P = get_problem("moe")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("moe_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def _silu(g):
    return g / (1.0 + np.exp(-g))


def test_the_oracle_routes_and_sums_per_token_as_the_spec_says():
    shape = {"M": 5, "H": 12, "I": 7, "E": 9, "k": 3}
    x = P.make_inputs(shape, np.random.default_rng(1))
    got = P.oracle(x)
    f = lambda n: np.asarray(x[n], np.float64)      # noqa: E731
    for m in range(5):
        lg = f("logits")[m]
        ids = sorted(range(9), key=lambda e: (-lg[e], e))[:3]
        w = np.exp(lg[ids] - lg[ids].max())
        w /= w.sum()
        want = sum(w[j] * (_silu(f("x")[m] @ f("w_gate")[e]) * (f("x")[m] @ f("w_up")[e])) @ f("w_down")[e]
                   for j, e in enumerate(ids))
        assert got["topk_ids"][m].tolist() == ids
        np.testing.assert_allclose(got["topk_weights"][m], w, rtol=1e-12)
        np.testing.assert_allclose(got["out"][m], want, rtol=1e-10, atol=1e-12)


def test_equal_logits_go_to_the_lower_expert_first():
    ids, w = route(np.array([[1.0, 3.0, 3.0, 0.0, 3.0]], np.float32), 2)
    assert ids.tolist() == [[1, 2]] and np.allclose(w, 0.5)


def test_the_inputs_spread_the_logits_and_plant_a_hot_and_a_cold_expert():
    shape = {"M": 16, "H": 32, "I": 16, "E": 24, "k": 4}
    x = P.make_inputs(shape, np.random.default_rng(2))
    srt = np.sort(x["logits"].astype(np.float64), axis=1)
    assert np.diff(srt, axis=1).min() >= SPREAD * 0.99
    ids = P.oracle(x)["topk_ids"]
    taken = np.bincount(ids.ravel(), minlength=24)
    assert taken.max() == 16 and (taken == 0).any()          # one expert takes every token, some take none
    hot, cold = int(np.argmax(taken)), np.flatnonzero(taken == 0)
    assert (ids[:, 0] == hot).all()                            # first, and not by far: the second weight counts
    assert (P.oracle(x)["topk_weights"][:, 1] > 0.1).all()
    gaps = np.sort(x["logits"], axis=1)
    assert np.allclose(gaps[:, -1] - gaps[:, -2], HOT, atol=2e-2) and np.allclose(gaps[:, 1] - gaps[:, 0], COLD,
                                                                                  atol=2e-2)
    assert len(cold) >= 1
    assert x["w_gate"].dtype == np.float32 and np.abs(x["w_gate"].std() * np.sqrt(32) - 1) < 0.1


def test_the_row_oracle_agrees_with_the_full_one():
    shape = {"M": 6, "H": 16, "I": 8, "E": 8, "k": 2}
    x = P.make_inputs(shape, np.random.default_rng(3))
    full, rows = P.oracle(x), np.array([1, 4])
    part = P.oracle_rows(x, rows)
    for name in ("topk_ids", "topk_weights"):
        np.testing.assert_array_equal(part[name], full[name][rows])
    np.testing.assert_allclose(part["out"], full["out"][rows], rtol=1e-12)     # summed in another grouping
    assert list(P.rows.rows_of_perturbed(x, np.array([16 + 3, 4 * 16]))) == [1, 4]


def test_the_comparison_names_a_wrong_expert_a_wrong_weight_and_a_wrong_output():
    shape = {"M": 3, "H": 16, "I": 8, "E": 6, "k": 2}
    want = P.oracle(P.make_inputs(shape, np.random.default_rng(4)))
    good = {"out": want["out"].astype(np.float32), "topk_ids": want["topk_ids"].astype(np.int32),
            "topk_weights": want["topk_weights"].astype(np.float32)}
    assert P.compare_fn(good, want, P.rtol)[0]
    swapped = {**good, "topk_ids": good["topk_ids"][:, ::-1].copy()}
    ok, _, msg = P.compare_fn(swapped, want, P.rtol)
    assert not ok and msg.startswith("topk_ids: token 0 slot 0")
    flat = {**good, "topk_weights": np.full_like(good["topk_weights"], 0.5)}
    ok, _, msg = P.compare_fn(flat, want, P.rtol)
    assert not ok and msg.startswith("topk_weights:")
    off = {**good, "out": good["out"] * 1.05}
    ok, err, msg = P.compare_fn(off, want, P.rtol)
    assert not ok and msg.startswith("out:") and 0.04 < err < 0.06
    nan = {**good, "out": good["out"].copy()}
    nan["out"][2, 5] = np.nan
    ok, _, msg = P.compare_fn(nan, want, P.rtol)
    assert not ok and msg == "out: token 2 column 5 is nan"


def test_the_floor_counts_the_experts_the_tokens_route_to():
    assert routed_experts({"M": 1, "E": 512, "k": 10}) == pytest.approx(10)
    assert routed_experts({"M": 128, "E": 512, "k": 10}) < 512
    assert routed_experts({"M": 6, "E": 4, "k": 4}) == 4
    x = P.make_inputs({"M": 64, "H": 8, "I": 8, "E": 128, "k": 8}, np.random.default_rng(5))
    distinct = len(np.unique(P.oracle(x)["topk_ids"]))
    assert abs(distinct - routed_experts({"M": 64, "E": 128, "k": 8})) < 12
    assert P.shape_error({"M": 1, "H": 8, "I": 8, "E": 4, "k": 5}) and not P.shape_error(_small()[0])


def test_the_experts_sum_matches_a_direct_loop():
    rng = np.random.default_rng(6)
    x, wg, wu, wd = rng.normal(size=(4, 6)), rng.normal(size=(5, 6, 3)), rng.normal(size=(5, 6, 3)), \
        rng.normal(size=(5, 3, 6))
    ids, w = np.array([[0, 4], [4, 1], [2, 0], [4, 3]]), rng.random((4, 2))
    want = np.stack([sum(w[m, j] * (_silu(x[m] @ wg[e]) * (x[m] @ wu[e])) @ wd[e] for j, e in enumerate(ids[m]))
                     for m in range(4)])
    np.testing.assert_allclose(experts(x, wg, wu, wd, ids, w), want, rtol=1e-12)


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "moe.cake") == []
    result = check_stage(parse_program(SEED, "moe.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert all(v.max_error < 4e-3 for v in result.value)       # the bf16 intermediate: ~2^-9


def _planted(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


@pytest.mark.parametrize("case, wrong_in", [
    ("smallest_logits", "topk_ids"), ("not_renormalised", "topk_weights"), ("no_silu", "out"),
    ("one_expert_short", "out"), ("unweighted", "out")])
def test_a_planted_mistake_is_wrong_where_it_shows(case, wrong_in):
    text = {
        "smallest_logits": _planted('        unary(lg, lg)\n', ""),
        "not_renormalised": _planted('    ewise(top_v, top_v, tot, fn="div")\n', ""),
        "no_silu": _planted('            unary(h, acc_g, fn="silu")\n', "            cast(h, acc_g)\n"),
        "one_expert_short": _planted("    for j in range(k):\n", "    for j in range(k - 1):\n"),
        "unweighted": _planted('            ewise(h, h, wj, fn="mul")\n', ""),
    }[case]
    assert text != SEED and check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert len(wrong) == len(_small("headline"))
    assert all(v.message.startswith(wrong_in + ":") for v in wrong), [v.message for v in wrong]


def test_an_expert_id_past_the_declared_range_faults_at_the_scalar():
    text = _planted("max=E - 1)", "max=E - 3)")
    result = check_stage(parse_program(text, "moe.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is not Outcome.CHECKED
    faults = [v for v in result.value if not v.correct and "outside its declared range" in v.message]
    assert faults, [v.message for v in result.value]


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    source = lowered_seed(P).source
    assert "const int e = cake::read_index(top_i + " in source
    compiled = compiled_seed(P, tmp_path)
    assert compiled.resources.spill_bytes == 0
