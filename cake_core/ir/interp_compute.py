"""Interpreter semantics of the compute ops (ops_compute.py declares what they mean).

Floats compute in float32 and integers in int32, as the lowered code does;
every write rounds to the destination's dtype (``interp_cta.round_to``). The running
ops and the scatter loop over rows in Python: the interpreter runs small
shapes only.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.ir.interp_cta import InterpFault, clip, round_to
from cake_core.ir.opdef import Op, View
from cake_core.ir.shapes import broadcasts_to, norm_axis


def _tile(cta, name: str) -> np.ndarray:
    return cta.tiles[name]


def _write(cta, name: str, value: np.ndarray) -> None:
    """dst := value (same shape, same element count, or broadcastable), rounded to dst's dtype."""
    dst, dtype = cta.tiles[name], cta.dtypes[name]
    value = np.asarray(value)
    if value.shape != dst.shape:
        value = value.reshape(dst.shape) if value.size == dst.size else np.broadcast_to(value, dst.shape)
    if not dtype.is_float and value.dtype.kind == "f":
        value = np.trunc(np.nan_to_num(value.astype(np.float64), nan=0.0, posinf=2**31 - 1, neginf=-2**31))
    dst[...] = round_to(dtype, value)


def _as_compute(x: np.ndarray, is_float: bool) -> np.ndarray:
    return x.astype(np.float32) if is_float else np.trunc(x).astype(np.int32) if x.dtype.kind == "f" \
        else x.astype(np.int32)


def fill(cta, n: Any) -> None:
    dst = n.args[0]
    _write(cta, dst, np.full(cta.tiles[dst].shape, n.attr("value"), dtype=np.float64))


def cast(cta, n: Any) -> None:
    _write(cta, n.args[0], _tile(cta, n.args[1]))


_UNARY = {"neg": np.negative, "abs": np.abs, "square": np.square, "sqrt": np.sqrt,
          "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "exp": np.exp, "log": np.log}


def unary(cta, n: Any) -> None:
    dst, src = n.args
    x = _as_compute(_tile(cta, src), cta.dtypes[dst].is_float)
    with np.errstate(all="ignore"):
        _write(cta, dst, _UNARY[n.attr("fn")](x))


def ewise(cta, n: Any) -> None:
    dst, a_name, b_name = n.args
    is_float = cta.dtypes[dst].is_float
    shape = cta.tiles[dst].shape
    a, b = (_as_compute(_tile(cta, x), is_float) for x in (a_name, b_name))
    for name, x in ((a_name, a), (b_name, b)):
        if not broadcasts_to(x.shape, shape):
            raise InterpFault(n, f"`{name}` of shape {x.shape} does not broadcast to {shape}")
    alpha, beta = n.attr("alpha"), n.attr("beta")
    if is_float:
        a, b = np.float32(alpha) * a, np.float32(beta) * b
    else:
        a, b = np.int32(int(alpha)) * a, np.int32(int(beta)) * b
    fn = n.attr("fn")
    with np.errstate(all="ignore"):
        if fn == "add":
            r = a + b
        elif fn == "sub":
            r = a - b
        elif fn == "mul":
            r = a * b
        elif fn == "div":
            if is_float:
                r = a / b
            else:
                if np.any(b == 0):
                    raise InterpFault(n, "integer division by zero in ewise(fn=\"div\")")
                r = np.trunc(a.astype(np.float64) / b).astype(np.int32)
        elif fn == "max":
            r = np.maximum(a, b)
        else:
            r = np.minimum(a, b)
    _write(cta, dst, np.broadcast_to(r, shape))


def transpose(cta, n: Any) -> None:
    _write(cta, n.args[0], _tile(cta, n.args[1]).T)


def _axis(cta, n: Any, src: np.ndarray) -> int:
    a = norm_axis(n.attr("axis"), src.ndim)
    if a is None:
        raise InterpFault(n, f"axis {n.attr('axis')} is not an axis of a {src.ndim}-D tile")
    return a


def _acc(cta, name: str) -> np.ndarray:
    return _as_compute(_tile(cta, name), cta.dtypes[name].is_float)


_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}
_SCAN = {"sum": np.cumsum, "max": np.maximum.accumulate, "min": np.minimum.accumulate}


def reduce(cta, n: Any) -> None:
    dst, src = n.args
    x = _acc(cta, src)
    r = _REDUCE[n.attr("fn")](x, axis=_axis(cta, n, x))
    _write(cta, dst, np.asarray(r, dtype=x.dtype))


def _identity(fn: str, dtype: np.dtype):
    if fn == "sum":
        return 0
    if dtype.kind == "f":
        return -np.inf if fn == "max" else np.inf
    return np.iinfo(np.int32).min if fn == "max" else np.iinfo(np.int32).max


def scan(cta, n: Any) -> None:
    dst, src = n.args
    x = _acc(cta, src)
    axis, fn = _axis(cta, n, x), n.attr("fn")
    r = _SCAN[fn](x, axis=axis).astype(x.dtype)
    if n.attr("exclusive"):
        r = np.roll(r, 1, axis=axis)
        first = [slice(None)] * r.ndim
        first[axis] = 0
        r[tuple(first)] = _identity(fn, x.dtype)
    _write(cta, dst, r)


def argreduce(cta, n: Any) -> None:
    val, idx, src = n.args
    x = _acc(cta, src)
    axis = _axis(cta, n, x)
    pick = np.argmin if n.op is Op.ARGMIN else np.argmax
    i = pick(x, axis=axis)
    _write(cta, val, np.take_along_axis(x, np.expand_dims(i, axis), axis))
    _write(cta, idx, i.astype(np.int32))


def _valid_columns(cta, n: Any, width: int) -> int:
    base, limit = cta.ev(n.arg("base")), cta.ev(n.arg("limit"))
    return max(0, min(width, limit - base))


def argmin_update(cta, n: Any) -> None:
    best, arg, scores = n.args[:3]
    s = _acc(cta, scores)
    if s.ndim != 2:
        raise InterpFault(n, f"scores must be 2-D, got shape {s.shape}")
    m = _valid_columns(cta, n, s.shape[1])
    if m == 0:
        return
    b = cta.tiles[best].reshape(-1)
    a = cta.tiles[arg].reshape(-1)
    j = np.argmin(s[:, :m], axis=1)
    v = s[np.arange(s.shape[0]), j]
    better = v < b.astype(np.float32)
    b[better] = v[better]
    a[better] = cta.ev(n.arg("base")) + j[better]


def topk_merge(cta, n: Any) -> None:
    vals, idx, scores = n.args[:3]
    s = _acc(cta, scores)
    if s.ndim != 2:
        raise InterpFault(n, f"scores must be 2-D, got shape {s.shape}")
    v, i = cta.tiles[vals], cta.tiles[idx]
    k = v.shape[-1]
    m = _valid_columns(cta, n, s.shape[1])
    base = cta.ev(n.arg("base"))
    cand_i = np.arange(base, base + m, dtype=np.int64)
    for r in range(s.shape[0]):
        allv = np.concatenate([v[r].astype(np.float32), s[r, :m]])
        alli = np.concatenate([i[r].astype(np.int64), cand_i])
        order = np.lexsort((alli, allv))[:k]        # by value, then by index
        v[r] = allv[order]
        i[r] = alli[order]


def _gmem_window(cta, n: Any, v: View, guard: bool):
    """The in-bounds part of a gmem window as a writable numpy view (dropped dims removed),
    the window's per-dim [lo, hi) of that part in window coordinates, and the window's extent."""
    win, shape = cta.window(n, v)
    g, t = clip(n, v, win, shape, guard, "write")
    g = tuple(s if kept else s.start for s, (_, _, kept) in zip(g, win))
    ext = tuple(length for _, length, kept in win if kept)
    return cta.gmem[v.buf][g], t, ext


def _add_into(cta, view: View, sub: np.ndarray, value: np.ndarray) -> None:
    """gmem += value, the value converted to the gmem dtype first (i32 adds integers)."""
    if cta.dtypes[view.buf].is_float:
        sub += value.astype(np.float32).astype(sub.dtype)
    else:
        sub += np.trunc(value.astype(np.float64)).astype(sub.dtype)


def atomic_add(cta, n: Any) -> None:
    view, src = n.args
    sub, t, ext = _gmem_window(cta, n, view, n.attr("guard"))
    x = _tile(cta, src)
    if x.size != int(np.prod(ext)):
        raise InterpFault(n, f"tile `{src}` has {x.size} elements, the window {ext} has {int(np.prod(ext))}")
    _add_into(cta, view, sub, x.reshape(ext)[t])


def _smem_window(cta, view: View):
    """A scatter target in shared memory: the whole tile (atomic.smem_target), as _gmem_window returns it."""
    tile = cta.tiles[view.buf]
    return tile, tuple(slice(0, d) for d in tile.shape), tile.shape


def scatter_add(cta, n: Any) -> None:
    view, idx, src = n.args[:3]
    guard = n.attr("guard")
    sub, t, ext = _smem_window(cta, view) if view.buf in cta.tiles else _gmem_window(cta, n, view, guard)
    x, ix = _tile(cta, src), _tile(cta, idx).reshape(-1)
    rows = _valid_columns(cta, n, x.shape[0])
    lo, hi = t[0].start, t[0].stop
    for r in range(rows):
        i = int(ix[r])
        if not lo <= i < hi:
            if guard:
                continue
            raise InterpFault(n, f"scatter row {r} has index {i}, outside the in-bounds rows [{lo}, {hi}) of the "
                                 f"window of `{view.buf}` (unguarded scatter_add)")
        if len(ext) == 1:
            _add_into(cta, view, sub[i - lo:i - lo + 1], x[r].reshape(1))
        else:
            _add_into(cta, view, sub[i - lo], x[r][t[1:]].reshape(sub[i - lo].shape))


def gather_add(cta, n: Any) -> None:
    """Row order within the call, f32 adds: the sums the lowering's owning warps produce, bit for bit."""
    dst, cnt, idx, src = n.arg("dst"), n.arg("count"), n.arg("idx"), n.arg("src")
    acc, counts = cta.tiles[dst.buf], cta.tiles[cnt.buf].reshape(-1)
    sub, t, ext = _gmem_window(cta, n, src, True)
    ix = _tile(cta, idx).reshape(-1)
    if len(ext) != 2 or ix.size != ext[0] or acc.ndim != 2 or acc.shape[1] != ext[1]:
        raise InterpFault(n, f"gather_add of a {ext} window with {ix.size} indices into `{dst.buf}` {acc.shape}")
    r0, r1 = t[0].start, min(t[0].stop, _valid_columns(cta, n, ix.size))
    if r1 <= r0:
        return
    k = ix[r0:r1].astype(np.int64) - cta.ev(n.arg("first"))
    keep = np.nonzero((k >= 0) & (k < acc.shape[0]))[0]
    if keep.size == 0:
        return
    np.add.at(acc, (k[keep][:, None], np.arange(t[1].start, t[1].stop)[None, :]), sub[keep].astype(np.float32))
    np.add.at(counts, k[keep], 1)
