"""Signatures, the rule miner, harness versions and the corpus gate."""
import numpy as np
import pytest

from cake_core.agents.tactics import drop_guards, retile
from cake_core.harness.gate import corpus_gate
from cake_core.harness.miners import mine_rule
from cake_core.harness.signature import signature
from cake_core.harness.version import HarnessSpec
from cake_core.ir.features import features
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem

SEED = parse_program(get_problem("gemm_bf16").seed_text())


def test_signature_normalises_sizes_and_names():
    a = signature("check", "runtime_fault", None, "line 7: out-of-bounds read of `a`: elements [64, 96)")
    b = signature("check", "runtime_fault", None, "line 9: out-of-bounds read of `b`: elements [0, 32)")
    assert a == b
    assert signature("verify", "verify_failed", "resources.smem", "x") == "verify:verify_failed:resources.smem"


def _variants(n, fn):
    rng = np.random.default_rng(0)
    out = []
    while len(out) < n:
        p = fn(retile(SEED, rng), rng)
        if p.hash not in {q.hash for q in out}:
            out.append(p)
    return out


def test_miner_finds_the_separating_feature():
    failing = [features(p) for p in _variants(4, drop_guards)]
    passing = [features(p) for p in _variants(4, lambda p, r: p)]
    prop = mine_rule("check:runtime_fault:x", failing, passing, "harness.learned_1")
    assert prop is not None and prop.kind == "rule"
    assert prop.payload["predicate"][0][0] in ("unguarded_load", "unguarded_store")


def test_miner_refuses_when_nothing_separates():
    same = [features(p) for p in _variants(4, lambda p, r: p)]
    assert mine_rule("sig", same, same, "r") is None
    assert mine_rule("sig", same[:2], [], "r", min_support=3) is None


def test_versions_round_trip_and_learned_rule_blocks():
    spec = HarnessSpec().apply("rule", {"id": "harness.learned_1", "predicate": [["unguarded_load", True]],
                                        "message": "m", "hint": "h"}, 1)
    assert spec.version == 1 and spec.parent == 0
    assert HarnessSpec.from_json(spec.to_json()) == spec
    bad = drop_guards(SEED, np.random.default_rng(0))
    gate = corpus_gate(HarnessSpec(), spec, [("seed", SEED.text())], [(bad.text(), 2.5)])
    assert gate.passed and gate.caught == 1 and gate.gpu_seconds_saved == 2.5


def test_gate_fails_a_rule_that_breaks_a_passing_kernel():
    spec = HarnessSpec().apply("rule", {"id": "r", "predicate": [["threads", 256]], "message": "m"}, 1)
    gate = corpus_gate(HarnessSpec(), spec, [("seed", SEED.text())], [])
    assert not gate.passed and gate.newly_failing == ["seed"]


def test_quality_measures():
    from cake_core.model.quality import best_survives, median_abs_log_error, rank_correlation
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2], [1, 2]) is None
    rows = [("g1", 1.0, 5.0), ("g1", 2.0, 1.0), ("g1", 3.0, 9.0), ("g2", 1.0, 1.0), ("g2", 2.0, 2.0)]
    assert best_survives(rows, k=1) == 0.5 and best_survives(rows, k=2) == 1.0
    assert abs(median_abs_log_error([2.0, 1.0, 4.0], [1.0, 1.0, 1.0]) - 0.6931) < 1e-3


def test_calibration_miner_refits_a_biased_atom_and_leaves_a_good_one():
    from cake_core.harness.miners import mine_calibration
    from cake_core.model.cost import CostModel
    m = CostModel("H200")
    biased = [(1.0 * (1 + 0.05 * i), 4.0 * (1 + 0.05 * i), "fma") for i in range(8)]   # 4x optimistic
    good = [(1.0 + i, 1.05 * (1.0 + i), "wgmma") for i in range(8)]
    prop = mine_calibration(biased + good, m)
    assert prop is not None and prop.kind == "calibration" and set(prop.payload["eff"]) == {"fma"}
    assert prop.payload["eff"]["fma"] < m.eff["fma"]        # slower than predicted: lower efficiency
    ev = prop.evidence["held_out_median_abs_log_error"]
    assert ev["after"] < 0.05 < 1.3 < ev["before"]
    assert mine_calibration(good, m) is None
    spec = HarnessSpec().apply(prop.kind, prop.payload, 1)
    assert dict(spec.cost_eff)["fma"] == prop.payload["eff"]["fma"]
