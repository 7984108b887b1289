"""kmeans_assign_ws, the best-known kmeans_assign program: the interpreter reproduces the oracle on the small
aligned shapes (CPU), its tensor maps, and the GPU gate on ragged aligned shapes and the headline shape
(marked `gpu`; no timing assertions, the headline median is printed).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_kmeans_ws.py -q -s -p no:cacheprovider -o addopts=""

kmeans_assign_unaligned (cp.async producer, no TMA: any D <= 128) and kmeans_assign_unaligned_m256 (256-point
tiles, so each centroid tile is read once per 256 points instead of 128; not measured yet) are gated on the
kmeans_assign_unaligned shapes and timed at B=4 N=100000 K=1000 D=100 and at the headline shape.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.runtime import tma
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
WS = corpus_file("kmeans_assign_ws.cake").read_text()
# variants of it, timed against it: persistent CTAs; two consumer warpgroup roles taking turns (ping-pong);
# ping-pong with the centroid tiles multicast to a 2-CTA cluster
VARIANTS = ["kmeans_assign_persistent", "kmeans_assign_pingpong", "kmeans_assign_pingpong_mc"]
KM = get_problem("kmeans_assign")
ALIGNED = KM.shape_set("kmeans_assign_aligned")
HEADLINE = {"B": 32, "N": 65536, "K": 1024, "D": 128}
UNALIGNED = KM.shape_set("kmeans_assign_unaligned")
LARGE_D100 = {"B": 4, "N": 100000, "K": 1000, "D": 100}
# beyond the shape set: N = 1 (one point, a 127-row zero-filled tail), K < 128 with an empty second tile,
# K = 4 * BN exactly, D = 8 (one 16-byte row)
EXTRA = [{"B": 1, "N": 1, "K": 4, "D": 8}, {"B": 3, "N": 129, "K": 60, "D": 32}, {"B": 2, "N": 384, "K": 512, "D": 128}]


def _program():
    return parse_program(WS, "kmeans_assign_ws.cake")


def test_it_is_the_problems_best_known_program():
    assert WS in KM.best_texts() and "kmeans_assign_aligned" in KM.shape_sets


def test_the_verifier_accepts_it_on_the_aligned_shapes_and_refuses_unaligned_d():
    assert not [d for d in verify(_program(), shapes=list(ALIGNED.shapes) + [HEADLINE]) if d.is_error]
    hits = [d for d in verify(_program(), shapes=[{"B": 1, "N": 33, "K": 7, "D": 9}]) if d.rule == "tma.global_align"]
    assert hits and "D=9" in hits[0].witness[0]


def test_the_interpreter_reproduces_the_oracle_on_the_small_aligned_shapes():
    from cake_core.runtime.cpu import check_on_cpu
    shapes = ALIGNED.cpu_shapes(KM.cpu_limit) + EXTRA
    assert len(shapes) >= 6 and "held_out" in ALIGNED.roles
    checks = check_on_cpu(_program(), KM, shapes, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_a_missing_tail_guard_fails_in_the_interpreter():
    from cake_core.runtime.cpu import check_on_cpu
    wrong = WS.replace("limit=K)", "limit=K + BN)")
    checks = check_on_cpu(parse_program(wrong), KM, [{"B": 1, "N": 100, "K": 100, "D": 64}], seed=1)
    assert not checks[0].correct


def test_tensor_maps_of_the_three_inputs():
    lk = lower(_program(), "kmeans_assign_ws.cake").value
    specs = tma.tensor_map_specs(lk, {"x": 1024, "c": 2048, "c_sq": 4096}, {"B": 2, "N": 300, "K": 100, "D": 40})
    assert [(s.gmem, s.global_dims, s.box_dims) for s in specs] == [
        ("x", (40, 300, 2), (64, 128, 1)), ("c", (40, 100, 2), (64, 128, 1)), ("c_sq", (100, 2), (128, 1))]


@pytest.mark.parametrize("name", VARIANTS)
def test_variants_pass_the_verifier_and_the_interpreter(name):
    from cake_core.runtime.cpu import check_on_cpu
    prog = parse_program(corpus_file(f"{name}.cake").read_text(), f"{name}.cake")
    assert not [d for d in verify(prog, shapes=list(ALIGNED.shapes) + [HEADLINE]) if d.is_error]
    checks = check_on_cpu(prog, KM, ALIGNED.cpu_shapes(KM.cpu_limit) + EXTRA, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_registers_are_counted_per_role():
    # the ping-pong roles hold 2 x 64 accumulator words each on disjoint warps: 132 per thread, not 260;
    # a third accumulator pair in one role is over the limit
    pp = corpus_file("kmeans_assign_pingpong.cake").read_text()
    assert "resources.registers" not in [d.rule for d in verify(parse_program(pp))]
    extra = "            acc0 = rmem(f32, (BM // 2, BN))\n"
    more = pp.replace(extra, extra + extra.replace("acc0", "acc4") + extra.replace("acc0", "acc5"))
    assert "resources.registers" in [d.rule for d in verify(parse_program(more))]


# ------------------------------------------------------------------ GPU


def _build_seed(name: str, tmp_path_factory):
    """(compiled, lowered, name) of a seed program of the corpus (a problem's kernels/)."""
    lk = lower(parse_program(corpus_file(f"{name}.cake").read_text(), f"{name}.cake"),
               f"{name}.cake").value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path_factory.mktemp("cubins"))
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk, name


@pytest.fixture(scope="module", params=["kmeans_assign_ws"] + VARIANTS)
def built(request, tmp_path_factory):
    return _build_seed(request.param, tmp_path_factory)


@pytest.mark.gpu
def test_kmeans_ws_passes_the_gate_on_ragged_aligned_shapes(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk, _ = built
    runs = check_and_time(compiled, lk, KM, list(ALIGNED.shapes) + EXTRA, seed=21, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
def test_kmeans_ws_passes_the_gate_at_the_headline_shape(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk, name = built
    (r,) = check_and_time(compiled, lk, KM, [HEADLINE], seed=22, reps=20, timeout_s=60, rows=4096)
    assert r.correct, r.message
    print(f"\n{name} {HEADLINE}: median {r.median_ms} ms (p10 {r.p10_ms}, p90 {r.p90_ms}, {r.timer}, "
          f"L2 {r.l2})")


@pytest.fixture(scope="module", params=["kmeans_assign_unaligned", "kmeans_assign_unaligned_m256"])
def built_unaligned(request, tmp_path_factory):
    return _build_seed(request.param, tmp_path_factory)


@pytest.mark.gpu
def test_kmeans_unaligned_passes_the_gate_on_ragged_unaligned_shapes(built_unaligned):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk, _ = built_unaligned
    shapes = list(UNALIGNED.shapes) + EXTRA + [{"B": 1, "N": 1, "K": 4, "D": 3}, {"B": 2, "N": 500, "K": 300, "D": 50}]
    runs = check_and_time(compiled, lk, KM, shapes, seed=21, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [LARGE_D100, HEADLINE], ids=["d100", "headline"])
def test_kmeans_unaligned_passes_the_gate_at_the_timed_shapes(built_unaligned, shape):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk, name = built_unaligned
    (r,) = check_and_time(compiled, lk, KM, [shape], seed=22, reps=20, timeout_s=60, rows=4096)
    assert r.correct, r.message
    print(f"\n{name} {shape}: median {r.median_ms} ms (p10 {r.p10_ms}, p90 {r.p90_ms}, {r.timer}, "
          f"L2 {r.l2})")
