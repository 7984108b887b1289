"""Op declarations: compute ops (``opdef`` says what a declaration holds; ``registry`` assembles them).

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
  column vector.
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

from cake_core.ir import interp_compute as sem
from cake_core.ir.opdef import (AttrSpec, ByAttr, CostClass, Effect, Exchange, Family, Op, OpDef, Ordering, buf,
                                value, view)
from cake_core.ir.types import MemSpace

EWISE_FNS = ("add", "sub", "mul", "div", "max", "min")
UNARY_FNS = ("neg", "abs", "square", "sqrt", "rsqrt", "exp", "log")
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

DECLS: tuple[OpDef, ...] = (
    OpDef(Op.FILL, Family.ELEMENTWISE, (buf("dst", _W),), sem.fill, CostClass.SIMT,
          {"value": AttrSpec(float, 0.0)}, **_CROSS,
          summary="Set every element of an smem or rmem tile to `value` (rounded to the tile's dtype).",
          example="fill(acc, value=0.0)",
          preconditions=("dst is an smem or rmem tile",)),
    OpDef(Op.CAST, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R)), sem.cast, CostClass.SIMT, **_COMPUTE,
          summary="dst := src converted to dst's dtype (16-bit floats round to nearest even; float -> i32 "
                  "truncates toward zero).",
          example="cast(acc_bf16, acc)",
          preconditions=("dst and src have the same shape",)),
    OpDef(Op.UNARY, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R)), sem.unary, CostClass.SIMT,
          {"fn": AttrSpec(str, "neg", UNARY_FNS)}, **_COMPUTE,
          summary="dst := fn(src) elementwise: neg, abs, square, sqrt, rsqrt, exp, log (computed in f32; "
                  "neg/abs/square also in i32).",
          example='unary(sq, db_s, fn="square")',
          preconditions=("dst and src have the same shape",
                         "sqrt, rsqrt, exp and log need a float dst")),
    OpDef(Op.EWISE, Family.ELEMENTWISE, (buf("dst", _W), buf("a", _R, exchange=Exchange.BROADCAST),
                                         buf("b", _R, exchange=Exchange.BROADCAST)), sem.ewise, CostClass.SIMT,
          {"fn": AttrSpec(str, "add", EWISE_FNS), "alpha": AttrSpec(float, 1.0), "beta": AttrSpec(float, 1.0)},
          **_COMPUTE,
          summary="dst := fn(alpha * a, beta * b) elementwise, fn one of add, sub, mul, div, max, min; a and b "
                  "broadcast to dst's shape like numpy (a (BK,) row vector or a (BN, 1) column vector against "
                  "a (BN, BK) dst). dst may be a or b (in place).",
          example='ewise(scores, c_sq_s, dot, fn="sub", beta=2.0)',
          preconditions=("a and b broadcast to dst's shape",
                         "with an i32 dst, alpha and beta are whole numbers")),
    OpDef(Op.TRANSPOSE, Family.ELEMENTWISE, (buf("dst", _W), buf("src", _R, exchange=_X)), sem.transpose,
          CostClass.SIMT, in_place=False, **_COMPUTE,
          summary="dst (C, R) := src (R, C) transposed, e.g. to feed a K-major tile to mma as its b operand.",
          example="transpose(ct_s, c_s)",
          preconditions=("src is 2-D and dst's shape is src's reversed", "dst is not src")),
    OpDef(Op.REDUCE, Family.AXIS, (buf("dst", _W, exchange=_X), buf("src", _R, exchange=_X)), sem.reduce,
          CostClass.SIMT, {"axis": _AXIS, "fn": AttrSpec(str, "sum", REDUCE_FNS)}, in_place=False, **_COMPUTE,
          summary="dst := the sum, max or min of src along `axis` (sums in f32, or i32 for an i32 src).",
          example='reduce(part, sq, axis=1, fn="sum")',
          preconditions=("src is 1-D or 2-D and axis is one of its axes",
                         "dst has src's shape without the axis (or with it as 1)")),
    OpDef(Op.SCAN, Family.AXIS, (buf("dst", _W, exchange=_X), buf("src", _R, exchange=_X)), sem.scan,
          CostClass.SIMT, {"axis": _AXIS, "fn": AttrSpec(str, "sum", REDUCE_FNS),
                           "exclusive": AttrSpec(bool, False)}, **_COMPUTE,
          summary="dst := the running sum, max or min of src along `axis` (inclusive; with exclusive=True "
                  "element j combines elements before j and the first is 0 / -inf / +inf).",
          example="scan(offsets, counts_s, axis=0, exclusive=True)",
          preconditions=("src is 1-D or 2-D and axis is one of its axes", "dst has src's shape")),
    OpDef(Op.ARGMIN, Family.AXIS, (buf("val", _W, exchange=_X), buf("idx", _W, index=True, exchange=_X),
                                   buf("src", _R, exchange=_X)), sem.argreduce, CostClass.SIMT,
          {"axis": _AXIS}, in_place=False, **_COMPUTE,
          summary="val := min of src along `axis`, idx := its position in the tile (the first on ties).",
          example="argmin(best, arg, scores, axis=1)",
          preconditions=("idx is i32", "val and idx have src's shape without the axis (or with it as 1)")),
    OpDef(Op.ARGMAX, Family.AXIS, (buf("val", _W, exchange=_X), buf("idx", _W, index=True, exchange=_X),
                                   buf("src", _R, exchange=_X)), sem.argreduce, CostClass.SIMT,
          {"axis": _AXIS}, in_place=False, **_COMPUTE,
          summary="val := max of src along `axis`, idx := its position in the tile (the first on ties).",
          example="argmax(top, arg, logits, axis=1)",
          preconditions=("idx is i32", "val and idx have src's shape without the axis (or with it as 1)")),
    OpDef(Op.ARGMIN_UPDATE, Family.RUNNING, (buf("best", _RW, exchange=_X),
                                             buf("arg", _RW, index=True, exchange=_X),
                                             buf("scores", _R, exchange=_X)) + _BASE_LIMIT,
          sem.argmin_update, CostClass.SIMT, in_place=False, **_COMPUTE,
          summary="Running arg-min over candidate tiles: for each row r of scores (R, C), the smallest "
                  "scores[r, j] over columns with base + j < limit replaces (best[r], arg[r]) with "
                  "(scores[r, j], base + j) when it is strictly smaller than best[r] (ties keep the earlier "
                  "candidate). Start best at inf.",
          example="argmin_update(best, arg, scores, base=kt * BK, limit=K)",
          preconditions=("scores is 2-D (R, C); best and arg are (R,) or (R, 1)",
                         "best is f32, arg is i32", "best and arg are filled before the first update")),
    OpDef(Op.TOPK_MERGE, Family.RUNNING, (buf("vals", _RW, exchange=_X), buf("idx", _RW, index=True, exchange=_X),
                                          buf("scores", _R, exchange=_X)) + _BASE_LIMIT,
          sem.topk_merge, CostClass.SIMT, in_place=False, **_COMPUTE,
          summary="Running smallest-k: each row of (vals, idx) (R, k) is a list sorted by (value, index); "
                  "the candidates (scores[r, j], base + j) with base + j < limit are merged in and the k "
                  "smallest by (value, index) kept, sorted ascending. Start vals at inf and idx at -1.",
          example="topk_merge(top_v, top_i, scores, base=nt * BN, limit=N)",
          preconditions=("scores is 2-D (R, C); vals and idx are (R, k)", "vals is f32, idx is i32",
                         "each row of (vals, idx) is sorted before the merge (a constant fill is)")),
    OpDef(Op.ATOMIC_ADD, Family.ATOMIC, (view("dst", Effect.ATOMIC_ADD), buf("src", _R)), sem.atomic_add,
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
          sem.scatter_add, CostClass.COPY,
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
          sem.gather_add, CostClass.GATHER, **_CROSS,
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
