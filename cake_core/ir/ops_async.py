"""Op declarations and their interpreter semantics: the Hopper async vocabulary (``opdef`` says what a
declaration holds; ``registry`` assembles them).

Warp roles, mbarrier rings, TMA and cp.async copies, wgmma (and tcgen05 on
Blackwell, declared only). The new operand kinds:

- ``slot``: a buffer name, or a ring slot ``name[expr]`` of an smem tile with
  ``stages=S`` / of an ``mbarrier(S)`` (the index is taken modulo nothing: it
  must lie in [0, S)). Represented by :class:`opdef.Slot`.
- ``str``: a string literal (a role's name).
- ``warps``: a pair of integer literals ``(lo, hi)``: warps lo..hi-1 (half-open).

Semantics that every consumer of these ops (interpreter, protocol checker,
lowering) agrees on:

- ``with role(name, warps=(lo, hi), regs=R):`` runs its body only on warps
  [lo, hi); ops inside are collective over the role's threads; an rmem tile
  allocated inside is distributed over the role's threads. Sibling roles run
  concurrently (the interpreter runs them as cooperative coroutines).
- An mbarrier slot counts completed phases. A phase completes when its pending
  arrivals reach zero and its transaction count is zero; it then re-arms with
  ``arrivals``. ``arrive`` adds one arrival per warpgroup of the executing
  role (one elected thread per warpgroup arrives); ``expect_tx`` is
  ``mbarrier.arrive.expect_tx``: one arrival plus ``bytes`` expected.
  ``wait(bar, phase=p)`` is ``try_wait.parity``: it returns once the number
  of completed phases ``c`` has ``c % 2 != p`` (so parity 1 passes on a fresh
  barrier: the producer's first trips over an empty ring).
- ``tma_load`` copies the whole box (elements past the tensor edge read as
  zero) and completes the box's bytes on ``bar``, out-of-bounds bytes included;
  with ``multicast=mask`` it does so in every cluster CTA of the mask (the slot
  and the barrier at the same place in each), and ``arrive(multicast=mask)``
  arrives on the barrier of every CTA of the mask. A CTA's rank in a
  ``cluster((n, 1, 1))`` is ``bid.x % n``. Every CTA of a cluster runs
  concurrently; before the first remote write and before exiting, the
  cluster synchronises (``cluster_sync()``), else a peer may write into a
  barrier not yet initialised or a CTA that has already exited.
- ``cp_async_bar`` is the TMA-free producer copy for windows whose rows are not
  16-byte aligned (a (B, N, D) tensor with D % 8 != 0 for 16-bit types): it
  writes the window into the slot (in the slot's swizzle; zero past the
  tensor's edge) and completes on ``bar`` without an arrival of its own: the
  barrier's phase also waits for these copies, so the role ``arrive``s on
  ``bar`` after them (instead of ``expect_tx``). The copies are ordinary
  (generic-proxy) smem writes: an async-proxy reader (``wgmma``) runs
  ``fence_async()`` after its ``wait`` on ``bar`` and before reading.
- ``wgmma`` is asynchronous: ``acc += a @ b`` is issued as one commit group;
  ``wgmma_wait(n)`` waits until at most ``n`` groups are in flight. The operand
  slots are read until then. ``b_major="n"`` (the default) takes b as (K, N),
  each row along N; ``b_major="k"`` takes b as (N, K), each row along K (the
  reduction dim), like a: ``acc += a @ b.T``. ``accumulate=False`` drops acc's old
  value: ``acc = a @ b`` (a fresh tile in a loop without a separate fill).
- ``argmin_bias`` is the fused epilogue of a distance kernel on a wgmma
  accumulator: scores ``bias[j] - beta * dots[r, j]`` (bias an smem slot of
  per-column values, e.g. squared centroid norms) feed a running arg-min (as the
  compute ops' running merge does). Its ``best`` / ``arg`` tiles are row state of the
  accumulator's fragment: the lowering keeps a private partial per thread for the
  rows it owns and merges the 4 lanes of a quad when the tile is stored, so
  ``store`` is the only other op that may read them.
- ``topk_bias`` is the k-smallest analogue of ``argmin_bias``: ``top_v`` /
  ``top_i`` (R, KMAX) hold each row's KMAX smallest (score, index) pairs in
  ascending (score, index) order; with rmem lists the lowering keeps a sorted list
  per thread for the rows it owns (over its own columns) and merges the quad's 4
  lists when ``top_i`` or ``top_v`` is stored (the first k columns of the window);
  with smem lists (KMAX up to 128) each row has one sorted list in the tile, which
  the 4 lanes of the row's quad insert into together.
- ``topk_shift`` adds a per-row value (an smem vector, e.g. ||q_r||^2) to every kept value of
  ``top_v``: the order is unchanged, and what ``store`` or ``topk_publish`` writes is then the whole
  squared distance ``||q_r||^2 + ||db_j||^2 - 2 q_r.db_j``.
- ``sqnorm_rows`` writes the squared norm of each row of an smem tile into an smem
  vector (f32), e.g. ||db_j||^2 from the landed database tile; it completes its
  writes among the role's threads before returning, so the role's next ``arrive``
  publishes them (the protocol checker counts the slot filled by that arrival).
- ``topk_publish`` / ``topk_cluster_merge`` split a top-k over the CTAs of a
  cluster (each streams a share of the database): inside the role,
  ``topk_publish`` writes each row's merged list (the value ``store`` would
  write, all KMAX columns) into smem tiles of the CTA; after the roles, a
  ``cluster_sync()`` makes them visible to the cluster, and
  ``topk_cluster_merge`` has CTA rank c of n merge, for rows [c * ceil(R / n),
  (c + 1) * ceil(R / n)), the lists of every CTA of the cluster (read through
  distributed shared memory) and write the first k to gmem. A second
  ``cluster_sync()`` must follow before the kernel exits: a peer's smem is
  gone once it has (the protocol checker reports both missing syncs).
- ``acc_publish`` / ``acc_cluster_reduce`` are split-K over the CTAs of a cluster
  without atomics: inside the role, ``acc_publish`` writes the wgmma
  accumulator (this CTA's partial sum over its K slice) into an smem tile of the
  CTA; after the roles, a ``cluster_sync()``, then ``acc_cluster_reduce`` has
  CTA rank c of n sum, for its share of the in-bounds elements of the window
  (chunks of 4 columns, row-major, [c * ceil(T / n), (c + 1) * ceil(T / n))
  of T), the tiles of every CTA of the cluster in rank order (f32) and store
  the sums; a second ``cluster_sync()`` before the kernel exits. Every
  element of the window is written once: the output needs no zeroing.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from cake_core.ir import interp_cta
from cake_core.ir.interp_cta import (CTA, Barrier, InterpFault, barrier_of, clip, no_effect, peers, round_to,
                                     slot_array)
from cake_core.ir.opdef import (Alloc, AttrSpec, BarrierUse, ByAttr, Completion, CostClass, Effect, Family, Op,
                                OpDef, Ordering, Proxy, SyncKind, View, barrier, buf, slot, value, view)
from cake_core.ir.types import MemSpace

_R, _W, _RW = Effect.READ, Effect.WRITE, Effect.READWRITE
_RMEM, _SMEM = (MemSpace.RMEM,), (MemSpace.SMEM,)
_LISTS = (MemSpace.RMEM, MemSpace.SMEM)         # topk_bias lists: registers (KMAX <= 32) or smem tiles
_BASE_LIMIT = (value("base", keyword=True), value("limit", keyword=True))
_ACC = buf("acc", ByAttr("accumulate", ((True, _RW), (False, _W))), _RMEM)


# ----------------------------------------------------------------- semantics
# Copies are synchronous here: ``tma_load`` writes its box (zero-filled past the tensor edge) and completes
# its bytes on the barrier at once; ``wgmma`` computes ``acc += a @ b`` in fp32 at issue, so ``wgmma_wait``
# and ``cp_async_wait`` have nothing left to wait for. Races that only an asynchronous machine would show
# are the protocol checker's job (``ir.protocol``).

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
    cta.put(n, v.buf, g, round_to(cta.dtypes[v.buf], tile[t]))


def mma_slots(cta: CTA, n: Any) -> None:
    acc = cta.tiles[n.arg("acc")]
    a, b = slot_array(cta, n, n.arg("a")), slot_array(cta, n, n.arg("b"))
    if n.op is Op.WGMMA and n.attr("b_major") == "k":
        b = b.T
    if n.op is Op.WGMMA and n.attr("a_major") == "m":
        a = a.T
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
    """scores = bias - beta * dots (f32), then a running arg-min (strictly smaller wins, ties keep the earlier)."""
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


def topk_shift(cta: CTA, n: Any) -> None:
    """top_v[r, :] += rows[r] in f32 (inf stays inf)."""
    tv, rows = cta.tiles[n.arg("top_v")], slot_array(cta, n, n.arg("rows")).reshape(-1)
    if tv.ndim != 2 or rows.size != tv.shape[0]:
        raise InterpFault(n, f"top_v {tv.shape} needs one value per row, rows holds {rows.size}")
    with np.errstate(all="ignore"):
        tv[...] = tv.astype(np.float32) + rows.astype(np.float32)[:, None]


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
    kept = [d for d, w in enumerate(win) if w[2]]       # the others: single indices (a batch), dropped
    if len(kept) != 2 or win[kept[0]][1] != rows or not 1 <= win[kept[1]][1] <= kmax:
        raise InterpFault(n, f"the window of `{v.buf}` must be ({rows}, k <= {kmax}) for lists {pv[0].shape}")
    rd, cd = kept
    (r0, _, _), (c0, k, _) = win[rd], win[cd]
    share = -(-rows // len(members))
    for r in range(rank * share, min(rows, (rank + 1) * share)):
        allv = np.concatenate([p[r].astype(np.float32) for p in pv])
        alli = np.concatenate([p[r].astype(np.int64) for p in pi])
        order = np.lexsort((alli, allv))[:k]
        g = r0 + r
        lo, hi = max(c0, 0), min(c0 + k, shape[cd])
        if 0 <= g < shape[rd] and lo < hi:
            vals = allv[order] if cta.dtypes[v.buf].is_float else alli[order]
            at = [slice(s, s + 1) for s, _, _ in win]
            at[rd], at[cd] = slice(g, g + 1), slice(lo, hi)
            cta.put(n, v.buf, tuple(at), round_to(cta.dtypes[v.buf], vals[lo - c0:hi - c0]))


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
    dt = cta.dtypes[v.buf]
    for i in range(rank * share, min(total, (rank + 1) * share)):
        r, q = divmod(i, per_row)
        hi = min(4 * q + 4, cols)
        s = parts[0][r, 4 * q:hi].astype(np.float32)
        for p in parts[1:]:
            s = s + p[r, 4 * q:hi].astype(np.float32)
        cta.put(n, v.buf, (slice(r0 + r, r0 + r + 1), slice(c0 + 4 * q, c0 + hi)), round_to(dt, s))


# -------------------------------------------------------------- declarations

DECLS: tuple[OpDef, ...] = (
    OpDef(Op.ROLE, Family.STRUCTURE, (value("name", "str"), value("warps", "warps", keyword=True)),
          interp_cta.run_role, CostClass.STRUCTURE, {"regs": AttrSpec(int, 0)}, block=True,
          summary="A block run only by warps [lo, hi) of the CTA (a warp role), with a setmaxnreg "
                  "register budget `regs` per thread (0: leave the budget alone). Sibling roles run "
                  "concurrently and talk through mbarriers.",
          example='with role("producer", warps=(0, 4), regs=40):',
          preconditions=("only at the kernel's top level, roles do not nest",
                         "warp ranges lie within threads and do not overlap",
                         "regs in [24, 256], step 8; sum of regs * threads within the register file",
                         "compute ops inside it: the elementwise ones (fill, cast, unary, ewise, select, iota) on smem "
                         "tiles and the role's wgmma accumulators")),
    OpDef(Op.MBARRIER, Family.ALLOC, (value("count"),), mbarrier, CostClass.FREE,
          {"arrivals": AttrSpec(int, 1)}, result=True, allocates=Alloc.MBARRIER,
          summary="Allocate `count` mbarriers in shared memory (8 B each), each expecting `arrivals` "
                  "arrivals per phase; index one as bar[s].",
          example="full = mbarrier(S, arrivals=1)",
          preconditions=("count is a compile-time constant", "allocated at top level, before the roles")),
    OpDef(Op.EXPECT_TX, Family.SYNC, (barrier("bar", BarrierUse.EXPECT_TX), value("bytes")),
          expect_tx, CostClass.FREE, ordering=Ordering.ASYNC,
          summary="mbarrier.arrive.expect_tx: one arrival on `bar` plus `bytes` transaction bytes that "
                  "async copies signalling `bar` must land before the phase completes.",
          example="expect_tx(full[kt % S], (BM * BK + BK * BN) * 2)",
          preconditions=("bytes equals the bytes of the copies that signal bar in this phase",)),
    OpDef(Op.ARRIVE, Family.SYNC, (barrier("bar", BarrierUse.ARRIVE),), arrive, CostClass.FREE,
          {"multicast": AttrSpec(int, 0)}, ordering=Ordering.ASYNC,
          summary="Arrive on an mbarrier: one arrival per warpgroup of the executing role. multicast: a "
                  "mask of cluster CTAs (this one included if its bit is set) on whose barrier at the same "
                  "slot the role arrives instead (mapa + mbarrier.arrive.shared::cluster): how consumers "
                  "release a ring slot that a multicast TMA copy refills in every CTA of the mask.",
          example="arrive(empty[kt % S])",
          preconditions=("the barrier's arrivals equal the arrivals made per phase",
                         "multicast names CTAs of the declared cluster")),
    OpDef(Op.WAIT, Family.SYNC, (barrier("bar", BarrierUse.WAIT), value("phase", keyword=True)),
          wait, CostClass.FREE, ordering=Ordering.ASYNC,
          summary="Block until the mbarrier phase of parity `phase` has completed (try_wait.parity).",
          example="wait(full[kt % S], phase=(kt // S) % 2)",
          preconditions=("phase is a parity: 0, 1 or an expression ending in % 2",
                         "something arrives on the barrier, or the wait never returns")),
    OpDef(Op.TMA_LOAD, Family.COPY, (slot("dst", _W), view("src", _R), barrier("bar", BarrierUse.COMPLETE_TX,
                                                                                keyword=True)),
          tma_load, CostClass.COPY, {"multicast": AttrSpec(int, 0), "rows": AttrSpec(int, 0)},
          ordering=Ordering.ASYNC, proxy=Proxy.ASYNC, completion=Completion.BARRIER, engine="tma", swizzle=True,
          summary="TMA (cp.async.bulk.tensor) copy of a gmem box into an smem slot; elements past the "
                  "tensor's edge are zero-filled; completes the box's bytes on `bar`. multicast: a "
                  "mask of cluster CTAs that receive the box too (0: this CTA only). rows=R (0: all): "
                  "only the first R rows of the box are copied, into the slot's first R rows, and only "
                  "their bytes complete on `bar`; the slot's other rows keep what they held (for an "
                  "operand whose rows past a small M feed results that are never stored).",
          example="tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])",
          preconditions=("box dims <= 256, inner box bytes <= swizzle span",
                         "global inner dimension 16-byte aligned", "smem slot 128-byte aligned",
                         "rows: a multiple of 8 below the slot's rows, without multicast")),
    OpDef(Op.TMA_STORE, Family.COPY, (view("dst", _W), slot("src", _R)), tma_store, CostClass.COPY,
          ordering=Ordering.ASYNC, proxy=Proxy.ASYNC, engine="tma", swizzle=True,
          summary="TMA store of an smem tile (slot) to a gmem box; elements past the edge are skipped. "
                  "Completes before the next op (bulk group committed and waited).",
          example="tma_store(c[tile(bid.y, BM), tile(bid.x, BN)], c_s)",
          preconditions=("fence_async() after ordinary smem writes to src",)),
    OpDef(Op.CP_ASYNC, Family.COPY, (slot("dst", _W), view("src", _R)), cp_async, CostClass.COPY,
          ordering=Ordering.BARRIER, completion=Completion.COPY_GROUP, engine="cp_async",
          summary="cp.async (Ampere-style, per-thread 16 B) copy of a gmem window into an smem slot, "
                  "zero-filling past the edge; visible after cp_async_wait and a barrier.",
          example="cp_async(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)])",
          preconditions=("dst shape equals the window",)),
    OpDef(Op.CP_ASYNC_WAIT, Family.SYNC, (value("n"),), no_effect, CostClass.FREE,
          sync=SyncKind.COPY_WAIT,
          summary="Wait until at most `n` cp.async groups of this thread are in flight.",
          example="cp_async_wait(0)"),
    OpDef(Op.CP_ASYNC_BAR, Family.COPY, (slot("dst", _W), view("src", _R), barrier("bar", BarrierUse.TRACK,
                                                                                    keyword=True)),
          cp_async_bar, CostClass.COPY, ordering=Ordering.ASYNC, completion=Completion.BARRIER,
          engine="cp_async", swizzle=True,
          summary="cp.async copy of a gmem window into an smem slot (laid out in the slot's swizzle, "
                  "zero past the tensor's edge) in 16, 8 or 4-byte chunks, as the window's row alignment "
                  "allows (element by element otherwise): the TMA-free producer for rows that are not "
                  "16-byte aligned. The copies complete on `bar` (cp.async.mbarrier.arrive) without an "
                  "arrival of their own: the role arrives on `bar` after them; a wgmma reader runs "
                  "fence_async() after its wait (the copies are generic-proxy writes).",
          example="cp_async_bar(c_s[s], c[bid.y, tile(kt, BN), tile(0, BK)], bar=full[s])",
          preconditions=("inside a role (the role's threads synchronise before it returns)",
                         "dst shape and dtype equal the window's",
                         "a swizzled dst has rows of exactly one 128-byte span",
                         "arrive(bar) after it in the same phase; wait(bar) and fence_async() before "
                         "a wgmma reads dst")),
    OpDef(Op.FENCE_ASYNC, Family.SYNC, (), no_effect, CostClass.FREE, sync=SyncKind.PROXY_FENCE,
          summary="fence.proxy.async: order ordinary smem writes before later TMA/wgmma reads.",
          example="fence_async()"),
    OpDef(Op.ROLE_SYNC, Family.SYNC, (), no_effect, CostClass.FREE, sync=SyncKind.ROLE,
          summary="Barrier of the enclosing role's threads (bar.sync on the role's named barrier): the smem writes "
                  "the role's threads made before it are visible to all of them after it. With fence_async() "
                  "before it, one thread's TMA store or the role's wgmma may read a tile every thread of the "
                  "role wrote (an accumulator cast into a wgmma operand).",
          example="role_sync()",
          preconditions=("inside a role (at the top level, sync())",)),
    OpDef(Op.CLUSTER, Family.STRUCTURE, (value("dims", "shape"),), no_effect, CostClass.FREE,
          summary="Declare the thread-block cluster shape (CTAs along x, y, z); at most the target's "
                  "max_cluster_size CTAs.",
          example="cluster((2, 1, 1))",
          preconditions=("static dims", "top level, first statement")),
    OpDef(Op.CLUSTER_SYNC, Family.SYNC, (), no_effect, CostClass.FREE, sync=SyncKind.CLUSTER,
          summary="Cluster-wide barrier (barrier.cluster.arrive + wait).",
          example="cluster_sync()"),
    OpDef(Op.WGMMA, Family.MMA, (_ACC, replace(slot("a", _R), space=(MemSpace.SMEM, MemSpace.RMEM)), slot("b", _R)),
          mma_slots, CostClass.MMA,
          {"b_major": AttrSpec(str, "n", ("n", "k")), "a_major": AttrSpec(str, "k", ("k", "m")),
           "accumulate": AttrSpec(bool, True)},
          ordering=Ordering.ASYNC, proxy=Proxy.ASYNC, completion=Completion.MMA_GROUP, atom="wgmma", swizzle=True,
          summary="Warpgroup MMA, issued asynchronously by the role: acc (rmem f32, 64 rows per "
                  "warpgroup) += a (smem, M x K) @ b (smem, K x N), one commit group. b_major=\"k\": b is "
                  "(N, K), rows along the reduction dim like a (e.g. centroid or database rows), and acc += "
                  "a @ b.T. accumulate=False: acc = a @ b (acc's old value dropped). a may instead be a 16-bit "
                  "register fragment of the role (an (M, K) bf16/f16 rmem tile allocated in it, e.g. an "
                  "accumulator cast to bf16: attention's probabilities times V), read 16 columns per k-step "
                  "in the accumulator's own layout; it must not change until the wgmma_wait that retires it. "
                  "a_major=\"m\": a is (K, M) in smem, rows along the reduction dim (e.g. a chunk's keys for "
                  "K^T V), and acc += a.T @ b.",
          example='wgmma(acc, x_s[0], c_s[kt % S], b_major="k", accumulate=False)',
          preconditions=("inside a role of whole warpgroups", "M = 64 * warpgroups, N in 8..256 step 8, "
                         "K a multiple of 16 (16-bit)", "a and b in smem with the same swizzle, or a a 16-bit "
                         "register fragment of the role (and b in smem)",
                         "b_major=\"k\": b is (N, K) with swizzle=128 rows of one span (K = 64 for 16-bit)",
                         "a_major=\"m\": a is an smem (K, M) 16-bit tile with swizzle=128, 64 columns (one span) "
                         "per warpgroup",
                         "wgmma_wait before the slots are released")),
    OpDef(Op.WGMMA_WAIT, Family.SYNC, (value("n"),), no_effect, CostClass.FREE, sync=SyncKind.MMA_WAIT,
          summary="wgmma.wait_group: wait until at most `n` wgmma groups of the role are in flight.",
          example="wgmma_wait(0)"),
    OpDef(Op.ARGMIN_BIAS, Family.EPILOGUE, (buf("best", _RW, _RMEM), buf("arg", _RW, _RMEM, index=True),
                                            buf("dots", _R, _RMEM), slot("bias", _R)) + _BASE_LIMIT,
          argmin_bias, CostClass.EPILOGUE, {"beta": AttrSpec(float, 2.0)}, ordering=Ordering.ASYNC,
          summary="Running arg-min on a wgmma accumulator: for each row r of dots (R, C), the scores "
                  "bias[j] - beta * dots[r, j] over columns with base + j < limit; the smallest replaces "
                  "(best[r], arg[r]) with (score, base + j) when strictly smaller than best[r] (ties keep the "
                  "smaller candidate index). bias is an smem slot of C f32 values (e.g. ||c_j||^2, with "
                  "beta=2 the scores rank squared L2 distances). best and arg are fragment row state: store "
                  "is the only other op that reads them.",
          example="argmin_bias(best, arg, acc, csq_s[kt % S], base=kt * BN, limit=K)",
          preconditions=("dots is the role's wgmma accumulator (R, C), f32", "best (R,) f32 filled with inf, "
                         "arg (R,) i32, both rmem in the same role", "bias is an smem f32 slot of C elements",
                         "wgmma_wait before it: dots complete")),
    OpDef(Op.TOPK_BIAS, Family.EPILOGUE, (buf("top_v", _RW, _LISTS), buf("top_i", _RW, _LISTS, index=True),
                                          buf("dots", _R, _RMEM), slot("bias", _R)) + _BASE_LIMIT,
          topk_bias, CostClass.EPILOGUE, {"beta": AttrSpec(float, 2.0)}, ordering=Ordering.ASYNC,
          summary="Running top-k (smallest) on a wgmma accumulator: for each row r of dots (R, C), the "
                  "scores bias[j] - beta * dots[r, j] over columns with base + j < limit merge into the "
                  "row's KMAX smallest (score, index) pairs kept in top_v[r, :] / top_i[r, :] (R, KMAX), "
                  "ascending by score, then by index. bias is an smem slot of C f32 values (e.g. ||db_j||^2: "
                  "with beta=2 the scores rank squared L2 distances). In rmem, top_v and top_i are fragment row "
                  "state: store is the only other op that reads them, writing the first k <= KMAX columns. In "
                  "one-stage smem tiles (KMAX <= 128), each row's list is kept sorted in place by the quad that "
                  "owns the row; fill them in the role and role_sync before the loop.",
          example="topk_bias(top_v, top_i, acc, nrm_s[t % S], base=t * BN, limit=N)",
          preconditions=("dots is the role's wgmma accumulator (R, C), f32", "top_v (R, KMAX) f32 filled with "
                         "inf, top_i (R, KMAX) i32, both rmem in the same role (KMAX <= 32) or both one-stage "
                         "smem tiles (KMAX <= 128) filled in the role before a role_sync",
                         "bias is an smem f32 slot of C elements", "wgmma_wait before it: dots complete")),
    OpDef(Op.TOPK_SHIFT, Family.EPILOGUE, (buf("top_v", _RW, _LISTS), slot("rows", _R)),
          topk_shift, CostClass.SIMT, ordering=Ordering.ASYNC,
          summary="Add rows[r] to every value top_v[r, :] of a topk_bias list (f32; inf stays inf): the order "
                  "does not change, and what store or topk_publish writes afterwards is shifted too, e.g. "
                  "||q_r||^2 + (||db_j||^2 - 2 q_r.db_j), the whole squared distance. rows is an smem f32 slot "
                  "of R values (sqnorm_rows of the query tile).",
          example="topk_shift(top_v, qn_s[0])",
          preconditions=("inside the role of the topk_bias that fills top_v, after its loop",
                         "top_v (R, KMAX) that topk_bias's list; rows an smem f32 slot of R values",
                         "rows ready: written by sqnorm_rows and published (arrive, then wait) before it")),
    OpDef(Op.SQNORM_ROWS, Family.EPILOGUE, (slot("dst", ByAttr("accumulate", ((False, _W), (True, _RW)))),
                                            slot("src", _R)),
          sqnorm_rows, CostClass.ROW_REDUCE, {"accumulate": AttrSpec(bool, False)},
          ordering=Ordering.ASYNC, swizzle=True,
          summary="dst[r] = sum_c src[r, c]^2 in f32 (accumulate=True: dst[r] += ...) for an smem tile src "
                  "(R, C) of 16-bit rows (swizzled or not: a row's sum does not depend on the order of its "
                  "chunks) and an smem f32 slot dst of R values; one or two threads per row. The role's threads "
                  "synchronise before it returns, so an arrive after it publishes dst.",
          example="sqnorm_rows(nrm_s[t % S], db_s[t % S * 2], accumulate=False)",
          preconditions=("inside a role (every thread of the role runs it)", "src (R, C) bf16/f16 smem, each "
                         "row at most one swizzle span when swizzled", "dst an smem f32 slot of R values",
                         "src landed (wait on its full barrier first)")),
    OpDef(Op.TOPK_PUBLISH, Family.CLUSTER, (buf("pub_v", _W, _SMEM, cluster=True),
                                            buf("pub_i", _W, _SMEM, index=True, cluster=True),
                                            buf("top_v", _R, _LISTS), buf("top_i", _R, _LISTS, index=True)),
          topk_publish, CostClass.FREE, ordering=Ordering.ASYNC,
          summary="Publish topk_bias lists to the cluster: write each row's merged (R, KMAX) list, ascending "
                  "by (value, index), into smem tiles pub_v (f32) and pub_i (i32) of this CTA (the quad merge "
                  "of store, every column). Visible to the cluster's CTAs after the next cluster_sync().",
          example="topk_publish(pub_v, pub_i, top_v, top_i)",
          preconditions=("inside the role of the topk_bias that fills top_v / top_i, after its loop",
                         "pub_v (R, KMAX) f32 and pub_i (R, KMAX) i32 smem tiles of one stage, the "
                         "lists' shape")),
    OpDef(Op.TOPK_CLUSTER_MERGE, Family.CLUSTER, (view("dst", _W), buf("pub_v", _R, _SMEM, cluster=True),
                                                  buf("pub_i", _R, _SMEM, index=True, cluster=True)),
          topk_cluster_merge, CostClass.FREE, ordering=Ordering.ASYNC,
          summary="Merge published top-k lists across the cluster: CTA rank c of n takes rows [c * ceil(R / n), "
                  "(c + 1) * ceil(R / n)) of the (R, KMAX) tiles pub_v / pub_i, merges the lists of every CTA "
                  "of the cluster (mapa + ld.shared::cluster) by (value, index) and writes the first k "
                  "(the window's columns) of each row to dst: indices for an i32 dst, values for f32. Rows "
                  "past the tensor's edge are skipped.",
          example="topk_cluster_merge(idx[tile(bid.x, BM), tile(0, k)], pub_v, pub_i)",
          preconditions=("top level, after the roles: every thread of the CTA runs it",
                         "cluster_sync() between the topk_publish and it, and again before the kernel exits",
                         "dst a (R, k) window, k <= KMAX; the CTAs of a cluster share the window's rows")),
    OpDef(Op.ACC_PUBLISH, Family.CLUSTER, (buf("part", _W, _SMEM, cluster=True), buf("acc", _R, _RMEM)),
          acc_publish, CostClass.FREE, ordering=Ordering.ASYNC,
          summary="Publish a wgmma accumulator to the cluster: write acc (R, C) f32, this CTA's partial sum, "
                  "into the smem tile part of this CTA (laid out by the lowering: only acc_cluster_reduce "
                  "reads it). Visible to the cluster's CTAs after the next cluster_sync().",
          example="acc_publish(part_s, acc)",
          preconditions=("inside the role of the wgmma that accumulates acc, after its wgmma_wait(0)",
                         "part a one-stage smem f32 tile of acc's shape, touched by no other op")),
    OpDef(Op.ACC_CLUSTER_REDUCE, Family.CLUSTER, (view("dst", _W), buf("part", _R, _SMEM, cluster=True)),
          acc_cluster_reduce, CostClass.COPY, ordering=Ordering.ASYNC,
          summary="Sum the published partial tiles over the cluster and store them: the in-bounds elements of "
                  "the (R, C) window, as row-major chunks of 4 columns, are split evenly over the cluster's "
                  "CTAs (rank c takes chunks [c * ceil(T / n), (c + 1) * ceil(T / n)) of T); each sums its "
                  "chunks over every CTA's part (mapa + 16-byte ld.shared::cluster, in rank order, f32) and "
                  "stores them with plain (vector) stores. Every in-bounds element is written once, so the "
                  "output needs no zeroing and no atomics.",
          example="acc_cluster_reduce(c[tile(bid.z, BM), tile(bid.x, BN)], part_s)",
          preconditions=("top level, after the roles: every thread of the CTA runs it",
                         "cluster_sync() between the acc_publish and it, and again before the kernel exits",
                         "dst an f32 window of part's shape; the CTAs of a cluster share the window (its "
                         "indices do not use the bid coordinates the cluster spans)")),
    OpDef(Op.TCGEN05_MMA, Family.MMA, (buf("acc", _RW, (MemSpace.RMEM, MemSpace.TMEM)), slot("a", _R),
                                       slot("b", _R)),
          mma_slots, CostClass.MMA, ordering=Ordering.ASYNC, proxy=Proxy.ASYNC,
          completion=Completion.MMA_GROUP, atom="tcgen05", swizzle=True,
          summary="Blackwell tcgen05 MMA (sm_100a only; declared, not lowered for sm_90a): acc += a @ b "
                  "with the accumulator in tensor memory.",
          example="tcgen05_mma(acc, a_s[s], b_s[s])",
          preconditions=("target sm_100a",)),
)
