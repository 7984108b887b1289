"""The rule feature catalogue, mined-rule predicates as data, and learned rules in the verifier."""
import json

import pytest

from cake_core.harness.catalogue import catalogue, describe
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.learned import LearnedRule
from cake_core.harness.predicate import Atom, Predicate
from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.pipeline import verify_stage
from cake_core.problems import get_problem
from cake_core.problems import corpus_file

GEMM = parse_program(get_problem("gemm_bf16").seed_text())
WS = parse_program(corpus_file("gemm_bf16_ws.cake").read_text())
KNN = parse_program(get_problem("knn_topk").seed_text())
RAGGED = [{"M": 96, "N": 80, "K": 72}, {"M": 128, "N": 128, "K": 64}]


def test_op_patterns_schedule_and_resources_come_from_the_program():
    c = catalogue(GEMM)
    v = c.values
    assert v["op.load"] == 2 and v["op.load.guard=True"] == 2 and v["op.mma.atom=fma"] == 1
    assert v["op.load.depth"] == 1 and v["op.store.depth"] == 0            # in the k loop / after it
    assert v["op.mma.loop.K"] == 1 and c.get("op.store.loop.K") == 0        # the loop over K holds the mma
    assert v["order.sync>mma"] == 1 and v["order.mma>sync"] == 1 and c.get("order.mma>load") == 0
    assert v["sched.threads"] == 256 and v["sched.loops"] == 1 and v["sched.roles"] == 0
    assert v["res.smem_bytes"] == 2 * 64 * 32 * 2 and v["const.BK"] == 32
    assert c.sites["op.mma"].line > 0 and "shape.K.tail" not in v           # no shapes, no shape relations
    w = catalogue(WS).values
    assert w["op.tma_load@producer"] == 2 and w["op.wgmma@consumer"] == 1 and w["sched.roles"] == 2
    assert w["op.smem.stages.max"] == 4 and w["sched.role_regs"] == 232 and w["res.role_regs_total"] > 0
    assert all(json.dumps(x) for x in v.values())                        # plain data


def test_shape_relations_compare_the_run_shapes_with_the_tiles():
    v = catalogue(GEMM, RAGGED).values
    assert v["shape.K.tail"] is True and v["shape.K.pow2"] == 8 and v["shape.K.max_tiles"] == 72 / 32
    assert v["shape.M.min"] == 96 and v["shape.N.min_tiles"] == 80 / 64
    aligned = catalogue(GEMM, [{"M": 128, "N": 128, "K": 64}]).values
    assert aligned["shape.K.tail"] is False and aligned["shape.K.pow2"] == 64
    # knn writes its k results as one tile at a fixed position: a k above KMAX is never written
    k = catalogue(KNN, [{"Q": 32, "N": 128, "D": 32, "k": 10}]).values
    assert k["view.fixed.max_tiles"] == 10 / 16 and k["shape.k.max_tiles"] == 10 / 16
    assert "view.fixed.max_tiles" not in catalogue(GEMM, RAGGED).values


def test_predicates_compare_with_thresholds_and_round_trip_as_data():
    cat = catalogue(GEMM, RAGGED)
    p = Predicate((Atom("shape.K.tail", "==", True), Atom("res.smem_bytes", "<=", 8192),
                   Atom("op.wgmma", "==", 0)))
    assert p.holds(cat)
    assert not Predicate((Atom("res.smem_bytes", ">", 8192),)).holds(cat)
    assert not Predicate((Atom("shape.Q.min", ">=", 0),)).holds(cat)       # absent (no such dim): false
    assert not Predicate((Atom("shape.K.tail", ">", 0),)).holds(cat)       # no ordering on booleans
    data = json.loads(json.dumps(p.to_data()))
    assert Predicate.from_data(data) == p
    assert Predicate.from_data({"all": list(reversed(data["all"]))}).key() == p.key()
    assert "the largest power of two" in describe("shape.K.pow2")


@pytest.mark.parametrize("bad, said", [
    ({"all": []}, "a predicate reads"),
    ({"all": [{"feature": "nonsense", "op": "==", "value": 1}]}, "not a catalogue feature"),
    ({"all": [{"feature": "sched.threads", "op": "~", "value": 1}]}, "use one of"),
    ({"all": [{"feature": "sched.threads", "op": "==", "value": [1]}]}, "values are numbers"),
    ({"all": [{"feature": "sched.threads", "op": "=="}]}, "exactly feature, op and value"),
])
def test_malformed_predicates_are_refused_with_what_is_wrong(bad, said):
    with pytest.raises(HarnessDataError, match=said):
        Predicate.from_data(bad)


def test_a_learned_rule_blocks_in_the_verifier_with_its_id_message_hint_and_site():
    rule = LearnedRule("learned.shape_k_tail.000001", Predicate((Atom("shape.K.tail", "==", True),
                                                                  Atom("op.load.guard=False", ">", 0))),
                       "unguarded loads on a ragged K", "guard the loads")
    unguarded = GEMM.text().replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)")
    prog = parse_program(unguarded)
    got = [d for d in verify(prog, learned=[rule], shapes=RAGGED) if d.rule == rule.id]
    assert len(got) == 1 and got[0].is_error and got[0].hint == "guard the loads"
    assert got[0].line == next(n.line for n in prog.body[3].body if n.op.value == "load")
    assert any("shape.K.tail = True" in w for w in got[0].witness)
    assert not [d for d in verify(prog, learned=[rule], shapes=[{"M": 128, "N": 128, "K": 64}]) if d.rule == rule.id]
    assert not [d for d in verify(GEMM, learned=[rule], shapes=RAGGED) if d.rule == rule.id]
    spec = HarnessSpec(1, 0, (rule,))
    r = verify_stage(unguarded, spec, get_problem("gemm_bf16"), RAGGED)
    assert r.outcome.value == "verify_failed" and rule.id in {d.rule for d in r.errors}
    assert HarnessSpec.from_json(spec.to_json()) == spec


def test_rules_of_older_versions_read_as_equalities_over_the_stored_features():
    old = {"version": 1, "parent": 0, "learned_rules": [
        {"id": "harness.learned_1", "predicate": [["unguarded_load", True]], "message": "m", "hint": "h"}],
        "cost_eff": {}, "disabled_tactics": []}
    spec = HarnessSpec.from_json(json.dumps(old))
    assert spec.learned_rules[0].predicate.atoms == (Atom("ir.unguarded_load", "==", True),)
    unguarded = parse_program(GEMM.text().replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)"))
    assert spec.learned_rules[0].diagnose(unguarded) and not spec.learned_rules[0].diagnose(GEMM)
    with pytest.raises(HarnessDataError, match="JSON"):
        HarnessSpec.from_json("{")
