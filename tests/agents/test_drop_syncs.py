"""drop_syncs: the CTA barriers that order no shared-memory access (races.smem, which follows the compute ops as
they are lowered) and separate no global write, removed. On the gated-delta-rule decode seed with its state in
registers it leaves the barriers after the copies, before a broadcast read and around the stores; the children of
the decode, prefill, MoE and mha seeds pass the CPU gate and verify; it refuses kernels where every barrier orders
something, and warp-specialized ones."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import STRUCTURAL, TACTICS, apply
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower import lower
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

SHAPES = {
    "kda_decode": [{"B": 2, "H": 3, "DK": 64, "DV": 64}, {"B": 1, "H": 1, "DK": 100, "DV": 16}],
    "kda_prefill": [{"B": 2, "T": 6, "H": 2, "DK": 64, "DV": 64}],
    "moe": [{"M": 3, "H": 72, "I": 40, "E": 12, "k": 3}],
    "mha": [{"H": 2, "T": 70, "DH": 64}],
}


def _syncs(p) -> int:
    return p.text().count("sync()")


def test_drop_syncs_is_a_structural_tactic():
    assert "drop_syncs" in TACTICS and "drop_syncs" in STRUCTURAL


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_seeds_barriers_that_order_nothing_go_and_the_child_stays_correct(name):
    problem = get_problem(name)
    seed = parse_program(problem.seed_text())
    child = apply("drop_syncs", seed, np.random.default_rng(0))
    assert not isinstance(child, Refused), child.reason
    assert 0 < _syncs(child) < _syncs(seed)
    assert not [d for d in verify(child, shapes=SHAPES[name]) if d.is_error]
    checks = check_on_cpu(child, problem, SHAPES[name], seed=3, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    assert lower(child).ok


def test_the_decode_loop_keeps_the_barriers_after_its_copies_before_a_broadcast_and_around_its_stores():
    p = parse_program(get_problem("kda_decode").seed_text())
    for i in range(2):
        p = apply("registers", p, np.random.default_rng(i))
    child = apply("drop_syncs", p, np.random.default_rng(0))
    body = [ln.strip() for ln in child.text().split("for vt in range")[1].splitlines()[1:]]
    assert body == ["load(s_t, s[bid.y, bid.x, tile(0, TK), tile(vt, BV)])",
                    "load(v_r, v[bid.y, tile(bid.x, 1), tile(vt, BV)])",
                    "sync()",                                   # the copies, before the reads
                    'ewise(s_t, s_t, a_c, fn="mul")', 'ewise(t, s_t, k_c, fn="mul")', "reduce(u, t, axis=0)",
                    'ewise(u, v_r, u, fn="sub")', 'ewise(u, u, b_1, fn="mul")',
                    "sync()",                                   # u's elements, read broadcast next
                    'ewise(t, k_c, u, fn="mul")', "ewise(s_t, s_t, t)", 'ewise(t, s_t, q_c, fn="mul")',
                    "reduce(u, t, axis=0)",
                    "sync()",                                   # before the stores (a global write)
                    "store(s[bid.y, bid.x, tile(0, TK), tile(vt, BV)], s_t)",
                    "store(o[bid.y, tile(bid.x, 1), tile(vt, BV)], u)",
                    "sync()"]                                   # the next trip's copies overwrite v_r, u


@pytest.mark.parametrize("name", ["gemm_bf16", "tinygemm"])
def test_a_kernel_whose_every_barrier_orders_a_copy_and_its_reads_is_refused(name):
    out = apply("drop_syncs", parse_program(get_problem(name).seed_text()), np.random.default_rng(0))
    assert isinstance(out, Refused) and "orders an smem access" in out.reason


def test_a_barrier_between_a_global_write_and_the_statements_after_it_stays():
    text = '''@kernel(target="sm_90a", grid=(1,), threads=128, consts={"R": 64, "C": 32})
def k(x: gmem[f32, (R, C)], y: gmem[f32, (R, C)]):
    t = rmem(f32, (R, C))
    load(t, x[:, :])
    sync()
    unary(t, t, fn="exp")
    sync()
    store(y[:, :], t)
    sync()
    load(t, y[:, :])
    store(x[:, :], t)
'''
    child = apply("drop_syncs", parse_program(text), np.random.default_rng(0))
    assert not isinstance(child, Refused)
    lines = [ln.strip() for ln in child.text().splitlines()]
    assert lines[-4:] == ["store(y[:, :], t)", "sync()", "load(t, y[:, :])", "store(x[:, :], t)"]
    assert _syncs(child) == 2          # the one after the copy into registers goes


def test_a_warp_specialized_kernel_is_refused():
    ws = apply("warp_specialize", parse_program(get_problem("gemm_bf16").seed_text()), np.random.default_rng(0))
    out = apply("drop_syncs", ws, np.random.default_rng(0))
    assert isinstance(out, Refused) and "warp roles" in out.reason
