"""knn_topk: idx[i, :] = the k database rows nearest to query i by L2 distance, nearest first.

q[Q, D] bf16 queries and db[N, D] bf16 database give idx[Q, k] i32 (k ≤ N), sorted by
ascending distance. Equal-distance ties may come in any order: the comparison takes the
exact (fp64) distance of each returned row and requires the j-th to be within ``rtol``
relative of the true j-th smallest distance, with no row returned twice.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cake_core.problems.base import (BenchTarget, Problem, RowOracle, Shape, array_module, as_sampler, bf16_round,
                                     data, output)
from cake_core.problems.common.distance import (check_indices, plant_ties, relative_gap, row_chunks, smallest_k,
                                                sq_dists, sq_norms)
from cake_core.problems.knn_topk.peers import PEERS


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    db = bf16_round(r.normal((s["N"], s["D"])))
    # half of the queries halfway between two database rows, one nearer by TIE_GAP: fp32 ranking orders
    # them, a bf16-rounded score does not
    q = plant_ties(r, db[None], r.normal((1, s["Q"], s["D"])))[0]
    return {"q": bf16_round(q), "db": db, "_k": np.array(s["k"])}     # `_k`: auxiliary, not a kernel argument


def _nearest(q: Any, db: Any, k: int) -> tuple[Any, Any]:
    """Indices and fp64 distances of the k nearest db rows of each query, nearest first."""
    xp = array_module(q, db)
    Q, N = q.shape[0], db.shape[0]
    idx = xp.empty((Q, k), xp.int64)
    dk = xp.empty((Q, k), xp.float64)
    db64 = db.astype(xp.float64)                      # once, not per chunk
    db_sq = xp.einsum("nd,nd->n", db64, db64)
    for lo, hi in row_chunks(Q, N, xp):
        idx[lo:hi], dk[lo:hi] = smallest_k(sq_dists(q[lo:hi], db64, db_sq), k)
    return idx, dk


def _context(x: dict[str, Any], rows: np.ndarray | None) -> dict[str, Any]:
    q = x["q"] if rows is None else x["q"][array_module(x["q"]).asarray(rows)]
    return {"_q": q, "_db": x["db"]}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    idx, dk = _nearest(x["q"], x["db"], int(x["_k"]))
    return {"idx": idx, "_dk": dk, **_context(x, None)}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    ctx = _context(x, rows)
    idx, dk = _nearest(ctx["_q"], x["db"], int(x["_k"]))
    return {"idx": idx, "_dk": dk, **ctx}


def _compare(got: dict[str, Any], want: dict[str, Any], rtol: float) -> tuple[bool, float, str]:
    q, db, dk = want["_q"], want["_db"], want["_dk"]
    xp = array_module(got["idx"], dk)
    g, msg = check_indices("idx", got["idx"], dk.shape, db.shape[0])
    if g is None:
        return False, float("inf"), msg
    if g.shape[1] > 1:
        srt = xp.sort(g, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
        if bool(dup.any()):
            i = int(xp.argmax(dup))
            return False, float("inf"), f"idx: row {i} returns a database row twice: {g[i].tolist()}"
    q64, rows = q.astype(xp.float64), db[g].astype(xp.float64)                          # (Q, k, D)
    d_got = sq_norms(q)[:, None] + sq_norms(db)[g] - 2.0 * xp.einsum("qd,qkd->qk", q64, rows)
    gap = xp.abs(relative_gap(d_got, dk, float(xp.mean(xp.abs(dk))) if dk.size else 1.0))
    worst = float(gap.max()) if gap.size else 0.0
    if worst <= rtol:
        return True, worst, ""
    i, j = (int(v) for v in np.unravel_index(int(xp.argmax(gap)), gap.shape))
    return False, worst, (f"idx: position {j} of query {i} is row {int(g[i, j])} at distance {float(d_got[i, j]):.6g}; "
                          f"the {j}-th nearest is at {float(dk[i, j]):.6g} (row {int(want['idx'][i, j])})")


PROBLEM = Problem(
    name="knn_topk",
    description="idx[i, :] = the k rows of db[N,D] nearest to q[i] (q[Q,D]) by L2, nearest first; bf16 inputs, "
                "i32 output (Q, k), k ≤ N; dot products accumulated in fp32 (or wider) and ranked unrounded: "
                "the inputs plant database pairs 2e-3 apart (relative) that a bf16 score cannot order; "
                "equal-distance ties in any order",
    dims=("Q", "N", "D", "k"),
    tensors=(data("q", "bf16"), data("db", "bf16"), output("idx", "i32")),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-3,   # the j-th returned distance within 1e-3 relative of the true j-th: fp32 ranking passes
    flops=lambda s: 2.0 * s["Q"] * s["N"] * s["D"],
    bytes=lambda s: 2.0 * (s["Q"] + s["N"]) * s["D"] + 4.0 * s["Q"] * s["k"],
    seed_file="knn_topk.cake",
    shape_sets=("knn_topk_small", "knn_topk_large", "knn_topk_aligned", "knn_topk_medium", "knn_build_portfolio"),
    compare_fn=_compare,
    # warp-specialized TMA + wgmma with a running top-k fused on the accumulator and the db row norms
    # computed in-kernel from the landed tile; D <= 128, D % 8 == 0 (TMA's 16-byte strides), k <= 16:
    # the knn_topk_aligned shapes. Fastest first on the H200: the database split over a cluster of 3 CTAs
    # (32 clusters of 4 do not fit in one wave), lists merged through distributed shared memory, two consumer
    # roles taking turns; the same over 4 CTAs; 4 CTAs with one consumer role; one CTA per query tile. Past those
    # (k up to 64 or 128, any D), 8 CTAs a cluster fed by cp.async, each row's list in shared memory.
    best_files=("knn_topk_split_pp3.cake", "knn_topk_split_pp.cake", "knn_topk_split.cake", "knn_topk_ws.cake",
                "knn_topk_split_k64.cake", "knn_topk_split_k128.cake"),
    rows=RowOracle(
        count=lambda s: s["Q"],
        oracle=_oracle_rows,
        take=lambda out, rows: {"idx": out["idx"][array_module(out["idx"]).asarray(rows)]},
        rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["q"].shape[1]),
    ),
    version=2,    # 2: near ties planted in the queries
    shape_rule=lambda s: "" if s["k"] <= s["N"] else f"k = {s['k']} > N = {s['N']}: fewer database rows than k",
    context=_context,
    peers=PEERS,
    bench=BenchTarget("knn_topk_large", ("torch",), 10.0, ("Q=4096,N=1048576,D=128,k=10",)),
    root=Path(__file__).resolve().parent,
)
