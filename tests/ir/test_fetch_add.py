"""fetch_add: one atomic read-modify-write per CTA, its old value bound as a name (text, verifier, interpreter,
bounds, cost model, protocol checker); a counter the CTAs share in gmem (tokens claim slots of their experts, in an
order the GPU chooses: checked as sets per expert) and one a CTA keeps in smem (a running offset across a loop's
trips). tests/lower/test_lower_fetch_add.py lowers and compiles them; tests/runtime/test_token_permute_gpu.py runs
them on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.interp import InterpFault
from cake_core.ir.intervals import Interval, loop_bounds
from cake_core.ir.ops import Op
from cake_core.ir.printer import print_program
from cake_core.ir.program import walk
from cake_core.ir.text import parse_program
from cake_core.model.features import extract
from cake_core.problems import corpus_file

# a capacity layout of tokens by expert: token m's j-th expert e gives it the next free slot of e's row of slots
# (slots[e * M + slot] = m); counts[e] ends as e's number of tokens. One CTA per token: the CTAs' adds into
# counts[e] land in any order, so the slots of one expert hold its tokens in any order.
DISPATCH = """@kernel(target="sm_90a", grid=(M,), threads=64)
def dispatch(topk_ids: gmem[i32, (M, k)], counts: gmem[i32, (E,)], slots: gmem[i32, (E * M,)]):
    tok = smem(i32, (1,))
    iota(tok, base=bid.x)
    sync()
    for j in range(k):
        scalar(e, topk_ids[bid.x, j], max=E - 1)
        fetch_add(slot, counts[e], 1, max=M - 1)
        store(slots[tile(e * M + slot, 1)], tok)
"""

# a running offset the CTA keeps in smem: starts[s] = lens[0] + ... + lens[s - 1] (an exclusive prefix sum, which
# bindings, fixed once bound, cannot carry from one trip to the next); a segment holds at most R entries
RUNNING = """@kernel(target="sm_90a", grid=(1,), threads=32, consts={"R": 8})
def running(lens: gmem[i32, (S,)], starts: gmem[i32, (S + 1,)]):
    cur = smem(i32, (1,))
    v = smem(i32, (1,))
    fill(cur)
    sync()
    for s in range(S):
        scalar(n, lens[s], max=R)
        fetch_add(off, cur[0], n, max=S * R)
        iota(v, base=off)
        sync()
        store(starts[tile(s, 1)], v)
        sync()
    scalar(total, cur[0], max=S * R)
    iota(v, base=total)
    sync()
    store(starts[tile(S, 1)], v)
"""


def _errors(text: str) -> list[str]:
    return [d.rule for d in check_text(text) if d.severity.name == "ERROR"]


def routed(rng, M: int, k: int, E: int, empty: int | None = 0, full: int | None = None) -> np.ndarray:
    """topk_ids (M, k): k distinct experts per token, none of them ``empty``, ``full`` among every token's."""
    pool = [e for e in range(E) if e not in (empty, full)]
    rows = []
    for _ in range(M):
        pick = list(rng.choice(pool, k - (full is not None), replace=False)) + ([full] if full is not None else [])
        rows.append(rng.permutation(pick))
    return np.asarray(rows, np.int32)


def dispatch_case(rng, M=23, k=3, E=6):
    ids = routed(rng, M, k, E, empty=0, full=E - 1)
    return {"M": M, "k": k, "E": E}, {"topk_ids": ids}


def _dispatch(shape: dict, inputs: dict, text: str = DISPATCH) -> dict:
    M, E = shape["M"], shape["E"]
    return interp.run(parse_program(text), shape, inputs, {"counts": np.zeros(E, np.int32),
                                                            "slots": np.full(E * M, -7, np.int32)})


def check_dispatch(ids: np.ndarray, E: int, counts: np.ndarray, slots: np.ndarray) -> None:
    """The oracle of any order of the adds: every expert's count, its tokens as a set, untouched slots past them."""
    M = ids.shape[0]
    slots = slots.reshape(E, M)
    for e in range(E):
        mine = np.flatnonzero((ids == e).any(axis=1))
        assert counts[e] == mine.size, (e, counts[e], mine)
        assert sorted(slots[e, :mine.size]) == list(mine), (e, slots[e], mine)
        assert (slots[e, mine.size:] == -7).all(), (e, slots[e])


def test_tokens_claim_slots_of_their_experts_in_an_order_the_oracle_leaves_open():
    assert _errors(DISPATCH) == []
    shape, inputs = dispatch_case(np.random.default_rng(0))
    got = _dispatch(shape, inputs)
    check_dispatch(inputs["topk_ids"], shape["E"], got["counts"], got["slots"])
    assert got["counts"][0] == 0 and got["counts"][-1] == shape["M"]        # an expert with none, one with all
    # the interpreter runs the CTAs in order: one order the GPU may take, each expert's tokens ascending
    slots = got["slots"].reshape(shape["E"], shape["M"])
    assert all(list(slots[e, :c]) == sorted(slots[e, :c]) for e, c in enumerate(got["counts"]))


def test_a_running_offset_kept_in_smem_is_the_exclusive_prefix_sum():
    assert _errors(RUNNING) == []
    lens = np.array([3, 0, 5, 5, 1, 0], np.int32)
    got = interp.run(parse_program(RUNNING), {"S": 6}, {"lens": lens},
                     {"starts": np.full(7, -7, np.int32)})["starts"]
    np.testing.assert_array_equal(got, np.concatenate([[0], np.cumsum(lens)]))


def test_an_old_value_outside_the_declared_range_is_a_fault_at_its_line():
    shape, inputs = dispatch_case(np.random.default_rng(1))
    with pytest.raises(InterpFault) as e:         # expert E - 1 takes every token: its last slot is M - 1
        _dispatch(shape, inputs, DISPATCH.replace("max=M - 1)", "max=M - 2)"))
    assert f"fetch_add `slot` found {shape['M'] - 1} in `counts`[{shape['E'] - 1}], outside its declared range " \
           f"[0, {shape['M'] - 2}]" in str(e.value)
    assert e.value.node.line == 8


def test_the_text_round_trips_in_canonical_form():
    for text in (DISPATCH, RUNNING):
        p = parse_program(text)
        assert print_program(p) == text
        assert print_program(parse_program(print_program(p))) == print_program(p)


def test_its_name_is_bounded_by_the_declared_range():
    p = parse_program(RUNNING.replace("max=S * R)\n        iota", "max=40)\n        iota"))
    loop = next(n for n, _, _ in walk(p.body) if n.op is Op.FOR)
    after = loop.body[2]                                        # the iota after the fetch_add
    assert loop_bounds(p, {"S"})[id(after)]["off"] == Interval(0, 40)


def test_the_cost_model_counts_one_atomic_per_cta_and_trip():
    f = extract(parse_program(DISPATCH), {"M": 64, "k": 8, "E": 16})
    assert f.atomic_ops == 8 and f.atomic_bytes == 8 * 4 and f.smem_atomic_ops == 0     # per CTA: one per trip
    g = extract(parse_program(RUNNING), {"S": 10})
    assert g.smem_atomic_ops == 10 and g.atomic_ops == 0


_RACY_FILL = RUNNING.replace("    fill(cur)\n    sync()\n", "    fill(cur)\n")
_RACY_READ = RUNNING.replace("        fetch_add(off, cur[0], n, max=S * R)\n",
                             "        fetch_add(off, cur[0], n, max=S * R)\n        scalar(seen, cur[0], max=S * R)\n")


@pytest.mark.parametrize("text, rule, words, line", [
    (DISPATCH.replace("counts: gmem[i32, (E,)]", "counts: gmem[f32, (E,)]"), "fetch_add.target",
     "`counts` is f32; it adds into i32", 8),
    (DISPATCH.replace("counts[e], 1", "counts[tile(e, 1)], 1"), "fetch_add.target",
     "a window of `counts`, not one element", 8),
    (RUNNING.replace("cur = smem(i32, (1,))", "cur = smem(i32, (1,), stages=2)"), "fetch_add.target",
     "`cur` is a ring smem tile", 9),
    (RUNNING.replace("cur = smem(i32, (1,))", "cur = rmem(i32, (32,))").replace("cur[0]", "cur[s]"),
     "fetch_add.target", "`cur` is a rmem tile", 9),
    (DISPATCH.replace("max=M - 1)", "max=j)"), "fetch_add.max", "fetch_add `slot`'s max uses `j`", 8),
    (DISPATCH.replace("max=M - 1)", "max=M - 0.5)"), "fetch_add.max", "holds a float", 8),
    (_RACY_FILL, "races.smem", "atomic-after-write race on smem tile `cur`", 8),
    (_RACY_READ, "races.smem", "read-after-atomic race on smem tile `cur`", 10),
])
def test_misuse_is_refused_for_its_reason_at_its_line(text, rule, words, line):
    diags = [d for d in check_text(text) if d.rule == rule]
    assert diags, [d.rule + ": " + d.message for d in check_text(text)]
    assert words in diags[0].message and diags[0].line == line, diags[0].message
    assert diags[0].hint


def test_fetch_adds_of_one_counter_need_no_sync_between_them():
    # two claims in a row: adds of one counter commute with each other, only plain accesses race with them
    claim = "        fetch_add(off, cur[0], n, max=S * R)\n"
    twice = RUNNING.replace(claim, claim + "        fetch_add(off2, cur[0], 0, max=S * R)\n")
    assert _errors(twice) == []


WS = corpus_file("gemm_bf16_ws.cake").read_text()


def _ws_with_claimed_trips(op: str) -> str:
    """The warp-specialized GEMM whose producer walks ``n`` k-tiles, ``n`` bound at the top level by ``op`` (at most
    cdiv(K, BK)), while its consumer walks cdiv(K, BK)."""
    text = WS.replace("c: gmem[f32, (M, N)]):", "c: gmem[f32, (M, N)], cnt: gmem[i32, (1,)]):")
    text = text.replace('    with role("producer", warps=(0, 4), regs=40):\n        for kt in range(cdiv(K, BK)):',
                        f'    {op}\n    with role("producer", warps=(0, 4), regs=40):\n        for kt in range(n):')
    assert text.count("range(n)") == 1
    return text


def test_the_protocol_checker_also_takes_the_old_value_at_zero():
    text = _ws_with_claimed_trips("fetch_add(n, cnt[0], 0, max=cdiv(K, BK))")
    diags = [d for d in check_text(text) if d.rule.startswith("protocol.")]
    assert diags and diags[0].rule == "protocol.deadlock", [d.rule + ": " + d.message for d in check_text(text)]
    assert any("every fetch_add's old value" in w for w in diags[0].witness), diags[0].witness


def test_inside_a_role_it_is_refused_and_before_the_roles_it_passes():
    inside = WS.replace("c: gmem[f32, (M, N)]):", "c: gmem[f32, (M, N)], cnt: gmem[i32, (1,)]):").replace(
        '    with role("producer", warps=(0, 4), regs=40):\n',
        '    with role("producer", warps=(0, 4), regs=40):\n        fetch_add(n, cnt[0], 1, max=M)\n')
    d = [d for d in check_text(inside) if d.rule == "let.cta_wide"]
    assert d and d[0].line == 8 and "inside role `producer`" in d[0].message, [x.rule for x in check_text(inside)]
    before = WS.replace("c: gmem[f32, (M, N)]):", "c: gmem[f32, (M, N)], cnt: gmem[i32, (1,)]):").replace(
        '    with role("producer"', '    fetch_add(n, cnt[0], 1, max=M)\n    with role("producer"')
    assert _errors(before) == []
