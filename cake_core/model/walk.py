"""The per-CTA walk behind the cost-model features (``features.extract``): what one program does per CTA at one
shape, and each of its gmem copies as a stream for the grid analysis.

Per CTA (CTA 0 stands for every CTA), summed over loop trips: tensor-core FLOPs by MMA
atom (``mma``'s atom, ``wgmma``, ``tcgen05_mma``: every MMA op counts), SIMT work, gmem bytes by copy
engine (plain loads, cp.async, TMA), gmem writes, atomics (gmem element or ``red.v4`` operations; adds
into smem apart, by lowering: shared-memory atomics or warp-owned rows), the smem traffic of MMA operands, CTA
barriers, and the bytes each copy keeps in flight (its ring depth, or the unroll of its loop). An ``if`` whose
condition folds under the shape (``M <= 8``) counts only when taken; a loop whose ``if``/binding depends on its
variable is walked trip by trip (a sample of trips when long), so ``if i > 0`` counts ``trips - 1`` times. A value
read from memory (``scalar``) stands at its declared maximum in windows; an ``if`` it decides is counted as taken,
and a loop it bounds runs to the bound's greatest value over [0, max] of each such value (``eos - bos`` with both
at most T: T trips).

Op coverage: ``TRAFFIC`` classifies every registered op (a test checks it); FLOPs and bytes per op come
from the per-op hooks of ``charges.py`` (``cost_hook``), except atomics, counted here from the added tile.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cake_core.ir.expr import Expr, substitute, symbols, try_evaluate
from cake_core.ir.intervals import Interval, bounds
from cake_core.ir.opdef import CostClass, Scope
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Slot, Tile, View, loop_range
from cake_core.ir.program import Program
from cake_core.ir.rule_ctx import view_extent
from cake_core.ir.types import MemSpace
from cake_core.model.charges import HOOKS, Work

ENGINES = ("none", "load", "cp_async", "tma")
MAX_WALKED_TRIPS = 32          # a loop walked trip by trip visits at most this many trips (evenly spaced)
# cp_async_smem_gmem's element-by-element path (rows not 16-byte aligned) is unrolled by 4 in its PTX: four
# ld.global ahead of their st.shared, so a thread keeps at most four elements in flight.
SYNC_COPY_ELEMS_IN_FLIGHT = 4

# What each op moves: (class, engine). read: gmem -> smem/rmem; write: smem/rmem -> gmem; atomic: adds
# into gmem or smem; mma: tensor-core or FMA matrix multiply; simt: tile math; none: structure, allocation,
# synchronisation (sync is counted apart).
TRAFFIC: dict[Op, tuple[str, str]] = {
    Op.LOAD: ("read", "load"), Op.CP_ASYNC: ("read", "cp_async"), Op.CP_ASYNC_BAR: ("read", "cp_async"),
    Op.TMA_LOAD: ("read", "tma"), Op.GATHER_ADD: ("read", "load"), Op.GATHER: ("read", "load"),
    Op.STORE: ("write", "load"), Op.TMA_STORE: ("write", "tma"), Op.ACC_CLUSTER_REDUCE: ("write", "load"),
    Op.TOPK_CLUSTER_MERGE: ("write", "load"),
    Op.ATOMIC_ADD: ("atomic", ""), Op.SCATTER_ADD: ("atomic", ""),
    Op.MMA: ("mma", ""), Op.WGMMA: ("mma", ""), Op.TCGEN05_MMA: ("mma", ""),
    Op.FILL: ("simt", ""), Op.CAST: ("simt", ""), Op.UNARY: ("simt", ""), Op.EWISE: ("simt", ""),
    Op.SELECT: ("simt", ""), Op.IOTA: ("simt", ""),
    Op.TRANSPOSE: ("simt", ""), Op.TRISOLVE: ("simt", ""), Op.REDUCE: ("simt", ""), Op.SCAN: ("simt", ""), Op.ARGMIN: ("simt", ""),
    Op.ARGMAX: ("simt", ""), Op.ARGMIN_UPDATE: ("simt", ""), Op.TOPK_MERGE: ("simt", ""),
    Op.ARGMIN_BIAS: ("simt", ""), Op.TOPK_BIAS: ("simt", ""), Op.TOPK_SHIFT: ("simt", ""), Op.SQNORM_ROWS: ("simt", ""),
    Op.TOPK_PUBLISH: ("simt", ""), Op.ACC_PUBLISH: ("simt", ""),
    Op.SMEM: ("none", ""), Op.RMEM: ("none", ""), Op.SYNC: ("none", ""), Op.MBARRIER: ("none", ""),
    Op.EXPECT_TX: ("none", ""), Op.ARRIVE: ("none", ""), Op.WAIT: ("none", ""), Op.CP_ASYNC_WAIT: ("none", ""),
    Op.FENCE_ASYNC: ("none", ""), Op.ROLE_SYNC: ("none", ""), Op.CLUSTER: ("none", ""), Op.CLUSTER_SYNC: ("none", ""),
    Op.WGMMA_WAIT: ("none", ""), Op.FOR: ("none", ""), Op.IF: ("none", ""), Op.ROLE: ("none", ""),
    Op.LET: ("none", ""),
    Op.TILE_ORDER: ("none", ""),
    Op.SCALAR: ("none", ""),
    Op.FETCH_ADD: ("atomic", ""),     # one element per CTA
    Op.COMPACT: ("simt", ""),
}


def cost_hook(op: Op):
    """The per-op FLOP/byte hook of the analytic model: the hook of the cost class the op declares."""
    return HOOKS[REGISTRY[op].cost]


@dataclass
class Stream:
    """One gmem copy op over the grid: its window's index expressions (bindings expanded) and bytes."""

    node: Node
    kind: str                   # read | write | atomic
    buf: str
    index: tuple[Expr, ...]     # the view's Tile/At indices, in terms of bid, loop variables, dims, consts
    loops: tuple[tuple[str, Expr], ...]   # enclosing loops (var, start) outermost first
    bytes: float = 0.0          # CTA 0's bytes over its trips
    unique: float = 0.0         # ... counting once a window that loops not in its index repeat


@dataclass
class _Acc:
    tensor: dict[str, float]
    simt: float = 0.0
    reads: dict[str, float] = field(default_factory=lambda: {e: 0.0 for e in ENGINES[1:]})
    write: float = 0.0
    atomic_ops: float = 0.0
    atomic_bytes: float = 0.0
    smem_atomic_ops: float = 0.0
    smem_owned_ops: float = 0.0
    smem_operand: float = 0.0
    syncs: float = 0.0
    copy_trips: float = 0.0
    tile: tuple[int, int, int] = (0, 0, 0)
    multicast: bool = False


def _view_of(n: Node) -> View | None:
    cls = TRAFFIC[n.op][0]
    if cls == "read":
        v = n.arg("src")
    elif cls in ("write", "atomic"):
        v = n.arg("dst")
    else:
        return None
    return v if isinstance(v, View) else None


def buf_name(x: Any) -> str:
    return x.buf if isinstance(x, (View, Slot)) else x


class Walker:
    def __init__(self, program: Program, ctx, env: dict[str, int]):
        self.program, self.ctx, self.env = program, ctx, env
        self.lets: dict[str, Expr] = {}
        self.loops: list[tuple[str, Expr, int]] = []     # enclosing loops: var, start, trips
        self.unroll: list[int] = [1]
        self.acc = _Acc(tensor={})
        self.streams: dict[int, Stream] = {}
        self.inflight: dict[int, float] = {}       # per async copy op: bytes of one issue x its ring depth
        self.sync_inflight: dict[int, float] = {}  # per synchronous copy op: what its threads keep in flight
        self.sync_bytes = 0.0                      # ... and the bytes such copies read
        self.roles: list[Node] = [n for n in program.body if n.op is Op.ROLE]
        self.math_roles: set[int] = set()
        self.role: Node | None = None
        self.max_unroll = 1
        self.read: dict[str, int] = {}             # names read from memory (scalar, fetch_add...): declared maximum

    def expand(self, e: Expr) -> Expr:
        return substitute(e, self.lets) if self.lets else e

    def _depends(self, nodes: tuple[Node, ...], var: str) -> bool:
        """Whether an ``if`` or a binding in ``nodes`` reads ``var`` (through bindings too)."""
        for n in nodes:
            if n.op is Op.IF and var in symbols(self.expand(n.arg("cond"))):
                return True
            if n.op is Op.LET and var in symbols(self.expand(n.arg("value"))):
                return True
            if n.body and self._depends(n.body, var):
                return True
        return False

    def walk(self, nodes: tuple[Node, ...], trips: float) -> None:
        saved = dict(self.lets)
        for n in nodes:
            if n.op is Op.FOR:
                self._for(n, trips)
            elif n.op is Op.IF:
                cond = self.expand(n.arg("cond"))
                # unknown, or decided by a value read from memory (at its maximum, a range like end - start would
                # be empty): assumed taken
                taken = None if symbols(cond) & set(self.read) else try_evaluate(cond, self.env)
                if taken is None or taken:
                    self.walk(n.body, trips)
            elif n.op is Op.ROLE:
                self.role = n
                self.walk(n.body, trips)
                self.role = None
            elif n.op is Op.LET:
                cost_hook(n.op)(n, self.ctx, self.env, trips, Work())
                self.lets[n.arg("var")] = self.expand(n.arg("value"))
            elif n.decl.data_dependent:             # a value read from memory: counted at its declared maximum
                HOOKS[CostClass.BIND](n, self.ctx, self.env, trips, Work())
                self.read.update({k: self.env[k] for k in REGISTRY[n.op].bound_names(n, Scope.BLOCK)
                                  if isinstance(self.env.get(k), int)})
                self._leaf(n, trips)                # and what the op does besides (an atomic, a compaction)
            else:
                self._leaf(n, trips)
        self.lets = saved

    def _for(self, n: Node, trips: float) -> None:
        exprs = [self.expand(x) for x in loop_range(n)]
        start, stop, step = (try_evaluate(x, self.env) for x in exprs)
        stop_expr = exprs[1]
        if symbols(stop_expr) & set(self.read):   # a bound read from memory (eos - bos): its greatest value
            env = {k: Interval(v, v) for k, v in self.env.items() if isinstance(v, int)}
            env.update({k: Interval(0, hi) for k, hi in self.read.items()})
            hi = bounds(stop_expr, env).hi
            stop = hi if hi is not None else stop
        if start is None or stop is None or step is None:
            return                                  # a bound CTA 0 cannot know: nothing counted
        values = range(int(start), int(stop), max(int(step), 1))
        var = n.arg("var")
        self.loops.append((var, self.expand(loop_range(n)[0]), len(values)))
        self.unroll.append(max(n.attr("unroll"), 1))
        self.max_unroll = max(self.max_unroll, n.attr("unroll"))
        before = self.env.get(var)
        if len(values) and self._depends(n.body, var):
            picks = values if len(values) <= MAX_WALKED_TRIPS else \
                [values[round(i * (len(values) - 1) / (MAX_WALKED_TRIPS - 1))] for i in range(MAX_WALKED_TRIPS)]
            weight = len(values) / len(picks)
            for v in picks:
                self.env[var] = v
                self.walk(n.body, trips * weight)
        elif len(values):
            self.env[var] = values[0]               # the first trip stands for all (windows, bindings)
            self.walk(n.body, trips * len(values))
        if before is None:
            self.env.pop(var, None)
        else:
            self.env[var] = before
        self.loops.pop()
        self.unroll.pop()

    def _leaf(self, n: Node, trips: float) -> None:
        cls, engine = TRAFFIC[n.op]
        a = self.acc
        if n.op is Op.SYNC:
            a.syncs += trips
            return
        if cls == "none":
            return
        w = Work()
        if cls != "atomic":
            cost_hook(n.op)(n, self.ctx, self.env, trips, w)
        if cls == "mma":
            self._mma(n, w, trips)
        elif cls == "simt":
            a.simt += w.simt_flops
        elif cls == "read":
            issue = w.bytes / max(trips, 1e-9)
            dst = self.ctx.buffers.get(buf_name(n.arg("dst")))
            depth = dst.stages if dst is not None and dst.stages > 1 else self.unroll[-1]
            sync = n.op is Op.CP_ASYNC and not self._cp_async_chunked(n)
            if sync:
                # rows not 16-byte aligned at this shape: the copy goes element by element, synchronously
                elem = self.ctx.buffers[n.arg("src").buf].dtype.bytes
                engine = "load"
                a.simt += w.bytes / elem
                self.sync_bytes += w.bytes
                self.sync_inflight[id(n)] = min(issue, self.ctx.threads_of(n) * SYNC_COPY_ELEMS_IN_FLIGHT * elem)
            a.reads[engine] += w.bytes
            a.simt += w.simt_flops
            a.copy_trips += trips
            if n.op is Op.TMA_LOAD and n.attr("multicast"):
                a.multicast = True
            if not sync:
                self.inflight[id(n)] = max(self.inflight.get(id(n), 0.0), issue * depth)
            self._stream(n, "read", w.bytes)
        elif cls == "write":
            a.write += w.bytes
            self._stream(n, "write", w.bytes)
        else:
            self._atomic(n, trips)

    def inflight_bytes(self) -> float:
        """Gmem bytes one CTA keeps in flight. Async copies overlap one another: their rings add up.
        Synchronous copies run one after another (the largest counts), and they bound the bytes they
        read: with both kinds, the bytes-weighted harmonic mean of the two."""
        rings = sum(self.inflight.values())
        if not self.sync_inflight:
            return rings
        sync = max(self.sync_inflight.values())
        async_bytes = sum(self.acc.reads.values()) - self.sync_bytes
        if not rings or async_bytes <= 0:
            return sync
        return (async_bytes + self.sync_bytes) / (async_bytes / rings + self.sync_bytes / sync)

    def _cp_async_chunked(self, n: Node) -> bool:
        """Whether ``cp_async`` moves its window in 16-byte cp.async chunks at this shape (as
        ``cake::cp_async_smem_gmem`` decides at run time): the window's columns are the tensor's last
        dimension, whole chunks wide, and its start and row stride are 16-byte multiples. Unknown: yes."""
        v = n.arg("src")
        t = self.ctx.buffers.get(v.buf) if isinstance(v, View) else None
        if t is None:
            return True
        dims = [try_evaluate(d, self.env) for d in t.shape]
        if any(d is None for d in dims):
            return True
        kept = [d for d, ix in enumerate(v.index) if isinstance(ix, (Tile, Full))]
        ext = view_extent(self.ctx, v)
        cols = try_evaluate(ext[-1], self.env) if ext else None
        if not kept or cols is None:
            return True
        elem = t.dtype.bytes
        stride = [math.prod(dims[d + 1:]) for d in range(len(dims))]
        offset = 0
        for d, ix in enumerate(v.index):
            if isinstance(ix, Tile) and ix.offset:
                offset += (try_evaluate(self.expand(ix.start), self.env) or 0) * stride[d]
            elif isinstance(ix, (Tile, At)):
                first = try_evaluate(self.expand(ix.index), self.env) or 0
                size = try_evaluate(ix.size, self.env) or 0 if isinstance(ix, Tile) else 1
                offset += first * size * stride[d]
        ld_row = stride[kept[0]] if len(kept) == 2 else 0
        return kept[-1] == len(dims) - 1 and (cols * elem) % 16 == 0 and (ld_row * elem) % 16 == 0 \
            and (offset * elem) % 16 == 0

    def _mma(self, n: Node, w: Work, trips: float) -> None:
        a = self.acc
        atom = w.atom if n.op is Op.MMA else n.op.value
        acc = self.ctx.buffers[n.arg("acc")]
        op_a = self.ctx.buffers[buf_name(n.arg("a"))]
        op_b = self.ctx.buffers[buf_name(n.arg("b"))]
        # f32 operands of mma_sync run as three tf32 products, each at half the 16-bit rate: 6x the 16-bit time
        tf32x3 = n.op is Op.MMA and atom == "mma_sync" and op_a.dtype.bytes == 4
        a.tensor[atom] = a.tensor.get(atom, 0.0) + w.flops * (6.0 if tf32x3 else 1.0)
        m, nn = (int(try_evaluate(d, self.env) or 0) for d in acc.shape[-2:])
        k = int(try_evaluate(op_a.shape[-1], self.env) or 0)
        if m * nn > a.tile[0] * a.tile[1]:
            a.tile = (m, nn, k)
        bytes_a, bytes_b = m * k * op_a.dtype.bytes, nn * k * op_b.dtype.bytes
        if n.op is Op.MMA and (op_a.space is not MemSpace.SMEM and op_b.space is not MemSpace.SMEM):
            return
        if n.op is Op.MMA:
            # warps in a near-square grid each read their rows of a and columns of b from smem
            warps = max(self.ctx.threads_of(n) // 32, 1)
            wm = 2 ** (int(math.log2(warps)) // 2)
            wn = max(warps // wm, 1)
            a.smem_operand += (bytes_a * wn * (op_a.space is MemSpace.SMEM) +
                               bytes_b * wm * (op_b.space is MemSpace.SMEM)) * trips
        else:
            # each warpgroup reads its 64 rows of a and all of b
            wgs = max(m // 64, 1)
            a.smem_operand += (bytes_a + bytes_b * wgs) * trips
        self.math_roles.add(id(self.role) if self.role is not None else 0)

    def _atomic(self, n: Node, trips: float) -> None:
        a = self.acc
        one = n.op is Op.FETCH_ADD                  # one element, added by one thread
        src = None if one else self.ctx.buffers.get(buf_name(n.arg("src")))
        dst = self.ctx.buffers.get(buf_name(n.arg("dst")))
        if (src is None and not one) or dst is None:
            return
        elems = (1 if one else math.prod(int(try_evaluate(d, self.env) or 0) for d in src.shape)) * trips
        if dst.space is MemSpace.GMEM:
            vec = n.attr("vector") if n.op is Op.SCATTER_ADD else 1
            a.atomic_ops += elems / vec
            a.atomic_bytes += elems * dst.dtype.bytes
            self._stream(n, "atomic", elems * dst.dtype.bytes)
        elif n.op is Op.SCATTER_ADD and n.attr("owner") == "warp":
            a.smem_owned_ops += elems
        else:
            a.smem_atomic_ops += elems

    def _stream(self, n: Node, kind: str, nbytes: float) -> None:
        s = self.streams.get(id(n))
        if s is None:
            v = _view_of(n)
            if v is None:
                return
            index = tuple(self.expand(i.start if isinstance(i, Tile) and i.offset else
                                      i.index if isinstance(i, (Tile, At)) else 0) for i in v.index
                          if not isinstance(i, Full))
            s = self.streams[id(n)] = Stream(n, kind, v.buf, index, tuple((x, st) for x, st, _ in self.loops))
        used = set().union(*(symbols(i) for i in s.index)) if s.index else set()
        repeats = math.prod(t for x, _, t in self.loops if x not in used and t > 0)
        s.bytes += nbytes
        s.unique += nbytes / repeats
