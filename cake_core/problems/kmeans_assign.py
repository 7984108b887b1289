"""kmeans_assign: out[b, n] = argmin_k ||x[b, n] - c[b, k]||^2.

x[B, N, D] bf16 points, c[B, K, D] bf16 centroids and c_sq[B, K] f32 their squared
norms (given, so a kernel ranks by c_sq[k] - 2 x·c[k]); out[B, N] i32. Equal-distance
ties may pick any of the tied centroids: the comparison accepts a centroid whose exact
(fp64) distance is within ``rtol`` relative of the minimum.
"""
from __future__ import annotations

import numpy as np

from cake_core.ir.numeric import bf16_round
from cake_core.problems._distance import check_indices, relative_gap, row_chunks, sq_dists, sq_norms
from cake_core.problems.base import Problem, RowOracle, Shape


def _inputs(s: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    B, N, K, D = s["B"], s["N"], s["K"], s["D"]
    c = bf16_round(rng.standard_normal((B, K, D), dtype=np.float32))
    # most points near a random centroid (the argmin is decided by more than noise); a quarter near the
    # origin, where every c_sq[k] - 2 x·c[k] is positive, so a zero-padded tail centroid would win them
    pick = rng.integers(0, K, size=(B, N))
    near = np.take_along_axis(c, pick[..., None], axis=1) + 0.5 * rng.standard_normal((B, N, D), dtype=np.float32)
    origin = 0.1 * rng.standard_normal((B, N, D), dtype=np.float32)
    x = np.where(rng.random((B, N, 1)) < 0.25, origin, near)
    return {"x": bf16_round(x), "c": c, "c_sq": sq_norms(c).astype(np.float32)}


def _oracle(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    B, N, _ = x["x"].shape
    out = np.empty((B, N), np.int64)
    dmin = np.empty((B, N), np.float64)
    for b in range(B):
        for lo, hi in row_chunks(N, x["c"].shape[1]):
            d = sq_dists(x["x"][b, lo:hi], x["c"][b], x["c_sq"][b])
            out[b, lo:hi] = np.argmin(d, axis=1)
            dmin[b, lo:hi] = d[np.arange(hi - lo), out[b, lo:hi]]
    return {"out": out, "_dmin": dmin, "_x": x["x"], "_c": x["c"], "_c_sq": x["c_sq"]}


def _oracle_rows(x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The oracle for points ``rows`` (numbered b*N + n), laid out as one batch row (1, R)."""
    B, N, D = x["x"].shape
    b_of, n_of = rows // N, rows % N
    out = np.empty(rows.size, np.int64)
    dmin = np.empty(rows.size, np.float64)
    for b in np.unique(b_of):
        sel = np.nonzero(b_of == b)[0]
        for lo, hi in row_chunks(sel.size, x["c"].shape[1]):
            d = sq_dists(x["x"][b, n_of[sel[lo:hi]]], x["c"][b], x["c_sq"][b])
            out[sel[lo:hi]] = np.argmin(d, axis=1)
            dmin[sel[lo:hi]] = d[np.arange(hi - lo), out[sel[lo:hi]]]
    return {"out": out[None], "_dmin": dmin[None], "_x": x["x"][b_of, n_of][None], "_c": x["c"],
            "_c_sq": x["c_sq"], "_bidx": b_of[None]}


def _compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float) -> tuple[bool, float, str]:
    xs, cs, csq, dmin = want["_x"], want["_c"], want["_c_sq"], want["_dmin"]
    g, msg = check_indices("out", got["out"], dmin.shape, cs.shape[1])
    if g is None:
        return False, float("inf"), msg
    # the batch of each point: its row in the full layout, `_bidx` in the row-subset one
    bidx = want["_bidx"] if "_bidx" in want else np.arange(g.shape[0])[:, None]
    chosen_c = cs[bidx, g].astype(np.float64)                                           # (B, N, D)
    chosen_sq = csq[bidx, g].astype(np.float64)
    d_got = sq_norms(xs) + chosen_sq - 2.0 * np.einsum("bnd,bnd->bn", xs.astype(np.float64), chosen_c)
    gap = relative_gap(d_got, dmin, float(np.mean(np.abs(dmin))))
    worst = float(gap.max()) if gap.size else 0.0
    if worst <= rtol:
        return True, max(worst, 0.0), ""
    idx = tuple(int(i) for i in np.unravel_index(np.argmax(gap), gap.shape))
    return False, worst, (f"out: centroid {g[idx]} at {idx} is {worst:.3g} farther (relative) than the nearest, "
                          f"centroid {int(want['out'][idx])} (distance {d_got[idx]:.6g} vs {dmin[idx]:.6g})")


KMEANS_ASSIGN = Problem(
    name="kmeans_assign",
    description="out[b, n] = argmin_k ||x[b, n] - c[b, k]||^2 with x[B,N,D], c[B,K,D] bf16 and c_sq[B,K] f32 "
                "= ||c[b, k]||^2 given; out i32; equal-distance ties may pick any tied centroid",
    dims=("B", "N", "K", "D"),
    inputs=("x", "c", "c_sq"),
    outputs=("out",),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=1e-3,   # chosen centroid's distance within 1e-3 relative of the nearest: fp32 scores pass, a wrong pick not
    flops=lambda s: 2.0 * s["B"] * s["N"] * s["K"] * s["D"],
    bytes=lambda s: 2.0 * s["B"] * (s["N"] + s["K"]) * s["D"] + 4.0 * s["B"] * (s["K"] + s["N"]),
    seed_file="kmeans_assign.cake",
    shape_sets=("kmeans_assign_small", "kmeans_assign_large", "kmeans_assign_unaligned", "kmeans_assign_aligned"),
    compare_fn=_compare,
    # warp-specialized TMA + wgmma with the argmin fused on the accumulator; D <= 128 and TMA's 16-byte
    # strides (D % 8 == 0, K % 4 == 0): the kmeans_assign_aligned shapes. Fastest first on the H200
    # (bench/results/corpus-vs-peers-2026-11-29b.md): two consumer roles taking turns on a persistent
    # grid (1.57x flash-kmeans at B=32 N=65536 K=1024 D=128), persistent, one CTA per row tile; for rows
    # TMA cannot describe (D % 8 != 0), the ping-pong kernel fed by cp.async into the same swizzled tiles,
    # on 256-point tiles so that each centroid byte serves twice the points (0.585 ms at B=4 N=100000
    # K=1000 D=100 against 0.851 ms on 128-point tiles: corpus-vs-peers-2026-11-29d.md)
    best_files=("kmeans_assign_pingpong.cake", "kmeans_assign_persistent.cake", "kmeans_assign_ws.cake",
                "kmeans_assign_unaligned_m256.cake"),
    rows=RowOracle(
        count=lambda s: s["B"] * s["N"],
        oracle=_oracle_rows,
        take=lambda out, rows: {"out": np.asarray(out["out"]).reshape(-1)[rows][None]},
        rows_of_input0=lambda x, flat: np.unique(np.asarray(flat) // x["x"].shape[2]),
    ),
)
