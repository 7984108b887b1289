"""role.compute: a compute op inside a warp role is verified only where the lowering runs it over the role's own
threads (elementwise ops on smem tiles and on the role's wgmma accumulators); the rest is refused at its line."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text

# TMA + wgmma gemm (384 threads: producer warps 0..4, consumer warps 4..12) whose consumer runs elementwise ops on
# its accumulator (with a broadcast smem vector) and on smem tiles loaded before the roles; stored after them
ROLE_KERNEL = '''@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=384, consts={"BK": 64, "BM": 128, "BN": 64, "S": 4})
def k(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], v: gmem[f32, (N,)], x: gmem[f32, (M, N)], c: gmem[f32, (M, N)], o: gmem[f32, (M, N)]):
    a_s = smem(bf16, (BM, BK), stages=4, swizzle=128)
    b_s = smem(bf16, (BK, BN), stages=4, swizzle=128)
    v_s = smem(f32, (BN,))
    x_s = smem(f32, (BM, BN))
    o_s = smem(f32, (BM, BN))
    full = mbarrier(S)
    empty = mbarrier(S, arrivals=2)
    load(v_s, v[tile(bid.x, BN)])
    load(x_s, x[tile(bid.y, BM), tile(bid.x, BN)])
    sync()
    with role("producer", warps=(0, 4), regs=40):
        for kt in range(cdiv(K, BK)):
            wait(empty[kt % S], phase=(kt // S + 1) % 2)
            expect_tx(full[kt % S], (BM * BK + BK * BN) * 2)
            tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x, BN)], bar=full[kt % S])
    with role("consumer", warps=(4, 12), regs=232):
        acc = rmem(f32, (BM, BN))
        for kt in range(cdiv(K, BK)):
            wait(full[kt % S], phase=kt // S % 2)
            wgmma(acc, a_s[kt % S], b_s[kt % S])
            wgmma_wait(0)
            arrive(empty[kt % S])
        unary(acc, acc, fn="silu")
        ewise(acc, acc, v_s, fn="add")
        unary(o_s, x_s, fn="sigmoid")
        store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)
    sync()
    store(o[tile(bid.y, BM), tile(bid.x, BN)], o_s)
'''
CONSUMER_OP = '        unary(o_s, x_s, fn="sigmoid")\n'


def _line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_elementwise_ops_on_smem_tiles_and_the_roles_accumulator_pass():
    assert check_text(ROLE_KERNEL, "role.cake") == []


@pytest.mark.parametrize("top,stmt,needle,why", [
    ("    r_s = smem(f32, (BM,))\n", "        reduce(r_s, x_s, axis=1)\n", "reduce(", "synchronises the CTA"),
    ("    u_s = smem(f32, (BN, BM))\n", "        transpose(u_s, x_s)\n", "transpose(", "move between threads"),
    ("    t = rmem(f32, (3, 128))\n", "        fill(t, value=1.0)\n", "fill(t", "spread over all the CTA's 384"),
    ("", "        t = rmem(f32, (BM, 4))\n        fill(t, value=1.0)\n", "fill(t", "in no layout it holds"),
    ("    s_s = smem(f32, (16, BN))\n    i_s = smem(i32, (BM,))\n",
     "        scatter_add(s_s[:, :], i_s, x_s, base=0, limit=BM)\n", "scatter_add(", "synchronises the CTA"),
], ids=["reduce", "transpose", "CTA-spread rmem", "role rmem", "scatter_add"])
def test_what_a_role_cannot_run_over_its_own_threads_is_refused(top, stmt, needle, why):
    text = ROLE_KERNEL.replace(CONSUMER_OP, CONSUMER_OP + stmt).replace("    full = mbarrier(S)\n",
                                                                         top + "    full = mbarrier(S)\n")
    hits = [d for d in check_text(text, "role.cake") if d.rule == "role.compute"]
    assert hits, "role.compute did not fire"
    assert hits[0].line == _line_of(text, needle) and why in hits[0].message, hits[0].format("role.cake", text)
    assert hits[0].hint and hits[0].path.startswith("role[consumer]")


@pytest.mark.parametrize("stmts,needle", [
    ("        cast(o_s, acc)\n", "cast(o_s"),          # o_s split over the threads above, then the fragments
    ("        fill(v_s, value=1.0)\n", "ewise(acc, acc, v_s"),                           # written, read broadcast
], ids=["fragments then split", "broadcast read"])
def test_a_tile_the_role_writes_is_touched_one_way_only(stmts, needle):
    text = ROLE_KERNEL.replace(CONSUMER_OP, CONSUMER_OP + stmts)
    hits = [d for d in check_text(text, "role.cake") if d.rule == "role.compute"]
    assert hits and hits[0].line == _line_of(text, needle) and "writes inside the same role" in hits[0].message, \
        [d.format("role.cake", text) for d in hits]


def test_a_tile_the_role_writes_and_reads_through_one_map_passes():
    text = ROLE_KERNEL.replace(CONSUMER_OP, CONSUMER_OP + '        ewise(o_s, o_s, x_s, fn="mul")\n')
    assert check_text(text, "role.cake") == []


def test_the_same_ops_outside_roles_are_not_the_rules_concern():
    before_roles = "    sync()\n    with role("
    text = ROLE_KERNEL.replace(before_roles, "    r_s = smem(f32, (BM,))\n    reduce(r_s, x_s, axis=1)\n" + before_roles)
    assert not [d for d in check_text(text, "role.cake") if d.rule == "role.compute"]


def test_split_k_atomic_add_of_the_roles_accumulator_stays_allowed():
    text = ROLE_KERNEL.replace("        store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)\n",
                               "        atomic_add(c[tile(bid.y, BM), tile(bid.x, BN)], acc)\n")
    assert not [d for d in check_text(text, "role.cake") if d.rule == "role.compute"]


def test_a_write_of_the_accumulator_while_its_wgmma_is_in_flight_is_refused():
    # the interpreter runs wgmma synchronously; on the GPU the wgmma still writes the registers the fill writes
    loop_end = "            wgmma_wait(0)\n            arrive(empty[kt % S])\n"
    text = ROLE_KERNEL.replace(loop_end, "            fill(acc, value=1.0)\n" + loop_end)
    (d,) = [d for d in check_text(text, "role.cake") if d.rule == "protocol.acc_in_flight"]
    assert d.line == _line_of(text, "fill(acc") and "fill writes accumulator `acc`" in d.message
    assert check_text(text.replace("            fill(acc, value=1.0)\n" + loop_end,
                                   loop_end + "            fill(acc, value=1.0)\n"), "role.cake") == []
