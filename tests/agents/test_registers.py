"""registers: an smem tile that only its owners touch moved into registers. It applies to the gated-delta-rule
decode and prefill seeds (their state and product tiles) and to the MoE seed, whose children pass the CPU gate
unchanged and lower with no staging of the moved tile (the decode child compiles with nvcc); it refuses, with the
reason, tiles a transpose or an mma operand reads, tiles whose elements the threads do not divide, a move past the
register budget, and kernels with warp roles."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import STRUCTURAL, TACTICS, apply
from cake_core.ir import interp
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

SHAPES = {
    "kda_decode": [{"B": 2, "H": 3, "DK": 64, "DV": 64}, {"B": 3, "H": 2, "DK": 40, "DV": 72},
                   {"B": 1, "H": 1, "DK": 100, "DV": 16}],
    "kda_prefill": [{"B": 2, "T": 6, "H": 2, "DK": 64, "DV": 64}, {"B": 1, "T": 9, "H": 3, "DK": 32, "DV": 48}],
    "moe": [{"M": 3, "H": 72, "I": 40, "E": 12, "k": 3}, {"M": 4, "H": 200, "I": 136, "E": 8, "k": 2}],
}

ROWSUM = '''@kernel(target="sm_90a", grid=(cdiv(M, BM),), threads=128, consts={"BM": 32, "BK": 64})
def rowscale(x: gmem[f32, (M, K)], w: gmem[f32, (1, K)], y: gmem[f32, (M, K)], r: gmem[f32, (1, K)]):
    x_s = smem(f32, (BM, BK))
    w_s = smem(f32, (1, BK))
    c_s = smem(f32, (1, BK))
    for kt in range(cdiv(K, BK)):
        load(x_s, x[tile(bid.x, BM), tile(kt, BK)])
        load(w_s, w[:, tile(kt, BK)])
        sync()
        ewise(x_s, x_s, w_s, fn="mul")
        sync()
        reduce(c_s, x_s, axis=0)
        sync()
        store(y[tile(bid.x, BM), tile(kt, BK)], x_s)
        atomic_add(r[:, tile(kt, BK)], c_s)
        sync()
'''


def _moved(p) -> set[str]:
    return {ln.split("=")[0].strip() for ln in p.text().splitlines() if "= rmem(" in ln}


def _errors(p, shapes=()):
    return [d for d in verify(p, shapes=shapes) if d.is_error]


def _refusal(p) -> str:
    out = apply("registers", p, np.random.default_rng(0))
    assert isinstance(out, Refused), out.text()
    return out.reason


def test_registers_is_a_structural_tactic():
    assert "registers" in TACTICS and "registers" in STRUCTURAL


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_seeds_owner_only_tile_moves_into_registers_and_stays_correct(name):
    problem = get_problem(name)
    seed = parse_program(problem.seed_text())
    child = apply("registers", seed, np.random.default_rng(0))
    assert not isinstance(child, Refused), child.reason
    moved = _moved(child) - _moved(seed)
    assert len(moved) == 1
    assert parse_program(child.text()) == child
    assert not _errors(child, SHAPES[name])
    checks = check_on_cpu(child, problem, SHAPES[name], seed=5, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(child)
    assert low.ok, [d.message for d in low.diagnostics]
    (tile,) = moved
    assert not any("stage_smem_rmem" in ln and f", {tile});" in ln for ln in low.value.source.splitlines())


def test_the_decode_state_and_its_product_both_move_and_the_reduction_exchanges_only_partials(tmp_path):
    seed = parse_program(get_problem("kda_decode").seed_text())
    p = seed
    for i in range(2):
        out = apply("registers", p, np.random.default_rng(i))
        assert not isinstance(out, Refused), out.reason
        p = out
    assert _moved(p) - _moved(seed) == {"s_t", "t"}
    src = lower(p).value.source
    assert "stage_smem_rmem" not in src and src.count("cake_part[") == 2      # both reductions of t
    # the same outputs as the seed, element for element, on the interpreter
    rng = np.random.default_rng(3)
    B, H, DK, DV = 2, 2, 40, 72
    ins = {"q": rng.normal(size=(B, H, DK)).astype(np.float32), "k": rng.normal(size=(B, H, DK)).astype(np.float32),
           "v": rng.normal(size=(B, H, DV)).astype(np.float32),
           "g": -rng.random((B, H, DK)).astype(np.float32), "beta": rng.random((B, H)).astype(np.float32)}
    shape = {"B": B, "H": H, "DK": DK, "DV": DV}
    state, runs = rng.normal(size=(B, H, DK, DV)).astype(np.float32), []
    for prog in (seed, p):
        outs = {"s": state.copy(), "o": np.full((B, H, DV), np.nan, np.float32)}
        runs.append(interp.run(prog, shape, ins, outs))
    for name in ("s", "o"):
        np.testing.assert_array_equal(runs[0][name], runs[1][name])
    if shutil.which("nvcc"):
        cr = compile_kernel(lower(p).value, arch="sm_90a", cache_dir=tmp_path)
        assert cr.ok and cr.value.resources.spill_bytes == 0, cr.diagnostics


def test_a_toy_tile_reduced_along_its_columns_moves_and_its_interpreter_output_is_unchanged():
    p = parse_program(ROWSUM)
    child = apply("registers", p, np.random.default_rng(0))
    assert not isinstance(child, Refused), child.reason
    assert _moved(child) == {"x_s"}          # w_s and c_s: 64 elements over 128 threads
    rng = np.random.default_rng(1)
    for M, K in ((70, 100), (32, 64)):
        x, w = rng.normal(size=(M, K)).astype(np.float32), rng.normal(size=(1, K)).astype(np.float32)
        got = [interp.run(q, {"M": M, "K": K}, {"x": x, "w": w},
                          {"y": np.full((M, K), np.nan, np.float32), "r": np.zeros((1, K), np.float32)})
               for q in (p, child)]
        np.testing.assert_array_equal(got[0]["y"], got[1]["y"])
        np.testing.assert_allclose(got[1]["r"][0], (x * w).sum(0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, why", [
    ("gemm_bf16", "`mma` (line 10) takes it as `a` in smem"),      # mma reads a and b from smem only
    ("kmeans_assign", "`transpose` (line"),
    ("moe", "elements do not split evenly over 128 threads"),
])
def test_tiles_it_cannot_move_are_refused_with_the_reason(name, why):
    p = parse_program(get_problem(name).seed_text())
    while True:      # move what can move, then the refusal names the rest
        out = apply("registers", p, np.random.default_rng(0))
        if isinstance(out, Refused):
            break
        p = out
    assert why in out.reason


def test_a_move_past_the_register_budget_is_refused():
    seed = parse_program(get_problem("kda_prefill").seed_text())
    p = seed
    while not isinstance(out := apply("registers", p, np.random.default_rng(0)), Refused):
        p = out
    assert "fails resources.registers" in out.reason


def test_a_swizzled_tile_and_a_warp_specialized_kernel_are_refused():
    swizzled = ROWSUM.replace("x_s = smem(f32, (BM, BK))", "x_s = smem(f32, (BM, BK), swizzle=128)")
    assert "`x_s` (line 3): a ring or a swizzled tile" in _refusal(parse_program(swizzled))
    ws = apply("warp_specialize", parse_program(get_problem("gemm_bf16").seed_text()), np.random.default_rng(0))
    assert "warp roles" in _refusal(ws)
