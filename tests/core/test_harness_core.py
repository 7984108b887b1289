"""Signatures, harness versions, proposal keys, macro tactics and the miners' refusals."""
import json
import math

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import TACTICS, drop_guards, retile
from cake_core.harness import calibration as cal
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.macro import Macro, chain, flatten
from cake_core.harness.miners import mine_calibration, mine_primitive, mine_rule, mine_tactic
from cake_core.harness.proposal import proposal_key
from cake_core.model.analytic import AnalyticModel
from cake_core.harness.records import AttemptRecord, ClusterRecord
from cake_core.harness.signature import signature
from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
from cake_core.problems import corpus_files

SEED = parse_program(get_problem("gemm_bf16").seed_text())
RULE = {"id": "learned.x.000001", "predicate": {"all": [{"feature": "sched.threads", "op": ">", "value": 512}]},
        "message": "m", "hint": "h"}
COMP = {"name": "sync2", "operands": [], "body": ["sync()", "sync()"]}


def test_signature_normalises_sizes_and_names():
    a = signature("check", "runtime_fault", None, "line 7: out-of-bounds read of `a`: elements [64, 96)")
    b = signature("check", "runtime_fault", None, "line 9: out-of-bounds read of `b`: elements [0, 32)")
    assert a == b
    assert signature("verify", "verify_failed", "resources.smem", "x") == "verify:verify_failed:resources.smem"


def test_every_kind_makes_a_version_that_round_trips():
    spec = HarnessSpec()
    spec = spec.apply("rule", RULE, 1)
    spec = spec.apply("primitive", {"composite": COMP}, 2)
    spec = spec.apply("calibration", {"eff": {"bytes": 1.6}}, 3)
    spec = spec.apply("tactic", {"macro": {"name": "macro_retile_unroll", "steps": ["retile", "unroll"]}}, 4)
    assert (spec.version, spec.parent) == (4, 3)
    assert HarnessSpec.from_json(spec.to_json()) == spec
    assert spec.cost_model().eff["bytes"] == 1.6 and spec.cost_model().version == f"{AnalyticModel().version}+harness-v4"
    assert "macro_retile_unroll" in spec.tactics(TACTICS) and "sync2" in spec.expand("sync2()\n").used
    with pytest.raises(HarnessDataError, match="already has a rule"):
        spec.apply("rule", RULE, 5)


@pytest.mark.parametrize("kind, payload, said", [
    ("rule", {"id": "r", "predicate": {"all": []}, "message": "m"}, "a predicate reads"),
    ("primitive", {"composite": {"name": "load", "operands": [], "body": ["sync()"]}}, "not an op"),
    ("calibration", {"eff": {"bytes": -1}}, "positive factors"),
    ("tactic", {"macro": {"name": "a+b", "steps": ["retile", "unroll"]}}, "no `\\+`"),
    ("tactic", {"macro": {"name": "m", "steps": ["retile"]}}, "two or more"),
    ("grammar", {}, "unknown proposal kind"),
])
def test_a_payload_that_does_not_read_as_its_kind_is_refused(kind, payload, said):
    with pytest.raises(HarnessDataError, match=said):
        HarnessSpec().apply(kind, payload, 1)


def test_proposal_keys_ignore_names_and_order():
    renamed = {**RULE, "id": "learned.other.9", "message": "other words"}
    assert proposal_key("rule", RULE) == proposal_key("rule", renamed)
    assert proposal_key("primitive", {"composite": COMP}) == \
        proposal_key("primitive", {"composite": {**COMP, "name": "two_syncs"}})
    assert proposal_key("calibration", {"eff": {"bytes": 1.601}}) == proposal_key("calibration", {"eff": {"bytes": 1.6}})
    assert proposal_key("calibration", {"eff": {"bytes": 1.6}}) != proposal_key("calibration", {"eff": {"bytes": 2.1}})
    a = {"macro": {"name": "m1", "steps": ["retile", "unroll"]}}
    assert proposal_key("tactic", a) == proposal_key("tactic", {"macro": {"name": "m2", "steps": ["retile", "unroll"]}})


def test_a_macro_applies_its_steps_in_order_or_not_at_all():
    m = Macro("macro_retile_drop_guards", ("retile", "drop_guards"))
    got = chain(m, TACTICS)(SEED, np.random.default_rng(3))
    want = drop_guards(retile(SEED, np.random.default_rng(3)), np.random.default_rng(3))
    assert got == want and got != SEED
    guarded_once = drop_guards(SEED, np.random.default_rng(0))
    with pytest.raises(Refused, match="no guarded loads"):     # a step that refuses refuses the macro
        chain(Macro("m", ("drop_guards", "drop_guards")), TACTICS)(guarded_once, np.random.default_rng(0))
    assert flatten("macro_retile_drop_guards+unroll", (m,)) == ["retile", "drop_guards", "unroll"]
    table = HarnessSpec(macros=(Macro("m", ("retile", "nonexistent")),)).tactics(TACTICS)
    assert "m" not in table and set(TACTICS) <= set(table)


def _record(i, prog, outcome, **kw):
    return AttemptRecord(f"a{i}", kw.pop("run_id", "r"), kw.pop("problem", "gemm_bf16"), prog.text(), outcome,
                         program=prog, ir_hash=prog.hash, **kw)


def test_the_rule_miner_finds_nothing_when_failures_and_passes_look_alike():
    rng = np.random.default_rng(0)
    variants = [retile(SEED, rng) for _ in range(8)]
    same = [_record(i, p, "wrong", signature="s") for i, p in enumerate(variants[:4])]
    passing = [_record(10 + i, p, "checked") for i, p in enumerate(variants[:4])]
    props, why = mine_rule(ClusterRecord("s", "check", None, 4), same, passing)
    assert props == [] and "no condition" in why["why"]
    props, why = mine_rule(ClusterRecord("s", "check", None, 2), same[:2], passing)
    assert props == [] and "fewer than 3" in why["why"]


def test_a_condition_that_restates_a_warning_is_a_rule_one_that_restates_an_error_is_not():
    # the MoE seed's drop_guards children store the top-k's 16 slots into rows of k = 10: the built-in
    # shapes.tail_guard only warns (a kernel may be written for tile multiples), so they reach the GPU and are wrong
    moe = parse_program(get_problem("moe").seed_text())
    rng = np.random.default_rng(3)
    guarded = [retile(moe, rng) for _ in range(4)]
    wrong = [_record(i, drop_guards(p, rng), "wrong", problem="moe", signature="s",
                     rules=frozenset({"shapes.tail_guard"})) for i, p in enumerate(guarded)]
    passing = [_record(10 + i, p, "measured", problem="moe") for i, p in enumerate(guarded)]
    props, why = mine_rule(ClusterRecord("s", "check", None, 4), wrong, passing)
    assert props and not why, why
    assert all("guard" in json.dumps(pr.payload["predicate"]) for pr in props), [pr.title for pr in props]
    # the same attempts flagged by an error-level rule are already stopped: nothing to learn
    stopped = [_record(i, r.program, "verify_failed", problem="moe", signature="s",
                       rules=frozenset({"mma.sync_tiling"})) for i, r in enumerate(wrong)]
    props, why = mine_rule(ClusterRecord("s", "verify", None, 4), stopped, passing)
    assert props == [] and "restates a built-in rule" in why["why"]


def test_the_primitive_miner_needs_a_pattern_shared_by_two_problems():
    gemm = [_record(i, SEED, "checked", score=1.0) for i in range(3)]
    prop, why = mine_primitive(gemm)
    assert prop is None and "2 problems" in why["why"]
    tiny = parse_program(get_problem("tinygemm").seed_text())
    prop, _ = mine_primitive(gemm + [_record(9, tiny, "checked", problem="tinygemm", score=1.0)])
    assert prop is not None and prop.payload["composite"]["name"] == "load2_sync_mma_sync"


def test_the_tactic_miner_counts_only_steps_that_made_the_child_faster():
    rng = np.random.default_rng(1)
    rows = []
    for n, problem in enumerate(("gemm_bf16", "tinygemm")):
        parent = parse_program(get_problem(problem).seed_text())
        child = retile(retile(parent, rng), rng)
        rows += [_record(10 * n, parent, "checked", problem=problem, run_id=problem, score=2.0, tactic="seed"),
                 _record(10 * n + 1, child, "checked", problem=problem, run_id=problem, score=1.0,
                         tactic="retile+retile", parents=(parent.hash,))]
    prop, _ = mine_tactic(rows)
    assert prop is not None and prop.payload["macro"]["steps"] == ["retile", "retile"]
    assert prop.evidence["cluster"]["median_speedup"] == 2.0
    slower = [r if r.tactic == "seed" else AttemptRecord(**{**r.__dict__, "score": 3.0}) for r in rows]
    prop, why = mine_tactic(slower)
    assert prop is None and "no tactic sequence won" in why["why"]


def test_quality_measures():
    from cake_core.model.quality import best_survives, median_abs_log_error, rank_correlation
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2], [1, 2]) is None
    rows = [("g1", 1.0, 5.0), ("g1", 2.0, 1.0), ("g1", 3.0, 9.0), ("g2", 1.0, 1.0), ("g2", 2.0, 2.0)]
    assert best_survives(rows, k=1) == 0.5 and best_survives(rows, k=2) == 1.0
    assert abs(median_abs_log_error([2.0, 1.0, 4.0], [1.0, 1.0, 1.0]) - 0.6931) < 1e-3


def _samples(wgmma_factor: float) -> list[cal.Sample]:
    """Corpus GEMM kernels at large shapes, 'measured' as a model whose wgmma efficiency is scaled predicts."""
    model = HarnessSpec().cost_model()
    truth = HarnessSpec(cost_eff=(("wgmma", model.eff["wgmma"] * wgmma_factor),)).cost_model()
    shapes = {"gemm_bf16": [{"M": m, "N": m, "K": m} for m in (1024, 2048, 4096)],
              "tinygemm": [{"M": m, "N": 4096, "K": 4096} for m in (1, 8, 16, 64)]}
    out = []
    for path in corpus_files("*gemm*.cake"):
        prog = parse_program(path.read_text())
        problem = "tinygemm" if path.name.startswith("tinygemm") else "gemm_bf16"
        for s in shapes[problem]:
            out.append(cal.Sample(f"{path.stem}-{s['M']}", problem, prog, s, truth.estimate(prog, s).ms,
                                  f"{problem}|{s}"))
    return out


def test_the_calibration_miner_refits_only_where_the_error_clusters():
    model = HarnessSpec().cost_model()
    prop, why = mine_calibration(_samples(1.0), model)
    assert prop is None and "no error class is off" in why["why"]
    prop, _ = mine_calibration(_samples(0.5), model)       # wgmma-bound kernels run up to 2x slower
    assert prop is not None and set(prop.payload["eff"]) == {"wgmma"}
    assert prop.payload["eff"]["wgmma"] == pytest.approx(0.5 * model.eff["wgmma"], rel=0.2)
    judged = prop.evidence["judged_on_held_out"]
    assert judged["after"]["median_abs_log_error"] < 0.9 * judged["before"]["median_abs_log_error"]
    for ex in prop.evidence["examples"]:     # the held-out kernels it was worst on are now predicted closer
        assert abs(math.log(ex["predicted_ms_after"] / ex["measured_ms"])) < \
            abs(math.log(ex["predicted_ms_before"] / ex["measured_ms"]))
    assert judged["predictions_changed"] > 0
    json.dumps(prop.evidence)
