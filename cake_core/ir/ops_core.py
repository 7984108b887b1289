"""Op declarations and their interpreter semantics: allocation, the CTA-wide copies, sync, mma and the structure
ops (``opdef`` says what a declaration holds; ``registry`` assembles them).

All tile ops are CTA-collective: every thread of the CTA executes them and they act on whole tiles. An
``rmem`` tile is distributed over the CTA's threads: element ``e`` of the flattened tile lives in thread
``e % threads``.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from cake_core.ir import interp_cta
from cake_core.ir.interp_cta import CTA, NUMPY, clip, no_effect, round_to
from cake_core.ir.opdef import (Alloc, AttrSpec, CostClass, Effect, Family, Op, OpDef, Ordering, Scope, SyncKind,
                                buf, value, view)
from cake_core.ir.types import MemSpace

_R, _W, _RW = Effect.READ, Effect.WRITE, Effect.READWRITE


# ----------------------------------------------------------------- semantics

def _element(cta: CTA, n: Any, v: Any, what: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """The array and index of the one element view ``v`` of ``n`` names (in a gmem tensor or an smem tile); an index
    outside it is a fault at the op's line."""
    arr = cta.gmem[v.buf] if v.buf in cta.gmem else cta.tiles[v.buf]
    index = tuple(cta.ev(i.index) for i in v.index)
    if not all(0 <= i < size for i, size in zip(index, arr.shape)):
        raise interp_cta.InterpFault(n, f"{what}: index {index} is outside `{v.buf}` {tuple(arr.shape)}")
    return arr, index


def _declared(cta: CTA, n: Any, got: Any, what: str) -> int:
    """``got`` as the value a data-dependent binding binds: a value outside [0, max] is a fault at the op's line (the
    GPU code clamps into the range, so that a window it offsets never leaves its tensor, and a kernel whose declared
    range does not hold for its inputs is wrong there)."""
    hi = cta.ev(n.arg("max"))
    if not float(got).is_integer() or not 0 <= int(got) <= hi:
        raise interp_cta.InterpFault(n, f"{what}, outside its declared range [0, {hi}]")
    return int(got)


def read_scalar(cta: CTA, n: Any) -> None:
    """``scalar(name, t[i, j], max=HI)``: bind ``name`` to the integer at that element of ``t`` (a gmem tensor or an
    smem tile), within [0, HI]."""
    var, v = n.arg("var"), n.arg("src")
    arr, index = _element(cta, n, v, f"scalar `{var}`")
    got = arr[index]
    cta.env[var] = _declared(cta, n, got, f"scalar `{var}` read {got} from `{v.buf}`{list(index)}")


def fetch_add(cta: CTA, n: Any) -> None:
    """``fetch_add(name, t[i], v, max=HI)``: one atomic read-modify-write for the CTA: t[i] += v, and ``name`` binds
    the value t[i] held before, within [0, HI]. CTAs run one after another here (x fastest, then y, z): one order
    the GPU may take; a kernel whose answer depends on the order is checked against an oracle that accepts any."""
    var, v = n.arg("var"), n.arg("dst")
    arr, index = _element(cta, n, v, f"fetch_add `{var}`")
    old = int(arr[index])
    arr[index] = old + cta.ev(n.arg("value"))
    cta.env[var] = _declared(cta, n, old, f"fetch_add `{var}` found {old} in `{v.buf}`{list(index)}")


def compact(cta: CTA, n: Any) -> None:
    """``compact(name, dst, flags, base=B, limit=L, max=HI)``: dst[r] := B + j for the r-th nonzero element j of
    flags (row-major) with B + j < L, in increasing j; dst[r] := -1 from the count on; ``name`` binds the count."""
    var, dst, flags = n.arg("var"), n.arg("dst"), n.arg("flags")
    base, limit = cta.ev(n.arg("base")), cta.ev(n.arg("limit"))
    f = cta.tiles[flags].reshape(-1)
    out = cta.tiles[dst].reshape(-1)
    if out.size < f.size:
        raise interp_cta.InterpFault(n, f"compact of {f.size} flags into `{dst}` of {out.size} entries")
    taking = max(0, min(f.size, limit - base))
    picked = base + np.flatnonzero(f[:taking] != 0)
    out[:] = -1
    out[:picked.size] = picked
    cta.env[var] = _declared(cta, n, picked.size, f"compact `{var}` counted {picked.size} set flags of `{flags}`")


def bound_at_max(n: Any, ev: Callable[[Any], int]) -> dict[str, int]:
    """What a reader without memory binds for a data-dependent binding (``scalar``, ``fetch_add``, ``compact``): its
    declared maximum (the most trips of a loop it bounds, the furthest window it offsets); the protocol checker runs
    one configuration at 0 besides."""
    return {n.arg("var"): ev(n.arg("max"))}


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
    cta.put(n, v.buf, g, round_to(cta.dtypes[v.buf], tile[t]))


def gather(cta: CTA, n: Any) -> None:
    """Row r of dst := row idx[base + r] of the src window, zeros where base + r >= limit or the index lies outside
    the tensor's rows (padding); an index position past idx's end below the limit is a fault."""
    dst, v, idx = n.arg("dst"), n.arg("src"), n.arg("idx")
    base, limit = cta.ev(n.arg("base")), cta.ev(n.arg("limit"))
    win, shape = cta.window(n, v)
    kept = [d for d, (_, _, k) in enumerate(win) if k]
    rows_dim, col_dim = kept[0], kept[1]
    arr, ids = cta.gmem[v.buf], np.asarray(cta.gmem[idx]).reshape(-1)
    out = np.zeros(cta.tiles[dst].shape, dtype=np.float64)
    c0, clen, _ = win[col_dim]
    c1 = min(c0 + clen, shape[col_dim])
    for r in range(out.shape[0]):
        p = base + r
        if p >= limit:
            continue
        if not 0 <= p < ids.size:
            raise interp_cta.InterpFault(n, f"gather reads `{idx}`[{p}], outside its {ids.size} entries (base "
                                            f"{base}, limit {limit})")
        i = int(ids[p])
        if not 0 <= i < shape[rows_dim] or c1 <= c0:
            continue
        at = tuple(i if d == rows_dim else slice(c0, c1) if d == col_dim else start
                   for d, (start, _, _) in enumerate(win))
        out[r, :c1 - c0] = arr[at]
    cta.tiles[dst][...] = round_to(cta.dtypes[dst], out.astype(cta.tiles[dst].dtype))


def mma(cta: CTA, n: Any) -> None:
    acc, a, b = (cta.tiles[n.arg(x)] for x in ("acc", "a", "b"))
    acc += a.astype(np.float32) @ b.astype(np.float32)


def tile_order(n: Any, ev: Callable[[Any], int]) -> dict[str, int]:
    """The coordinates of linear tile ``t`` of a (tiles_m, tiles_n) grid in grouped order: runs of ``group`` tile
    rows (fewer in the last run) are walked column by column, so the CTAs at work at one time share the
    operand tiles of a few rows and columns in L2."""
    tm, tn, t, tiles_m, tiles_n, group = n.args
    t, tiles_m, tiles_n, group = ev(t), ev(tiles_m), ev(tiles_n), ev(group)
    if group < 1:
        raise ValueError(f"group={group}: a group is at least one tile row")
    if not 0 <= t < tiles_m * tiles_n:
        raise ValueError(f"tile {t} of a {tiles_m} x {tiles_n} grid of tiles")
    width = group * tiles_n                    # tiles per run of `group` tile rows
    first = t // width * group                 # the run's first tile row
    rows = min(tiles_m - first, group)
    return {tm: first + t % width % rows, tn: t % width // rows}


# -------------------------------------------------------------- declarations

DECLS: tuple[OpDef, ...] = (
    OpDef(Op.SMEM, Family.ALLOC, (value("dtype", "dtype"), value("shape", "shape")), alloc,
          CostClass.FREE, {"swizzle": AttrSpec(int, 0, (0, 32, 64, 128)), "stages": AttrSpec(int, 1)},
          result=True, allocates=Alloc.SMEM,
          summary="Allocate a shared-memory tile for one CTA (a ring of `stages` copies).",
          example="a_s = smem(bf16, (BM, BK), swizzle=128)",
          preconditions=("shape is static (constants only)", "total smem per CTA within the target")),
    OpDef(Op.RMEM, Family.ALLOC, (value("dtype", "dtype"), value("shape", "shape")), alloc,
          CostClass.FREE, {"fill": AttrSpec(float, 0.0)},
          result=True, allocates=Alloc.RMEM,
          summary="Allocate a register tile distributed over the CTA's threads, filled with `fill`.",
          example="acc = rmem(f32, (BM, BN), fill=0.0)",
          preconditions=("shape is static", "elements divisible by threads")),
    OpDef(Op.LOAD, Family.COPY, (buf("dst", _W), view("src", _R)), load, CostClass.COPY,
          {"guard": AttrSpec(bool, True)}, ordering=Ordering.BARRIER, engine="plain",
          summary="Copy a gmem tile into an smem or rmem tile; with guard, elements past the "
                  "tensor's edge read as zero.",
          example="load(a_s, a[tile(bid.y, BM), tile(kt, BK)])",
          preconditions=("dst shape equals the view's extent", "same dtype")),
    OpDef(Op.STORE, Family.COPY, (view("dst", _W), buf("src", _R)), store, CostClass.COPY,
          {"guard": AttrSpec(bool, True)}, ordering=Ordering.BARRIER, engine="plain",
          summary="Write an rmem or smem tile to a gmem tile (converting to the gmem dtype); with "
                  "guard, elements past the edge are skipped.",
          example="store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)",
          preconditions=("src shape equals the view's extent",)),
    OpDef(Op.GATHER, Family.COPY, (buf("dst", _W, (MemSpace.SMEM,)), view("src", _R),
                                   buf("idx", _R, (MemSpace.GMEM,), index=True), value("base", keyword=True),
                                   value("limit", keyword=True)),
          gather, CostClass.ROW_GATHER, ordering=Ordering.BARRIER, engine="plain",
          summary="Gather rows by index: row r of dst (R, C) := row idx[base + r] of the src window, whose first "
                  "kept dimension is `:` (the rows gathered from) and whose second is C columns; rows with base + "
                  "r >= limit, or whose index lies outside the tensor, are zeros (padding). idx is a 1-D i32 gmem "
                  "tensor, read at any offset: the A operand of a grouped GEMM over tokens sorted by expert "
                  "(base = the group's start + the tile's first row, limit = the group's end).",
          example="gather(a_s, x[:, tile(kt, BK)], perm, base=start + bid.x * BM, limit=end)",
          preconditions=("dst is a 2-D unswizzled smem tile (R, C) of src's dtype",
                         "src's window keeps two dimensions: `:` (the gathered rows), then a tile of C columns",
                         "idx is a 1-D i32 gmem tensor; base + r < limit only where base + r < len(idx)")),
    OpDef(Op.SYNC, Family.SYNC, (), no_effect, CostClass.FREE, sync=SyncKind.CTA,
          summary="CTA-wide barrier (__syncthreads): all smem writes before it are visible after it.",
          example="sync()",
          preconditions=("not inside role-divergent code",)),
    OpDef(Op.MMA, Family.MMA, (buf("acc", _RW, (MemSpace.RMEM,)), buf("a", _R, (MemSpace.SMEM,)), buf("b", _R, (MemSpace.SMEM,))), mma,
          CostClass.MMA, {"atom": AttrSpec(str, "fma", ("fma", "mma_sync", "wgmma"))}, ordering=Ordering.BARRIER,
          summary="acc += a @ b with fp32 accumulation, using the named MMA atom. With atom=mma_sync, f32 a and b "
                  "run on the tensor cores as three tf32 products an m16n8k8 atom (3xTF32: about 1e-6 relative, "
                  "fp32's accuracy); 16-bit ones as m16n8k16 atoms.",
          example='mma(acc, a_s, b_s, atom="fma")',
          preconditions=("acc is rmem f32 (M, N); a is (M, K); b is (K, N)",
                         "a and b share a dtype: bf16 or f16, or f32 with atom=fma or atom=mma_sync",
                         "atom=mma_sync: K a multiple of 16 (8 for f32), unswizzled smem operands")),
    OpDef(Op.FOR, Family.STRUCTURE, (value("var", "name", binds=Scope.BODY), value("extent"), value("start"),
                                     value("step")),
          interp_cta.run_for, CostClass.STRUCTURE, {"unroll": AttrSpec(int, 1)}, block=True,
          summary="A sequential loop `for var in range(extent):`, or `range(start, stop, step)` (var = start, "
                  "start + step, ... while var < stop), executed by the whole CTA (or role). A persistent "
                  "kernel's tile loop reads `for t in range(bid.x, tiles, ncta.x):` with "
                  "`grid=(min(tiles, num_sms),)`: each CTA walks every ncta.x-th tile, and ring phases "
                  "continue across tiles through a running k-tile count such as "
                  "`(t - bid.x) // ncta.x * cdiv(K, BK) + kt` (bind it once per trip, `it = ...`: see `let`).",
          example="for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):",
          preconditions=("bounds are uniform across the CTA", "step is positive")),
    OpDef(Op.IF, Family.STRUCTURE, (value("cond", "cond"),), interp_cta.run_if, CostClass.STRUCTURE, block=True,
          summary="Run the body only when the condition holds: `if a < b:` over index expressions "
                  "(uniform across the CTA: conditions see consts, dims, loop variables and bid only).",
          example="if kt < cdiv(K, BK) - 1:",
          preconditions=("one comparison (<, <=, >, >=, ==, !=); no else branch",)),
    OpDef(Op.LET, Family.STRUCTURE, (value("var", "name", binds=Scope.BLOCK), value("value")), interp_cta.run_binding,
          CostClass.BIND, bind=lambda n, ev: {n.args[0]: ev(n.args[1])},
          summary="Bind a name to an index expression, written `name = expr` (an expression, not an op call): "
                  "later statements of the same block, and the blocks nested in it, may use the name wherever "
                  "an index expression goes, so a long index is written once. Evaluated by the whole CTA (or "
                  "role) where it stands, again on every trip of an enclosing loop; uniform like a `for` "
                  "extent. A runtime value: smem/rmem shapes, tile sizes and other compile-time operands "
                  "take consts, not bindings.",
          example="kt0 = (t - bid.x) // ncta.x * cdiv(K, BK)",
          preconditions=("a new name: not a const, dim, parameter, buffer, loop variable or binding in scope",
                         "used only after it, within its block",
                         "an integer expression (no float literal)",
                         "not between two sibling roles (bind before the first role or inside a role)")),
    OpDef(Op.TILE_ORDER, Family.STRUCTURE, (value("tm", "name", binds=Scope.BLOCK), value("tn", "name", binds=Scope.BLOCK),
                                            value("t"), value("tiles_m"), value("tiles_n"),
                                            value("group", keyword=True)),
          interp_cta.run_binding, CostClass.BIND, bind=tile_order,
          summary="Bind the coordinates (tm, tn) of linear tile t of a tiles_m x tiles_n grid of tiles in grouped "
                  "order: runs of `group` tile rows (fewer in the last run) are walked column by column, so the "
                  "CTAs of a persistent grid at work at one time share the a and b tiles of a few rows and "
                  "columns in L2. tm and tn are bindings: visible, like `name = expr`, to the rest of the block.",
          example="tile_order(tm, tn, t, cdiv(M, BM), cdiv(N, BN), group=G)",
          preconditions=("tm and tn are new names (the let rules: not a const, dim, parameter, buffer, loop "
                         "variable or binding in scope)",
                         "0 <= t < tiles_m * tiles_n", "group is a positive compile-time constant")),
    OpDef(Op.SCALAR, Family.STRUCTURE, (value("var", "name", binds=Scope.BLOCK),
                                        view("src", _R, (MemSpace.GMEM, MemSpace.SMEM)), value("max", keyword=True)),
          read_scalar, CostClass.BIND, bind=bound_at_max, data_dependent=True, ordering=Ordering.BARRIER,
          summary="Bind a name to an integer read from memory: one element of an integer gmem tensor or smem "
                  "tile (an expert id, a token count, a sequence offset), in the declared range [0, max]. The name "
                  "is a binding (like `name = expr`) usable in loop bounds, `if` conditions and window offsets: a "
                  "data-dependent bound. Every thread reads the same element, so it is uniform across the CTA; "
                  "a value the kernel wrote itself is read after a sync(). On the GPU the value is clamped into "
                  "[0, max] (a window it offsets stays inside its tensor); the interpreter faults on a value "
                  "outside it. Readers without memory take it at max (the cost model) or at max and at 0 (the "
                  "protocol checker).",
          example="scalar(e, topk_ids[bid.x, j], max=E - 1)",
          preconditions=("src is one element (every index a single index) of an i32 or i64 gmem tensor or of a "
                         "single-stage unswizzled smem tile",
                         "max is an expression of consts and problem dimensions",
                         "var is a new name (the let rules)")),
    OpDef(Op.FETCH_ADD, Family.STRUCTURE, (value("var", "name", binds=Scope.BLOCK),
                                           view("dst", Effect.ATOMIC_ADD, (MemSpace.GMEM, MemSpace.SMEM)),
                                           value("value"), value("max", keyword=True)),
          fetch_add, CostClass.BIND, bind=bound_at_max, data_dependent=True, ordering=Ordering.BARRIER,
          scratch_bytes=4,
          summary="Atomic fetch-add: one thread of the CTA adds `value` to one i32 element of a gmem tensor or smem "
                  "tile (an atomic add that returns the old value) and every thread binds `var` to the value the "
                  "element held before, declared within [0, max]. It runs once per CTA each time the statement "
                  "runs (not once per thread or per row): a counter the CTAs share in gmem (claim `value` slots of "
                  "a list, `var` the first; count a CTA's rows into a total) or one the CTA keeps in smem (a "
                  "running offset across a loop's trips, which a binding cannot hold). `var` is a binding like "
                  "`scalar`'s: window offsets (a store's position), loop bounds, `if` conditions. Across CTAs the "
                  "adds land in the GPU's order (the interpreter runs the CTAs one after another): a kernel whose "
                  "output depends on that order is checked against an oracle that accepts every order. On the "
                  "GPU the old value is clamped into [0, max]; the interpreter faults outside it. Every thread of "
                  "the CTA runs it (two CTA barriers inside hand the value over): outside roles; an smem counter "
                  "is ordered against plain reads and writes by sync() (fetch_adds of one counter need none "
                  "between them).",
          example="fetch_add(slot, counts[e], 1, max=M - 1)",
          preconditions=("dst is one element (every index a single index) of an i32 gmem tensor or of a "
                         "single-stage unswizzled i32 smem tile",
                         "value is an index expression (the same in every thread)",
                         "max is an expression of consts and problem dimensions",
                         "var is a new name (the let rules)", "outside roles")),
    OpDef(Op.COMPACT, Family.STRUCTURE, (value("var", "name", binds=Scope.BLOCK),
                                         buf("dst", _W, (MemSpace.SMEM,), index=True),
                                         buf("flags", _R, (MemSpace.SMEM,), predicate=True),
                                         value("base", keyword=True), value("limit", keyword=True),
                                         value("max", keyword=True)),
          compact, CostClass.SIMT, bind=bound_at_max, data_dependent=True, in_place=False,
          ordering=Ordering.BARRIER, scratch_bytes=4 * 32,
          summary="Stable stream compaction over the CTA: dst[r] := base + j for the r-th nonzero element j of "
                  "flags (row-major), taking only the elements with base + j < limit, in increasing j; dst[r] := -1 "
                  "from the count on (a gather pads that index, a guarded scatter skips it). `var` binds the count "
                  "of set flags, the same in every thread, declared within [0, max] like `scalar`'s. With flags = "
                  "(ids == e) it lists where expert e's tokens are, in their original order: one expert at a time, "
                  "a token permutation by expert that is the same on every run (the counts and starts come from "
                  "it too: `fetch_add` keeps the running offset); with any other predicate, the rows to keep. Every "
                  "thread of the CTA runs it (a warp ballot and a scan of the warps' counts, CTA barriers inside): "
                  "outside roles, with sync() before and after it as for any tile op. On the GPU the count is "
                  "clamped into [0, max]; the interpreter faults outside it.",
          example="compact(n, pos_s, hit_s, base=t * BP, limit=P, max=BP)",
          preconditions=("flags is a 1-D or 2-D single-stage unswizzled smem tile of any dtype (nonzero: set)",
                         "dst is a 1-D single-stage unswizzled i32 smem tile with at least as many elements as flags",
                         "max is an expression of consts and problem dimensions",
                         "var is a new name (the let rules)", "outside roles")),
)
