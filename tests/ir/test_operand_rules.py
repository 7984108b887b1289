"""The operand rules (rules_operands: names in scope, memory spaces, register tiles of one role, integer
indices, divisors, implicit narrowing) and the synchronisation rules (rules_sync: mbarrier placement and
counts, the cluster against the grid, the fence and barrier before a tma_store or a wgmma of smem that threads
wrote, role_sync's placement), with the slot-index bounds of
async.slot_index: every planted defect fails with its rule at the statement at fault, and its twin passes."""
from __future__ import annotations

from pathlib import Path

import pytest

import sibling
from cake_core.ir.check import check_text
from cake_core.ir.verify import RULES
from cake_core.problems import corpus_file

WS = corpus_file("gemm_bf16_ws.cake").read_text()
GEMM = corpus_file("gemm_bf16.cake").read_text()
MC = corpus_file("gemm_bf16_persistent_mc.cake").read_text()
STORE = """@kernel(target="sm_90a", grid=(cdiv(N, 64), cdiv(M, 64)), threads=128, consts={})
def twice(x: gmem[f32, (M, N)], y: gmem[f32, (M, N)]):
    r = rmem(f32, (64, 64))
    load(r, x[tile(bid.y, 64), tile(bid.x, 64)])
    y_s = smem(f32, (64, 64))
    ewise(y_s, r, r, fn="add")
    fence_async()
    sync()
    tma_store(y[tile(bid.y, 64), tile(bid.x, 64)], y_s)
"""
_gather = sibling.load(Path(__file__).parent / "test_gather.py")


def _attention_through_smem() -> str:
    """mha_ws.cake with P cast into a swizzled smem tile that the second wgmma reads (not a register A): the
    consumers' writes fenced, then a barrier of their role, then the wgmma."""
    from cake_core.problems import get_problem
    text = get_problem("mha").kernel_text("mha_ws.cake")
    for old, new in (("    ninf = smem(f32, (1, 1))\n", "    ninf = smem(f32, (1, 1))\n    p_s = smem(bf16, (BM, BN), swizzle=128)\n"
                                                  "    o_s = smem(f32, (BM, D))\n"),
                     ("        p = rmem(bf16, (BM, BN))\n", ""),
                     ("            cast(p, s)\n", "            cast(p_s, s)\n            fence_async()\n            role_sync()\n"),
                     ("            wgmma(acc, p, v_s[j % S])\n", "            wgmma(acc, p_s, v_s[j % S])\n")):
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


ATTN = _attention_through_smem()
BASES = {"ws": WS, "gemm": GEMM, "mc": MC, "store": STORE, "pick": _gather.PICK, "attn": ATTN}
WGMMA = "wgmma(acc, a_s[kt % S], b_s[kt % S])"
LOAD_B = "            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x, BN)], bar=full[kt % S])\n"
ACC = "        acc = rmem(f32, (BM, BN))\n"

# (rule, base, old, new, the text of the line the diagnostic must point at, words its message or hint holds)
PLANTED = [
    # an accumulator that was never allocated
    ("types.undefined", "ws", WGMMA, WGMMA.replace("acc,", "acc2,"), "wgmma(acc2", ("`acc2`", "not defined")),
    # a role storing the register tile another role allocated
    ("types.undefined", "ws", LOAD_B, LOAD_B + "            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)\n",
     "            store(c[", ("allocated at line 15 in role `consumer`",)),
    ("types.undefined", "gemm", "    acc = rmem(f32, (BM, BN))\n    for", "    for", "mma(acc", ("before its allocation",)),
    ("types.undefined", "ws", "arrive(empty[kt % S])", "arrive(empt[kt % S])", "arrive(empt", ("did you mean",)),
    ("types.space", "gemm", "acc = rmem(f32, (BM, BN))", "acc = smem(f32, (BM, BN))", "mma(acc", ("must be in rmem",)),
    ("types.space", "gemm", "store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)", "store(acc[tile(bid.y, BM), :], acc)",
     "store(acc", ("must be in gmem",)),
    # an mbarrier named where a tile is read or written (an op with its own space rule, and one without)
    ("types.space", "ws", WGMMA, WGMMA.replace("acc,", "empty,"), "            wgmma(empty",
     ("names the mbarrier `empty`", "rmem")),
    ("types.space", "ws", "store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)",
     "store(c[tile(bid.y, BM), tile(bid.x, BN)], full)", "        store(c[", ("names the mbarrier `full`",)),
    # a top-level register tile written by the consumers and stored by the producer
    ("types.rmem_role", "ws", ACC, "", "            store(c[", ("role `producer`", "role `consumer` holds")),
    ("types.index", "gemm", "tile(kt, BK)])\n        load(b_s", "tile(kt, 1.5)])\n        load(b_s",
     "load(a_s", ("1.5",)),
    ("shapes.divisor", "ws", "phase=kt // S % 2", "phase=kt // (S - 4) % 2", "wait(full", ("`S - 4`", "0")),
    # an implicit f32 -> i32 narrowing
    ("types.narrowing", "gemm", "c: gmem[f32, (M, N)]", "c: gmem[i32, (M, N)]", "store(c", ("f32", "i32", "cast")),
    ("types.narrowing", "gemm", "acc = rmem(f32, (BM, BN))", "acc = rmem(f32, (BM, BN))\n    ix = rmem(i32, (BM, BN), "
     "fill=0.5)", "ix = rmem", ("0.5",)),
    # an mbarrier allocated inside a role
    ("mbarrier.placement", "ws", ACC, ACC + "        done = mbarrier(1)\n", "done = mbarrier", ("role `consumer`",)),
    ("mbarrier.count", "ws", "empty = mbarrier(S, arrivals=2)", "empty = mbarrier(S, arrivals=0)", "empty = mbarrier",
     ("0 arrivals",)),
    ("mbarrier.count", "ws", "full = mbarrier(S)", "full = mbarrier(0)", "full = mbarrier", ("positive",)),
    ("cluster.placement", "mc", "    cluster((2, 1, 1))\n    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)\n",
     "    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)\n    cluster((2, 1, 1))\n", "cluster((2", ("first",)),
    # cluster dimensions that do not divide the grid
    ("cluster.grid", "mc", "num_sms // 2) * 2,)", "num_sms // 2),)", "cluster((2", ("multiple of the cluster's 2",)),
    # a tma_store of shared memory written without a fence, or fenced but not synchronised
    ("tma.store_fence", "store", "    fence_async()\n", "", "tma_store(", ("ewise at line 6", "no fence_async()")),
    ("tma.store_fence", "store", "    sync()\n", "", "tma_store(", ("no sync()",)),
    # a wgmma operand its role's threads wrote: not fenced, or fenced with no barrier of the role after
    ("wgmma.smem_fence", "attn", "            fence_async()\n", "", "            wgmma(acc, p_s",
     ("cast at line", "no fence_async()")),
    ("wgmma.smem_fence", "attn", "            role_sync()\n", "", "            wgmma(acc, p_s", ("no role_sync()",)),
    # inside a role, one thread issues the tma_store: the role's writes need its barrier after their fence
    ("tma.store_fence", "attn", "        store(o[bid.y, tile(bid.x, BM), tile(0, D)], acc)\n",
     "        cast(o_s, acc)\n        fence_async()\n        tma_store(o[bid.y, tile(bid.x, BM), tile(0, D)], o_s)\n",
     "        tma_store(", ("cast at line", "no role_sync()")),
    # a role's barrier outside any role
    ("control.role_sync", "attn", "    fill(ninf, value=-inf)\n    sync()\n", "    fill(ninf, value=-inf)\n    role_sync()\n",
     "    role_sync()", ("outside a role", "sync()")),
    # ring-slot and barrier indices that can go out of range
    ("async.slot_index", "ws", "tma_load(a_s[kt % S]", "tma_load(a_s[kt]", "tma_load(a_s[kt]",
     ("grows without bound",)),
    ("async.slot_index", "ws", "arrive(empty[kt % S])", "arrive(empty[kt % 5])", "arrive(empty", ("can reach 4",)),
    # a gather whose window is narrower than its tile (tests/ir/test_gather.py plants the other misuses)
    ("gather.operands", "pick", "x[:, tile(c, BC)], perm", "x[:, tile(c, 16)], perm", "gather(a_s", ("columns differ",)),
]
# edits that keep the program correct: the rule stays silent
TWINS = [
    ("types.narrowing", "gemm", "c: gmem[f32, (M, N)]", "c: gmem[bf16, (M, N)]"),     # float -> narrower float rounds
    ("types.rmem_role", "ws", ACC, ""),                  # at the top level, used by the consumers only
    ("async.slot_index", "ws", "arrive(empty[kt % S])", "arrive(empty[(kt + S + 1) % S])"),
    ("cluster.grid", "mc", "num_sms // 2) * 2,)", "num_sms // 2) * 4,)"),
    ("gather.operands", "pick", "x[:, tile(c, BC)], perm", "x[:, tile(c, 32)], perm"),      # BC = 32: the same
    ("tma.store_fence", "store", "    fence_async()\n    sync()\n", "    sync()\n    fence_async()\n    sync()\n"),
    ("tma.store_fence", "attn", "        store(o[bid.y, tile(bid.x, BM), tile(0, D)], acc)\n",
     "        cast(o_s, acc)\n        fence_async()\n        role_sync()\n"
     "        tma_store(o[bid.y, tile(bid.x, BM), tile(0, D)], o_s)\n"),
    # a second barrier of the role changes nothing
    ("wgmma.smem_fence", "attn", "            role_sync()\n", "            role_sync()\n            role_sync()\n"),
]
MINE = {"cake_core.ir.rules_operands", "cake_core.ir.rules_sync"}


def _line_of(text: str, needle: str) -> int:
    """The first line that starts with ``needle`` (indentation included) or, for a needle without
    indentation, whose statement starts with it."""
    return next(i for i, ln in enumerate(text.splitlines(), 1)
                if ln.startswith(needle) or not needle.startswith(" ") and ln.strip().startswith(needle))


def test_every_rule_of_these_modules_is_planted():
    mine = {r for r, v in RULES.items() if v.check.__module__ in MINE}
    assert mine == {p[0] for p in PLANTED} - {"async.slot_index"}


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_bases_pass(base):
    assert check_text(BASES[base]) == []


@pytest.mark.parametrize("case", PLANTED, ids=lambda c: f"{c[0]}:{c[3][:30].strip()}")
def test_planted_defect_fails_at_its_line(case):
    rule_id, base, old, new, needle, words = case
    src = BASES[base]
    assert src.count(old) >= 1, old
    text = src.replace(old, new, 1)
    if rule_id == "types.rmem_role":      # the consumers' tile moved to the top level; the producer stores it
        text = text.replace("    with role(\"producer\"", "    acc = rmem(f32, (BM, BN))\n    with role(\"producer\"")
        text = text.replace(LOAD_B, LOAD_B + "            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)\n")
    if new == "    for":                # the accumulator allocated after the loop that uses it
        text = text.replace("    store(c[", "    acc = rmem(f32, (BM, BN))\n    store(c[")
    hits = [d for d in check_text(text, "planted.cake") if d.rule == rule_id]
    assert hits, f"{rule_id} did not fire; got {[d.rule for d in check_text(text)]}"
    d = hits[0]
    assert d.line == _line_of(text, needle), d.format("planted.cake", text)
    assert all(w in d.message + d.hint for w in words), (d.message, d.hint)
    assert d.hint and d.path


@pytest.mark.parametrize("case", TWINS, ids=lambda c: c[0])
def test_the_twin_passes(case):
    rule_id, base, old, new = case
    assert old in BASES[base]
    text = BASES[base].replace(old, new, 1)
    assert not [d for d in check_text(text) if d.rule == rule_id]


def test_the_witnesses_name_both_sides():
    text = STORE.replace("    fence_async()\n", "")
    (d,) = [d for d in check_text(text) if d.rule == "tma.store_fence"]
    assert d.witness == ("write: ewise at line 6 (the CTA's threads)", "read: tma_store at line 8")
    grid = MC.replace("num_sms // 2) * 2,)", "num_sms // 2),)")
    (g,) = [d for d in check_text(grid) if d.rule == "cluster.grid"]
    assert "grid x = " in g.witness[0] and "% 2 = 1" in g.witness[0]
    slot = WS.replace("tma_load(a_s[kt % S]", "tma_load(a_s[kt]")
    (s,) = [d for d in check_text(slot) if d.rule == "async.slot_index"]
    assert s.witness == ("kt in [0, inf]",)


def test_the_runs_shapes_name_the_witness_of_a_grid():
    from cake_core.ir.text import parse_program
    from cake_core.ir.verify import verify
    grid = parse_program(MC.replace("num_sms // 2) * 2,)", "num_sms // 2),)"))
    (g,) = [d for d in verify(grid, shapes=[{"M": 384, "N": 128, "K": 64}]) if d.rule == "cluster.grid"]
    assert "M=384, N=128" in g.message


ROWS = corpus_file("tinygemm_rows.cake").read_text()


def test_an_undefined_name_in_an_if_condition_is_named_at_its_line():
    assert not [d for d in check_text(ROWS) if d.rule == "shapes.symbols"]
    text = ROWS.replace("            if M <= 8:", "            if Mx <= 8:", 1)
    (d,) = [d for d in check_text(text) if d.rule == "shapes.symbols"]
    assert d.line == _line_of(text, "            if Mx <= 8:") and "`Mx` is not defined" in d.message


@pytest.mark.parametrize("old, new, rule_id", [
    ('with role("producer", warps=(0, 4), regs=40)', 'with role("producer", warps=(4, 4), regs=40)', "role.bounds"),
    ('with role("producer", warps=(0, 4), regs=40)', 'with role("producer", warps=(0, 1000000), regs=40)',
     "role.bounds"),
    ("full = mbarrier(S)", "full = mbarrier(1000000000)", "resources.smem"),      # 8 GB of barriers
    ("empty = mbarrier(S, arrivals=2)", "empty = mbarrier(S, arrivals=-1)", "mbarrier.count"),
], ids=["no threads", "huge warps", "huge barrier count", "negative arrivals"])
def test_degenerate_roles_and_barriers_get_a_diagnostic_not_a_crash(old, new, rule_id):
    # each of these once crashed (a role of no threads divided by zero) or hung (warps and barrier slots
    # enumerated one by one, arrivals <= 0 settling forever)
    assert old in WS
    diags = check_text(WS.replace(old, new, 1))
    assert rule_id in {d.rule for d in diags}, [d.rule for d in diags]
