"""The corpus gate: every hand-written kernel, seed and best attempt replayed under a proposed harness."""
import json
import time

from cake_core.harness.gate import (ORIGINS, GateCache, Kernel, corpus, gate_shapes, kernel_problem, kernel_shapes,
                                     replay, run_gate)
from cake_core.harness.predicate import Atom, Predicate
from cake_core.harness.proposal import Proposal
from cake_core.harness.version import HarnessSpec
from cake_core.problems import get_problem, list_problems
from cake_core.problems import corpus_files


def _rule(*atoms):
    pred = Predicate(tuple(Atom(*a) for a in atoms))
    return Proposal("rule", "test", pred.text(), {"id": "learned.test.000000", "predicate": pred.to_data(),
                                                  "message": "m", "hint": "h"})


def test_the_corpus_is_every_kernel_file_with_its_problem():
    kernels = corpus()
    files = sorted(p.name for p in corpus_files("*.cake"))
    assert sorted(k.name.rsplit("/", 1)[-1] for k in kernels) == files
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
    assert gate["corpus"]["strict_replays"] >= len(corpus())          # every kernel on its own strict shapes too
    assert gate["refusals"] == ["the rule would have stopped no failure that reached a later stage"]
    assert set(ORIGINS) >= {k["origin"] for k in gate["flips"]}


def test_the_gate_asks_the_gpu_checker_when_there_is_one():
    calls = []

    def gpu(program, problem, shapes, seed):
        calls.append(program.name)
        return [(program.name != "tinygemm_rows", "wrong on the GPU")] * len(shapes)
    tiny = [k for k in corpus() if k.problem == "tinygemm"]
    gate = run_gate(_rule(("op.tcgen05_mma", ">=", 1)), HarnessSpec(), tiny, GateCache(), gpu=gpu)
    assert gate["gpu"] and set(calls) == {k.name.rsplit("/", 1)[-1].removesuffix(".cake") for k in tiny}
    assert {f["kernel"] for f in gate["corpus"]["failing_today"]} == {"tinygemm/kernels/tinygemm_rows.cake"}
    assert gate["flips"] == []


KM_SEED = Kernel("seeds/kmeans_assign.cake", "seed", "kmeans_assign", get_problem("kmeans_assign").seed_text())


def test_each_kernel_is_replayed_on_its_strict_shapes_too():
    (shape, strict), = [(s, st) for s, st in kernel_shapes(KM_SEED, get_problem("kmeans_assign"), HarnessSpec()) if st]
    assert shape == {"B": 2, "N": 257, "K": 129, "D": 65}        # two 128-row tiles and a tail: past any gate shape
    # a rule that holds only past N = 160 blocks no kernel on the gate shapes (all CPU-sized) and the seed on its
    # strict shape: a flip, and the proposal is refused
    gate = run_gate(_rule(("shape.N.max", ">", 160)), HarnessSpec(), [KM_SEED], GateCache())
    assert [(f["shape"], f["strict"], f["stage"]) for f in gate["flips"]] == [("B=2,N=257,K=129,D=65", True, "verify")]
    assert not gate["passed"] and gate["corpus"]["strict_replays"] == 1


def test_a_kernel_wrong_only_past_the_gate_shapes_fails_today():
    text = KM_SEED.text.replace("limit=K)", "limit=min(K, 256))")
    report = replay([Kernel("attempt:first-256", "best-attempt", "kmeans_assign", text)], HarnessSpec(),
                    HarnessSpec(), GateCache())
    # right on every gate shape and on the strict shape under the threshold; wrong past it (K > 256)
    (bad,) = report["failing_today"]
    assert bad["strict"] and bad["shape"] == "B=2,N=257,K=321,D=65" and bad["why"].startswith("wrong: ")
    assert report["replays"] == len(gate_shapes(get_problem("kmeans_assign"))) + 1 and report["flips"] == []
