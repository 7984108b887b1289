"""Shared pieces of the distance problems, on numpy or CuPy alike: exact fp64 squared distances,
chunked; the k smallest entries of each row; near ties planted in the inputs; the validity checks of
an index output (finite, whole, in range) before tie-aware comparison."""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems.base import Sampler, array_module, bf16_round

CHUNK_ELEMS = 1 << 24        # fp64 distance entries per chunk on a CPU (128 MiB)
CHUNK_ELEMS_GPU = 1 << 27    # on a GPU (1 GiB): fewer, larger fp64 GEMMs
# near ties: the margin between a planted pair's two distances, relative to the distance. A dot product
# rounded to bf16 (8 bits: a relative step of 2^-8 = 3.9e-3 of a dot about as large as the distance)
# cannot order the pair; fp32 (2^-24) orders it with three orders of magnitude to spare; and it is
# twice the comparisons' rtol (1e-3), so the farther one of a pair is a wrong answer.
TIE_GAP = 2e-3


def sq_norms(x: Any) -> Any:
    xp = array_module(x)
    x64 = x.astype(xp.float64)
    return xp.einsum("...d,...d->...", x64, x64)


def sq_dists(a: Any, b: Any, b_sq: Any | None = None) -> Any:
    """||a_i - b_j||^2 for a (n, D), b (m, D), in fp64 (``b_sq`` replaces ||b_j||^2 when given)."""
    xp = array_module(a, b)
    a64, b64 = a.astype(xp.float64, copy=False), b.astype(xp.float64, copy=False)
    bs = sq_norms(b) if b_sq is None else b_sq.astype(xp.float64, copy=False)
    return sq_norms(a)[:, None] + bs[None, :] - 2.0 * (a64 @ b64.T)


def row_chunks(n: int, m: int, xp: Any = np):
    step = max(1, (CHUNK_ELEMS if xp is np else CHUNK_ELEMS_GPU) // max(m, 1))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def smallest_k(d: Any, k: int) -> tuple[Any, Any]:
    """Column indices (int64) and values of the ``k`` smallest entries of each row of ``d`` (n, N),
    ascending; equal values in any order.

    Without a partial sort (CuPy's argpartition sorts whole rows): split each row into at least ``k``
    groups; the k-th smallest group minimum ``tau`` bounds the k-th smallest entry from above (k groups
    each hold an entry <= tau), so the entries <= tau hold the answer. Only those few candidates per row
    are sorted."""
    xp = array_module(d)
    n, N = d.shape
    if k >= N:
        order = xp.argsort(d, axis=1)
        return order, xp.take_along_axis(d, order, axis=1)
    groups = min(N, max(k, 256))
    width = -(-N // groups)
    padded = xp.full((n, groups * width), xp.inf, dtype=d.dtype)
    padded[:, :N] = d
    gmin = padded.reshape(n, groups, width).min(axis=2)
    tau = xp.sort(gmin, axis=1)[:, k - 1]
    rows, cols = xp.nonzero(d <= tau[:, None])           # row-major: the candidates of each row together
    count = xp.bincount(rows, minlength=n)
    width_c = int(count.max())
    pos = xp.arange(rows.size) - (xp.cumsum(count) - count)[rows]
    cand_v = xp.full((n, width_c), xp.inf, dtype=d.dtype)
    cand_i = xp.zeros((n, width_c), dtype=xp.int64)
    cand_v[rows, pos] = d[rows, cols]
    cand_i[rows, pos] = cols
    order = xp.argsort(cand_v, axis=1)[:, :k]
    return xp.take_along_axis(cand_i, order, axis=1), xp.take_along_axis(cand_v, order, axis=1)


def plant_ties(r: Sampler, anchors: Any, near: Any, frac: float = 0.5) -> Any:
    """Points with near ties: about ``frac`` of the points ``near`` (B, n, D) are replaced by points that
    two of the ``anchors`` (B, m, D) are nearly equally near, the nearer by ``TIE_GAP`` relative.

    With u = b - a, p = (a + b)/2 + off + s u (off orthogonal to u) has d(p, a) - d(p, b) = 2 s |u|^2
    while d(p, a) is about |u|^2 / 4: s = +-TIE_GAP / 8 gives the margin. Returned bf16-rounded (the
    rounding moves the margin by about a tenth of |u|'s scale per coordinate: the oracle, exact on
    the rounded values, decides which one is nearer)."""
    xp = r.xp
    B, n, D = near.shape
    m = anchors.shape[1]
    if m < 2:
        return near
    i = r.integers(0, m, (B, n))
    j = (i + r.integers(1, m, (B, n))) % m
    a = xp.take_along_axis(anchors, i[..., None], axis=1)
    b = xp.take_along_axis(anchors, j[..., None], axis=1)
    u = b - a
    uu = xp.maximum(xp.sum(u * u, axis=-1, keepdims=True), xp.float32(1e-30))
    off = xp.float32(0.05) * r.normal((B, n, D)) * xp.sqrt(uu / D)
    off = off - (xp.sum(off * u, axis=-1, keepdims=True) / uu) * u
    s = ((r.uniform((B, n, 1)) < 0.5).astype(xp.float32) * 2 - 1) * xp.float32(TIE_GAP / 8)
    p = xp.float32(0.5) * (a + b) + off + s * u
    pick = r.uniform((B, n, 1)) < frac
    return bf16_round(xp.where(pick, p, near).astype(xp.float32))


def check_indices(name: str, got: Any, shape: tuple[int, ...], upper: int) -> tuple[Any | None, str]:
    """The output as int64 if every element is a finite whole number in [0, upper); else a message."""
    xp = array_module(got)
    g = xp.asarray(got, dtype=xp.float64)
    if g.shape != shape:
        return None, f"{name}: shape {g.shape}, expected {shape}"
    bad = ~xp.isfinite(g)
    n_bad = int(bad.sum())
    if n_bad:
        idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(bad)), g.shape))
        return None, f"{name}: {n_bad} non-finite elements (first at {idx}); unwritten or NaN"
    out_of_range = (g != xp.round(g)) | (g < 0) | (g >= upper)
    n_out = int(out_of_range.sum())
    if n_out:
        idx = tuple(int(i) for i in np.unravel_index(int(xp.argmax(out_of_range)), g.shape))
        return None, f"{name}: {n_out} elements are not indices in [0, {upper}) (first at {idx}: {float(g[idx]):.6g})"
    return g.astype(xp.int64), ""


def relative_gap(d_got: Any, d_best: Any, scale: float) -> Any:
    """How much farther the chosen points are than the best ones, relative to the best distance
    (floored at 1e-6 of the typical distance ``scale`` so that a zero distance does not divide)."""
    xp = array_module(d_got, d_best)
    return (d_got - d_best) / xp.maximum(xp.abs(d_best), 1e-6 * scale + 1e-30)
