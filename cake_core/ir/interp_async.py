"""Interpreter semantics of the async ops, and the executor that runs warp roles.

Sibling ``with role(...)`` blocks run as cooperative coroutines (generators)
inside one CTA: each role has its own loop variables and runs until a
``wait`` finds its barrier phase not yet completed, then yields to the next
role. When a whole round passes with every unfinished role blocked, the CTA
is deadlocked: that raises :class:`InterpFault` at the first blocked wait
(what the GPU would show as a hang, caught by the watchdog).

Copies are synchronous here: ``tma_load`` writes its box (zero-filled past
the tensor edge) and completes its bytes on the barrier at once; ``wgmma``
computes ``acc += a @ b`` in fp32 at issue, so ``wgmma_wait`` and
``cp_async_wait`` have nothing left to wait for. Races that only an
asynchronous machine would show are the protocol checker's job
(``ir.protocol``).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from cake_core.ir.interp import SEMANTICS, InterpFault, _clip, _CTA, _round, loop_values
from cake_core.ir.ops import Node, Op, Tile, View
from cake_core.ir.ops_async import Slot
from cake_core.ir.program import Program, walk


class Barrier:
    """One mbarrier: completed phases, arrivals still pending in this phase, transaction bytes outstanding."""

    __slots__ = ("arrivals", "pending", "tx", "done")

    def __init__(self, arrivals: int):
        self.arrivals, self.pending, self.tx, self.done = arrivals, arrivals, 0, 0

    def _settle(self) -> None:
        while self.pending <= 0 and self.tx == 0:
            self.done += 1
            self.pending += self.arrivals

    def arrive(self, count: int = 1) -> None:
        self.pending -= count
        self._settle()

    def expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._settle()

    def passed(self, parity: int) -> bool:
        """try_wait.parity: the phase of this parity has completed."""
        return self.done % 2 != parity % 2


# ------------------------------------------------------------------ helpers

def _state(cta: _CTA) -> dict:
    st = getattr(cta, "async_state", None)
    if st is None:
        stages = {n.result: n.attr("stages") for n, _, _ in walk(cta.prog.body) if n.op is Op.SMEM}
        st = cta.async_state = {"bars": {}, "stages": stages, "role_wgs": None, "steps": 0}
    return st


def _slot(cta: _CTA, n: Node, s: Slot, owner: _CTA | None = None) -> np.ndarray:
    """The array of one ring slot (or the whole tile when it has one stage); the index is evaluated in
    ``cta``, the slot taken from ``owner`` (a cluster peer: the same slot in another CTA)."""
    owner = owner or cta
    if s.buf not in owner.tiles:
        raise InterpFault(n, f"`{s.buf}` is not allocated")
    arr = owner.tiles[s.buf]
    stages = _state(cta)["stages"].get(s.buf, 1)
    if s.index is None:
        if stages > 1:
            raise InterpFault(n, f"`{s.buf}` is a ring of {stages} stages: index a slot, {s.buf}[s]")
        return arr
    i = cta.ev(s.index)
    if stages == 1:
        if i != 0:
            raise InterpFault(n, f"slot {i} of `{s.buf}`, which has one stage")
        return arr
    if not 0 <= i < stages:
        raise InterpFault(n, f"slot {i} of `{s.buf}` is outside its {stages} stages")
    return arr[i]


def _bar(cta: _CTA, n: Node, s: Slot, owner: _CTA | None = None) -> Barrier:
    bars = _state(owner or cta)["bars"].get(s.buf)
    if bars is None:
        raise InterpFault(n, f"`{s.buf}` is not an mbarrier")
    i = cta.ev(s.index) if s.index is not None else 0
    if not 0 <= i < len(bars):
        raise InterpFault(n, f"barrier {s.buf}[{i}] is outside its {len(bars)} slots")
    return bars[i]


def _box(cta: _CTA, n: Node, v: View, dst: np.ndarray, dtype, rows: int = 0) -> int:
    """Copy a gmem window into ``dst``, zero past the edge; returns the box bytes. ``rows`` > 0: only the
    first ``rows`` rows (first dimension) of the box land, in the slot's first rows; the rest of the slot
    keeps what it held."""
    win, shape = cta.window(n, v)
    g, t = _clip(n, v, win, shape, True, "read")
    ext = tuple(length for _, length, kept in win if kept)
    if int(np.prod(ext)) != dst.size:
        raise InterpFault(n, f"the window {ext} of `{v.buf}` does not fill the {dst.shape} slot")
    tile = np.zeros(ext, dtype=dst.dtype)
    tile[t] = cta.gmem[v.buf][g].reshape(tile[t].shape)
    box = _round(dtype, tile.reshape(dst.shape))
    if not rows:
        dst[...] = box
        return dst.size * dtype.bytes
    dst[:rows] = box[:rows]
    return dst[:rows].size * dtype.bytes


# ---------------------------------------------------------------- semantics

def _mbarrier(cta: _CTA, n: Node) -> None:
    _state(cta)["bars"][n.result] = [Barrier(n.attr("arrivals")) for _ in range(cta.ev(n.args[0]))]


def _peers(cta: _CTA, n: Node, mask: int) -> list[_CTA]:
    """The CTAs of ``cta``'s cluster that a multicast mask names."""
    cluster = getattr(cta, "cluster", None)
    if cluster is None:
        raise InterpFault(n, f"multicast={mask:#x} outside a cluster: declare cluster((n, 1, 1))")
    if mask >> len(cluster):
        raise InterpFault(n, f"multicast mask {mask:#x} names CTAs beyond the cluster of {len(cluster)}")
    return [c for r, c in enumerate(cluster) if mask >> r & 1]


def _arrive(cta: _CTA, n: Node) -> None:
    wgs = _state(cta)["role_wgs"]
    count = wgs if wgs is not None else -(-cta.prog.threads // 128)
    mask = n.attr("multicast")
    for dst in _peers(cta, n, mask) if mask else [cta]:
        _bar(cta, n, n.arg("bar"), dst).arrive(count)


def _expect_tx(cta: _CTA, n: Node) -> None:
    _bar(cta, n, n.arg("bar")).expect_tx(cta.ev(n.arg("bytes")))


def _wait(cta: _CTA, n: Node) -> None:
    if not _bar(cta, n, n.arg("bar")).passed(cta.ev(n.arg("phase"))):
        raise InterpFault(n, "deadlock: this wait can never return (no other role runs here)")


def _tma_load(cta: _CTA, n: Node) -> None:
    dst = n.arg("dst")
    mask = n.attr("multicast")
    for c in _peers(cta, n, mask) if mask else [cta]:      # the box and its bytes land in every CTA of the mask
        nbytes = _box(cta, n, n.arg("src"), _slot(cta, n, dst, c), cta.dtypes[dst.buf], n.attr("rows"))
        _bar(cta, n, n.arg("bar"), c).complete_tx(nbytes)


def _cp_async(cta: _CTA, n: Node) -> None:
    dst = n.arg("dst")
    _box(cta, n, n.arg("src"), _slot(cta, n, dst), cta.dtypes[dst.buf])


def _cp_async_bar(cta: _CTA, n: Node) -> None:
    """The window lands at once; its completion adds nothing to the barrier's phase (the role arrives)."""
    dst = n.arg("dst")
    _bar(cta, n, n.arg("bar"))
    _box(cta, n, n.arg("src"), _slot(cta, n, dst), cta.dtypes[dst.buf])


def _tma_store(cta: _CTA, n: Node) -> None:
    v, src = n.arg("dst"), _slot(cta, n, n.arg("src"))
    win, shape = cta.window(n, v)
    g, t = _clip(n, v, win, shape, True, "write")
    tile = src.reshape(tuple(length for _, length, kept in win if kept))
    out = cta.gmem[v.buf]
    out[g] = _round(cta.dtypes[v.buf], tile[t]).reshape(out[g].shape)


def _mma_slots(cta: _CTA, n: Node) -> None:
    acc = cta.tiles[n.arg("acc")]
    a, b = _slot(cta, n, n.arg("a")), _slot(cta, n, n.arg("b"))
    if n.op is Op.WGMMA and n.attr("b_major") == "k":
        b = b.T
    prod = a.astype(np.float32) @ b.astype(np.float32)
    if prod.shape != acc.shape:
        raise InterpFault(n, f"a {a.shape} @ b {b.shape} gives {prod.shape}, the accumulator is {acc.shape}")
    if n.op is Op.WGMMA and not n.attr("accumulate"):
        acc[...] = prod
    else:
        acc += prod


def _bias_scores(cta: _CTA, n: Node) -> tuple[np.ndarray, int]:
    """(scores, base) of a fused epilogue: bias[j] - beta * dots[r, j] in f32 over the columns j with
    base + j < limit (R, m)."""
    dots, bias = cta.tiles[n.arg("dots")], _slot(cta, n, n.arg("bias")).reshape(-1)
    if dots.ndim != 2 or bias.size != dots.shape[1]:
        raise InterpFault(n, f"dots {dots.shape} needs a bias of {dots.shape[-1]} values, got {bias.shape}")
    base, limit = cta.ev(n.arg("base")), cta.ev(n.arg("limit"))
    m = max(0, min(dots.shape[1], limit - base))
    with np.errstate(all="ignore"):
        s = bias[None, :m].astype(np.float32) - np.float32(n.attr("beta")) * dots[:, :m].astype(np.float32)
    return s, base


def _argmin_bias(cta: _CTA, n: Node) -> None:
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


def _topk_bias(cta: _CTA, n: Node) -> None:
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


def _sqnorm_rows(cta: _CTA, n: Node) -> None:
    """dst[r] (+)= sum_c src[r, c]^2 in f32."""
    dst, src = _slot(cta, n, n.arg("dst")).reshape(-1), _slot(cta, n, n.arg("src"))
    if src.ndim != 2 or dst.size != src.shape[0]:
        raise InterpFault(n, f"dst of {dst.size} values for src {src.shape}: one value per row needed")
    x = src.astype(np.float64)
    part = np.einsum("rc,rc->r", x, x)
    dst[...] = (dst.astype(np.float64) + part if n.attr("accumulate") else part).astype(np.float32)


def _topk_publish(cta: _CTA, n: Node) -> None:
    """pub_v / pub_i = the rows' lists (already merged here: the interpreter keeps one list per row)."""
    tv, ti = cta.tiles[n.arg("top_v")], cta.tiles[n.arg("top_i")]
    pv, pi = cta.tiles[n.arg("pub_v")], cta.tiles[n.arg("pub_i")]
    if pv.shape != tv.shape or pi.shape != ti.shape:
        raise InterpFault(n, f"pub_v {pv.shape} / pub_i {pi.shape} must have the lists' shape {tv.shape}")
    pv[...], pi[...] = tv, ti


def _topk_cluster_merge(cta: _CTA, n: Node) -> None:
    """CTA rank c of n: rows [c * ceil(R / n), (c + 1) * ceil(R / n)) of the cluster's published lists,
    merged by (value, index); the first k (the window's columns) to dst, rows past the edge skipped."""
    peers = getattr(cta, "cluster", None) or [cta]
    rank = next(i for i, c in enumerate(peers) if c is cta)
    pv = [c.tiles[n.arg("pub_v")] for c in peers]
    pi = [c.tiles[n.arg("pub_i")] for c in peers]
    rows, kmax = pv[0].shape
    v = n.arg("dst")
    win, shape = cta.window(n, v)
    if len(win) != 2 or not all(kept for _, _, kept in win) or win[0][1] != rows or not 1 <= win[1][1] <= kmax:
        raise InterpFault(n, f"the window of `{v.buf}` must be ({rows}, k <= {kmax}) for lists {pv[0].shape}")
    k, out = win[1][1], cta.gmem[v.buf]
    share = -(-rows // len(peers))
    for r in range(rank * share, min(rows, (rank + 1) * share)):
        allv = np.concatenate([p[r].astype(np.float32) for p in pv])
        alli = np.concatenate([p[r].astype(np.int64) for p in pi])
        order = np.lexsort((alli, allv))[:k]
        g = win[0][0] + r
        lo, hi = max(win[1][0], 0), min(win[1][0] + k, shape[1])
        if 0 <= g < shape[0] and lo < hi:
            vals = allv[order] if cta.dtypes[v.buf].is_float else alli[order]
            out[g, lo:hi] = _round(cta.dtypes[v.buf], vals[lo - win[1][0]:hi - win[1][0]])


def _acc_publish(cta: _CTA, n: Node) -> None:
    """part = acc: this CTA's partial sum, in the smem tile the cluster's reduction reads."""
    acc, part = cta.tiles[n.arg("acc")], cta.tiles[n.arg("part")]
    if part.shape != acc.shape:
        raise InterpFault(n, f"part {part.shape} must have the accumulator's shape {acc.shape}")
    part[...] = acc


def _acc_cluster_reduce(cta: _CTA, n: Node) -> None:
    """CTA rank c of n: chunks [c * ceil(T / n), (c + 1) * ceil(T / n)) of the T in-bounds chunks of 4 columns
    (row-major) of the window, each the f32 sum in rank order of the cluster's published tiles."""
    peers = getattr(cta, "cluster", None) or [cta]
    rank = next(i for i, c in enumerate(peers) if c is cta)
    parts = [c.tiles[n.arg("part")] for c in peers]
    v = n.arg("dst")
    win, shape = cta.window(n, v)
    if len(win) != 2 or not all(kept for _, _, kept in win) or (win[0][1], win[1][1]) != parts[0].shape:
        raise InterpFault(n, f"the window of `{v.buf}` must be a 2-D window of part's shape {parts[0].shape}")
    for c in peers:
        if c.window(n, v)[0] != win:
            raise InterpFault(n, f"cluster CTAs {rank} and {peers.index(c)} reduce into different windows of "
                                 f"`{v.buf}`: the CTAs of a cluster must share the window")
    (r0, nr, _), (c0, nc, _) = win
    if r0 < 0 or c0 < 0:
        raise InterpFault(n, f"the window of `{v.buf}` starts before the tensor")
    rows, cols = max(0, min(nr, shape[0] - r0)), max(0, min(nc, shape[1] - c0))
    per_row = -(-cols // 4)
    total = rows * per_row
    share = -(-total // len(peers))
    out, dt = cta.gmem[v.buf], cta.dtypes[v.buf]
    for i in range(rank * share, min(total, (rank + 1) * share)):
        r, q = divmod(i, per_row)
        hi = min(4 * q + 4, cols)
        s = parts[0][r, 4 * q:hi].astype(np.float32)
        for p in parts[1:]:
            s = s + p[r, 4 * q:hi].astype(np.float32)
        out[r0 + r, c0 + 4 * q:c0 + hi] = _round(dt, s)


def _nothing(cta: _CTA, n: Node) -> None:
    """Ordering ops: copies and MMAs complete at issue here, so there is nothing to wait for."""


def _role(cta: _CTA, n: Node) -> None:
    run_roles(cta, (n,))


SEMANTICS.update({
    Op.ROLE: _role,
    Op.MBARRIER: _mbarrier,
    Op.EXPECT_TX: _expect_tx,
    Op.ARRIVE: _arrive,
    Op.WAIT: _wait,
    Op.TMA_LOAD: _tma_load,
    Op.TMA_STORE: _tma_store,
    Op.CP_ASYNC: _cp_async,
    Op.CP_ASYNC_WAIT: _nothing,
    Op.CP_ASYNC_BAR: _cp_async_bar,
    Op.FENCE_ASYNC: _nothing,
    Op.CLUSTER: _nothing,
    Op.CLUSTER_SYNC: _nothing,
    Op.WGMMA: _mma_slots,
    Op.WGMMA_WAIT: _nothing,
    Op.ARGMIN_BIAS: _argmin_bias,
    Op.TOPK_BIAS: _topk_bias,
    Op.SQNORM_ROWS: _sqnorm_rows,
    Op.TOPK_PUBLISH: _topk_publish,
    Op.TOPK_CLUSTER_MERGE: _topk_cluster_merge,
    Op.ACC_PUBLISH: _acc_publish,
    Op.ACC_CLUSTER_REDUCE: _acc_cluster_reduce,
    Op.TCGEN05_MMA: _mma_slots,
})


# ----------------------------------------------------------------- executor

def _steps(cta: _CTA, nodes: tuple[Node, ...], st: dict) -> Iterator[Node]:
    """Run ``nodes`` as a coroutine: yields the blocking wait each time it cannot go on."""
    for n in nodes:
        if n.op is Op.FOR:
            var = n.args[0]
            for i in loop_values(cta, n):
                cta.env[var] = i
                yield from _steps(cta, n.body, st)
            cta.env.pop(var, None)
        elif n.op is Op.IF:
            if cta.ev(n.args[0]):
                yield from _steps(cta, n.body, st)
        elif n.op is Op.WAIT:
            while not _bar(cta, n, n.arg("bar")).passed(cta.ev(n.arg("phase"))):
                yield n
            st["steps"] += 1
        elif n.op is Op.ROLE:
            raise InterpFault(n, "roles do not nest")
        else:
            SEMANTICS[n.op](cta, n)
            st["steps"] += 1


def run_roles(cta: _CTA, roles: tuple[Node, ...]) -> None:
    """Run sibling roles concurrently (round-robin until each blocks); InterpFault on a deadlock."""
    _run_tasks([(cta, roles)])


def _run_tasks(groups: list[tuple[_CTA, tuple[Node, ...]]]) -> None:
    """Run the roles of one or more CTAs (the CTAs of a cluster) concurrently, round-robin."""
    tasks, outer = [], {}
    for cta, roles in groups:
        outer[id(cta)] = cta.env
        st = _state(cta)
        for r in roles:
            lo, hi = r.args[1]
            env = dict(cta.env)
            cta.env = env
            tasks.append([r, env, _steps(cta, r.body, st), -(-(hi - lo) // 4), None, cta])
            cta.env = outer[id(cta)]
    live = list(tasks)
    ctas = [c for c, _ in groups]
    try:
        while live:
            before = sum(_state(c)["steps"] for c in ctas)
            for t in list(live):
                cta = t[5]
                cta.env, _state(cta)["role_wgs"] = t[1], t[3]
                try:
                    t[4] = next(t[2])
                except StopIteration:
                    live.remove(t)
            if live and sum(_state(c)["steps"] for c in ctas) == before:
                first = live[0][4]
                parts = []
                for t in live:
                    cta = t[5]
                    cta.env = t[1]
                    b = t[4].arg("bar")
                    slot = cta.ev(b.index) if b.index is not None else 0
                    where = f" (CTA {cta.env['bid.x']})" if len(groups) > 1 else ""
                    parts.append(f"role {t[0].args[0]}{where} waits on {b.buf}[{slot}] for parity "
                                 f"{cta.ev(t[4].arg('phase')) % 2} at line {t[4].line}")
                stuck = "; ".join(parts)
                raise InterpFault(first, f"deadlock: every unfinished role is blocked ({stuck})")
    finally:
        for cta in ctas:
            cta.env, _state(cta)["role_wgs"] = outer[id(cta)], None


def run_clusters(program: Program, gmem: dict, env0: dict, grid: list[int], cl: tuple[int, int, int],
                 outputs: dict) -> dict:
    """Run the grid cluster by cluster, the CTAs of a cluster concurrently: each runs its statements up to its
    roles, then the roles of all of them round-robin (multicast copies and remote arrivals reach the peers),
    then what follows the roles."""
    import itertools
    if any(g % c for g, c in zip(grid, cl)):
        raise InterpFault(next(n for n in program.body if n.op is Op.CLUSTER),
                          f"the grid {tuple(grid)} is not a whole number of clusters {cl}: the launch fails")
    for cz, cy, cx in itertools.product(range(grid[2] // cl[2]), range(grid[1] // cl[1]), range(grid[0] // cl[0])):
        members = []
        for z, y, x in itertools.product(range(cl[2]), range(cl[1]), range(cl[0])):
            env = {**env0, "bid.x": cx * cl[0] + x, "bid.y": cy * cl[1] + y, "bid.z": cz * cl[2] + z}
            members.append(_CTA(program, gmem, env))
        for c in members:
            c.cluster = members
        body = program.body
        first = next((i for i, n in enumerate(body) if n.op is Op.ROLE), len(body))
        last = max((i for i, n in enumerate(body) if n.op is Op.ROLE), default=first - 1)
        for c in members:
            c.run(body[:first])
        if first <= last:
            _run_tasks([(c, body[first:last + 1]) for c in members])
        for c in members:
            c.run(body[last + 1:])
    return outputs
