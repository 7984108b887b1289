"""kmeans_update: per-cluster sums and counts of the points assigned to each centroid.

x[B, N, D] bf16 points and assign[B, N] i32 in [0, K) give sums[B, K, D] f32 with
sums[b, k] = Σ_{n: assign[b, n] = k} x[b, n] and counts[B, K] i32 with counts[b, k] =
#{n: assign[b, n] = k}. The new centroids are sums / counts (left to the caller, so an
empty cluster stays visible). Both outputs are zeroed by the harness before every launch
(``zeroed_outputs``): kernels accumulate into them with atomics across CTAs.
"""
from __future__ import annotations

import numpy as np

from cake_core.ir.numeric import bf16_round
from cake_core.problems.base import Problem, RowOracle, Shape


def _inputs(s: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    B, N, K, D = s["B"], s["N"], s["K"], s["D"]
    x = bf16_round(rng.standard_normal((B, N, D), dtype=np.float32))
    # `_K`: auxiliary (not a kernel argument): K is not recoverable from `assign` alone
    return {"x": x, "assign": rng.integers(0, K, size=(B, N)).astype(np.int32), "_K": np.array(K)}


def _oracle(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    xs, a, K = x["x"].astype(np.float64), x["assign"].astype(np.int64), int(x["_K"])
    B, N, D = xs.shape
    sums = np.zeros((B, K, D), np.float64)
    counts = np.zeros((B, K), np.int64)
    for b in range(B):
        np.add.at(sums[b], a[b], xs[b])
        counts[b] = np.bincount(a[b], minlength=K)
    return {"sums": sums, "counts": counts}


def _oracle_rows(x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Sums and counts of the clusters ``rows`` (numbered b*K + k, each once): sums (R, D), counts (R,)."""
    K = int(x["_K"])
    B, N, D = x["x"].shape
    rows = np.asarray(rows, np.int64)
    sums = np.zeros((rows.size, D), np.float64)
    counts = np.zeros(rows.size, np.int64)
    for b in np.unique(rows // K):
        pos = np.nonzero(rows // K == b)[0]
        slot = np.full(K, -1, np.int64)
        slot[rows[pos] % K] = pos
        s = slot[x["assign"][b].astype(np.int64)]
        m = s >= 0
        np.add.at(sums, s[m], x["x"][b][m].astype(np.float64))
        counts += np.bincount(s[m], minlength=rows.size)
    return {"sums": sums, "counts": counts}


def _rows_of_x(x: dict[str, np.ndarray], flat: np.ndarray) -> np.ndarray:
    B, N, D = x["x"].shape
    point = np.asarray(flat) // D
    return np.unique((point // N) * int(x["_K"]) + x["assign"].reshape(-1)[point].astype(np.int64))


KMEANS_UPDATE = Problem(
    name="kmeans_update",
    description="sums[b, k] = Σ x[b, n] and counts[b, k] = #n over the points with assign[b, n] = k; x[B,N,D] "
                "bf16, assign[B,N] i32 in [0, K); sums f32, counts i32 (both zeroed before the launch)",
    dims=("B", "N", "K", "D"),
    inputs=("x", "assign"),
    outputs=("sums", "counts"),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-4,   # f32 atomic sums of exact bf16 values, any order: ~1e-6; a lost or doubled row is ~1e-1
    flops=lambda s: 1.0 * s["B"] * s["N"] * (s["D"] + 1),
    bytes=lambda s: 2.0 * s["B"] * s["N"] * s["D"] + 4.0 * s["B"] * s["N"] + 4.0 * s["B"] * s["K"] * (s["D"] + 1),
    seed_file="kmeans_update.cake",
    # gather_add: each CTA sums its clusters' rows in smem, no global atomics (bench/results/
    # corpus-vs-peers-2026-11-29e.md); red.global.add.v4.f32 of whole 128-column rows; the smem-privatised
    # sums over D-slices
    best_files=("kmeans_update_gather.cake", "kmeans_update_red4.cake", "kmeans_update_smem.cake"),
    shape_sets=("kmeans_update_small", "kmeans_update_large"),
    zeroed_outputs=("sums", "counts"),
    rows=RowOracle(
        count=lambda s: s["B"] * s["K"],
        oracle=_oracle_rows,
        take=lambda out, rows: {"sums": np.asarray(out["sums"]).reshape(-1, np.shape(out["sums"])[-1])[rows],
                                "counts": np.asarray(out["counts"]).reshape(-1)[rows]},
        rows_of_input0=_rows_of_x,
    ),
)
