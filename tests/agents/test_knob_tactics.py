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
