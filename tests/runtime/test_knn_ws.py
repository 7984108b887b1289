"""knn_topk_ws, the best-known knn_topk program: the interpreter reproduces the oracle on the small aligned
shapes (CPU), its tensor maps, and the GPU gate on ragged aligned shapes and the headline shape (marked `gpu`;
no timing assertions, the headline median is printed).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_knn_ws.py -q -s -p no:cacheprovider -o addopts=""
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
WS = corpus_file("knn_topk_ws.cake").read_text()
KNN = get_problem("knn_topk")
ALIGNED = KNN.shape_set("knn_topk_aligned")
HEADLINE = {"Q": 4096, "N": 1048576, "D": 128, "k": 10}
# beyond the CPU limit: 8 tiles wrap the 5-slot ring and the norm lag, a second CTA with 2 rows; a db of
# 1300 rows (a 20-row last tile) with D = 8 (one 16-byte row); a single query
EXTRA = [{"Q": 130, "N": 1000, "D": 128, "k": 10}, {"Q": 5, "N": 1300, "D": 8, "k": 3},
         {"Q": 1, "N": 300, "D": 32, "k": 16}]


def _program():
    return parse_program(WS, "knn_topk_ws.cake")


def test_it_is_the_problems_best_known_program():
    assert WS in KNN.best_texts() and "knn_topk_aligned" in KNN.shape_sets


def test_the_verifier_accepts_it_on_the_aligned_shapes_and_refuses_unaligned_d():
    assert not [d for d in verify(_program(), shapes=list(ALIGNED.shapes) + [HEADLINE]) if d.is_error]
    hits = [d for d in verify(_program(), shapes=[{"Q": 33, "N": 100, "D": 9, "k": 5}]) if d.rule == "tma.global_align"]
    assert hits and "D=9" in hits[0].witness[0]


def test_the_interpreter_reproduces_the_oracle_on_the_small_aligned_shapes():
    from cake_core.runtime.cpu import check_on_cpu
    shapes = ALIGNED.cpu_shapes(KNN.cpu_limit) + EXTRA
    assert len(shapes) >= 8 and "held_out" in ALIGNED.roles
    assert any(s["k"] < 16 for s in shapes) and any(s["N"] % 128 for s in shapes)
    checks = check_on_cpu(_program(), KNN, shapes, seed=7)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_a_missing_tail_guard_fails_in_the_interpreter():
    from cake_core.runtime.cpu import check_on_cpu
    wrong = WS.replace("limit=N)", "limit=N + BN)")
    checks = check_on_cpu(parse_program(wrong), KNN, [{"Q": 20, "N": 100, "D": 64, "k": 5}], seed=1)
    assert not checks[0].correct


def test_norms_of_only_the_first_k_block_fail_in_the_interpreter():
    from cake_core.runtime.cpu import check_on_cpu
    wrong = "\n".join(line for line in WS.splitlines() if "accumulate=True" not in line)
    checks = check_on_cpu(parse_program(wrong), KNN, [{"Q": 20, "N": 200, "D": 128, "k": 5}], seed=1)
    assert not checks[0].correct


def test_tensor_maps_of_the_two_inputs():
    lk = lower(_program(), "knn_topk_ws.cake").value
    specs = tma.tensor_map_specs(lk, {"q": 1024, "db": 2048}, {"Q": 300, "N": 1000, "D": 40, "k": 10})
    assert [(s.gmem, s.global_dims, s.box_dims) for s in specs] == [
        ("q", (40, 300), (64, 128)), ("db", (40, 1000), (64, 128))]


# ------------------------------------------------------------------ GPU


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    lk = lower(_program(), "knn_topk_ws.cake").value
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path_factory.mktemp("cubins"))
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk


@pytest.mark.gpu
def test_knn_ws_passes_the_gate_on_ragged_aligned_shapes(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = built
    runs = check_and_time(compiled, lk, KNN, list(ALIGNED.shapes) + EXTRA, seed=21, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
def test_knn_ws_passes_the_gate_at_the_headline_shape(built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = built
    (r,) = check_and_time(compiled, lk, KNN, [HEADLINE], seed=22, reps=10, timeout_s=120,
                          rows=256)
    assert r.correct, r.message
    print(f"\nknn_topk_ws {HEADLINE}: median {r.median_ms} ms (p10 {r.p10_ms}, p90 {r.p90_ms}, {r.timer}, "
          f"L2 {r.l2})")
