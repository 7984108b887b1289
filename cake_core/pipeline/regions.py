"""A portfolio split into regions of similar shapes, each searched on a few representatives of its own.

A portfolio of hundreds of shapes cannot be searched shape by shape: every candidate would be timed on every
row. Shapes that differ by a small factor in every dimension want the same kernel, so the rows are grouped by
their dimensions on a log scale (seeded k-means with k-means++ starts over log2 of each dimension that varies,
each scaled to unit spread), and each region is searched on ``per_region`` representatives: its medoid first,
then the member farthest from those chosen (the region's extremes), so a region's winner has seen its corners.
Held-out rows never steer a search: they are left out of the grouping and only attached, for the report, to
the region whose centre is nearest.

Pure: numpy and ``problems.base`` only; the same shape set, count and seed give the same regions everywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from cake_core.problems.base import SEARCHED, Shape, ShapeSet, shape_key

KMEANS_ITERATIONS = 100


@dataclass(frozen=True)
class Region:
    """One region: its searched representatives, every member (representatives included) and the portfolio's
    held-out rows nearest to it (never searched, reported apart)."""

    index: int
    members: tuple[Shape, ...]
    representatives: tuple[Shape, ...]
    held_out: tuple[Shape, ...]

    @property
    def name(self) -> str:
        return f"region-{self.index:02d}"

    def csv(self, dims: tuple[str, ...], sweep: tuple[Shape, ...] = ()) -> str:
        """The region as a shape set: its representatives (headline), its held-out rows (held_out) and the rows
        ``sweep`` its finalists are measured on after the search (sweep: never searched)."""
        lines = [",".join([*dims, "role"])]
        lines += [",".join([*(str(s[d]) for d in dims), "headline"]) for s in self.representatives]
        lines += [",".join([*(str(s[d]) for d in dims), "held_out"]) for s in self.held_out]
        lines += [",".join([*(str(s[d]) for d in dims), "sweep"]) for s in sweep]
        return "\n".join(lines) + "\n"


def default_count(n_shapes: int) -> int:
    """Regions for ``n_shapes`` searched rows when none is asked: ceil(sqrt(n / 2)) (a 105-row portfolio: 8)."""
    return max(1, math.ceil(math.sqrt(n_shapes / 2)))


def _scaler(shapes: list[Shape], dims: tuple[str, ...]) -> Callable[[list[Shape]], np.ndarray]:
    """Features of shapes, fitted on ``shapes``: log2 of each dimension that varies over them, centred and scaled
    to unit spread (one zero column when none varies)."""
    def log2(rows: list[Shape]) -> np.ndarray:
        return np.log2(np.array([[max(s[d], 1) for d in dims] for s in rows], dtype=np.float64))

    x = log2(shapes)
    spread = x.std(axis=0)
    keep = spread > 0
    centre = x[:, keep].mean(axis=0)
    if not keep.any():
        return lambda rows: np.zeros((len(rows), 1))
    return lambda rows: (log2(rows)[:, keep] - centre) / spread[keep]


def _kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Labels of seeded k-means with k-means++ starts (Lloyd's iterations until nothing moves)."""
    rng = np.random.default_rng(seed)
    centres = [x[int(rng.integers(len(x)))]]
    for _ in range(1, k):
        d2 = np.min([((x - c) ** 2).sum(axis=1) for c in centres], axis=0)
        if d2.sum() == 0:
            break
        centres.append(x[int(rng.choice(len(x), p=d2 / d2.sum()))])
    c = np.array(centres)
    labels = np.full(len(x), -1)
    for _ in range(KMEANS_ITERATIONS):
        new = ((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
        if (new == labels).all():
            break
        labels = new
        c = np.array([x[labels == j].mean(axis=0) if (labels == j).any() else c[j] for j in range(len(c))])
    return labels


def _representatives(x: np.ndarray, members: list[int], per_region: int) -> list[int]:
    """The medoid of ``members``, then farthest-point picks, ``per_region`` at most."""
    pts = x[members]
    dist = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
    chosen = [int(dist.sum(axis=1).argmin())]
    while len(chosen) < min(per_region, len(members)):
        far = dist[:, chosen].min(axis=1)
        far[chosen] = -1.0
        chosen.append(int(far.argmax()))
    return [members[i] for i in chosen]


def plan_regions(shape_set: ShapeSet, dims: tuple[str, ...], count: int | None = None, per_region: int = 3,
                 seed: int = 0) -> list[Region]:
    """``shape_set`` split into ``count`` regions (``default_count`` when None; fewer when the rows allow fewer),
    each with ``per_region`` representatives; regions ordered by their first member in the set."""
    if per_region < 1:
        raise ValueError(f"per_region must be at least 1, got {per_region}")
    searched = [s for s, r in zip(shape_set.shapes, shape_set.roles) if r in SEARCHED]
    held = [s for s, r in zip(shape_set.shapes, shape_set.roles) if r == "held_out"]
    if not searched:
        raise ValueError(f"shape set `{shape_set.name}` has no rows to search: every row is held out")
    k = min(count or default_count(len(searched)), len(searched))
    if k < 1:
        raise ValueError(f"the region count must be at least 1, got {count}")
    features = _scaler(searched, dims)
    x = features(searched)
    labels = _kmeans(x, k, seed)
    groups = sorted((np.flatnonzero(labels == j).tolist() for j in set(labels.tolist())), key=lambda g: g[0])
    held_of: list[list[Shape]] = [[] for _ in groups]
    if held:
        hx = features(held)
        centres = np.array([x[g].mean(axis=0) for g in groups])
        for s, j in zip(held, ((hx[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)):
            held_of[int(j)].append(s)
    return [Region(i, tuple(searched[m] for m in g), tuple(searched[m] for m in _representatives(x, g, per_region)),
                   tuple(held_of[i])) for i, g in enumerate(groups)]


def region_of(regions: list[Region], shape: Shape) -> Region | None:
    """The region whose members (or held-out rows) hold ``shape``."""
    key = shape_key(shape)
    return next((r for r in regions if any(shape_key(s) == key for s in r.members + r.held_out)), None)
