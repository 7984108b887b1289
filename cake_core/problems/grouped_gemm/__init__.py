"""grouped_gemm: a grouped GEMM over rows gathered by index, the first projection of a routed mixture-of-experts
layer after its tokens are permuted by expert.

Tokens x (T, K) and expert weights w (E, K, N) are bf16. perm (P,) i32, P = T * topk, lists token ids grouped by
expert; offsets (E + 1,) i32 bounds the groups: expert e's rows are r = offsets[e] .. offsets[e+1] - 1 (offsets[0]
= 0, offsets[E] = P, nondecreasing; an expert may have none). The output y (P, N) is f32:

    y[r] = x[perm[r]] @ w[e(r)],   e(r) = the expert whose range holds r

Products are accumulated in fp32 (or wider).

Inputs: unit-variance tokens, weights at the 1/sqrt(K) scale of a trained layer. The routing is drawn as MoE
routing produces it: each token takes topk distinct experts, so P = T * topk and every token appears topk times.
Every draw plants a hot expert that every token takes (T rows, more than one row tile once T passes the tile) and a
cold expert that none takes (an empty group); each token's other topk - 1 experts are drawn uniformly, without
replacement, from the remaining E - 2. Within a group the tokens come in a random order (as a permutation built
with atomics leaves them): a kernel may not assume them sorted.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems.base import (BenchTarget, Problem, RowOracle, Shape, array_module, as_sampler, bf16_round,
                                     data, index, output, to_host)

from .peers import PEERS


def routing(r: Any, T: int, E: int, topk: int) -> Any:
    """ids (T, topk): each token's experts, distinct; a hot expert first in every row, a cold one in none, the other
    topk - 1 drawn uniformly without replacement from the remaining E - 2 experts (needs topk < E)."""
    xp = r.xp
    hot = int(r.integers(0, E, (1,))[0])
    cold = (hot + 1 + int(r.integers(0, E - 1, (1,))[0])) % E
    others = xp.asarray([e for e in range(E) if e not in (hot, cold)], dtype=xp.int64)
    picked = others[xp.argsort(r.uniform((T, E - 2)), axis=1)[:, :topk - 1]]
    return xp.concatenate([xp.full((T, 1), hot, dtype=xp.int64), picked], axis=1)


def permute(ids: Any, E: int, order: Any) -> tuple[Any, Any]:
    """(perm, offsets) of a routing ``ids`` (T, topk): the token ids sorted by expert (P,) i32, those of one expert in
    the order of their ``order`` values (T * topk distinct values in [0, 1), one per entry of ``ids``), and each
    expert's start in them, P last (E + 1,) i32."""
    xp = array_module(ids)
    flat = ids.reshape(-1)
    perm = xp.argsort(flat + order) // ids.shape[1]
    counts = xp.bincount(flat, minlength=E)
    offsets = xp.concatenate([xp.zeros(1, dtype=counts.dtype), xp.cumsum(counts)])
    return perm.astype(xp.int32), offsets.astype(xp.int32)


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    T, E, K, N, topk = s["T"], s["E"], s["K"], s["N"], s["topk"]
    perm, offsets = permute(routing(r, T, E, topk), E, r.uniform((T * topk,)))
    return {"x": bf16_round(r.normal((T, K))), "w": bf16_round(r.normal((E, K, N)) * K ** -0.5),
            "perm": perm, "offsets": offsets}


def grouped(x: Any, w: Any, perm: Any, offsets: Any, rows: np.ndarray) -> Any:
    """y[rows] (len(rows), N) in fp64: each row's token times its expert's weights, one expert at a time."""
    xp = array_module(x, w)
    off = to_host(offsets).astype(np.int64)
    expert = np.searchsorted(off, rows, side="right") - 1    # the last e with offsets[e] <= r: empty groups skipped
    y = xp.zeros((rows.size, w.shape[2]), xp.float64)
    for e in np.unique(expert):
        at = np.flatnonzero(expert == e)
        tokens = perm[xp.asarray(rows[at])]
        y[xp.asarray(at)] = x[tokens].astype(xp.float64) @ w[int(e)].astype(xp.float64)
    return y


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"y": grouped(x["x"], x["w"], x["perm"], x["offsets"], np.asarray(rows, np.int64))}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return _oracle_rows(x, np.arange(x["perm"].shape[0]))


def _rows_of_perturbed(x: dict[str, Any], flat: np.ndarray) -> np.ndarray:
    """The rows of y that the tokens holding x's elements ``flat`` feed (topk rows each)."""
    tokens = np.unique(np.asarray(flat) // x["x"].shape[1])
    return np.flatnonzero(np.isin(to_host(x["perm"]), tokens))


def routed_experts(s: Shape) -> float:
    """The expected number of experts with rows: the hot one, and T tokens taking topk - 1 of the other E - 2
    each, uniformly."""
    T, E, k = s["T"], s["E"], s["topk"]
    rest = E - 2
    return 1.0 + (rest * (1.0 - (1.0 - (k - 1) / rest) ** T) if rest else 0.0)


def weight_bytes(s: Shape) -> float:
    """The routed experts' weights, each read once: what bounds the product at decode sizes."""
    return routed_experts(s) * 2.0 * s["K"] * s["N"]


def _bytes(s: Shape) -> float:
    """The tokens and the routed experts' weights read once, perm and offsets read, y written."""
    P = s["T"] * s["topk"]
    return 2.0 * s["T"] * s["K"] + weight_bytes(s) + 4.0 * (P + s["E"] + 1) + 4.0 * P * s["N"]


PROBLEM = Problem(
    name="grouped_gemm",
    description="grouped GEMM over gathered rows: y[r] (f32) = x[perm[r]] @ w[e] for r in offsets[e] .. "
                "offsets[e+1]-1, with tokens x (T, K) and expert weights w (E, K, N) bf16, perm (T*topk,) i32 the "
                "token ids grouped by expert (each token in topk distinct experts), offsets (E+1,) i32 the groups' "
                "bounds (0 first, T*topk last; empty groups allowed); fp32 accumulation",
    dims=("T", "topk", "E", "K", "N"),
    tensors=(data("x", "bf16"), data("w", "bf16"), index("perm", "i32"), index("offsets", "i32"),
             output("y", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # a product of two bf16 values is exact in fp32, and fp32 sums of K = 2048 of them (|y| ~ 1, the sum of the
    # terms' magnitudes ~ 0.64 sqrt(K)) stay within 1e-3 of max|y| even at the worst-case bound K 2^-24; a row
    # with another expert's weights or another token moves by O(1) of max|y| (~0.2 and more)
    rtol=2e-3,
    flops=lambda s: 2.0 * s["T"] * s["topk"] * s["K"] * s["N"],
    bytes=_bytes,
    seed_file="grouped_gemm.cake",
    shape_sets=("grouped_gemm_small", "grouped_gemm_decode"),
    # a kernel whose row tiles start at a group's start (not at a multiple of the tile) writes a ragged group end
    # with scatter_add's limit, adding into a zeroed y; a program that only stores gets y poisoned
    zeroed_outputs=("y",),
    rows=RowOracle(count=lambda s: s["T"] * s["topk"], oracle=_oracle_rows, rows_of_perturbed=_rows_of_perturbed),
    shape_rule=lambda s: "" if s["topk"] < s["E"] else (f"topk = {s['topk']} >= E = {s['E']}: the draws need a cold "
                                                         "expert beside each token's topk"),
    peers=PEERS,
    bench=BenchTarget("grouped_gemm_decode", ("torch.grouped_mm",), 1.0),
)
