"""Shared pieces of the distance problems: exact fp64 squared distances, chunked, and the
validity checks of an index output (finite, whole, in range) before tie-aware comparison."""
from __future__ import annotations

import numpy as np

CHUNK_ELEMS = 1 << 24        # fp64 distance entries per chunk (128 MiB)


def sq_norms(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return np.einsum("...d,...d->...", x64, x64)


def sq_dists(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray | None = None) -> np.ndarray:
    """||a_i - b_j||^2 for a (n, D), b (m, D), in fp64 (``b_sq`` replaces ||b_j||^2 when given)."""
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    bs = sq_norms(b) if b_sq is None else b_sq.astype(np.float64, copy=False)
    return sq_norms(a)[:, None] + bs[None, :] - 2.0 * (a64 @ b64.T)


def row_chunks(n: int, m: int):
    step = max(1, CHUNK_ELEMS // max(m, 1))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def check_indices(name: str, got: np.ndarray, shape: tuple[int, ...], upper: int) -> tuple[np.ndarray | None, str]:
    """The output as int64 if every element is a finite whole number in [0, upper); else a message."""
    g = np.asarray(got, dtype=np.float64)
    if g.shape != shape:
        return None, f"{name}: shape {g.shape}, expected {shape}"
    bad = ~np.isfinite(g)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return None, f"{name}: {int(bad.sum())} non-finite elements (first at {idx}); unwritten or NaN"
    out_of_range = (g != np.round(g)) | (g < 0) | (g >= upper)
    if out_of_range.any():
        idx = tuple(int(i) for i in np.argwhere(out_of_range)[0])
        return None, f"{name}: {int(out_of_range.sum())} elements are not indices in [0, {upper}) " \
                     f"(first at {idx}: {g[idx]:.6g})"
    return g.astype(np.int64), ""


def relative_gap(d_got: np.ndarray, d_best: np.ndarray, scale: float) -> np.ndarray:
    """How much farther the chosen points are than the best ones, relative to the best distance
    (floored at 1e-6 of the typical distance ``scale`` so that a zero distance does not divide)."""
    return (d_got - d_best) / np.maximum(np.abs(d_best), 1e-6 * scale + 1e-30)
