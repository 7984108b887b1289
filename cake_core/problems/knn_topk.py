"""knn_topk: idx[i, :] = the k database rows nearest to query i by L2 distance, nearest first.

q[Q, D] bf16 queries and db[N, D] bf16 database give idx[Q, k] i32 (k ≤ N), sorted by
ascending distance. Equal-distance ties may come in any order: the comparison takes the
exact (fp64) distance of each returned row and requires the j-th to be within ``rtol``
relative of the true j-th smallest distance, with no row returned twice.
"""
from __future__ import annotations

import numpy as np

from cake_core.ir.numeric import bf16_round
from cake_core.problems._distance import check_indices, relative_gap, row_chunks, sq_dists, sq_norms
from cake_core.problems.base import Problem, RowOracle, Shape


def _inputs(s: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    q = bf16_round(rng.standard_normal((s["Q"], s["D"]), dtype=np.float32))
    db = bf16_round(rng.standard_normal((s["N"], s["D"]), dtype=np.float32))
    return {"q": q, "db": db, "_k": np.array(s["k"])}     # `_k`: auxiliary, not a kernel argument


def _nearest(q: np.ndarray, db: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and fp64 distances of the k nearest db rows of each query, nearest first."""
    Q, N = q.shape[0], db.shape[0]
    idx = np.empty((Q, k), np.int64)
    dk = np.empty((Q, k), np.float64)
    db64 = db.astype(np.float64)                      # once, not per chunk
    db_sq = np.einsum("nd,nd->n", db64, db64)
    for lo, hi in row_chunks(Q, N):
        d = sq_dists(q[lo:hi], db64, db_sq)
        part = np.argpartition(d, k - 1, axis=1)[:, :k] if k < N else np.tile(np.arange(N), (hi - lo, 1))
        pd = np.take_along_axis(d, part, axis=1)
        order = np.argsort(pd, axis=1, kind="stable")
        idx[lo:hi] = np.take_along_axis(part, order, axis=1)
        dk[lo:hi] = np.take_along_axis(pd, order, axis=1)
    return idx, dk


def _oracle(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    idx, dk = _nearest(x["q"], x["db"], int(x["_k"]))
    return {"idx": idx, "_dk": dk, "_q": x["q"], "_db": x["db"]}


def _oracle_rows(x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    q = x["q"][rows]
    idx, dk = _nearest(q, x["db"], int(x["_k"]))
    return {"idx": idx, "_dk": dk, "_q": q, "_db": x["db"]}


def _compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> tuple[bool, float, str]:
    q, db, dk = want["_q"], want["_db"], want["_dk"]
    g, msg = check_indices("idx", got["idx"], dk.shape, db.shape[0])
    if g is None:
        return False, float("inf"), msg
    srt = np.sort(g, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1) if g.shape[1] > 1 else np.zeros(g.shape[0], bool)
    if dup.any():
        i = int(np.argmax(dup))
        return False, float("inf"), f"idx: row {i} returns a database row twice: {g[i].tolist()}"
    q64, rows = q.astype(np.float64), db[g].astype(np.float64)                          # (Q, k, D)
    d_got = sq_norms(q)[:, None] + sq_norms(db)[g] - 2.0 * np.einsum("qd,qkd->qk", q64, rows)
    gap = np.abs(relative_gap(d_got, dk, float(np.mean(np.abs(dk)))))
    worst = float(gap.max()) if gap.size else 0.0
    if worst <= rtol:
        return True, worst, ""
    i, j = (int(v) for v in np.unravel_index(np.argmax(gap), gap.shape))
    return False, worst, (f"idx: position {j} of query {i} is row {g[i, j]} at distance {d_got[i, j]:.6g}; the "
                          f"{j}-th nearest is at {dk[i, j]:.6g} (row {int(want['idx'][i, j])})")


KNN_TOPK = Problem(
    name="knn_topk",
    description="idx[i, :] = the k rows of db[N,D] nearest to q[i] (q[Q,D]) by L2, nearest first; bf16 inputs, "
                "i32 output (Q, k), k ≤ N; equal-distance ties in any order",
    dims=("Q", "N", "D", "k"),
    inputs=("q", "db"),
    outputs=("idx",),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-3,   # the j-th returned distance within 1e-3 relative of the true j-th: fp32 ranking passes
    flops=lambda s: 2.0 * s["Q"] * s["N"] * s["D"],
    bytes=lambda s: 2.0 * (s["Q"] + s["N"]) * s["D"] + 4.0 * s["Q"] * s["k"],
    seed_file="knn_topk.cake",
    shape_sets=("knn_topk_small", "knn_topk_large", "knn_topk_aligned"),
    compare_fn=_compare,
    # warp-specialized TMA + wgmma with a running top-k fused on the accumulator and the db row norms
    # computed in-kernel from the landed tile; D <= 128, D % 8 == 0 (TMA's 16-byte strides), k <= 16:
    # the knn_topk_aligned shapes. Fastest first on the H200 (bench/results/corpus-vs-peers-2026-11-29c.md):
    # the database split over a cluster of 3 CTAs (32 clusters of 4 do not fit in one wave), lists merged
    # through distributed shared memory, two consumer roles taking turns (6.74 ms, 11.6x torch mm + topk);
    # the same over 4 CTAs; 4 CTAs with one consumer role; one CTA per query tile
    best_files=("knn_topk_split_pp3.cake", "knn_topk_split_pp.cake", "knn_topk_split.cake", "knn_topk_ws.cake"),
    rows=RowOracle(
        count=lambda s: s["Q"],
        oracle=_oracle_rows,
        take=lambda out, rows: {"idx": np.asarray(out["idx"])[rows]},
        rows_of_input0=lambda x, flat: np.unique(np.asarray(flat) // x["q"].shape[1]),
    ),
)
