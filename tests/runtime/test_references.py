"""The gate's references (runtime.references): keys, the cache under the Cake home, invalidation when a
problem's version changes, the size cap, damaged entries; and the fingerprints that say when a
problem's version must be bumped."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cake_core.problems import list_problems, get_problem
from cake_core.problems.base import input_sampler
from cake_core.runtime.references import ReferenceCache, problem_fingerprint, ref_key, reference

PROBLEMS = {p.name: p for p in list_problems()}

KM = get_problem("kmeans_assign")
SHAPE = {"B": 2, "N": 40, "K": 12, "D": 16}

# what each problem draws and computes on a small shape, at its version: a change to make_inputs or the
# oracle changes the fingerprint; then bump Problem.version (cached references carry it in their key)
# and record the new pair here
FINGERPRINTS = {
    "mha": (1, "b7b90ae8bdeddde6"),
    "gemm_bf16": (1, "5b89a3b32dc1b776"),
    "grouped_gemm": (1, "52049a0928f11e84"),
    "kda_prefill": (1, "ddcdfddb93cd31d7"),
    "kda_decode": (1, "17762bdc17d7992a"),
    "kda_varlen": (1, "8ce1fba10215be44"),
    "kmeans_assign": (2, "c39075bf6394c55c"),
    "kmeans_update": (1, "bc7ca8841019504f"),
    "knn_search": (1, "a4d4f4a02729aed1"),
    "knn_topk": (2, "ed884dce47d8ad11"),
    "moe": (1, "41f9b648ccea785f"),
    "tinygemm": (1, "12a04079961a5e26"),
}


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_a_change_to_inputs_or_oracle_comes_with_a_version_bump(name):
    p = PROBLEMS[name]
    version, fingerprint = FINGERPRINTS[name]
    got = problem_fingerprint(p)
    assert (p.version, got) == (version, fingerprint), (
        f"{name}: version {p.version}, fingerprint {got}; recorded ({version}, {fingerprint}). If make_inputs or "
        "the oracle changed, bump Problem.version and record the new pair in FINGERPRINTS")


# a branch of make_inputs the default small shape does not take (it sets every dimension to 5 + its position):
# fingerprinted on a shape of its own, bumped the same way
BRANCH_FINGERPRINTS = {("knn_search", "B=2,Q=6,M=6,D=8,k=5,S=1"): (1, "1ae117ae5b6a2787")}     # a self-search


@pytest.mark.parametrize("name, shape", sorted(BRANCH_FINGERPRINTS))
def test_a_change_to_a_branch_of_the_inputs_comes_with_a_version_bump(name, shape):
    p = PROBLEMS[name]
    version, fingerprint = BRANCH_FINGERPRINTS[(name, shape)]
    got = problem_fingerprint(p, dict((d, int(v)) for d, v in (x.split("=") for x in shape.split(","))))
    assert (p.version, got) == (version, fingerprint), (
        f"{name} at {shape}: version {p.version}, fingerprint {got}; recorded ({version}, {fingerprint}). If "
        "make_inputs or the oracle changed, bump Problem.version and record the new pair in BRANCH_FINGERPRINTS")


def test_the_key_names_every_input_of_a_reference_and_ignores_dimension_order():
    k = ref_key(KM, SHAPE, 3, "cpu")
    assert (k.problem, k.version, k.shape, k.seed, k.device, k.rows) == ("kmeans_assign", KM.version,
                                                                         "B=2,N=40,K=12,D=16", 3, "cpu", "all")
    assert ref_key(KM, dict(reversed(list(SHAPE.items()))), 3, "cpu") == k
    others = [ref_key(KM, {**SHAPE, "N": 41}, 3, "cpu"), ref_key(KM, SHAPE, 4, "cpu"),
              ref_key(KM, SHAPE, 3, "cuda:NVIDIA H200"), ref_key(KM, SHAPE, 3, "cpu", np.array([1, 5])),
              ref_key(dataclasses.replace(KM, version=KM.version + 1), SHAPE, 3, "cpu")]
    assert len({k.digest()} | {o.digest() for o in others}) == 6
    assert ref_key(KM, SHAPE, 3, "cpu", np.array([1, 5])).rows.startswith("2:")


def _inputs(p=KM, shape=SHAPE, seed=3):
    return p.make_inputs(shape, input_sampler(seed, shape))


def test_the_second_reference_comes_from_the_cache_and_equals_the_first(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    x = _inputs()
    first = reference(KM, x, SHAPE, 3, device="cpu", cache=cache)
    second = reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    assert (first.source, second.source) == ("computed", "cached")
    assert (cache.hits, cache.misses, cache.stored) == (1, 1, 1)
    for name in ("out", "_dmin"):
        np.testing.assert_array_equal(first.want[name], second.want[name])
    # only what the oracle computed is stored: the inputs the comparison reads come back from the inputs
    (entry,) = cache.entries()
    assert set(entry["arrays"]) == {"out", "_dmin"} and entry["key"]["shape"] == "B=2,N=40,K=12,D=16"
    assert second.want["_x"] is not None and KM.compare({"out": second.want["out"]}, second.want)[0]


def test_a_version_bump_leaves_old_entries_unread(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    bumped = dataclasses.replace(KM, version=KM.version + 1)
    r = reference(bumped, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    assert r.source == "computed" and len(cache.entries()) == 2
    assert reference(bumped, _inputs(), SHAPE, 3, device="cpu", cache=cache).source == "cached"


def test_a_row_subset_is_cached_under_its_own_key(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    rows = np.array([0, 7, 41, 79])
    r = reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache, rows=rows)
    assert r.want["out"].shape == (1, 4) and r.key.rows.startswith("4:")
    assert reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache).source == "computed"   # all rows: another
    assert reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache, rows=rows).source == "cached"


def test_an_entry_over_the_cap_is_recomputed_and_says_so(tmp_path):
    cache = ReferenceCache(tmp_path / "refs", max_entry_bytes=100)
    r = reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    assert r.source.startswith("computed, not cached") and "cap" in r.source and cache.entries() == []
    assert reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=None).source == "computed, no cache"


def test_a_damaged_entry_is_a_miss_and_is_replaced(tmp_path):
    cache = ReferenceCache(tmp_path / "refs")
    r = reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    entry = tmp_path / "refs" / "kmeans_assign" / r.key.digest()
    (entry / "out.npy").write_bytes(b"not numpy")
    again = reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache)
    assert again.source == "computed"
    np.testing.assert_array_equal(again.want["out"], r.want["out"])
    index = json.loads((entry / "index.json").read_text())
    assert index["key"]["seed"] == 3 and index["arrays"]["out"]["shape"] == [2, 40]
    assert reference(KM, _inputs(), SHAPE, 3, device="cpu", cache=cache).source == "cached"


def test_inputs_are_a_function_of_seed_and_shape_and_never_constant():
    for name, p in sorted(PROBLEMS.items()):
        shape = {d: 9 + i for i, d in enumerate(p.dims)}
        if "k" in shape:
            shape["k"] = 5
        a, b = _inputs(p, shape, 1), _inputs(p, shape, 1)
        c = _inputs(p, shape, 2)
        for n in p.inputs:
            np.testing.assert_array_equal(a[n], b[n])
            assert not np.array_equal(a[n], c[n]), (name, n)
            assert np.count_nonzero(a[n]) > 0.5 * a[n].size and np.unique(a[n]).size > 2, (name, n)
