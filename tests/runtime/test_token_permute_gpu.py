"""fetch_add and compact on the GPU (marked `gpu`): the token permutation by expert agrees with the interpreter (and
numpy's stable sort) element for element, an expert no token picks and one every token picks among them, and the
grouped GEMM fed with its rows agrees too; the positions compacted tile by tile and the running offset in smem agree
element for element; tokens claiming slots of their experts across CTAs agree as sets per expert (the GPU orders
the adds as it likes).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_token_permute_gpu.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling
from cake_core.ir import interp
from cake_core.ir.numeric import bf16_round
from cake_core.ir.text import parse_program

pytestmark = pytest.mark.gpu


_here = Path(__file__).parent
_gpu = sibling.load(_here / "test_role_compute_gpu.py")
_fetch_add = sibling.load(_here.parent / "ir" / "test_fetch_add.py")
_compact = sibling.load(_here.parent / "ir" / "test_compact.py")
_permute = sibling.load(_here.parent / "ir" / "test_token_permute.py")
_gather = sibling.load(_here.parent / "ir" / "test_gather.py")

ADDED = ("counts", "perm", "rows")       # the outputs permute_by_expert adds into: uploaded zeroed, fetched back


def _gpu_permute(shape: dict, inputs: dict, tmp_path: Path) -> dict[str, np.ndarray]:
    zeroed = {k: v for k, v in _permute.accumulated(shape).items() if k in ADDED}
    return _gpu._launch(_permute.PERMUTE, shape, {**inputs, **zeroed}, tmp_path, fetch=ADDED)


@pytest.mark.parametrize("M, k, E, empty, full", _permute.CASES + [(1000, 8, 64, 5, 17), (257, 6, 128, 0, 127)])
def test_the_permutation_by_expert_matches_the_interpreter(tmp_path, M, k, E, empty, full):
    shape, inputs = _permute.permute_case(np.random.default_rng(M + k + E), M, k, E, empty, full)
    got = _gpu_permute(shape, inputs, tmp_path)
    ref = _permute.run_permute(shape, inputs)
    want = _permute.permutation(inputs["topk_ids"], E)
    for name in ("counts", "offs", "perm", "rows"):
        np.testing.assert_array_equal(got[name].reshape(ref[name].shape), ref[name], err_msg=name)
        np.testing.assert_array_equal(ref[name], want[name], err_msg=name)


def test_the_grouped_gemm_over_the_permuted_rows_matches_the_interpreter(tmp_path):
    rng = np.random.default_rng(11)
    M, k, E, K, N = 300, 4, 16, 96, 130
    shape, inputs = _permute.permute_case(rng, M, k, E, empty=3, full=9)
    perm = _gpu_permute(shape, inputs, tmp_path)
    P = M * k
    x = bf16_round(rng.normal(size=(M, K)).astype(np.float32))
    w = bf16_round(rng.normal(size=(E, K, N)).astype(np.float32))
    gshape = {"M": M, "K": K, "N": N, "G": E, "P": P}
    gin = {"x": x, "perm": perm["rows"].reshape(P), "offs": perm["offs"].reshape(E + 1), "w": w}
    zero = np.zeros((P, N), np.float32)
    got = _gpu._launch(_gather.GROUPED, gshape, {**gin, "y": zero}, tmp_path, fetch=("y",))["y"]
    ref = interp.run(parse_program(_gather.GROUPED), gshape, gin, {"y": zero.copy()})["y"]
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)


def test_tokens_claiming_slots_across_ctas_match_the_interpreter_as_sets_per_expert(tmp_path):
    shape, inputs = _fetch_add.dispatch_case(np.random.default_rng(12), M=500, k=8, E=32)
    M, E = shape["M"], shape["E"]
    added = {"counts": np.zeros(E, np.int32), "slots": np.full(E * M, -7, np.int32)}
    got = _gpu._launch(_fetch_add.DISPATCH, shape, {**inputs, **added}, tmp_path, fetch=tuple(added))
    _fetch_add.check_dispatch(inputs["topk_ids"], E, got["counts"].reshape(E), got["slots"].reshape(E * M))
    ref = _fetch_add._dispatch(shape, inputs)
    np.testing.assert_array_equal(got["counts"].reshape(E), ref["counts"])


@pytest.mark.parametrize("case", ["mixed", "none", "all"])
def test_positions_compacted_at_a_running_offset_match_the_interpreter(tmp_path, case):
    rng = np.random.default_rng(13)
    x = rng.normal(size=1000).astype(np.float32)
    x = -np.abs(x) if case == "none" else np.abs(x) + 0.5 if case == "all" else x
    added = {"keep": np.zeros(x.size, np.int32)}
    got = _gpu._launch(_compact.KEEP, {"N": x.size}, {"x": x, **added}, tmp_path, fetch=("keep",))
    keep, kept = _compact.keep_positive(x)
    assert int(got["kept"].reshape(-1)[0]) == kept
    np.testing.assert_array_equal(got["keep"].reshape(-1), keep)


def test_the_set_flags_of_a_tile_and_a_running_offset_match_the_interpreter(tmp_path):
    rng = np.random.default_rng(14)
    f = (rng.random((3, 5)) < 0.5).astype(np.int32)
    _gpu._agree(_compact.WHERE, {"R": 3, "C": 5}, {"f": f}, tmp_path)
    lens = rng.integers(0, 9, 40).astype(np.int32)
    _gpu._agree(_fetch_add.RUNNING, {"S": lens.size}, {"lens": lens}, tmp_path)
