"""kmeans_update: per-cluster sums and counts of the points assigned to each centroid.

x[B, N, D] bf16 points and assign[B, N] i32 in [0, K) give sums[B, K, D] f32 with
sums[b, k] = Σ_{n: assign[b, n] = k} x[b, n] and counts[B, K] i32 with counts[b, k] =
#{n: assign[b, n] = k}. The new centroids are sums / counts (left to the caller, so an
empty cluster stays visible). Both outputs are zeroed by the harness before every launch
(``zeroed_outputs``): kernels accumulate into them with atomics across CTAs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cake_core.problems.base import (BenchTarget, Problem, RowOracle, Shape, array_module, as_sampler, bf16_round,
                                     data, index, output, to_host)
from cake_core.problems.kmeans_update.peers import PEERS


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    B, N, K, D = s["B"], s["N"], s["K"], s["D"]
    x = bf16_round(r.normal((B, N, D)))
    # `_K`: auxiliary (not a kernel argument): K is not recoverable from `assign` alone
    return {"x": x, "assign": r.integers(0, K, (B, N)).astype(r.xp.int32), "_K": np.array(K)}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    xp = array_module(x["x"])
    xs, a, K = x["x"].astype(xp.float64), x["assign"].astype(xp.int64), int(x["_K"])
    B, N, D = xs.shape
    sums = xp.zeros((B, K, D), xp.float64)
    counts = xp.zeros((B, K), xp.int64)
    for b in range(B):
        xp.add.at(sums[b], a[b], xs[b])
        counts[b] = xp.bincount(a[b], minlength=K)
    return {"sums": sums, "counts": counts}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Sums and counts of the clusters ``rows`` (numbered b*K + k, each once): sums (R, D), counts (R,)."""
    xp = array_module(x["x"])
    K = int(x["_K"])
    B, N, D = x["x"].shape
    rows = np.asarray(rows, np.int64)
    sums = xp.zeros((rows.size, D), xp.float64)
    counts = xp.zeros(rows.size, xp.int64)
    for b in np.unique(rows // K):
        pos = np.nonzero(rows // K == b)[0]
        slot = xp.full(K, -1, xp.int64)
        slot[xp.asarray(rows[pos] % K)] = xp.asarray(pos)
        s = slot[x["assign"][int(b)].astype(xp.int64)]
        m = s >= 0
        xp.add.at(sums, s[m], x["x"][int(b)][m].astype(xp.float64))
        counts += xp.bincount(s[m], minlength=rows.size)
    return {"sums": sums, "counts": counts}


def _rows_of_x(x: dict[str, Any], flat: np.ndarray) -> np.ndarray:
    B, N, D = x["x"].shape
    point = np.asarray(flat) // D
    assign = to_host(x["assign"].reshape(-1)[array_module(x["assign"]).asarray(point)]).astype(np.int64)
    return np.unique((point // N) * int(x["_K"]) + assign)


def _take(out: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    xp = array_module(out["sums"])
    r = xp.asarray(rows)
    return {"sums": out["sums"].reshape(-1, out["sums"].shape[-1])[r], "counts": out["counts"].reshape(-1)[r]}


PROBLEM = Problem(
    name="kmeans_update",
    description="sums[b, k] = Σ x[b, n] and counts[b, k] = #n over the points with assign[b, n] = k; x[B,N,D] "
                "bf16, assign[B,N] i32 in [0, K); sums accumulated in fp32 (or wider), f32, counts i32 (both zeroed "
                "before the launch)",
    dims=("B", "N", "K", "D"),
    tensors=(data("x", "bf16"), index("assign", "i32"), output("sums", "f32"), output("counts", "i32")),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-4,   # f32 atomic sums of exact bf16 values, any order: ~1e-6; a lost or doubled row is ~1e-1
    flops=lambda s: 1.0 * s["B"] * s["N"] * (s["D"] + 1),
    bytes=lambda s: 2.0 * s["B"] * s["N"] * s["D"] + 4.0 * s["B"] * s["N"] + 4.0 * s["B"] * s["K"] * (s["D"] + 1),
    seed_file="kmeans_update.cake",
    # gather_add: each CTA sums its clusters' rows in smem, no global atomics; red.global.add.v4.f32 of
    # whole 128-column rows; the smem-privatised sums over D-slices
    best_files=("kmeans_update_gather.cake", "kmeans_update_red4.cake", "kmeans_update_smem.cake"),
    shape_sets=("kmeans_update_small", "kmeans_update_large"),
    zeroed_outputs=("sums", "counts"),
    rows=RowOracle(
        count=lambda s: s["B"] * s["K"],
        oracle=_oracle_rows,
        take=_take,
        rows_of_perturbed=_rows_of_x,
    ),
    peers=PEERS,
    bench=BenchTarget("kmeans_update_large", ("flash-kmeans-sorted",), 1.5, ("B=32,N=65536,K=1024,D=128",)),
    root=Path(__file__).resolve().parent,
)
