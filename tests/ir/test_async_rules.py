"""Every async verifier rule: the ws GEMM seed passes it, and a planted mistake fails with its id at the right line."""
from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.verify import RULES
from cake_core.problems import corpus_file

SEED = corpus_file("gemm_bf16_ws.cake").read_text()
LOAD_A = "tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])"
WGMMA = "wgmma(acc, a_s[kt % S], b_s[kt % S])"

# rule id -> (old, new, line of the diagnostic)
PLANTED = {
    "role.placement": ("        acc = rmem(f32, (BM, BN))\n",
                       '        with role("inner", warps=(4, 8)):\n            pass\n        acc = rmem(f32, (BM, BN))\n',
                       14),
    "role.bounds": ("threads=384", "threads=256", 13),
    "role.overlap": ("warps=(4, 12)", "warps=(2, 10)", 13),
    # an rmem tile of the role in no layout the role holds (4 columns: not an m64nN fragment): its lowering would
    # spread it over the CTA
    "role.compute": ("        acc = rmem(f32, (BM, BN))\n",
                     "        acc = rmem(f32, (BM, BN))\n        t = rmem(f32, (BM, 4))\n"
                     "        fill(t, value=0.0)\n", 16),
    "setmaxnreg.value": ("regs=40", "regs=44", 7),
    "setmaxnreg.budget": ("regs=232", "regs=248", 13),
    "control.sync_in_role": ("            wgmma_wait(0)\n", "            wgmma_wait(0)\n            sync()\n", 19),
    "async.operands": (LOAD_A, LOAD_A.replace("bar=full", "bar=a_s"), 11),
    "async.slot_index": (WGMMA, "wgmma(acc, a_s, b_s[kt % S])", 17),
    "async.atom_target": ('target="sm_90a"', 'target="sm_100a"', 17),
    "tma.box_dim": ('"BM": 128', '"BM": 512', 11),
    "tma.swizzle_span": ('"BK": 64', '"BK": 128', 11),
    "tma.global_align": ("a: gmem[bf16, (M, K)]", "a: gmem[bf16, (M, 100)]", 11),
    "tma.smem_align": ('"BM": 128', '"BM": 100', 11),
    "tma.box_shape": (LOAD_A, LOAD_A.replace("tile(bid.y, BM)", "tile(bid.y, BN)"), 11),
    "tma.rows": (LOAD_A, LOAD_A.replace("bar=full[kt % S])", "bar=full[kt % S], rows=12)"), 11),
    "wgmma.role": ("warps=(4, 12)", "warps=(4, 10)", 17),
    "wgmma.acc": ("acc = rmem(f32, (BM, BN))", "acc = rmem(bf16, (BM, BN))", 17),
    "wgmma.m": ("warps=(4, 12)", "warps=(4, 8)", 17),
    "wgmma.n": ('"BN": 64', '"BN": 4', 17),
    "wgmma.k": ('"BK": 64', '"BK": 40', 17),
    # a plain load inside the consumer role: lowered over every thread of the CTA
    "role.copy": ("        for kt in range(cdiv(K, BK)):\n            wait(full",
                  "        load(acc, c[tile(bid.y, BM), tile(bid.x, BN)])\n"
                  "        for kt in range(cdiv(K, BK)):\n            wait(full", 15),
    # an M-major a whose tile has 64 columns for the role's two warpgroups (tests/lower/test_wgmma_a_major.py)
    "wgmma.a_major": (WGMMA, 'wgmma(acc, a_s[kt % S], b_s[kt % S], a_major="m")', 17),
    "wgmma.operands": ("b_s = smem(bf16, (BK, BN), stages=4, swizzle=128)",
                       "b_s = smem(bf16, (BK, BN), stages=4, swizzle=64)", 17),
    "mbarrier.phase": ("phase=kt // S % 2", "phase=kt // S", 16),
    "mbarrier.arrivals": ("empty = mbarrier(S, arrivals=2)", "empty = mbarrier(S, arrivals=1)", 6),
    "mbarrier.expect_tx": ("(BM * BK + BK * BN) * 2", "BM * BK * 2", 10),
    "resources.cluster": ("    a_s = smem(", "    cluster((16, 1, 1))\n    a_s = smem(", 3),
    # a multicast copy with no cluster_sync between the peers' barrier init and it, nor before exit
    "cluster.sync": (LOAD_A, LOAD_A.replace("bar=full[kt % S])", "bar=full[kt % S], multicast=1)"), 11),
    "protocol.deadlock": ("phase=(kt // S + 1) % 2", "phase=kt // S % 2", 9),
    "protocol.tx_mismatch": ("(BM * BK + BK * BN) * 2", "BM * BK * 2", 10),
    "protocol.read_before_ready": ("            wait(full[kt % S], phase=kt // S % 2)\n", "", 16),
    "protocol.slot_reuse": (f"            {WGMMA}\n            wgmma_wait(0)\n            arrive(empty[kt % S])\n",
                            f"            arrive(empty[kt % S])\n            {WGMMA}\n            wgmma_wait(0)\n", 11),
}
ASYNC_MODULES = ("cake_core.ir.rules_async", "cake_core.ir.rules_async_copy", "cake_core.ir.rules_wgmma")


def test_every_async_rule_has_a_planted_failure():
    import importlib.util      # the K-major b and argmin_bias rules are planted in the kmeans seed's tests
    spec = importlib.util.spec_from_file_location("fragment_epilogue", Path(__file__).with_name(
        "test_fragment_epilogue.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    KMEANS_PLANTED = mod.PLANTED
    spec = importlib.util.spec_from_file_location("cp_async_bar", Path(__file__).with_name("test_cp_async_bar.py"))
    cp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cp)
    mine = {r for r in RULES if RULES[r].check.__module__ in ASYNC_MODULES}
    elsewhere = {"protocol.cluster_read",      # test_topk_cluster.py
                 "protocol.multicast_reuse",   # test_cluster.py
                 "protocol.undecided", "protocol.acc_in_flight", "protocol.slot_range"}        # test_protocol.py
    assert mine == set(PLANTED) | set(KMEANS_PLANTED) | set(cp.PLANTED) | elsewhere
    assert len(mine) >= 12


def test_the_ws_seed_passes_every_rule():
    assert check_text(SEED, "gemm_bf16_ws.cake") == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_planted_mistake_fails_with_the_rule_at_its_line(rule_id):
    old, new, line = PLANTED[rule_id]
    assert old in SEED, old
    text = SEED.replace(old, new, 1)
    diags = check_text(text, "planted.cake")
    hits = [d for d in diags if d.rule == rule_id]
    assert hits, f"{rule_id} did not fire; got {[d.rule for d in diags]}"
    assert hits[0].line == line, hits[0].format("planted.cake", text)
    assert hits[0].hint and hits[0].path


def test_rule_limits_come_from_the_target_data(monkeypatch):
    import dataclasses

    import cake_core.ir.verify as verify_mod
    from cake_core.targets import SetMaxNReg, get_arch
    assert not any(d.rule == "setmaxnreg.value" for d in check_text(SEED))
    arch = dataclasses.replace(get_arch("sm_90a"), setmaxnreg=SetMaxNReg(24, 256, 16))
    monkeypatch.setattr(verify_mod, "find_arch", lambda name: arch)
    assert any(d.rule == "setmaxnreg.value" and d.line == 7 for d in check_text(SEED))   # 40 is not a step of 16


def test_tma_global_align_judges_symbolic_strides_on_the_runs_shapes():
    from pathlib import Path

    from cake_core.ir.text import parse_program
    from cake_core.ir.verify import verify
    prog = parse_program(corpus_file("gemm_bf16_ws_n256.cake").read_text())
    assert not [d for d in verify(prog, shapes=[{"M": 1000, "N": 1000, "K": 1000}]) if d.is_error]
    hits = [d for d in verify(prog, shapes=[{"M": 64, "N": 64, "K": 64}, {"M": 2047, "N": 1024, "K": 513}])
            if d.rule == "tma.global_align"]
    assert len(hits) == 1 and "1026 B apart" in hits[0].message      # a's rows: K = 513 bf16
    assert hits[0].witness == ("shape M=2047, N=1024, K=513",)
    assert hits[0].line == next(i for i, ln in enumerate(prog.text().splitlines(), 1) if "tma_load(a_s" in ln)


def _wgmma_kernel() -> str:
    from cake_core.problems import get_problem
    return get_problem("tinygemm").kernel_text("tinygemm_splitk.cake")


def test_a_wgmma_operand_outside_shared_memory_is_reported_as_its_space_at_the_operand():
    text = _wgmma_kernel()
    assert not [d for d in check_text(text, "k.cake") if d.is_error], "the smem operands pass"
    wgmma = "wgmma(acc, a_s[i % S], b_s[i % S])"
    # a register tile spread over the CTA (allocated outside the role) is no register A of the role's wgmma
    regs = text.replace("    full = mbarrier(S)\n", "    a_r = rmem(bf16, (160, BK))\n    full = mbarrier(S)\n", 1)
    regs = regs.replace(wgmma, "wgmma(acc, a_r, b_s[i % S])", 1)
    # and b is read from shared memory only
    gmem_b = text.replace(wgmma, "wgmma(acc, a_s[i % S], b)", 1)
    for planted, needle, said in ((regs, "wgmma(acc, a_r", "wgmma's a `a_r` is an rmem tile but not a 16-bit "
                                                           "fragment of the wgmma's role"),
                                  (gmem_b, "wgmma(acc, a_s[i % S], b)", "wgmma's b `b` lives in gmem")):
        # (with its wgmma reading b from gmem, b_s's wide TMA box is no longer one a wgmma reads: tma.swizzle_span)
        errors = [d for d in check_text(planted, "k.cake") if d.is_error and d.rule != "tma.swizzle_span"]
        assert [d.rule for d in errors] == ["wgmma.operands"], [(d.rule, d.message) for d in errors]
        assert said in errors[0].message
        assert errors[0].line == next(i for i, ln in enumerate(planted.splitlines(), 1) if needle in ln)


def test_a_wgmma_b_in_global_memory_is_reported_as_its_space_at_the_operand():
    # b named as the gmem tensor itself: one wgmma.operands at the wgmma, naming b and its space; the shape rules
    # (wgmma.n, wgmma.k) leave an operand outside smem to it, and the protocol checker does not read it
    text = _wgmma_kernel()
    gmem = text.replace("wgmma(acc, a_s[i % S], b_s[i % S])", "wgmma(acc, a_s[i % S], b)", 1)
    line = next(i for i, ln in enumerate(gmem.splitlines(), 1) if "wgmma(acc, a_s[i % S], b)" in ln)
    diags = check_text(gmem, "k.cake")
    at = [d for d in diags if d.line == line]
    assert [d.rule for d in at] == ["wgmma.operands"], [(d.rule, d.message) for d in at]
    assert "wgmma's b `b` lives in gmem" in at[0].message and at[0].path.endswith("wgmma")
    assert not [d for d in diags if d.rule.startswith("protocol.")]


def test_a_register_a_wgmmas_b_that_its_descriptor_cannot_read_is_refused_at_the_wgmma():
    # fuzz seed 11, mutant 1632: v_s given swizzle=64 verified, then the lowering refused the register-A wgmma
    from cake_core.problems import get_problem
    text = get_problem("mha").kernel_text("mha_ws.cake")
    old = "v_s = smem(bf16, (BN, D), stages=2, swizzle=128)"
    assert old in text and not [d for d in check_text(text, "m.cake") if d.is_error]
    planted = text.replace(old, old.replace("swizzle=128", "swizzle=64"))
    errors = [d for d in check_text(planted, "m.cake") if d.is_error]
    assert [d.rule for d in errors] == ["wgmma.operands"], [(d.rule, d.message) for d in errors]
    assert "with a register A, b `v_s`" in errors[0].message
    assert "wgmma(acc, p, v_s" in planted.splitlines()[errors[0].line - 1]
