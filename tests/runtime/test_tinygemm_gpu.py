"""The split-K tinygemm program (TMA + wgmma, atomics into a zeroed C) through check_and_time on the
H200 (marked `gpu`): tail, held-out and headline shapes of tinygemm_decode, the aligned small set.

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_tinygemm_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem

TINY = get_problem("tinygemm")
SPLITK = "tinygemm_splitk.cake"
# beyond the shape sets: M past one 64-row tile (grid z), K ragged against the 64-wide K tiles and the
# split, N ragged inside a 128-column tile, one split only (few K tiles, many N tiles)
EXTRA = [{"M": 70, "N": 200, "K": 1000}, {"M": 64, "N": 264, "K": 8}, {"M": 2, "N": 36000, "K": 128}]


@pytest.fixture(scope="module")
def splitk_built(tmp_path_factory):
    text = dict(zip(TINY.best_files, TINY.best_texts()))[SPLITK]
    lk = lower(parse_program(text, SPLITK), SPLITK)
    assert lk.ok, lk.diagnostics
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path_factory.mktemp("cubins"))
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk.value


@pytest.mark.gpu
def test_splitk_passes_the_gate_on_decode_tail_held_out_and_small_shapes(splitk_built):
    from cake_core.runtime.gpu import check_and_time, gpu_model
    assert "H200" in (gpu_model() or "") or "H100" in (gpu_model() or "")
    compiled, lk = splitk_built
    decode = TINY.shape_set("tinygemm_decode")
    shapes = list(TINY.shape_set("tinygemm_aligned").shapes) + EXTRA + list(decode.shapes)
    assert {"tail", "held_out", "headline"} <= set(decode.roles)
    runs = check_and_time(compiled, lk, TINY, shapes, seed=5, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.outcome == "checked" and r.max_error < TINY.rtol for r in runs)


@pytest.mark.gpu
def test_splitk_is_timed_and_still_correct_after_timing(splitk_built):
    # every timed launch starts from a zeroed C (zeroing inside the timed region): the re-check after
    # the timed launches would see their sum otherwise
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = splitk_built
    runs = check_and_time(compiled, lk, TINY, [{"M": 1, "N": 4096, "K": 4096}, {"M": 64, "N": 8192, "K": 8192}],
                          seed=6, reps=20, timeout_s=20)
    for r in runs:
        assert r.correct and r.outcome == "measured", r.message
        assert 0 < r.p10_ms <= r.median_ms <= r.p90_ms


@pytest.mark.gpu
def test_a_splitk_kernel_that_drops_a_k_slice_fails_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    text = dict(zip(TINY.best_files, TINY.best_texts()))[SPLITK]
    wrong = text.replace("atomic_add(c[tile(bid.z, BM), tile(bid.x, BN)], acc)",
                         "if bid.y > 0:\n            atomic_add(c[tile(bid.z, BM), tile(bid.x, BN)], acc)")
    assert wrong != text
    lk = lower(parse_program(wrong, SPLITK), SPLITK)
    assert lk.ok, lk.diagnostics
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok
    (r,) = check_and_time(cr.value, lk.value, TINY, [{"M": 8, "N": 4096, "K": 4096}], seed=3, time=False,
                          timeout_s=20)
    assert r.outcome == "wrong", r.message


@pytest.mark.gpu
def test_splitk_under_the_graph_timer_is_zeroed_before_every_launch_of_a_replay(splitk_built):
    # one replay launches the kernel 8 times into the same C, each on its own input copy: without the
    # zeroing captured before each launch, the re-check after the timed replays would see their sum
    from cake_core.runtime.gpu import check_and_time
    from cake_core.runtime.timing import GRAPH_LAUNCHES
    compiled, lk = splitk_built
    (r,) = check_and_time(compiled, lk, TINY, [{"M": 8, "N": 4096, "K": 4096}], seed=7, reps=20, timeout_s=20,
                          timer="graph")
    assert r.correct and r.outcome == "measured", r.message
    assert r.timer == "cuda_graph" and f"{GRAPH_LAUNCHES} back-to-back launches" in r.message
    assert 0 < r.p10_ms <= r.median_ms <= r.p90_ms
