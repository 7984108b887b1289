"""gather_add: segment sums of gathered gmem rows into one CTA's smem tile, warps owning target rows. The
kmeans_update_gather seed is correct in the CPU interpreter (its sums are the row-order f32 sums the lowering's
owning warps produce), a wrong segment offset fails, the race checker treats the target as warp-owned and the
queue as written, and the seed lowers to ``cake::gather_add_bucketed`` and compiles for sm_90a with vector loads
of the rows and no local memory."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.problems import get_problem, load_shape_set
from cake_core.runtime.cpu import check_on_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx import ptx_of  # noqa: E402
from cake_core.problems import corpus_file

SEED = corpus_file("kmeans_update_gather.cake").read_text()
UPD = get_problem("kmeans_update")
# K = 600 > KC: three CTAs split the clusters; D = 130 > BD: two D-slices, one ragged; B = 1: N split over CTAs
EXTRA = [{"B": 2, "N": 4100, "K": 600, "D": 128}, {"B": 1, "N": 5000, "K": 300, "D": 130},
         {"B": 3, "N": 700, "K": 3, "D": 36}]


def test_the_seed_checks_and_matches_the_oracle_in_the_cpu_interpreter():
    assert check_text(SEED, "g.cake") == []
    shapes = load_shape_set(UPD, "kmeans_update_small").cpu_shapes(UPD.cpu_limit) + EXTRA
    checks = check_on_cpu(parse_program(SEED, "g.cake"), UPD, shapes, seed=12)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_a_wrong_segment_offset_fails():
    # every CTA adds clusters [0, KC) into its tile: the CTAs past the first store the first CTA's sums
    wrong = SEED.replace("first=bid.x * KC)", "first=0)")
    assert wrong.count("first=0)") == 2
    (c,) = check_on_cpu(parse_program(wrong, "w.cake"), UPD, [EXTRA[0]], seed=12)
    assert not c.correct and ("sums" in c.message or "counts" in c.message), c.message


def test_the_interpreter_adds_in_row_order_in_f32():
    from cake_core.ir.interp import run
    rng = np.random.default_rng(3)
    shape = {"B": 1, "N": 3000, "K": 40, "D": 128}
    x = UPD.make_inputs(shape, rng)
    outs = {"sums": np.full((1, 40, 128), np.nan, np.float32), "counts": np.full((1, 40), -7, np.int32)}
    one = SEED.replace('"SMS": 132', '"SMS": 1')           # one CTA per segment block: no atomic merge
    out = run(parse_program(one, "o.cake"), shape, {"x": x["x"], "assign": x["assign"]}, outs)
    want = np.zeros((40, 128), np.float32)
    for r in range(3000):                                  # a sequential loop in f32, row by row
        want[x["assign"][0, r]] += x["x"][0, r]
    assert np.array_equal(out["sums"][0], want)
    assert np.array_equal(out["counts"][0], np.bincount(x["assign"][0], minlength=40))


RACY = '''@kernel(target="sm_90a", grid=(1,), threads=128, consts={"R": 128})
def g(x: gmem[bf16, (N, C)], a: gmem[i32, (N,)], s: gmem[f32, (K, C)], n: gmem[i32, (K,)]):
    acc = smem(f32, (64, 32))
    cnt = smem(i32, (64,))
    ix = smem(i32, (R,))
    q0 = smem(i32, (R + 32,))
    q1 = smem(i32, (R + 32,))
    fill(acc, value=0.0)
    fill(cnt, value=0.0)
    load(ix, a[tile(0, R)])
    sync()
    gather_add(acc[:, :], cnt[:], ix, q0, x[tile(0, R), tile(0, 32)], base=0, limit=N, first=0)
    gather_add(acc[:, :], cnt[:], ix, q1, x[tile(1, R), tile(0, 32)], base=R, limit=N, first=0)
    sync()
    store(s[tile(0, 64), tile(0, 32)], acc)
'''


def test_two_gathers_into_one_tile_need_no_barrier_but_its_readers_do():
    assert [d.rule for d in check_text(RACY, "r.cake")] == []
    racy = RACY.replace("    sync()\n    store(", "    store(")
    d = next(d for d in check_text(racy, "r.cake") if d.rule == "races.smem")
    assert "read-after-owned" in d.message and "store(" in racy.splitlines()[d.line - 1]


def test_two_gathers_through_one_queue_need_a_barrier_between():
    one = RACY.replace("ix, q1, x[", "ix, q0, x[")
    d = next(d for d in check_text(one, "r.cake") if d.rule == "races.smem")
    assert "write-after-write race on smem tile `q0`" in d.message, d.message
    assert "tile(1, R)" in one.splitlines()[d.line - 1]
    fixed = one.replace("first=0)\n    gather_add(", "first=0)\n    sync()\n    gather_add(")
    assert [d.rule for d in check_text(fixed, "r.cake")] == []


def test_an_atomic_scatter_after_a_warp_owned_one_needs_a_barrier():
    text = RACY.replace("    gather_add(acc[:, :], cnt[:], ix, q1, x[tile(1, R), tile(0, 32)], base=R, limit=N, first=0)\n",
                        "    scatter_add(cnt[:], ix, ix, base=0, limit=N)\n")
    d = next(d for d in check_text(text, "r.cake") if d.rule == "races.smem")
    assert "atomic-after-owned" in d.message


def test_the_seed_lowers_to_the_bucketed_gather():
    r = lower(parse_program(SEED, "g.cake"), "g.cake")
    assert r.ok, [d.format("g.cake") for d in r.diagnostics]
    src = r.value.source
    assert src.count("cake::gather_add_bucketed<4096, 128, 256, THREADS>(acc_s, cnt_s, a") == 2
    assert src.count(", q_s, (int)(") == 2


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_seed_compiles_for_sm_90a_with_vector_row_loads(tmp_path):
    r = lower(parse_program(SEED, "g.cake"), "g.cake")
    c = compile_kernel(r.value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.registers <= 128            # ctas_per_sm=1: 512 threads x 128 registers
    ptx = ptx_of(r.value.source, tmp_path)
    assert "ld.global.v2.u32" in ptx                     # 4 bf16 columns per lane per load, as two words
    assert "match.any.sync" in ptx and ".local" not in ptx    # the counting sort; no stack
