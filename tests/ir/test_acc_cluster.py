"""tinygemm_cluster: split-K over the CTAs of a (1, SPLIT, 1) cluster, each CTA's wgmma accumulator published to
its smem (acc_publish) and summed across the cluster through distributed shared memory (acc_cluster_reduce), each
output element stored once. The interpreter against the oracle (aligned set, ragged tails, empty K slices, other
SPLITs, a poisoned output), the protocol checker on missing cluster barriers, the operand rules on planted
mistakes."""
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.interp import InterpFault
from cake_core.ir.protocol import check_protocol
from cake_core.targets import get_arch
from cake_core.ir.text import parse_program
from cake_core.ir.verify import build_ctx
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SEED = corpus_file("tinygemm_cluster.cake").read_text()
TINY = get_problem("tinygemm")
PUBLISH = "        acc_publish(part_s, acc)\n"
REDUCE = "    acc_cluster_reduce(c[tile(bid.z, BM), tile(bid.x, BN)], part_s)\n"
# M = 70: two 64-row tiles (grid z); K = 1000: 16 K tiles, 2 per CTA; K = 8: one K tile, seven CTAs of each
# cluster publish zeros; N = 200 / 40: a ragged last tile (chunks cut inside); K = 200: 4 tiles, 4 empty slices
EXTRA = [{"M": 70, "N": 200, "K": 1000}, {"M": 64, "N": 264, "K": 8}, {"M": 3, "N": 40, "K": 200},
         {"M": 1, "N": 256, "K": 4096}]


def _plant(old: str, new: str, text: str = SEED) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _rules(text: str) -> list[tuple[str, int]]:
    return [(d.rule, d.line) for d in check_text(text) if d.is_error]


def _run_poisoned(text: str, shape: dict, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """c filled with NaN before the run (no zeroing): (what the program wrote, the oracle)."""
    x = TINY.make_inputs(shape, np.random.default_rng(seed))
    out = {"c": np.full((shape["M"], shape["N"]), np.nan, dtype=np.float32)}
    interp.run(parse_program(text), shape, x, out)
    return out["c"], TINY.oracle(x)["c"]


def test_the_cluster_seed_is_canonical_and_passes_every_rule():
    assert parse_program(SEED).text() == SEED
    assert check_text(SEED) == []             # no findings, no protocol.undecided either


def test_the_interpreter_reproduces_the_oracle_on_the_aligned_set_and_ragged_shapes():
    aligned = TINY.shape_set("tinygemm_aligned")
    checks = check_on_cpu(parse_program(SEED), TINY, list(aligned.shapes) + EXTRA, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


@pytest.mark.parametrize("shape", [{"M": 5, "N": 136, "K": 520}, {"M": 70, "N": 40, "K": 64}])
def test_every_element_is_written_over_a_poisoned_output(shape):
    got, want = _run_poisoned(SEED, shape)
    assert not np.isnan(got).any()
    assert np.abs(got - want).max() <= TINY.rtol * np.abs(want).max()


@pytest.mark.parametrize("split", [1, 2, 3])
def test_other_splits_reproduce_the_oracle(split):
    text = _plant('"SPLIT": 8}', f'"SPLIT": {split}}}')
    assert check_text(text) == []
    checks = check_on_cpu(parse_program(text), TINY, EXTRA[:3], seed=3)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_a_dropped_k_slice_is_wrong_and_a_reduction_left_to_one_cta_a_race_in_the_interpreter():
    slice0 = _plant("tile(bid.y * cdiv(cdiv(K, BK), SPLIT) + i, BK), tile(bid.x, BN)",
                    "tile(i, BK), tile(bid.x, BN)")      # b read from slice 0 in every CTA
    got, want = _run_poisoned(slice0, {"M": 4, "N": 128, "K": 1024})
    assert np.abs(got - want).max() > 10 * TINY.rtol * np.abs(want).max()
    # each CTA stores only its own partial, over the other CTAs' (a race: the last to land wins)
    one = _plant('cluster((1, SPLIT, 1))', 'cluster((1, 1, 1))')
    with pytest.raises(InterpFault, match=r"CTAs \(0, 0, 0\) and \(0, 1, 0\) both store `c`.*a race between CTAs"):
        _run_poisoned(one, {"M": 4, "N": 128, "K": 1024})


def test_cluster_ctas_reducing_into_different_windows_fault_in_the_interpreter():
    wrong = _plant(REDUCE, REDUCE.replace("tile(bid.z, BM)", "tile(bid.y, BM)"))
    assert ("acc_cluster_reduce.operands", 26) in _rules(wrong)
    with pytest.raises(InterpFault, match="different windows"):
        _run_poisoned(wrong, {"M": 4, "N": 128, "K": 512})


def test_a_reduce_without_the_cluster_sync_after_the_roles_is_a_protocol_finding():
    wrong = _plant("    cluster_sync()\n" + REDUCE, REDUCE)
    found = [d for d in check_protocol(build_ctx(parse_program(wrong), get_arch("sm_90a")))]
    assert [(d.rule, d.line) for d in found] == [("protocol.cluster_read", 25)], found
    assert "reads `part_s`" in found[0].message and "no cluster_sync() between its write" in found[0].message
    assert any("acc_publish at line 18" in w for w in found[0].witness)


def test_exiting_without_a_cluster_sync_after_the_reduce_is_a_protocol_finding():
    wrong = _plant(REDUCE + "    cluster_sync()\n", REDUCE)
    assert _rules(wrong) == [("protocol.cluster_read", 26)]
    assert "may exit" in [d for d in check_text(wrong) if d.is_error][0].message


def test_publish_of_a_wrong_tile_or_accumulator_is_refused():
    assert _rules(_plant("part_s = smem(f32, (BM, BN))", "part_s = smem(f32, (BM, 64))")) == [
        ("acc_publish.operands", 18), ("acc_cluster_reduce.operands", 26)]
    bf16 = _plant("part_s = smem(f32, (BM, BN))", "part_s = smem(bf16, (BM, BN))")
    assert ("acc_publish.operands", 18) in _rules(bf16)
    ring = _plant("part_s = smem(f32, (BM, BN))", "part_s = smem(f32, (BM, BN), stages=2)")
    assert ("acc_publish.operands", 18) in _rules(ring)
    other = _plant(PUBLISH, "        other = rmem(f32, (BM, BN))\n        acc_publish(part_s, other)\n")
    assert ("acc_publish.operands", 19) in _rules(other)


def test_another_op_touching_the_published_tile_is_refused():
    touch = _plant(PUBLISH, PUBLISH + "        store(c[tile(bid.z, BM), tile(bid.x, BN)], part_s)\n")
    assert ("acc_publish.operands", 19) in _rules(touch)


def test_a_reduce_of_an_unpublished_tile_inside_a_role_or_into_a_wrong_window_is_refused():
    assert _rules(_plant(PUBLISH, "")) == [("acc_cluster_reduce.operands", 25)]
    in_role = _plant(PUBLISH, PUBLISH + "    " + REDUCE, _plant("    cluster_sync()\n" + REDUCE, ""))
    assert ("acc_cluster_reduce.operands", 19) in _rules(in_role)
    narrow = _plant(REDUCE, REDUCE.replace("tile(bid.x, BN)", "tile(bid.x, 64)"))
    assert _rules(narrow) == [("acc_cluster_reduce.operands", 26)]
