"""grouped_gemm: a grouped GEMM over rows gathered by index. The fp64 oracle matches a direct loop over the rows;
the inputs are an MoE routing (topk distinct experts per token, a hot expert with every token, a cold one with
none); the naive seed (row tiles from each group's start, gathered by perm, written with scatter_add up to the
group's end) passes the gate on the small set (ragged group ends and K, N off the tiles, a lone token, the held-out
row) and compiles; planted mistakes in the group bounds are wrong; the tactics that apply keep it correct."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import apply
from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.ir.zeroing import accumulated_params
from cake_core.outcome import Outcome
from cake_core.pipeline.stages import check_stage
from cake_core.problems import get_problem
from cake_core.problems.grouped_gemm import permute, routed_experts
from cake_core.runtime.cpu import check_on_cpu

from seed_build import compiled_seed, lowered_seed

P = get_problem("grouped_gemm")
SEED = P.seed_text()


def _small(role=None):
    s = P.shape_set("grouped_gemm_small")
    return [x for x, r in zip(s.shapes, s.roles) if role is None or r == role]


def test_the_oracle_matches_a_direct_loop_over_the_rows():
    shape = {"T": 7, "topk": 3, "E": 6, "K": 20, "N": 9}
    x = P.make_inputs(shape, np.random.default_rng(1))
    got = P.oracle(x)["y"]
    f = lambda n: np.asarray(x[n], np.float64)      # noqa: E731
    off = x["offsets"]
    for r in range(21):
        e = next(e for e in range(6) if off[e] <= r < off[e + 1])
        np.testing.assert_allclose(got[r], f("x")[x["perm"][r]] @ f("w")[e], rtol=1e-12, atol=1e-12)


def test_the_inputs_are_a_routing_with_a_hot_and_a_cold_expert():
    T, topk, E, K = 24, 4, 10, 64
    x = P.make_inputs({"T": T, "topk": topk, "E": E, "K": K, "N": 8}, np.random.default_rng(2))
    perm, off = x["perm"], x["offsets"]
    assert perm.dtype == off.dtype == np.int32 and perm.shape == (T * topk,) and off.shape == (E + 1,)
    assert off[0] == 0 and off[-1] == T * topk and (np.diff(off) >= 0).all()
    sizes = np.diff(off)
    assert sizes.max() == T and (sizes == 0).any()
    groups = [perm[off[e]:off[e + 1]] for e in range(E)]
    assert all(np.unique(g).size == g.size for g in groups)                 # a token once per expert
    assert any((np.diff(g) < 0).any() for g in groups)                      # in no particular order
    assert (np.bincount(perm, minlength=T) == topk).all()
    assert abs(x["x"].std() - 1) < 0.1 and abs(x["w"].std() * np.sqrt(K) - 1) < 0.1
    assert P.shape_error({"T": 4, "topk": 4, "E": 4, "K": 8, "N": 8}) and not P.shape_error(_small()[0])


def test_the_permutation_groups_the_tokens_by_expert_in_the_order_given():
    ids = np.array([[2, 0], [1, 2], [2, 1]])
    perm, off = permute(ids, 4, np.array([0.5, 0.1, 0.2, 0.9, 0.3, 0.4]))
    assert perm.tolist() == [0, 1, 2, 2, 0, 1] and off.tolist() == [0, 1, 3, 6, 6]


def test_the_row_oracle_agrees_with_the_full_one():
    shape = {"T": 9, "topk": 2, "E": 5, "K": 12, "N": 6}
    x = P.make_inputs(shape, np.random.default_rng(3))
    rows = np.array([0, 5, 11, 17])
    np.testing.assert_allclose(P.oracle_rows(x, rows)["y"], P.oracle(x)["y"][rows], rtol=1e-12)
    token = int(x["perm"][5])
    fed = P.rows.rows_of_perturbed(x, np.array([token * 12 + 3]))
    assert fed.size == 2 and (x["perm"][fed] == token).all()


def test_the_floor_counts_the_experts_the_tokens_route_to():
    assert routed_experts({"T": 1, "topk": 8, "E": 128}) == pytest.approx(8)
    assert routed_experts({"T": 4, "topk": 2, "E": 3}) == pytest.approx(2)
    x = P.make_inputs({"T": 64, "topk": 8, "E": 128, "K": 8, "N": 8}, np.random.default_rng(5))
    assert abs(np.count_nonzero(np.diff(x["offsets"])) - routed_experts({"T": 64, "topk": 8, "E": 128})) < 12


def test_the_seed_passes_the_gate_on_the_small_set():
    assert check_text(SEED, "grouped_gemm.cake") == []
    assert P.zeroed_for(accumulated_params(parse_program(SEED))) == ("y",)      # scatter_add adds into y
    result = check_stage(parse_program(SEED, "grouped_gemm.cake"), P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]
    assert {"tail", "held_out"} <= set(P.shape_set("grouped_gemm_small").roles)


def _planted(old: str, new: str, count: int = 1) -> str:
    assert SEED.count(old) == count, old
    return SEED.replace(old, new)


@pytest.mark.parametrize("case", ["end_is_the_start", "no_limit", "ragged_tile_skipped"])
def test_a_planted_mistake_in_the_group_bounds_fails_the_gate(case):
    text = {
        # every group read as empty: nothing is written
        "end_is_the_start": _planted("offsets[bid.y + 1]", "offsets[bid.y]"),
        # a ragged last tile runs into the next group: its rows take this expert's weights too
        "no_limit": _planted("limit=end", "limit=T * topk", count=2),
        # a group's last tile is dropped when it is not full (a group of fewer rows than a tile: all of it)
        "ragged_tile_skipped": _planted("if bid.x * BM < end - start:", "if bid.x * BM + BM <= end - start:"),
    }[case]
    assert check_text(text, f"{case}.cake") == []
    result = check_stage(parse_program(text, f"{case}.cake"), P, _small("headline"), seed=4, strict=False)
    assert result.outcome is Outcome.WRONG
    wrong = [v for v in result.value if not v.correct]
    assert len(wrong) == len(_small("headline")), [v.message for v in result.value]
    assert all(v.message.startswith("y:") for v in wrong), [v.message for v in wrong]


def test_the_seed_lowers_and_compiles_for_sm_90a(tmp_path):
    source = lowered_seed(P).source
    assert "cake::read_index(offsets + " in source
    compiled = compiled_seed(P, tmp_path)
    assert compiled.resources.spill_bytes == 0


@pytest.mark.parametrize("tactic", ["mma_sync", "prefetch", "retile", "rethread", "unroll", "occupancy"])
def test_a_tactic_that_applies_to_the_seed_keeps_it_correct(tactic):
    seed = parse_program(SEED)
    child = apply(tactic, seed, np.random.default_rng(0))
    assert not isinstance(child, Refused), child.reason
    assert child != seed and check_text(child.text()) == []
    result = check_stage(child, P, _small(), seed=4)
    assert result.outcome is Outcome.CHECKED, [(v.shape, v.message) for v in result.value if not v.correct]


def test_dropping_the_guards_narrows_the_domain_to_whole_tiles():
    child = apply("drop_guards", parse_program(SEED), np.random.default_rng(0))
    assert not isinstance(child, Refused), child.reason
    for shape, c in zip(_small(), check_on_cpu(child, P, _small(), seed=4)):
        whole = shape["K"] % 32 == 0 and shape["N"] % 64 == 0
        assert (c.correct, c.refused) == (whole, not whole), (shape, c.message)
