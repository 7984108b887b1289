"""A token permutation by expert written in Cake IR with compact and fetch_add: from topk_ids (M, k) and E experts,
each expert's count, the start of its segment (offs, E + 1 entries) and the permuted order (perm: entries m * k + j
sorted by expert, each expert's in their original order; rows: their tokens m), checked on the interpreter against
numpy's stable argsort on random routings with an expert no token picks and one every token picks; then fed to the
grouped GEMM over gathered rows of tests/ir/test_gather.py (gather with scalar bounds). tests/lower/
test_lower_fetch_add.py compiles it; tests/runtime/test_token_permute_gpu.py runs both on the GPU.

One CTA per expert e. Pass 1 counts the entries of experts below e (compact's count, tile by tile, summed by a
fetch_add into an smem counter): e's segment starts there. Pass 2 compacts the positions of e's entries tile by tile
and claims their places with a fetch_add into counts[e] (a gmem counter no other CTA touches, so the order is fixed:
the same on every run and on the GPU), then scatters the entries and their tokens there. Every CTA reads every id:
O(E * M * k) flag tests, spread over E CTAs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling
from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.numeric import bf16_round
from cake_core.ir.printer import print_program
from cake_core.ir.text import parse_program

_here = Path(__file__).parent
_fetch_add = sibling.load(_here / "test_fetch_add.py")
_gather = sibling.load(_here / "test_gather.py")

# an id tile is (BM, KT): BM tokens, their k <= KT experts (columns past k read as E, no expert); an entry's
# position in the tile grid is m * KT + j, turned into m * k + j (perm) and m (rows)
PERMUTE = """@kernel(target="sm_90a", grid=(E,), threads=128, consts={"BM": 32, "KT": 8})
def permute_by_expert(topk_ids: gmem[i32, (M, k)], counts: gmem[i32, (E,)], offs: gmem[i32, (E + 1,)], perm: gmem[i32, (M * k,)], rows: gmem[i32, (M * k,)]):
    ids_s = smem(i32, (BM, KT))
    hit_s = smem(i32, (BM, KT))
    pos_s = smem(i32, (BM * KT,))
    tok_s = smem(i32, (BM * KT,))
    flat_s = smem(i32, (BM * KT,))
    at_s = smem(i32, (BM * KT,))
    col_s = smem(i32, (1, KT))
    live_s = smem(i32, (1, KT))
    e_s = smem(i32, (1, 1))
    k_s = smem(i32, (1, 1))
    none_s = smem(i32, (1, 1))
    kt_s = smem(i32, (1,))
    pad_s = smem(i32, (1,))
    below_s = smem(i32, (1,))
    v_s = smem(i32, (1,))
    end_s = smem(i32, (1,))
    iota(col_s, base=0, axis=1)
    iota(e_s, base=bid.x)
    iota(k_s, base=k)
    iota(none_s, base=E)
    iota(kt_s, base=KT)
    iota(pad_s, base=KT - k)
    fill(below_s)
    sync()
    ewise(live_s, col_s, k_s, fn="lt")
    sync()
    for t in range(cdiv(M, BM)):
        load(ids_s, topk_ids[tile(t, BM), tile(0, KT)])
        sync()
        select(ids_s, live_s, ids_s, none_s)
        sync()
        ewise(hit_s, ids_s, e_s, fn="lt")
        sync()
        compact(nlo, pos_s, hit_s, base=t * BM * KT, limit=M * KT, max=BM * KT)
        fetch_add(lo, below_s[0], nlo, max=M * k)
        sync()
    scalar(start, below_s[0], max=M * k)
    for t in range(cdiv(M, BM)):
        load(ids_s, topk_ids[tile(t, BM), tile(0, KT)])
        sync()
        select(ids_s, live_s, ids_s, none_s)
        sync()
        ewise(hit_s, ids_s, e_s, fn="eq")
        sync()
        compact(n, pos_s, hit_s, base=t * BM * KT, limit=M * KT, max=BM * KT)
        fetch_add(at, counts[bid.x], n, max=M * k)
        sync()
        ewise(tok_s, pos_s, kt_s, fn="div")
        iota(at_s, base=start + at)
        sync()
        ewise(flat_s, tok_s, pad_s, fn="mul")
        sync()
        ewise(flat_s, pos_s, flat_s, fn="sub")
        sync()
        scatter_add(perm[:], at_s, flat_s, base=0, limit=n)
        scatter_add(rows[:], at_s, tok_s, base=0, limit=n)
        sync()
    iota(v_s, base=start)
    sync()
    store(offs[tile(bid.x, 1)], v_s)
    if bid.x == E - 1:
        fetch_add(total, counts[bid.x], 0, max=M * k)
        iota(end_s, base=start + total)
        sync()
        store(offs[tile(E, 1)], end_s)
"""

# (M, k, E, the expert no token picks, the expert every token picks)
CASES = [(37, 3, 8, 0, 7), (64, 8, 12, 11, 0), (5, 1, 4, 2, None), (33, 2, 5, None, 3)]


def permutation(ids: np.ndarray, E: int) -> dict[str, np.ndarray]:
    """numpy's answer: the entries sorted by expert, stably."""
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int32)
    counts = np.bincount(flat, minlength=E).astype(np.int32)
    return {"counts": counts, "offs": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), "perm": order,
            "rows": order // ids.shape[1]}


def permute_case(rng, M: int, k: int, E: int, empty: int | None, full: int | None):
    ids = _fetch_add.routed(rng, M, k, E, empty=empty, full=full)
    return {"M": M, "k": k, "E": E}, {"topk_ids": ids}


def accumulated(shape: dict) -> dict[str, np.ndarray]:
    """The outputs permute_by_expert adds into (counts, perm, rows), zeroed; offs, which it stores, poisoned."""
    P, E = shape["M"] * shape["k"], shape["E"]
    return {"counts": np.zeros(E, np.int32), "perm": np.zeros(P, np.int32), "rows": np.zeros(P, np.int32),
            "offs": np.full(E + 1, -7, np.int32)}


def run_permute(shape: dict, inputs: dict) -> dict[str, np.ndarray]:
    return interp.run(parse_program(PERMUTE), shape, inputs, accumulated(shape))


def test_the_kernel_verifies_and_is_in_canonical_form():
    assert [d.rule for d in check_text(PERMUTE)] == []
    assert print_program(parse_program(PERMUTE)) == PERMUTE


@pytest.mark.parametrize("M, k, E, empty, full", CASES)
def test_the_permutation_by_expert_matches_numpys_stable_sort(M, k, E, empty, full):
    shape, inputs = permute_case(np.random.default_rng(M * k + E), M, k, E, empty, full)
    got, want = run_permute(shape, inputs), permutation(inputs["topk_ids"], E)
    for name in ("counts", "offs", "perm", "rows"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    if empty is not None:
        assert got["counts"][empty] == 0
    if full is not None:
        assert got["counts"][full] == M


def test_the_permuted_rows_feed_the_grouped_gemm_over_gathered_rows():
    rng = np.random.default_rng(9)
    M, k, E, K, N = 29, 2, 5, 48, 40
    shape, inputs = permute_case(rng, M, k, E, empty=1, full=4)
    got = run_permute(shape, inputs)
    x = bf16_round(rng.normal(size=(M, K)).astype(np.float32))
    w = bf16_round(rng.normal(size=(E, K, N)).astype(np.float32))
    P = M * k
    gshape = {"M": M, "K": K, "N": N, "G": E, "P": P}
    y = interp.run(parse_program(_gather.GROUPED), gshape, {"x": x, "perm": got["rows"], "offs": got["offs"], "w": w},
                   {"y": np.zeros((P, N), np.float32)})["y"]
    # entry r of the permuted order is token perm[r] // k's choice perm[r] % k: x[token] @ w[its expert]
    ids = inputs["topk_ids"].reshape(-1)
    want = np.stack([x[p // k].astype(np.float64) @ w[ids[p]].astype(np.float64) for p in got["perm"]])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
