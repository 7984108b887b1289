"""kmeans_assign: out[b, n] = argmin_k ||x[b, n] - c[b, k]||^2.

x[B, N, D] bf16 points, c[B, K, D] bf16 centroids and c_sq[B, K] f32 their squared
norms (given, so a kernel ranks by c_sq[k] - 2 x·c[k]); out[B, N] i32. Equal-distance
ties may pick any of the tied centroids: the comparison accepts a centroid whose exact
(fp64) distance is within ``rtol`` relative of the minimum.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cake_core.problems.base import (BenchTarget, Problem, RowOracle, Shape, array_module, as_sampler, bf16_round,
                                     data, output)
from cake_core.problems.common.distance import (check_indices, plant_ties, relative_gap, row_chunks, sq_dists,
                                                sq_norms)
from cake_core.problems.kmeans_assign.peers import PEERS


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    xp = r.xp
    B, N, K, D = s["B"], s["N"], s["K"], s["D"]
    c = bf16_round(r.normal((B, K, D)))
    # most points near a random centroid (the argmin is decided by more than noise); a quarter near the
    # origin, where every c_sq[k] - 2 x·c[k] is positive, so a zero-padded tail centroid would win them;
    # half of the others halfway between two centroids, one nearer by TIE_GAP (fp32 scoring separates
    # them, bf16 scoring does not)
    pick = r.integers(0, K, (B, N))
    near = xp.take_along_axis(c, pick[..., None], axis=1) + xp.float32(0.5) * r.normal((B, N, D))
    origin = xp.float32(0.1) * r.normal((B, N, D))
    x = xp.where(r.uniform((B, N, 1)) < 0.25, origin, plant_ties(r, c, near))
    return {"x": bf16_round(x), "c": c, "c_sq": sq_norms(c).astype(xp.float32)}


def _nearest(x: Any, c: Any, c_sq: Any) -> tuple[Any, Any]:
    """argmin and fp64 distance to the nearest of the centroids c (K, D) of each point of x (n, D)."""
    xp = array_module(x, c)
    out = xp.empty(x.shape[0], xp.int64)
    dmin = xp.empty(x.shape[0], xp.float64)
    for lo, hi in row_chunks(x.shape[0], c.shape[0], xp):
        d = sq_dists(x[lo:hi], c, c_sq)
        out[lo:hi] = xp.argmin(d, axis=1)
        dmin[lo:hi] = d[xp.arange(hi - lo), out[lo:hi]]
    return out, dmin


def _context(x: dict[str, Any], rows: np.ndarray | None) -> dict[str, Any]:
    if rows is None:
        return {"_x": x["x"], "_c": x["c"], "_c_sq": x["c_sq"]}
    B, N, D = x["x"].shape
    xp = array_module(x["x"])
    b_of, n_of = xp.asarray(rows // N), xp.asarray(rows % N)
    return {"_x": x["x"][b_of, n_of][None], "_c": x["c"], "_c_sq": x["c_sq"], "_bidx": b_of[None]}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    xp = array_module(x["x"])
    B, N, _ = x["x"].shape
    out = xp.empty((B, N), xp.int64)
    dmin = xp.empty((B, N), xp.float64)
    for b in range(B):
        out[b], dmin[b] = _nearest(x["x"][b], x["c"][b], x["c_sq"][b])
    return {"out": out, "_dmin": dmin, **_context(x, None)}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The oracle for points ``rows`` (numbered b*N + n), laid out as one batch row (1, R)."""
    xp = array_module(x["x"])
    B, N, D = x["x"].shape
    b_of, n_of = rows // N, rows % N
    out = xp.empty(rows.size, xp.int64)
    dmin = xp.empty(rows.size, xp.float64)
    for b in np.unique(b_of):
        sel = np.nonzero(b_of == b)[0]
        o, d = _nearest(x["x"][int(b)][xp.asarray(n_of[sel])], x["c"][int(b)], x["c_sq"][int(b)])
        out[xp.asarray(sel)], dmin[xp.asarray(sel)] = o, d
    return {"out": out[None], "_dmin": dmin[None], **_context(x, rows)}


def _compare(got: dict[str, Any], want: dict[str, Any], rtol: float) -> tuple[bool, float, str]:
    xs, cs, csq, dmin = want["_x"], want["_c"], want["_c_sq"], want["_dmin"]
    xp = array_module(got["out"], dmin)
    g, msg = check_indices("out", got["out"], dmin.shape, cs.shape[1])
    if g is None:
        return False, float("inf"), msg
    # the batch of each point: its row in the full layout, `_bidx` in the row-subset one
    bidx = want["_bidx"] if "_bidx" in want else xp.arange(g.shape[0])[:, None]
    chosen_c = cs[bidx, g].astype(xp.float64)                                           # (B, N, D)
    chosen_sq = csq[bidx, g].astype(xp.float64)
    d_got = sq_norms(xs) + chosen_sq - 2.0 * xp.einsum("bnd,bnd->bn", xs.astype(xp.float64), chosen_c)
    gap = relative_gap(d_got, dmin, float(xp.mean(xp.abs(dmin))) if dmin.size else 1.0)
    worst = float(gap.max()) if gap.size else 0.0
    if worst <= rtol:
        return True, max(worst, 0.0), ""
    idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(gap)), gap.shape))
    return False, worst, (f"out: centroid {int(g[idx])} at {idx} is {worst:.3g} farther (relative) than the nearest, "
                          f"centroid {int(want['out'][idx])} (distance {float(d_got[idx]):.6g} vs "
                          f"{float(dmin[idx]):.6g})")


def _take(out: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    xp = array_module(out["out"])
    return {"out": out["out"].reshape(-1)[xp.asarray(rows)][None]}


PROBLEM = Problem(
    name="kmeans_assign",
    description="out[b, n] = argmin_k ||x[b, n] - c[b, k]||^2 with x[B,N,D], c[B,K,D] bf16 and c_sq[B,K] f32 "
                "= ||c[b, k]||^2 given; out i32; dot products accumulated in fp32 (or wider) and scored "
                "unrounded: the inputs plant centroid pairs 2e-3 apart (relative) that a bf16 score cannot "
                "order; equal-distance ties may pick any tied centroid",
    dims=("B", "N", "K", "D"),
    tensors=(data("x", "bf16"), data("c", "bf16"), data("c_sq", "f32"), output("out", "i32")),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-3,   # chosen centroid's distance within 1e-3 relative of the nearest: fp32 scores pass, a wrong pick not
    flops=lambda s: 2.0 * s["B"] * s["N"] * s["K"] * s["D"],
    bytes=lambda s: 2.0 * s["B"] * (s["N"] + s["K"]) * s["D"] + 4.0 * s["B"] * (s["K"] + s["N"]),
    seed_file="kmeans_assign.cake",
    shape_sets=("kmeans_assign_small", "kmeans_assign_large", "kmeans_assign_unaligned", "kmeans_assign_aligned",
                "kmeans_portfolio"),
    compare_fn=_compare,
    # warp-specialized TMA + wgmma with the argmin fused on the accumulator; D <= 128 and TMA's 16-byte
    # strides (D % 8 == 0, K % 4 == 0): the kmeans_assign_aligned shapes. Fastest first on the H200
    # (bench/results/corpus-vs-peers-2026-11-29b.md): two consumer roles taking turns on a persistent
    # grid (1.57x flash-kmeans at B=32 N=65536 K=1024 D=128), persistent, one CTA per row tile; for rows
    # TMA cannot describe (D % 8 != 0), the ping-pong kernel fed by cp.async into the same swizzled tiles,
    # on 256-point tiles so that each centroid byte serves twice the points (0.585 ms at B=4 N=100000
    # K=1000 D=100 against 0.851 ms on 128-point tiles: corpus-vs-peers-2026-11-29d.md); for 128 < D <= 512
    # (77 of the 123 kmeans_portfolio rows), the x tile resident in 8 slots of 64 columns and the centroids
    # streamed in 64-column chunks (checked on the interpreter and compiled; not yet timed on a GPU)
    best_files=("kmeans_assign_pingpong.cake", "kmeans_assign_persistent.cake", "kmeans_assign_ws.cake",
                "kmeans_assign_unaligned_m256.cake", "kmeans_assign_ws_deep.cake"),
    rows=RowOracle(
        count=lambda s: s["B"] * s["N"],
        oracle=_oracle_rows,
        take=_take,
        rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["x"].shape[2]),
    ),
    version=2,    # 2: near ties planted in the points
    context=_context,
    peers=PEERS,
    subset_rows=4096,
    bench=BenchTarget("kmeans_assign_large", ("flash-kmeans",), 1.3, ("B=32,N=65536,K=1024,D=128",), geomean=1.1),
    root=Path(__file__).resolve().parent,
)
