"""Knob tactics move constants only within what the kernel's structure allows."""
import numpy as np

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import WGMMA_N, apply, ring_consts, wgmma_consts
from cake_core.ir.ops import Op
from cake_core.ir.program import walk
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.problems import get_problem

GEMM = get_problem("gemm_bf16")
WS = parse_program(GEMM.best_texts()[2])          # gemm_bf16_ws: S = 4, stages=4, BN = 64
SHAPE = [{"M": 256, "N": 256, "K": 512}]


def test_restage_moves_a_ring_and_its_buffers_together():
    seen = set()
    for i in range(10):
        out = apply("restage", WS, np.random.default_rng(i))
        s = out.const_env["S"]
        assert s in (3, 5)
        stages = {n.result: n.attr("stages") for n, _, _ in walk(out.body) if n.op is Op.SMEM}
        assert stages == {"a_s": s, "b_s": s}
        assert not [d for d in verify(out, shapes=SHAPE) if d.is_error]
        seen.add(s)
    assert seen == {3, 5}


def test_restage_refuses_a_program_without_rings():
    out = apply("restage", parse_program(GEMM.seed_text()), np.random.default_rng(0))
    assert isinstance(out, Refused) and "no ring" in out.reason


def test_ring_depths_and_wgmma_shapes_are_not_free_knobs():
    assert ring_consts(WS) == {"S"}
    fixed, n_dims = wgmma_consts(WS)
    assert {"BM", "BK"} <= fixed and n_dims == {"BN"}
    for i in range(12):
        out = apply("retile", WS, np.random.default_rng(i))
        assert set(out.const_env) == set(WS.const_env)
        changed = {k for k in WS.const_env if out.const_env[k] != WS.const_env[k]}
        assert changed == {"BN"} and out.const_env["BN"] in WGMMA_N
        assert not [d for d in verify(out, shapes=SHAPE) if d.is_error]


def test_retune_refuses_ring_depths_and_rethread_refuses_roles():
    assert isinstance(apply("retune", WS, np.random.default_rng(0)), Refused)       # S only: a ring depth
    r = apply("rethread", WS, np.random.default_rng(0))
    assert isinstance(r, Refused) and "roles" in r.reason
    assert apply("rethread", parse_program(GEMM.seed_text()), np.random.default_rng(0)).threads != 256


def test_rethread_draws_only_thread_counts_the_resource_rules_accept():
    """kmeans_update's seed holds `a_r = rmem(i32, (BN,))` with BN = 128 at threads=128: 256 and 512 threads
    would leave threads without an element (the verifier's resources.rmem_split), so only 64 is drawn; with no
    count left, rethread refuses and says why."""
    seed_prog = parse_program(get_problem("kmeans_update").seed_text())
    assert seed_prog.threads == 128 and seed_prog.const_env["BN"] == 128
    drawn = [apply("rethread", seed_prog, np.random.default_rng(i)) for i in range(12)]
    assert {c.threads for c in drawn} == {64}
    assert all(not [d for d in verify(c) if d.rule.startswith("resources.")] for c in drawn[:4])
    wider = seed_prog.with_consts(BN=512)          # 64 threads would need 272 registers each (resources.registers)
    assert {apply("rethread", wider, np.random.default_rng(i)).threads for i in range(20)} == {256, 512}
    tiny = parse_program(get_problem("kmeans_update").seed_text().replace('"BN": 128', '"BN": 64')
                         .replace("threads=128", "threads=64"))
    assert not [d for d in verify(tiny) if d.rule.startswith("resources.")]    # 64 of 64: every other count fails
    r = apply("rethread", tiny, np.random.default_rng(0))
    assert isinstance(r, Refused) and "resource rules" in r.reason
