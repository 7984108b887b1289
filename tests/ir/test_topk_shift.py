"""topk_shift and knn_search_ws_deep: the kernel passes every rule and is right on the interpreter (the query norms
added to the kept lists), planted mistakes fail with topk_shift.operands or the protocol checker at their line,
a role's own published norms need no wait of its own, and the op lowers and compiles without spills."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file, get_problem
from cake_core.runtime.cpu import check_on_cpu
from planting import assert_fires_at_its_line

DEEP = corpus_file("knn_search_ws_deep.cake").read_text()
SHIFT = "topk_shift(top_v, qn_s)"
SHIFT_LINE = next(i for i, ln in enumerate(DEEP.splitlines(), 1) if SHIFT in ln)

PLANTED = {
    # the indices list is not the values list of a topk_bias
    "topk_shift.operands": (SHIFT, "topk_shift(top_i, qn_s)", SHIFT_LINE),
}


KERNELS = ["knn_search_ws_deep", "knn_search_ws_deep_k32", "knn_search_split", "knn_search_split_m64",
           "knn_search_split_stream", "knn_search_split_unaligned"]


@pytest.mark.parametrize("name", KERNELS)
def test_the_kernels_pass_every_rule(name):
    assert check_text(corpus_file(f"{name}.cake").read_text(), f"{name}.cake") == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    assert_fires_at_its_line(DEEP, PLANTED, {}, rule_id)


def test_rows_of_the_wrong_length_are_refused():
    text = DEEP.replace("qn_s = smem(f32, (BM,))", "qn_s = smem(f32, (BN // 2,))")
    hits = [d for d in check_text(text) if d.rule == "topk_shift.operands"]
    assert hits and hits[0].line == SHIFT_LINE and "128 values" in hits[0].message, hits


def test_shifting_without_waiting_for_the_query_norms_is_a_protocol_error():
    text = DEEP.replace("        wait(q_ready[0], phase=0)\n", "")
    hits = [d for d in check_text(text) if d.rule == "protocol.read_before_ready"]
    assert hits and hits[0].line == SHIFT_LINE - 1 and "qn_s" in hits[0].message, [d.rule for d in check_text(text)]


def test_a_role_reads_the_norms_it_published_itself_without_a_wait():
    # the producer adds chunk after chunk into nrm_s (accumulate=True) across its own arrives on `empty`: the
    # role's own threads wrote them (sqnorm_rows ends on a barrier of the role), so no wait of its own is owed;
    # the consumer still must wait on `ready` (the next test)
    assert "sqnorm_rows(nrm_s[j // min(cdiv(D, BK), 8) % 2], db_s[j % S], accumulate=True)" in DEEP
    assert not [d for d in check_text(DEEP) if d.rule.startswith("protocol.")]


def test_the_consumer_still_waits_for_the_norms_the_producer_publishes():
    text = DEEP.replace("            wait(ready[mt % 2], phase=mt // 2 % 2)\n", "")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "topk_bias(" in ln)
    hits = [d for d in check_text(text) if d.rule == "protocol.read_before_ready"]
    assert hits and hits[0].line == line, [d.rule for d in check_text(text)]


def test_interpreter_adds_each_rows_value_to_its_list():
    prog = parse_program(DEEP, "knn_search_ws_deep.cake")
    rng = np.random.default_rng(3)
    tv = np.sort(rng.normal(size=(128, 16)).astype(np.float32), axis=1)
    tv[:, -2:] = np.inf
    rows = rng.normal(size=128).astype(np.float32)

    class _CTA:   # the op's semantics read the list tile and the rows slot
        tiles = {"top_v": tv.copy(), "qn_s": rows}
    from cake_core.ir import ops_async
    node = next(n for n in _walk(prog) if n.op.value == "topk_shift")
    cta = _CTA()
    orig = ops_async.slot_array
    ops_async.slot_array = lambda c, n, s: c.tiles[s.buf if hasattr(s, "buf") else s]
    try:
        ops_async.topk_shift(cta, node)
    finally:
        ops_async.slot_array = orig
    want = tv + rows[:, None]
    assert np.array_equal(cta.tiles["top_v"], want.astype(np.float32))
    assert np.isinf(cta.tiles["top_v"][:, -2:]).all()


def _walk(prog):
    from cake_core.ir.tree import walk
    return [n for n, _, _ in walk(prog.body)]


@pytest.mark.parametrize("name, shapes", [
    ("knn_search_ws_deep", ["B=2,Q=130,M=300,D=200,k=16,S=2", "B=1,Q=64,M=64,D=64,k=5,S=1",
                            "B=1,Q=5,M=129,D=136,k=10,S=2"]),
    ("knn_search_ws_deep_k32", ["B=2,Q=70,M=300,D=200,k=32,S=2", "B=1,Q=200,M=200,D=512,k=20,S=1"]),
    # the database split over the 8 CTAs of a cluster (some with no tile of it at M = 100), merged per batch
    ("knn_search_split", ["B=2,Q=130,M=3000,D=200,k=16,S=2", "B=1,Q=3,M=100,D=64,k=10,S=2"]),
    ("knn_search_split_m64", ["B=2,Q=70,M=3000,D=512,k=16,S=2", "B=1,Q=100,M=100,D=64,k=16,S=1"]),
    # the query streamed beside the database past D = 512; at M = 100 seven of the eight CTAs get no tile
    ("knn_search_split_stream", ["B=1,Q=3,M=100,D=1024,k=10,S=2", "B=1,Q=64,M=64,D=768,k=16,S=1"]),
    # fed by cp.async: rows of 201, 7, 33 and 1 elements (16-, 8-, 4-byte chunks do not fit; element by element)
    ("knn_search_split_unaligned", ["B=2,Q=130,M=3000,D=201,k=16,S=2", "B=1,Q=3,M=100,D=7,k=10,S=2",
                                    "B=1,Q=64,M=64,D=33,k=16,S=1", "B=1,Q=5,M=1300,D=1,k=1,S=2"]),
])
def test_the_kernels_are_right_on_the_interpreter(name, shapes):
    prob = get_problem("knn_search")
    prog = parse_program(corpus_file(f"{name}.cake").read_text(), f"{name}.cake")
    parsed = [{k: int(v) for k, v in (kv.split("=") for kv in s.split(","))} for s in shapes]
    checks = check_on_cpu(prog, prob, parsed, seed=4)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks]


def test_without_the_shift_the_distances_are_wrong():
    # the lists still rank right, but the distances lack ||q||^2: the check names the distances
    prob = get_problem("knn_search")
    prog = parse_program(DEEP.replace(f"        {SHIFT}\n", ""), "planted.cake")
    (c,) = check_on_cpu(prog, prob, [{"B": 1, "Q": 64, "M": 200, "D": 64, "k": 8, "S": 2}], seed=4)
    assert not c.correct


def test_topk_shift_lowers_onto_the_header():
    r = lower(parse_program(DEEP, "knn_search_ws_deep.cake"), "knn_search_ws_deep.cake")
    assert r.outcome is Outcome.OK, r.diagnostics
    assert "cake::topk_shift_rows<16>(top_v, qn_s, (int)threadIdx.x - 128);" in r.value.source


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", KERNELS)
def test_the_kernels_compile_for_sm_90a_without_spills(tmp_path, name):
    lowered = lower(parse_program(corpus_file(f"{name}.cake").read_text(), f"{name}.cake"), f"{name}.cake")
    assert lowered.outcome is Outcome.OK, lowered.diagnostics
    r = compile_kernel(lowered.value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0, res


def test_a_cta_with_no_database_tile_waiting_for_query_norms_never_computed_is_a_deadlock():
    # the streamed kernel computes the query norms from the first tile's chunks: a CTA of the cluster with no tile
    # (M small) must not wait for them; without its guard the protocol checker finds the consumer blocked
    text = corpus_file("knn_search_split_stream.cake").read_text()
    guard = "        if max(min(cdiv(cdiv(M, BN), SPLIT), cdiv(M, BN) - bid.y * cdiv(cdiv(M, BN), SPLIT)), 0) > 0:\n"
    assert guard in text
    planted = text.replace(guard, "").replace("            wait(q_ready[0], phase=0)\n            topk_shift(",
                                              "        wait(q_ready[0], phase=0)\n        topk_shift(")
    hits = [d for d in check_text(planted) if d.rule == "protocol.deadlock"]
    assert hits and "q_ready" in hits[0].message, [d.rule for d in check_text(planted)]
