"""gather: rows of a gmem tensor by index into an smem tile, the indices read at any offset with a limit (text,
verifier, interpreter, cost model); a grouped GEMM over rows gathered by expert, groups bounded by offsets read
with `scalar` (an empty group, one with every row, ragged tails); tests/lower/test_lower_gather_rows.py lowers
and compiles them and tests/runtime/test_gather_rows_gpu.py runs them on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.interp import InterpFault
from cake_core.ir.numeric import bf16_round
from cake_core.ir.printer import print_program
from cake_core.ir.text import parse_program
from cake_core.model.features import extract

# rows base .. base + R - 1 of perm (up to limit) pick rows of x: y[r] = x[perm[base + r]], zero rows past limit
PICK = """@kernel(target="sm_90a", grid=(cdiv(R, BR),), threads=64, consts={"BR": 8, "BC": 32})
def pick_rows(perm: gmem[i32, (P,)], x: gmem[f32, (N, C)], y: gmem[f32, (R, C)]):
    a_s = smem(f32, (BR, BC))
    for c in range(cdiv(C, BC)):
        gather(a_s, x[:, tile(c, BC)], perm, base=3 + bid.x * BR, limit=3 + R)
        sync()
        store(y[tile(bid.x, BR), tile(c, BC)], a_s)
        sync()
"""

# a grouped GEMM: rows offs[g] .. offs[g+1]-1 of the expert-sorted order take expert g's weights; each row is
# token perm[r] of x: y[r] = x[perm[r]] @ w[g]
GROUPED = """@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(P, BM), G), threads=128, consts={"BM": 16, "BN": 64, "BK": 32})
def grouped_gemm(x: gmem[bf16, (M, K)], perm: gmem[i32, (P,)], offs: gmem[i32, (G + 1,)], w: gmem[bf16, (G, K, N)], y: gmem[f32, (P, N)]):
    a_s = smem(bf16, (BM, BK))
    b_s = smem(bf16, (BK, BN))
    rows = smem(i32, (BM,))
    acc = rmem(f32, (BM, BN))
    scalar(start, offs[bid.z], max=P)
    scalar(end, offs[bid.z + 1], max=P)
    if bid.y * BM < end - start:
        fill(acc, value=0.0)
        for kt in range(cdiv(K, BK)):
            gather(a_s, x[:, tile(kt, BK)], perm, base=start + bid.y * BM, limit=end)
            load(b_s, w[bid.z, tile(kt, BK), tile(bid.x, BN)])
            sync()
            mma(acc, a_s, b_s, atom="fma")
            sync()
        iota(rows, base=start + bid.y * BM)
        sync()
        scatter_add(y[:, tile(bid.x, BN)], rows, acc, base=start + bid.y * BM, limit=end)
"""


def _errors(text: str) -> list[str]:
    return [d.rule for d in check_text(text) if d.severity.name == "ERROR"]


def grouped_case(rng, M=20, K=70, N=90, G=4, sizes=(0, 9, 20, 3)):
    """Inputs of the grouped GEMM: group g takes sizes[g] rows (an empty group, a group of every token)."""
    x = bf16_round(rng.normal(size=(M, K)).astype(np.float32))
    w = bf16_round(rng.normal(size=(G, K, N)).astype(np.float32))
    perm = np.concatenate([rng.permutation(M)[:s] for s in sizes]).astype(np.int32)
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    P = int(offs[-1])
    want = np.zeros((P, N))
    for g in range(G):
        r = slice(offs[g], offs[g + 1])
        want[r] = x[perm[r]].astype(np.float64) @ w[g].astype(np.float64)
    shape = {"M": M, "K": K, "N": N, "G": G, "P": P}
    return shape, {"x": x, "perm": perm, "offs": offs, "w": w}, want


def test_rows_are_picked_by_index_and_padded_past_the_limit():
    assert _errors(PICK) == []
    rng = np.random.default_rng(0)
    P, N, C, R = 15, 11, 45, 10
    perm = rng.integers(0, N, P).astype(np.int32)
    perm[5] = -1                         # an index outside the tensor: a zero row
    x = rng.normal(size=(N, C)).astype(np.float32)
    got = interp.run(parse_program(PICK), {"P": P, "N": N, "C": C, "R": R}, {"perm": perm, "x": x},
                     {"y": np.full((R, C), np.nan, np.float32)})["y"]
    want = np.stack([x[perm[3 + r]] if perm[3 + r] >= 0 else np.zeros(C) for r in range(R)])
    np.testing.assert_array_equal(got, want)


def test_an_index_position_past_the_index_tensor_is_a_fault():
    with pytest.raises(InterpFault) as e:
        interp.run(parse_program(PICK), {"P": 8, "N": 4, "C": 32, "R": 8},
                   {"perm": np.zeros(8, np.int32), "x": np.ones((4, 32), np.float32)},
                   {"y": np.full((8, 32), np.nan, np.float32)})
    assert "gather reads `perm`[8], outside its 8 entries" in str(e.value)


def test_the_grouped_gemm_over_gathered_rows_matches_numpy():
    assert _errors(GROUPED) == []
    for seed, sizes in [(1, (0, 9, 20, 3)), (2, (20, 0, 0, 1)), (3, (17, 17, 5, 0))]:
        shape, inputs, want = grouped_case(np.random.default_rng(seed), sizes=sizes)
        got = interp.run(parse_program(GROUPED), shape, inputs,
                         {"y": np.zeros((shape["P"], shape["N"]), np.float32)})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_the_text_round_trips_and_the_cost_model_counts_the_gathered_rows():
    for text in (PICK, GROUPED):
        p = parse_program(text)
        assert print_program(parse_program(print_program(p))) == print_program(p)
    f = extract(parse_program(PICK), {"P": 40, "N": 100, "C": 64, "R": 32})
    assert f.read_bytes_load == 2 * (8 * 32 * 4 + 4 * 8)        # two column tiles of 8 rows, and their indices


@pytest.mark.parametrize("old, new, words", [
    ("a_s = smem(f32, (BR, BC))", "a_s = smem(f32, (BR, BC), swizzle=128)", "2-D unswizzled single-stage smem tile"),
    ("a_s = smem(f32, (BR, BC))", "a_s = smem(bf16, (BR, BC))", "gather copies one dtype"),
    ("x[:, tile(c, BC)], perm", "x[tile(0, BR), tile(c, BC)], perm", "`:` (the rows gathered from)"),
    ("x[:, tile(c, BC)], perm", "x[:, tile(c, 16)], perm", "columns differ"),
    ("perm: gmem[i32, (P,)]", "perm: gmem[f32, (P,)]", "the indices are a 1-D i32 gmem tensor"),
])
def test_misuse_is_refused_at_the_gather(old, new, words):
    text = PICK.replace(old, new)
    d = [d for d in check_text(text) if d.rule == "gather.operands"]
    assert d and words in d[0].message, [x.rule + ": " + x.message for x in check_text(text)]
    assert d[0].line == 5
