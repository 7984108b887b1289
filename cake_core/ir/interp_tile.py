"""Interpreter semantics of allocation and the CTA-wide tile ops: smem, rmem, load, store, sync, mma."""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.ir.interp_cta import CTA, NUMPY, clip, round_to
from cake_core.ir.opdef import Op


def alloc(cta: CTA, n: Any) -> None:
    shape = tuple(cta.ev(d) for d in n.args[1])
    if n.op is Op.SMEM:
        shape = (n.attr("stages"),) + shape if n.attr("stages") > 1 else shape
        # shared memory is not zeroed on the GPU: fill with NaN so reads of unwritten smem show up
        cta.tiles[n.result] = np.full(shape, np.nan, dtype=np.float64).astype(NUMPY[n.args[0]]) \
            if n.args[0].is_float else np.zeros(shape, NUMPY[n.args[0]])
    else:
        cta.tiles[n.result] = np.full(shape, n.attr("fill"), dtype=NUMPY[n.args[0]])
    cta.dtypes[n.result] = n.args[0]


def load(cta: CTA, n: Any) -> None:
    dst, v = n.arg("dst"), n.arg("src")
    win, shape = cta.window(n, v)
    g, t = clip(n, v, win, shape, n.attr("guard"), "read")
    tile = np.zeros(tuple(length for _, length, kept in win if kept), dtype=cta.tiles[dst].dtype)
    tile[t] = cta.gmem[v.buf][g].reshape(tile[t].shape)
    cta.tiles[dst][...] = round_to(cta.dtypes[dst], tile.reshape(cta.tiles[dst].shape))


def store(cta: CTA, n: Any) -> None:
    v, src = n.arg("dst"), n.arg("src")
    win, shape = cta.window(n, v)
    g, t = clip(n, v, win, shape, n.attr("guard"), "write")
    tile = cta.tiles[src].reshape(tuple(length for _, length, kept in win if kept))
    dst = cta.gmem[v.buf]
    dst[g] = round_to(cta.dtypes[v.buf], tile[t]).reshape(dst[g].shape)


def mma(cta: CTA, n: Any) -> None:
    acc, a, b = (cta.tiles[n.arg(x)] for x in ("acc", "a", "b"))
    acc += a.astype(np.float32) @ b.astype(np.float32)


def nothing(cta: CTA, n: Any) -> None:
    """Ordering ops: tile ops are collective and copies and MMAs complete at issue here, so a barrier, a fence
    or a wait has nothing left to order (races are the verifier's and the protocol checker's to find)."""
