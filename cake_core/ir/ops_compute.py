"""Op declarations and their interpreter semantics: compute ops (``opdef`` says what a declaration holds;
``registry`` assembles them).

Tile math on smem and rmem tiles, reductions along an axis, the running
arg-min and top-k merges of distance kernels, and atomic adds into gmem. Every
op is CTA-collective (all threads execute it) and destination-first.

Semantics that the interpreter, the verifier and the lowering agree on:

- Arithmetic is done in f32 when the destination is a float dtype and in i32
  when it is i32; the result is rounded to the destination dtype on the write
  (f32 -> i32 truncates toward zero, as a C cast does).
- ``ewise`` broadcasts like numpy: each source's shape, aligned to the right
  of the destination's, has every dimension equal to the destination's or 1.
  A (BK,) tile against a (BN, BK) destination is a row vector; (BN, 1) is a
  column vector. ``select`` broadcasts its three sources the same way.
- Compares (``ewise`` with fn lt, le, gt, ge, eq, ne) write 1 where the
  comparison holds and 0 where it does not, in the destination's dtype, any
  dtype (bool, i32 or a float: a mask is a tile like any other). They compare
  in f32 when either operand is a float tile, else in i32, whatever the
  destination: a float score compared into an i32 mask is not truncated first.
  ``select`` takes any nonzero (NaN included) element of ``cond`` as true.
- Axis ops (``reduce``, ``scan``, ``argmin``, ``argmax``) act on 1-D or 2-D
  tiles; ``axis=-1`` is the last axis. A reduced result has the source's shape
  with the axis dropped, or kept as 1 (both accepted).
- The running ops (``argmin_update``, ``topk_merge``) scan the columns of a
  2-D ``scores`` tile (rows x candidates); column ``j`` is candidate
  ``base + j`` and takes part only when ``base + j < limit`` (the tail guard
  for a candidate dimension that is not a tile multiple). Ties go to the
  smaller candidate index.
- ``atomic_add`` / ``scatter_add`` add into a gmem window with hardware
  atomics; with ``guard`` (the default), elements past the tensor's edge (and
  scatter rows whose index lies outside the window) are skipped.
- ``gather_add`` sums gmem rows by segment into one CTA's smem tile: the rows
  whose segment the tile holds are read, the others never are; each target
  row belongs to one warp, which adds its rows in row order without atomics.

Operands whose elements move between threads (the axis ops' and running merges' tiles, broadcast ewise
sources, a transposed source, the scatter index) are declared with an :class:`~cake_core.ir.opdef.Exchange`:
in rmem they go through shared memory that the lowering allocates, and ``ir.scratch`` says which and how
much, so that the verifier counts that scratch against the smem budget.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.ir.interp_cta import InterpFault, clip, round_to
from cake_core.ir.opdef import (AttrSpec, ByAttr, CostClass, Effect, Exchange, Family, Op, OpDef, Ordering, View,
                                buf, value, view)
from cake_core.ir.shapes import broadcasts_to, norm_axis
from cake_core.ir.types import MemSpace

COMPARE_FNS = ("lt", "le", "gt", "ge", "eq", "ne")
EWISE_FNS = ("add", "sub", "mul", "div", "max", "min") + COMPARE_FNS
UNARY_FNS = ("neg", "abs", "square", "sqrt", "rsqrt", "exp", "log", "exp2", "sigmoid", "silu", "softplus")
UNARY_INT_FNS = ("neg", "abs", "square")          # also defined on i32 tiles
REDUCE_FNS = ("sum", "max", "min")
# who adds a scatter row into an smem target: any thread with an atomic, or the warp that owns the row
SCATTER_OWNERS = ("atomic", "warp")

_R, _W, _RW = Effect.READ, Effect.WRITE, Effect.READWRITE
_X = Exchange.ALWAYS
_SMEM = (MemSpace.SMEM,)
_AXIS = AttrSpec(int, -1, (-1, 0, 1))
_BASE_LIMIT = (value("base", keyword=True), value("limit", keyword=True))
_COMPUTE = dict(ordering=Ordering.INTERNAL)      # each thread its own elements, or CTA barriers inside the op
_CROSS = dict(ordering=Ordering.BARRIER)         # threads touch each other's elements: sync() orders them

# ----------------------------------------------------------------- semantics
# Floats compute in float32 and integers in int32, as the lowered code does; every write rounds to the
# destination's dtype (``interp_cta.round_to``). The running ops and the scatter loop over rows in Python:
# the interpreter runs small shapes only.

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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x) without overflow: e^-|x| <= 1, and log1p keeps the small tail exact."""
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, np.float32(0))


# f32 formulas the header's device functions (cake_compute.cuh) compute the same way
_UNARY = {"neg": np.negative, "abs": np.abs, "square": np.square, "sqrt": np.sqrt,
          "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "exp": np.exp, "log": np.log, "exp2": np.exp2,
          "sigmoid": _sigmoid, "silu": lambda x: x * _sigmoid(x), "softplus": _softplus}


def unary(cta, n: Any) -> None:
    dst, src = n.args
    x = _as_compute(_tile(cta, src), cta.dtypes[dst].is_float)
    with np.errstate(all="ignore"):
        _write(cta, dst, _UNARY[n.attr("fn")](x))


def _broadcast_sources(cta, n: Any, names: tuple[str, ...], is_float: bool) -> list[np.ndarray]:
    shape = cta.tiles[n.args[0]].shape
    out = [_as_compute(_tile(cta, x), is_float) for x in names]
    for name, x in zip(names, out):
        if not broadcasts_to(x.shape, shape):
            raise InterpFault(n, f"`{name}` of shape {x.shape} does not broadcast to {shape}")
    return out


def computes_in_float(dtypes: dict, n: Any) -> bool:
    """Whether ``ewise`` node ``n`` computes in f32: a float destination, or for a compare a float operand."""
    if n.attr("fn") in COMPARE_FNS:
        return dtypes[n.args[1]].is_float or dtypes[n.args[2]].is_float
    return dtypes[n.args[0]].is_float


def scatter_rows_by_4(rows: int, cols: int, threads: int, warp: int) -> bool:
    """Whether a vector=4 scatter_add of an (rows, cols) rmem src over ``threads`` adds its rows 4 columns per
    red.global.add.v4.f32: each thread on one column of whole rows, every slot full (the verifier's
    ``atomic.vector`` and the lowering ask the same)."""
    return threads > 0 and cols > 0 and cols % 4 == 0 and threads % warp == 0 and threads % cols == 0 \
        and (rows * cols) % threads == 0


_COMPARE = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
            "ne": np.not_equal}


def ewise(cta, n: Any) -> None:
    dst, a_name, b_name = n.args
    is_float = computes_in_float(cta.dtypes, n)
    shape = cta.tiles[dst].shape
    a, b = _broadcast_sources(cta, n, (a_name, b_name), is_float)
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
        elif fn == "min":
            r = np.minimum(a, b)
        else:
            r = _COMPARE[fn](a, b).astype(np.int32)
    _write(cta, dst, np.broadcast_to(r, shape))


def select(cta, n: Any) -> None:
    dst, cond = n.args[:2]
    a, b = _broadcast_sources(cta, n, n.args[2:], cta.dtypes[dst].is_float)
    c = _tile(cta, cond)
    if not broadcasts_to(c.shape, cta.tiles[dst].shape):
        raise InterpFault(n, f"`{cond}` of shape {c.shape} does not broadcast to {cta.tiles[dst].shape}")
    _write(cta, dst, np.broadcast_to(np.where(c != 0, a, b), cta.tiles[dst].shape))


def iota(cta, n: Any) -> None:
    dst = cta.tiles[n.args[0]]
    axis = _axis(cta, n, dst)
    idx = np.arange(dst.shape[axis], dtype=np.int64) + cta.ev(n.arg("base"))
    _write(cta, n.args[0], np.broadcast_to(np.expand_dims(idx, tuple(a for a in range(dst.ndim) if a != axis)),
                                           dst.shape).astype(np.float64))


def transpose(cta, n: Any) -> None:
    _write(cta, n.args[0], _tile(cta, n.args[1]).T)


def trisolve(cta, n: Any) -> None:
    """x := L^-1 x by forward substitution, row by row in f32 (the order the lowering sums in)."""
    x, low = _tile(cta, n.arg("x")), _tile(cta, n.arg("l"))
    rows = x.shape[0]
    if x.ndim != 2 or low.shape != (rows, rows):
        raise InterpFault(n, f"trisolve of x {x.shape} by l {low.shape}: l must be (N, N) for x (N, M)")
    out = x.astype(np.float32)
    lf = low.astype(np.float32)
    with np.errstate(all="ignore"):      # a zero pivot gives inf / NaN, as on the GPU; the check reports it
        for i in range(rows):
            acc = out[i].copy()
            for j in range(i):
                acc = (acc - lf[i, j] * out[j]).astype(np.float32)
            out[i] = acc if n.attr("unit") else (acc / lf[i, i]).astype(np.float32)
    _write(cta, n.arg("x"), out)


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


# -------------------------------------------------------------- declarations

DECLS: tuple[OpDef, ...] = (
    OpDef(Op.FILL, Family.ELEMENTWISE, (buf("dst", _W),), fill, CostClass.SIMT,
          {"value": AttrSpec(float, 0.0)}, **_CROSS, swizzle=True,
          summary="Set every element of an smem or rmem tile to `value` (rounded to the tile's dtype).",
          example="fill(acc, value=0.0)",
          preconditions=("dst is an smem or rmem tile",)),
    OpDef(Op.CAST, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R)), cast, CostClass.SIMT, **_COMPUTE,
          swizzle=True,
          summary="dst := src converted to dst's dtype (16-bit floats round to nearest even; float -> i32 "
                  "truncates toward zero).",
          example="cast(acc_bf16, acc)",
          preconditions=("dst and src have the same shape",)),
    OpDef(Op.UNARY, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R)), unary, CostClass.SIMT,
          {"fn": AttrSpec(str, "neg", UNARY_FNS)}, **_COMPUTE, swizzle=True,
          summary="dst := fn(src) elementwise: neg, abs, square, sqrt, rsqrt, exp, log, exp2, sigmoid "
                  "(1 / (1 + e^-x)), silu (x * sigmoid(x)), softplus (log(1 + e^x), computed as "
                  "log1p(e^-|x|) + max(x, 0) so that it never overflows); computed in f32, neg/abs/square "
                  "also in i32.",
          example='unary(sq, db_s, fn="square")',
          preconditions=("dst and src have the same shape",
                         "every fn but neg, abs and square needs a float dst")),
    OpDef(Op.EWISE, Family.ELEMENTWISE, (buf("dst", _W), buf("a", _R, exchange=Exchange.BROADCAST),
                                         buf("b", _R, exchange=Exchange.BROADCAST)), ewise, CostClass.SIMT,
          {"fn": AttrSpec(str, "add", EWISE_FNS), "alpha": AttrSpec(float, 1.0), "beta": AttrSpec(float, 1.0)},
          **_COMPUTE, swizzle=True,
          summary="dst := fn(alpha * a, beta * b) elementwise, fn one of add, sub, mul, div, max, min, or a "
                  "compare lt, le, gt, ge, eq, ne, which writes 1 where it holds and 0 where not, into a dst of "
                  "any dtype (compared in f32 when a or b is a float tile, else in i32); a and b broadcast to "
                  "dst's shape like numpy (a (BK,) row vector or a (BN, 1) column vector against a (BN, BK) "
                  "dst). dst may be a or b (in place).",
          example='ewise(scores, c_sq_s, dot, fn="sub", beta=2.0)',
          preconditions=("a and b broadcast to dst's shape",
                         "computing in i32 (an i32 dst; a compare of two integer tiles), alpha and beta are whole "
                         "numbers")),
    OpDef(Op.SELECT, Family.ELEMENTWISE,
          (buf("dst", _W), buf("cond", _R, exchange=Exchange.BROADCAST, predicate=True),
           buf("a", _R, exchange=Exchange.BROADCAST), buf("b", _R, exchange=Exchange.BROADCAST)),
          select, CostClass.SIMT, **_COMPUTE, swizzle=True,
          summary="dst := a where cond is nonzero, else b, elementwise (a and b converted to dst's dtype as "
                  "ewise converts); cond, a and b broadcast to dst's shape like ewise's operands; cond may have "
                  "any dtype (a compare's 0/1 mask). dst may be any of the sources (in place).",
          example="select(scores, mask, scores, ninf_s)",
          preconditions=("cond, a and b broadcast to dst's shape",)),
    OpDef(Op.IOTA, Family.ELEMENTWISE, (buf("dst", _W), value("base", keyword=True)), iota, CostClass.SIMT,
          {"axis": _AXIS}, **_COMPUTE, swizzle=True,
          summary="dst := base + the index of each element along `axis` (rounded to dst's dtype): with "
                  "base=bid.y * BM along axis 0 the global row of each element, along axis 1 its column; "
                  "compared with ewise (fn=\"ge\") they give a causal mask.",
          example="iota(row, base=bid.y * BM, axis=0)",
          preconditions=("dst is 1-D or 2-D and axis is one of its axes",)),
    OpDef(Op.TRANSPOSE, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R, exchange=_X)), transpose,
          CostClass.SIMT, in_place=False, **_COMPUTE,
          summary="dst (C, R) := src (R, C) transposed, e.g. to feed a K-major tile to mma as its b operand.",
          example="transpose(ct_s, c_s)",
          preconditions=("src is 2-D and dst's shape is src's reversed", "dst is not src")),
    OpDef(Op.TRISOLVE, Family.ELEMENTWISE, (buf("x", _RW, (MemSpace.SMEM,)),
                                            buf("l", _R, (MemSpace.SMEM,), exchange=_X)),
          trisolve, CostClass.SIMT, {"unit": AttrSpec(bool, True)}, in_place=False, **_COMPUTE,
          summary="x := L^-1 x, the solve of L y = x by forward substitution, for a lower-triangular L (N, N) and "
                  "x (N, M), both f32 smem tiles: row i of x becomes (x_i - sum_{j<i} L_ij y_j) / L_ii, summed in "
                  "f32 in order of j. With unit=True (the default) the diagonal is taken as 1 and not read, so L "
                  "may hold a strictly lower-triangular A for (I + A)^-1 x (the UT transform of a KDA chunk); "
                  "entries above the diagonal are never read. Each thread solves whole columns of x; the op "
                  "synchronises the CTA before and after.",
          example="trisolve(u_s, a_s, unit=True)",
          preconditions=("x is (N, M) and l is (N, N), both f32 smem tiles of one stage", "l is not x")),
    OpDef(Op.REDUCE, Family.AXIS, (buf("dst", _W, exchange=_X), buf("src", _R, exchange=_X)), reduce,
          CostClass.SIMT, {"axis": _AXIS, "fn": AttrSpec(str, "sum", REDUCE_FNS)}, in_place=False, **_COMPUTE,
          summary="dst := the sum, max or min of src along `axis` (sums in f32, or i32 for an i32 src).",
          example='reduce(part, sq, axis=1, fn="sum")',
          preconditions=("src is 1-D or 2-D and axis is one of its axes",
                         "dst has src's shape without the axis (or with it as 1)")),
    OpDef(Op.SCAN, Family.AXIS, (buf("dst", _W, exchange=_X), buf("src", _R, exchange=_X)), scan,
          CostClass.SIMT, {"axis": _AXIS, "fn": AttrSpec(str, "sum", REDUCE_FNS),
                           "exclusive": AttrSpec(bool, False)}, **_COMPUTE,
          summary="dst := the running sum, max or min of src along `axis` (inclusive; with exclusive=True "
                  "element j combines elements before j and the first is 0 / -inf / +inf).",
          example="scan(offsets, counts_s, axis=0, exclusive=True)",
          preconditions=("src is 1-D or 2-D and axis is one of its axes", "dst has src's shape")),
    OpDef(Op.ARGMIN, Family.AXIS, (buf("val", _W, exchange=_X), buf("idx", _W, index=True, exchange=_X),
                                   buf("src", _R, exchange=_X)), argreduce, CostClass.SIMT,
          {"axis": _AXIS}, in_place=False, **_COMPUTE,
          summary="val := min of src along `axis`, idx := its position in the tile (the first on ties).",
          example="argmin(best, arg, scores, axis=1)",
          preconditions=("idx is i32", "val and idx have src's shape without the axis (or with it as 1)")),
    OpDef(Op.ARGMAX, Family.AXIS, (buf("val", _W, exchange=_X), buf("idx", _W, index=True, exchange=_X),
                                   buf("src", _R, exchange=_X)), argreduce, CostClass.SIMT,
          {"axis": _AXIS}, in_place=False, **_COMPUTE,
          summary="val := max of src along `axis`, idx := its position in the tile (the first on ties).",
          example="argmax(top, arg, logits, axis=1)",
          preconditions=("idx is i32", "val and idx have src's shape without the axis (or with it as 1)")),
    OpDef(Op.ARGMIN_UPDATE, Family.RUNNING, (buf("best", _RW, exchange=_X),
                                             buf("arg", _RW, index=True, exchange=_X),
                                             buf("scores", _R, exchange=_X)) + _BASE_LIMIT,
          argmin_update, CostClass.SIMT, in_place=False, keeps_per_row=1, **_COMPUTE,
          summary="Running arg-min over candidate tiles: for each row r of scores (R, C), the smallest "
                  "scores[r, j] over columns with base + j < limit replaces (best[r], arg[r]) with "
                  "(scores[r, j], base + j) when it is strictly smaller than best[r] (ties keep the earlier "
                  "candidate). Start best at inf.",
          example="argmin_update(best, arg, scores, base=kt * BK, limit=K)",
          preconditions=("scores is 2-D (R, C); best and arg are (R,) or (R, 1)",
                         "best is f32, arg is i32", "best and arg are filled before the first update")),
    OpDef(Op.TOPK_MERGE, Family.RUNNING, (buf("vals", _RW, exchange=_X), buf("idx", _RW, index=True, exchange=_X),
                                          buf("scores", _R, exchange=_X)) + _BASE_LIMIT,
          topk_merge, CostClass.SIMT, in_place=False, **_COMPUTE,
          summary="Running smallest-k: each row of (vals, idx) (R, k) is a list sorted by (value, index); "
                  "the candidates (scores[r, j], base + j) with base + j < limit are merged in and the k "
                  "smallest by (value, index) kept, sorted ascending. Start vals at inf and idx at -1.",
          example="topk_merge(top_v, top_i, scores, base=nt * BN, limit=N)",
          preconditions=("scores is 2-D (R, C); vals and idx are (R, k)", "vals is f32, idx is i32",
                         "each row of (vals, idx) is sorted before the merge (a constant fill is)")),
    OpDef(Op.ATOMIC_ADD, Family.ATOMIC, (view("dst", Effect.ATOMIC_ADD), buf("src", _R)), atomic_add,
          CostClass.COPY, {"guard": AttrSpec(bool, True)}, **_CROSS,
          summary="gmem window dst += src elementwise with atomic adds (src converted to dst's dtype); with "
                  "guard, elements past the tensor's edge are skipped. Used to combine partial results of "
                  "several CTAs into an output the harness zeroes before the launch.",
          example="atomic_add(out[tile(bid.y, BM), tile(bid.x, BN)], acc)",
          preconditions=("dst is a gmem parameter of dtype f32 or i32 (i32 takes an i32 src)",
                         "src's shape equals the window's extent")),
    OpDef(Op.SCATTER_ADD, Family.ATOMIC,
          (view("dst", ByAttr("owner", (("atomic", Effect.ATOMIC_ADD), ("warp", Effect.OWNED_ADD))),
                (MemSpace.GMEM, MemSpace.SMEM)),
           buf("idx", _R, index=True, exchange=_X), buf("src", _R)) + _BASE_LIMIT,
          scatter_add, CostClass.COPY,
          {"guard": AttrSpec(bool, True), "owner": AttrSpec(str, "atomic", SCATTER_OWNERS),
           "vector": AttrSpec(int, 1, (1, 4))}, **_CROSS,
          summary="Scatter-add rows: for each row r of src with base + r < limit, window row idx[r] of dst "
                  "+= src[r] with atomic adds (a 1-D window adds the element src[r]). With guard, rows whose "
                  "index is outside the window and columns past the tensor's edge are skipped. dst may be a "
                  "whole smem tile `acc_s[:, :]` (a per-CTA privatised accumulator, shared-memory atomics: "
                  "conflict-free when C = 32 and threads is a multiple of 32); sync() before and after it. "
                  "owner=\"warp\" (smem target and src only): warp w of the CTA adds the rows idx[r] with "
                  "idx[r] % warps == w, with plain loads and stores instead of atomics (the sum is the same, "
                  "its f32 rounding order differs). vector=4 (an rmem src into f32 gmem rows, C a multiple of "
                  "4 dividing threads): 4 columns per 16-byte red.global.add.v4.f32 where the view is aligned "
                  "at run time, element atomics elsewhere.",
          example="scatter_add(sums[bid.y, :, tile(dt, BD)], a_r, x_r, base=bid.x * BN, limit=N)",
          preconditions=("dst is a gmem parameter or a whole single-stage smem tile, of dtype f32 or i32 "
                         "(i32 takes an i32 src)",
                         "window (E, C) with src (R, C), or window (E,) with src (R,); idx is (R,) i32",
                         "owner=\"warp\" takes a whole smem tile target and an smem src")),
    OpDef(Op.GATHER_ADD, Family.GATHER,
          (view("dst", Effect.OWNED_ADD, _SMEM), view("count", Effect.OWNED_ADD, _SMEM),
           buf("idx", _R, _SMEM, index=True), buf("queue", _W, _SMEM), view("src", _R))
          + _BASE_LIMIT + (value("first", keyword=True),),
          gather_add, CostClass.GATHER, **_CROSS,
          summary="Segment sums of gathered rows: for each row r of the gmem window src (R, C) with base + r "
                  "< limit and inside the tensor, k = idx[r] - first; when 0 <= k < E, row k of dst (an smem "
                  "tile (E, C), f32) += src row r (columns past the tensor's edge are skipped) and count[k] "
                  "(an smem tile (E,), i32) += 1. A row whose k falls outside [0, E) is never read, so CTAs "
                  "that split the segments between them read each row once in all. Warp w adds the rows with "
                  "k % warps == w in row order, with plain loads and stores: no atomics, and the same f32 "
                  "sums on every run. The rows reach their warps through a stable counting sort in queue, an "
                  "i32 smem tile of R + 2 * warps * warps entries that is scratch: each warp scans R / warps "
                  "indices, not all R. An owner keeps 16 of its rows' loads in flight (rows of 128 bf16 columns; "
                  "fewer for wider rows). Every thread of the CTA runs it (it holds three CTA barriers), so it sits "
                  "outside roles; sync() before and after it, as for any tile op.",
          example="gather_add(acc_s[:, :], cnt_s[:], a_s, q_s, x[bid.y, tile(c, BN), tile(0, BD)], base=c * BN, "
                  "limit=N, first=bid.x * KC)",
          preconditions=("dst is a whole single-stage smem tile (E, C) of f32, count one (E,) of i32",
                         "idx is an (R,) i32 smem tile; src a rank-2 gmem window (R, C) of bf16, f16 or f32",
                         "queue is a whole (R + 2 * warps * warps,) i32 smem tile; R and E at most 65536",
                         "outside roles: every thread of the CTA runs it")),
)
