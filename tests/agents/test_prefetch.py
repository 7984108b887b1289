"""prefetch: a role-free loop's copies issued one trip ahead with cp_async into a second set of buffers. It applies
to the MoE, KDA prefill and decode and tinygemm seeds, whose children pass the CPU gate and lower (the MoE child compiles
with nvcc); it refuses, with the reason, warp-specialized kernels, a window that names the loop variable outside
tile(..), a body whose loads are not followed by sync(), and a tile read outside the loop. The races rule sees
the copies land only at the cp_async_wait that retires their group: a wait that leaves the trip's own copies in
flight is an error, the tactic's count is not."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import cake_core.problems
from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import STRUCTURAL, TACTICS, apply
from cake_core.ir import interp
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

SHAPES = {
    "moe": [{"M": 3, "H": 72, "I": 40, "E": 12, "k": 3}, {"M": 4, "H": 200, "I": 136, "E": 8, "k": 2}],
    "kda_prefill": [{"B": 2, "T": 6, "H": 2, "DK": 64, "DV": 64}, {"B": 1, "T": 9, "H": 3, "DK": 32, "DV": 48}],
    "tinygemm": [{"M": 1, "N": 128, "K": 128}, {"M": 16, "N": 100, "K": 72}, {"M": 3, "N": 40, "K": 8}],
    # the state tile is updated in place after the barrier: each trip starts from its own copy
    "kda_decode": [{"B": 2, "H": 3, "DK": 64, "DV": 64}, {"B": 3, "H": 2, "DK": 40, "DV": 72},
                   {"B": 1, "H": 1, "DK": 100, "DV": 16}],
}

LOOP = '''@kernel(target="sm_90a", grid=(cdiv(M, BM),), threads=128, consts={"BM": 128, "BK": 32})
def rowsum(x: gmem[f32, (M, K)], ones: gmem[f32, (K, 1)], y: gmem[f32, (M, 1)]):
    x_s = smem(f32, (BM, BK))
    o_s = smem(f32, (BK, 1))
    acc = rmem(f32, (BM, 1))
    fill(acc)
    for kt in range(cdiv(K, BK)):
        load(x_s, x[tile(bid.x, BM), tile(kt, BK)])
        load(o_s, ones[tile(kt, BK), :])
        sync()
        mma(acc, x_s, o_s)
        sync()
    store(y[tile(bid.x, BM), :], acc)
'''


def _apply(p):
    out = apply("prefetch", p, np.random.default_rng(0))
    assert not isinstance(out, Refused), out.reason
    return out


def _refusal(text: str) -> str:
    out = apply("prefetch", parse_program(text), np.random.default_rng(0))
    assert isinstance(out, Refused), out.text()
    return out.reason


def _errors(p, shapes=()):
    return [d for d in verify(p, shapes=shapes) if d.is_error]


def test_prefetch_is_a_structural_tactic():
    assert "prefetch" in TACTICS and "prefetch" in STRUCTURAL


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_seeds_reduction_copies_go_a_trip_ahead_and_stay_correct(name):
    problem = get_problem(name)
    child = _apply(parse_program(problem.seed_text()))
    text = child.text()
    assert "cp_async(" in text and "cp_async_wait(0)" in text and "if " in text
    assert parse_program(text) == child
    assert not _errors(child, SHAPES[name])
    checks = check_on_cpu(child, problem, SHAPES[name], seed=5, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(child, f"{name}.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]


def test_the_rewrite_has_two_buffers_a_prologue_and_the_wait_counts_of_the_copies_per_trip():
    child = _apply(parse_program(LOOP))
    lines = [ln.strip() for ln in child.text().splitlines()]
    assert "x_s1 = smem(f32, (BM, BK))" in lines and "o_s1 = smem(f32, (BK, 1))" in lines
    assert lines.count("cp_async_wait(2)") == 2          # two copies a trip: the trip's own have landed
    first = lines.index("cp_async(x_s, x[tile(bid.x, BM), tile(0, BK)])")
    assert lines[first + 2].startswith("for kt2 in range(cdiv(cdiv(K, BK), 2)):")
    assert "cp_async(x_s1, x[tile(bid.x, BM), tile(kt + 1, BK)])" in lines
    assert "mma(acc, x_s1, o_s1)" in lines and lines[-2] == "cp_async_wait(0)"
    rng = np.random.default_rng(4)
    for M, K in ((200, 70), (128, 32), (5, 3), (9, 64)):
        x = rng.normal(size=(M, K)).astype(np.float32)
        got = interp.run(child, {"M": M, "K": K}, {"x": x, "ones": np.ones((K, 1), np.float32)},
                         {"y": np.full((M, 1), np.nan, np.float32)})
        np.testing.assert_allclose(got["y"][:, 0], x.sum(1), rtol=1e-5, atol=1e-5)


def test_a_wait_that_leaves_the_trips_own_copies_in_flight_is_a_race():
    child = _apply(parse_program(LOOP)).text()
    assert not _errors(parse_program(child))
    bad = parse_program(child.replace("cp_async_wait(2)", "cp_async_wait(4)"))
    found = [d for d in _errors(bad) if d.rule == "races.smem"]
    assert found and all("may still be landing" in d.message for d in found)
    assert {"x_s", "o_s"} <= {d.message.split("`")[1] for d in found}
    no_drain = parse_program(child.replace("cp_async_wait(2)", "cp_async_wait(3)"))
    assert [d for d in _errors(no_drain) if d.rule == "races.smem"]


def test_a_copy_read_after_a_sync_without_a_wait_is_a_race():
    text = LOOP.replace("load(x_s, x[tile(bid.x, BM), tile(kt, BK)])", "cp_async(x_s, x[tile(bid.x, BM), tile(kt, BK)])")
    found = [d for d in _errors(parse_program(text)) if d.rule == "races.smem"]
    assert len(found) == 1 and "x_s" in found[0].message and "may still be landing" in found[0].message
    fixed = text.replace("        sync()\n        mma", "        cp_async_wait(0)\n        sync()\n        mma")
    assert not _errors(parse_program(fixed))


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.replace("load(o_s, ones[tile(kt, BK), :])", "load(o_s, ones[tile(0, BK), :])"),
     "does not move with `kt`"),
    (lambda t: t.replace("        sync()\n        mma(acc, x_s, o_s)", "        mma(acc, x_s, o_s)"),
     "not followed by sync()"),
    (lambda t: t.replace("    store(y[tile(bid.x, BM), :], acc)", "    sync()\n    mma(acc, x_s, o_s)\n"
                                                                   "    store(y[tile(bid.x, BM), :], acc)"),
     "outside the loop"),
])
def test_loops_whose_copies_cannot_go_ahead_are_refused_with_the_reason(edit, why):
    assert why in _refusal(edit(LOOP))


def test_an_index_outside_tile_is_refused_as_the_copy_past_the_end_could_leave_the_tensor():
    text = LOOP.replace("ones: gmem[f32, (K, 1)]", "ones: gmem[f32, (K, 1)], w: gmem[f32, (K, BM, BK)]").replace(
        "load(x_s, x[tile(bid.x, BM), tile(kt, BK)])", "load(x_s, w[kt, :, :])")
    assert "outside tile(..)" in _refusal(text)


def test_warp_specialized_kernels_are_left_to_their_producers():
    kernels = Path(cake_core.problems.__file__).parent / "gemm_bf16" / "kernels"
    text = next(f.read_text() for f in sorted(kernels.glob("*.cake")) if "role(" in f.read_text())
    assert "warp roles" in _refusal(text)


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
def test_the_moe_child_compiles_for_sm_90a(tmp_path):
    from cake_core.lower.compile import compile_kernel
    child = _apply(parse_program(get_problem("moe").seed_text()))
    comp = compile_kernel(lower(child, "moe.cake").value, arch="sm_90a", cache_dir=tmp_path)
    assert comp.outcome is Outcome.OK, comp.artifacts.get("log", "")[-2000:]
