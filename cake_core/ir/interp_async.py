"""Interpreter semantics of the async ops: mbarriers, TMA and cp.async copies, wgmma, the fused epilogues and
the cluster exchanges (``interp_cta`` runs the roles that issue them).

Copies are synchronous here: ``tma_load`` writes its box (zero-filled past the tensor edge) and completes its
bytes on the barrier at once; ``wgmma`` computes ``acc += a @ b`` in fp32 at issue, so ``wgmma_wait`` and
``cp_async_wait`` have nothing left to wait for. Races that only an asynchronous machine would show are the
protocol checker's job (``ir.protocol``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.ir.interp_cta import CTA, Barrier, InterpFault, barrier_of, clip, peers, round_to, slot_array
from cake_core.ir.opdef import Op, View


def _box(cta: CTA, n: Any, v: View, dst: np.ndarray, dtype, rows: int = 0) -> int:
    """Copy a gmem window into ``dst``, zero past the edge; returns the box bytes. ``rows`` > 0: only the
    first ``rows`` rows (first dimension) of the box land, in the slot's first rows; the rest of the slot
    keeps what it held."""
    win, shape = cta.window(n, v)
    g, t = clip(n, v, win, shape, True, "read")
    ext = tuple(length for _, length, kept in win if kept)
    if int(np.prod(ext)) != dst.size:
        raise InterpFault(n, f"the window {ext} of `{v.buf}` does not fill the {dst.shape} slot")
    tile = np.zeros(ext, dtype=dst.dtype)
    tile[t] = cta.gmem[v.buf][g].reshape(tile[t].shape)
    box = round_to(dtype, tile.reshape(dst.shape))
    if not rows:
        dst[...] = box
        return dst.size * dtype.bytes
    dst[:rows] = box[:rows]
    return dst[:rows].size * dtype.bytes


# ---------------------------------------------------------------- semantics

def mbarrier(cta: CTA, n: Any) -> None:
    cta.async_state["bars"][n.result] = [Barrier(n.attr("arrivals")) for _ in range(cta.ev(n.args[0]))]


def arrive(cta: CTA, n: Any) -> None:
    wgs = cta.async_state["role_wgs"]
    count = wgs if wgs is not None else -(-cta.prog.threads // cta.arch.warpgroup_threads)
    mask = n.attr("multicast")
    for dst in peers(cta, n, mask) if mask else [cta]:
        barrier_of(cta, n, n.arg("bar"), dst).arrive(count)


def expect_tx(cta: CTA, n: Any) -> None:
    barrier_of(cta, n, n.arg("bar")).expect_tx(cta.ev(n.arg("bytes")))


def wait(cta: CTA, n: Any) -> None:
    if not barrier_of(cta, n, n.arg("bar")).passed(cta.ev(n.arg("phase"))):
        raise InterpFault(n, "deadlock: this wait can never return (no other role runs here)")


def tma_load(cta: CTA, n: Any) -> None:
    dst = n.arg("dst")
    mask = n.attr("multicast")
    for c in peers(cta, n, mask) if mask else [cta]:      # the box and its bytes land in every CTA of the mask
        nbytes = _box(cta, n, n.arg("src"), slot_array(cta, n, dst, c), cta.dtypes[dst.buf], n.attr("rows"))
        barrier_of(cta, n, n.arg("bar"), c).complete_tx(nbytes)


def cp_async(cta: CTA, n: Any) -> None:
    dst = n.arg("dst")
    _box(cta, n, n.arg("src"), slot_array(cta, n, dst), cta.dtypes[dst.buf])


def cp_async_bar(cta: CTA, n: Any) -> None:
    """The window lands at once; its completion adds nothing to the barrier's phase (the role arrives)."""
    dst = n.arg("dst")
    barrier_of(cta, n, n.arg("bar"))
    _box(cta, n, n.arg("src"), slot_array(cta, n, dst), cta.dtypes[dst.buf])


def tma_store(cta: CTA, n: Any) -> None:
    v, src = n.arg("dst"), slot_array(cta, n, n.arg("src"))
    win, shape = cta.window(n, v)
    g, t = clip(n, v, win, shape, True, "write")
    tile = src.reshape(tuple(length for _, length, kept in win if kept))
    out = cta.gmem[v.buf]
    out[g] = round_to(cta.dtypes[v.buf], tile[t]).reshape(out[g].shape)


def mma_slots(cta: CTA, n: Any) -> None:
    acc = cta.tiles[n.arg("acc")]
    a, b = slot_array(cta, n, n.arg("a")), slot_array(cta, n, n.arg("b"))
    if n.op is Op.WGMMA and n.attr("b_major") == "k":
        b = b.T
    prod = a.astype(np.float32) @ b.astype(np.float32)
    if prod.shape != acc.shape:
        raise InterpFault(n, f"a {a.shape} @ b {b.shape} gives {prod.shape}, the accumulator is {acc.shape}")
    if n.op is Op.WGMMA and not n.attr("accumulate"):
        acc[...] = prod
    else:
        acc += prod


def _bias_scores(cta: CTA, n: Any) -> tuple[np.ndarray, int]:
    """(scores, base) of a fused epilogue: bias[j] - beta * dots[r, j] in f32 over the columns j with
    base + j < limit (R, m)."""
    dots, bias = cta.tiles[n.arg("dots")], slot_array(cta, n, n.arg("bias")).reshape(-1)
    if dots.ndim != 2 or bias.size != dots.shape[1]:
        raise InterpFault(n, f"dots {dots.shape} needs a bias of {dots.shape[-1]} values, got {bias.shape}")
    base, limit = cta.ev(n.arg("base")), cta.ev(n.arg("limit"))
    m = max(0, min(dots.shape[1], limit - base))
    with np.errstate(all="ignore"):
        s = bias[None, :m].astype(np.float32) - np.float32(n.attr("beta")) * dots[:, :m].astype(np.float32)
    return s, base


def argmin_bias(cta: CTA, n: Any) -> None:
    """scores = bias - beta * dots (f32), then argmin_update's running merge (strictly smaller wins)."""
    s, base = _bias_scores(cta, n)
    if s.shape[1] == 0:
        return
    best, arg = cta.tiles[n.arg("best")].reshape(-1), cta.tiles[n.arg("arg")].reshape(-1)
    j = np.argmin(s, axis=1)
    v = s[np.arange(s.shape[0]), j]
    better = v < best.astype(np.float32)
    best[better] = v[better]
    arg[better] = base + j[better]


def topk_bias(cta: CTA, n: Any) -> None:
    """scores = bias - beta * dots (f32) merged into each row's KMAX smallest (score, index), ascending by
    score, then index (a candidate equal in both to a kept pair cannot occur: indices are unique)."""
    s, base = _bias_scores(cta, n)
    tv, ti = cta.tiles[n.arg("top_v")], cta.tiles[n.arg("top_i")]
    if tv.ndim != 2 or tv.shape != ti.shape or tv.shape[0] != s.shape[0]:
        raise InterpFault(n, f"top_v {tv.shape} / top_i {ti.shape} must both be ({s.shape[0]}, KMAX)")
    m = s.shape[1]
    if m == 0:
        return
    kmax = tv.shape[1]
    cand = np.arange(base, base + m, dtype=np.int64)
    for r in range(s.shape[0]):
        allv = np.concatenate([tv[r].astype(np.float32), s[r]])
        alli = np.concatenate([ti[r].astype(np.int64), cand])
        order = np.lexsort((alli, allv))[:kmax]
        tv[r], ti[r] = allv[order], alli[order]


def sqnorm_rows(cta: CTA, n: Any) -> None:
    """dst[r] (+)= sum_c src[r, c]^2 in f32."""
    dst, src = slot_array(cta, n, n.arg("dst")).reshape(-1), slot_array(cta, n, n.arg("src"))
    if src.ndim != 2 or dst.size != src.shape[0]:
        raise InterpFault(n, f"dst of {dst.size} values for src {src.shape}: one value per row needed")
    x = src.astype(np.float64)
    part = np.einsum("rc,rc->r", x, x)
    dst[...] = (dst.astype(np.float64) + part if n.attr("accumulate") else part).astype(np.float32)


def topk_publish(cta: CTA, n: Any) -> None:
    """pub_v / pub_i = the rows' lists (already merged here: the interpreter keeps one list per row)."""
    tv, ti = cta.tiles[n.arg("top_v")], cta.tiles[n.arg("top_i")]
    pv, pi = cta.tiles[n.arg("pub_v")], cta.tiles[n.arg("pub_i")]
    if pv.shape != tv.shape or pi.shape != ti.shape:
        raise InterpFault(n, f"pub_v {pv.shape} / pub_i {pi.shape} must have the lists' shape {tv.shape}")
    pv[...], pi[...] = tv, ti


def topk_cluster_merge(cta: CTA, n: Any) -> None:
    """CTA rank c of n: rows [c * ceil(R / n), (c + 1) * ceil(R / n)) of the cluster's published lists,
    merged by (value, index); the first k (the window's columns) to dst, rows past the edge skipped."""
    members = cta.cluster or [cta]
    rank = next(i for i, c in enumerate(members) if c is cta)
    pv = [c.tiles[n.arg("pub_v")] for c in members]
    pi = [c.tiles[n.arg("pub_i")] for c in members]
    rows, kmax = pv[0].shape
    v = n.arg("dst")
    win, shape = cta.window(n, v)
    if len(win) != 2 or not all(kept for _, _, kept in win) or win[0][1] != rows or not 1 <= win[1][1] <= kmax:
        raise InterpFault(n, f"the window of `{v.buf}` must be ({rows}, k <= {kmax}) for lists {pv[0].shape}")
    k, out = win[1][1], cta.gmem[v.buf]
    share = -(-rows // len(members))
    for r in range(rank * share, min(rows, (rank + 1) * share)):
        allv = np.concatenate([p[r].astype(np.float32) for p in pv])
        alli = np.concatenate([p[r].astype(np.int64) for p in pi])
        order = np.lexsort((alli, allv))[:k]
        g = win[0][0] + r
        lo, hi = max(win[1][0], 0), min(win[1][0] + k, shape[1])
        if 0 <= g < shape[0] and lo < hi:
            vals = allv[order] if cta.dtypes[v.buf].is_float else alli[order]
            out[g, lo:hi] = round_to(cta.dtypes[v.buf], vals[lo - win[1][0]:hi - win[1][0]])


def acc_publish(cta: CTA, n: Any) -> None:
    """part = acc: this CTA's partial sum, in the smem tile the cluster's reduction reads."""
    acc, part = cta.tiles[n.arg("acc")], cta.tiles[n.arg("part")]
    if part.shape != acc.shape:
        raise InterpFault(n, f"part {part.shape} must have the accumulator's shape {acc.shape}")
    part[...] = acc


def acc_cluster_reduce(cta: CTA, n: Any) -> None:
    """CTA rank c of n: chunks [c * ceil(T / n), (c + 1) * ceil(T / n)) of the T in-bounds chunks of 4 columns
    (row-major) of the window, each the f32 sum in rank order of the cluster's published tiles."""
    members = cta.cluster or [cta]
    rank = next(i for i, c in enumerate(members) if c is cta)
    parts = [c.tiles[n.arg("part")] for c in members]
    v = n.arg("dst")
    win, shape = cta.window(n, v)
    if len(win) != 2 or not all(kept for _, _, kept in win) or (win[0][1], win[1][1]) != parts[0].shape:
        raise InterpFault(n, f"the window of `{v.buf}` must be a 2-D window of part's shape {parts[0].shape}")
    for c in members:
        if c.window(n, v)[0] != win:
            raise InterpFault(n, f"cluster CTAs {rank} and {members.index(c)} reduce into different windows of "
                                 f"`{v.buf}`: the CTAs of a cluster must share the window")
    (r0, nr, _), (c0, nc, _) = win
    if r0 < 0 or c0 < 0:
        raise InterpFault(n, f"the window of `{v.buf}` starts before the tensor")
    rows, cols = max(0, min(nr, shape[0] - r0)), max(0, min(nc, shape[1] - c0))
    per_row = -(-cols // 4)
    total = rows * per_row
    share = -(-total // len(members))
    out, dt = cta.gmem[v.buf], cta.dtypes[v.buf]
    for i in range(rank * share, min(total, (rank + 1) * share)):
        r, q = divmod(i, per_row)
        hi = min(4 * q + 4, cols)
        s = parts[0][r, 4 * q:hi].astype(np.float32)
        for p in parts[1:]:
            s = s + p[r, 4 * q:hi].astype(np.float32)
        out[r0 + r, c0 + 4 * q:c0 + hi] = round_to(dt, s)
