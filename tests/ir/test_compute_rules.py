"""Every compute/atomic/gather verifier rule: a program using every compute op passes, and a planted
mistake fails with the rule's id at the line of the statement at fault."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.verify import RULES

OPS = '''@kernel(target="sm_90a", grid=(cdiv(N, 128),), threads=128, consts={"BC": 64})
def ops(x: gmem[f32, (N, C)], s: gmem[f32, (N, C)], cnt: gmem[i32, (C,)]):
    a = rmem(f32, (128, BC))
    b = smem(f32, (BC, 128))
    v = rmem(f32, (128,))
    col = rmem(f32, (128, 1))
    i = rmem(i32, (128,), fill=-1.0)
    ones = rmem(i32, (128,), fill=1.0)
    best = rmem(f32, (128,), fill=inf)
    top_v = rmem(f32, (128, 4), fill=inf)
    top_i = rmem(i32, (128, 4), fill=-1.0)
    h = rmem(bf16, (128, BC))
    a6 = rmem(f32, (128, 6), fill=1.0)
    load(a, x[tile(bid.x, 128), tile(0, BC)])
    unary(a, a, fn="exp")
    cast(h, a)
    transpose(b, a)
    sync()
    reduce(col, a, axis=1, fn="max")
    ewise(a, a, col, fn="sub")
    scan(a, a, axis=1)
    argmin(v, i, a, axis=1)
    argmax(v, i, a)
    argmin_update(best, i, a, base=0, limit=C)
    topk_merge(top_v, top_i, a, base=0, limit=C)
    fill(v, value=1.0)
    atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)
    scatter_add(cnt[:], i, ones, base=bid.x * 128, limit=N)
    g_acc = smem(f32, (16, BC))
    g_cnt = smem(i32, (16,))
    g_i = smem(i32, (128,))
    g_q = smem(i32, (160,))
    fill(g_acc, value=0.0)
    fill(g_cnt, value=0.0)
    fill(g_i, value=3.0)
    sync()
    gather_add(g_acc[:, :], g_cnt[:], g_i, g_q, x[tile(bid.x, 128), tile(0, BC)], base=bid.x * 128, limit=N, first=0)
    t_x = smem(f32, (16, BC))
    t_l = smem(f32, (16, 16))
    fill(t_x, value=1.0)
    fill(t_l, value=0.5)
    trisolve(t_x, t_l)
'''
GATHER = "gather_add(g_acc[:, :], g_cnt[:], g_i, g_q, x[tile(bid.x, 128), tile(0, BC)], base=bid.x * 128, limit=N, first=0)"

# rule id -> (old, new, needle naming the line the diagnostic must point at)
PLANTED = {
    "compute.space": ("cast(h, a)", "r = smem(f32, (128, BC), stages=2)\n    fill(r, value=0.0)", "fill(r"),
    "compute.shape": ("h = rmem(bf16, (128, BC))", "h = rmem(bf16, (128, 32))", "cast(h, a)"),
    "compute.broadcast": ('ewise(a, a, col, fn="sub")', 'ewise(a, a, v, fn="sub")', "ewise("),
    "compute.axis": ('reduce(col, a, axis=1, fn="max")', 'reduce(col, v, axis=1, fn="max")', "reduce("),
    "compute.reduce_shape": ('reduce(col, a, axis=1, fn="max")', 'reduce(col, a, axis=0, fn="max")', "reduce("),
    "compute.index_dtype": ("i = rmem(i32, (128,), fill=-1.0)", "i = rmem(f32, (128,), fill=-1.0)", "argmin(v, i"),
    "compute.dtype": ("top_v = rmem(f32, (128, 4), fill=inf)", "top_v = rmem(bf16, (128, 4), fill=inf)",
                      "topk_merge("),
    "compute.alias": ("argmin(v, i, a, axis=1)", "argmin(v, i, i, axis=1)", "argmin(v, i, i"),
    "compute.trisolve": ("t_l = smem(f32, (16, 16))", "t_l = smem(f32, (16, 8))", "trisolve("),   # l not square
    "compute.scratch_smem": ("b = smem(f32, (BC, 128))", "b = smem(f32, (416, 128))", "transpose("),
    "atomic.space": ("atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)", "atomic_add(b[tile(0, BC), :], a)",
                     "atomic_add("),
    "atomic.dtype": ("s: gmem[f32, (N, C)]", "s: gmem[bf16, (N, C)]", "atomic_add("),
    "atomic.shape": ("atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)",
                     "atomic_add(s[tile(bid.x, 128), tile(0, 32)], a)", "atomic_add("),
    "atomic.owner": ("scatter_add(cnt[:], i, ones, base=bid.x * 128, limit=N)",
                     'scatter_add(cnt[:], i, ones, base=bid.x * 128, limit=N, owner="warp")', "scatter_add("),
    "atomic.vector": ("atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)",      # an (R, 64) src over 128 threads
                      "atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)\n"
                      "    scatter_add(s[:, tile(0, BC)], i, a, base=bid.x * 128, limit=N, vector=4)\n"
                      "    scatter_add(s[:, tile(0, 6)], i, a6, base=bid.x * 128, limit=N, vector=4)",
                      "scatter_add(s[:, tile(0, 6)]"),
    "atomic.smem_target": ("scatter_add(cnt[:], i, ones, base=bid.x * 128, limit=N)",
                           "scatter_add(b[tile(0, 32), :], i, v, base=bid.x * 128, limit=N)", "scatter_add("),
    "gather.target": (GATHER, GATHER.replace("g_acc[:, :]", "a[:, :]"), "gather_add("),          # an rmem target
    "gather.source": (GATHER, GATHER.replace("tile(0, BC)]", "tile(0, 32)]"), "gather_add("),   # columns differ
    "gather.queue": ("g_q = smem(i32, (160,))", "g_q = smem(i32, (159,))", "gather_add("),   # 128 + 2 * 4 * 4
}
# a second planted failure for rules with several distinct checks
MORE = [
    ("compute.trisolve", "t_x = smem(f32, (16, BC))", "t_x = smem(bf16, (16, BC))", "trisolve("),   # a bf16 x
    ("compute.trisolve", "t_x = smem(f32, (16, BC))", "t_x = smem(f32, (8, BC))", "trisolve("),     # rows differ
    ("compute.dtype", 'unary(a, a, fn="exp")', 'unary(i, i, fn="exp")', "unary("),
    ("compute.dtype", 'ewise(a, a, col, fn="sub")', 'ewise(i, i, ones, beta=0.5, fn="sub")', "ewise("),
    ("compute.shape", "transpose(b, a)", "transpose(a, a)", "transpose("),
    ("compute.reduce_shape", "best = rmem(f32, (128,), fill=inf)", "best = rmem(f32, (64, 2), fill=inf)",
     "argmin_update("),
    ("atomic.dtype", "cnt: gmem[i32, (C,)]", "cnt: gmem[i32, (C,)], fones: gmem[f32, (N,)]", None),
    ("atomic.shape", "scatter_add(cnt[:], i, ones,", "scatter_add(s[tile(bid.x, 128), :], i, ones,", "scatter_add("),
    ("atomic.space", "scatter_add(cnt[:], i, ones,", "scatter_add(v[:], i, ones,", "scatter_add("),
    ("atomic.space", "fill(v, value=1.0)", "fill(v, value=1.0)\n    p = smem(f32, (16, BC))\n"
     "    scatter_add(p[:, :], i, a, base=0, limit=N)", None),   # a whole smem tile: a privatised accumulator
    ("atomic.owner", "fill(v, value=1.0)", "fill(v, value=1.0)\n    p = smem(f32, (16, BC))\n"   # an rmem src
     '    scatter_add(p[:, :], i, a, base=0, limit=N, owner="warp")', "scatter_add(p"),
    ("atomic.owner", "fill(v, value=1.0)", "fill(v, value=1.0)\n    p = smem(f32, (16, BC))\n"   # smem -> smem
     "    q = smem(f32, (128, BC))\n    sync()\n"
     '    scatter_add(p[:, :], i, q, base=0, limit=N, owner="warp")', None),
    ("atomic.vector", "atomic_add(s[tile(bid.x, 128), tile(0, BC)], a)",    # a gmem i32 target
     "scatter_add(cnt[:], i, ones, base=bid.x * 128, limit=N, vector=4)", "scatter_add(cnt"),
    ("atomic.vector", "fill(v, value=1.0)", "fill(v, value=1.0)\n    sync()\n"   # an smem src
     "    scatter_add(s[:, tile(0, BC)], i, b, base=bid.x * 128, limit=N, vector=4)", "scatter_add(s[:, tile(0, BC)], i, b"),
    ("atomic.smem_target", "fill(v, value=1.0)", "fill(v, value=1.0)\n    p = smem(f32, (16, BC), stages=2)\n"
     "    scatter_add(p[:, :], i, a, base=0, limit=N)", "scatter_add(p"),
    ("gather.target", "g_cnt = smem(i32, (16,))", "g_cnt = smem(f32, (16,))", "gather_add("),     # f32 counts
    ("gather.target", "g_cnt = smem(i32, (16,))", "g_cnt = smem(i32, (32,))", "gather_add("),     # a count per row
    ("gather.target", GATHER, GATHER.replace("g_acc[:, :]", "g_acc[tile(0, 8), :]"), "gather_add("),   # a window
    ("gather.target", "g_acc = smem(f32, (16, BC))", "g_acc = smem(f32, (16, BC), stages=2)", "gather_add("),
    ("gather.source", GATHER, GATHER.replace("g_i, g_q, x[", "i, g_q, x["), "gather_add("),        # rmem indices
    ("gather.source", "g_i = smem(i32, (128,))", "g_i = smem(i32, (64,))", "gather_add("),   # one index per row
    ("gather.source", GATHER, GATHER.replace("x[tile(bid.x, 128), tile(0, BC)]", "b[tile(0, 128), tile(0, BC)]"),
     "gather_add("),                                                                        # an smem source
    ("gather.source", GATHER, GATHER.replace("x[tile(bid.x, 128), tile(0, BC)]", "cnt[tile(0, 128)]"),
     "gather_add("),                                                                        # i32, rank 1
    ("gather.queue", "g_q = smem(i32, (160,))", "g_q = smem(f32, (160,))", "gather_add("),   # f32 entries
    ("gather.queue", "g_q = smem(i32, (160,))", "g_q = smem(i32, (160,), stages=2)", "gather_add("),
    ("gather.queue", "    sync()\n    " + GATHER, '    sync()\n    with role("all", warps=(0, 4)):\n        ' + GATHER,
     "gather_add("),                                                                        # inside a role
]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_every_compute_rule_has_a_planted_failure():
    ours = {r for r, v in RULES.items() if v.family in ("compute", "atomic", "gather")}
    assert ours == set(PLANTED)


def test_the_program_with_every_compute_op_passes():
    assert check_text(OPS, "ops.cake") == []


def _check(rule_id: str, old: str, new: str, needle: str | None):
    assert old in OPS, old
    text = OPS.replace(old, new)
    diags = check_text(text, "planted.cake")
    hits = [d for d in diags if d.rule == rule_id]
    if needle is None:        # a variant that must stay clean
        assert not hits, [d.format("planted.cake", text) for d in hits]
        return
    assert hits, f"{rule_id} did not fire; got {[d.rule for d in diags]}"
    assert hits[0].line == _line_of(text, needle), hits[0].format("planted.cake", text)
    assert hits[0].hint and hits[0].path


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    _check(rule_id, *PLANTED[rule_id])


@pytest.mark.parametrize("case", MORE, ids=lambda c: f"{c[0]}:{c[2][:24]}")
def test_more_planted_mistakes(case):
    _check(*case)


def test_i32_atomics_need_an_i32_tile():
    text = OPS.replace("ones = rmem(i32, (128,), fill=1.0)", "ones = rmem(f32, (128,), fill=1.0)")
    d = next(d for d in check_text(text) if d.rule == "atomic.dtype")
    assert "f32 tile into i32" in d.message and d.line == _line_of(text, "scatter_add(")
