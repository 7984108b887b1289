"""The corpus gate: every hand-written kernel, seed and best attempt replayed under a proposed harness."""
import json
import time

from cake_core.harness.gate import ORIGINS, GateCache, corpus, gate_shapes, kernel_problem, run_gate
from cake_core.harness.predicate import Atom, Predicate
from cake_core.harness.proposal import Proposal
from cake_core.harness.version import HarnessSpec
from cake_core.problems import get_problem, list_problems
from cake_core.problems.base import SEEDS_DIR


def _rule(*atoms):
    pred = Predicate(tuple(Atom(*a) for a in atoms))
    return Proposal("rule", "test", pred.text(), {"id": "learned.test.000000", "predicate": pred.to_data(),
                                                  "message": "m", "hint": "h"})


def test_the_corpus_is_every_kernel_file_with_its_problem():
    kernels = corpus()
    files = sorted(p.name for p in SEEDS_DIR.glob("*.cake"))
    assert sorted(k.name.removeprefix("seeds/") for k in kernels) == files
    assert {k.origin for k in kernels} == {"seed", "hand-written"}
    assert sum(k.origin == "seed" for k in kernels) == len(list_problems())
    assert kernel_problem("kmeans_assign_pingpong_mc.cake") == "kmeans_assign"     # listed nowhere: by prefix
    assert kernel_problem("tinygemm_rows.cake") == "tinygemm" and kernel_problem("nothing.cake") is None
    for p in list_problems():
        shapes = gate_shapes(p)
        ss = [p.shape_set(n) for n in p.shape_sets]
        held = [s for x in ss for s, r in zip(x.shapes, x.roles) if r == "held_out"]
        assert shapes and all(max(s.values()) <= p.cpu_limit and s not in held for s in shapes)


def test_a_rule_that_blocks_hand_written_kernels_is_refused(gate_cache):
    kernels = corpus()
    t0 = time.monotonic()
    gate = run_gate(_rule(("sched.threads", "==", 384)), HarnessSpec(), kernels, gate_cache)
    first = time.monotonic() - t0
    assert not gate["passed"] and gate["refusals"][0].endswith("kernel(s) that pass today would fail")
    blocked = {f["kernel"] for f in gate["flips"]}
    expected = {k.name for k in kernels if "threads=384" in k.text}
    assert blocked == expected and len(blocked) >= 10
    assert {f["origin"] for f in gate["flips"]} == {"hand-written"}
    assert all(f["stage"] == "verify" and f["why"].startswith("learned.test.000000") for f in gate["flips"])
    assert gate["corpus"]["hand-written"] == len(kernels) - len(list_problems())
    json.dumps(gate)                                                     # the report is plain data
    misses = gate_cache.misses
    again = run_gate(_rule(("sched.threads", "==", 384)), HarnessSpec(), kernels, gate_cache)
    assert again["flips"] == gate["flips"] and gate_cache.misses == misses   # replayed from the cache
    print(f"corpus gate: {len(kernels)} kernels, {gate['corpus']['replays']} replays, {first:.1f} s, "
          f"from the cache {again['seconds']:.2f} s")


def test_a_rule_no_passing_kernel_meets_flips_nothing(gate_cache):
    gate = run_gate(_rule(("op.tcgen05_mma", ">=", 1), ("sched.threads", "<", 64)), HarnessSpec(), corpus(),
                    gate_cache)
    assert gate["flips"] == [] and gate["corpus"]["replays"] > 2 * len(corpus())
    assert gate["refusals"] == ["the rule would have stopped no failure that reached a later stage"]
    assert set(ORIGINS) >= {k["origin"] for k in gate["flips"]}


def test_the_gate_asks_the_gpu_checker_when_there_is_one():
    calls = []

    def gpu(program, problem, shapes, seed):
        calls.append(program.name)
        return [(program.name != "tinygemm_rows", "wrong on the GPU")] * len(shapes)
    tiny = [k for k in corpus() if k.problem == "tinygemm"]
    gate = run_gate(_rule(("op.tcgen05_mma", ">=", 1)), HarnessSpec(), tiny, GateCache(), gpu=gpu)
    assert gate["gpu"] and set(calls) == {k.name.removeprefix("seeds/").removesuffix(".cake") for k in tiny}
    assert {f["kernel"] for f in gate["corpus"]["failing_today"]} == {"seeds/tinygemm_rows.cake"}
    assert gate["flips"] == []
