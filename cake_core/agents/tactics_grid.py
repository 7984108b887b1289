"""Grid tactics on warp-specialized programs: a persistent grid with a tile loop, split-K over CTAs.

``persistent`` launches one CTA per SM (``min(tiles, num_sms)``) and has every role walk the output tiles
``t = bid.x, bid.x + ncta.x, ...``: the CTA's barriers and rings stay initialised across tiles, the
producer fills the next tile's ring slots while the consumers finish the last one, and no CTA waits in a
tail wave behind a full one. Every ring's slot and phase count continues across tiles (a running count),
and operands kept resident for a tile get a second buffer so the next tile's copy can land early.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (Refused, fresh, map_exprs, refuse_unless, replace_expr, stmt, stmts, subst_expr,
                                      subst_view, view_syms, walk_nodes)
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols
from cake_core.ir.ops import REGISTRY, Node, Op, Slot, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view

_BAR_SLOT_OPS = {Op.WAIT: (0,), Op.ARRIVE: (0,), Op.EXPECT_TX: (0,), Op.TMA_LOAD: (2,), Op.CP_ASYNC_BAR: (2,)}


def _tile_coords(grid: tuple[Expr, ...], t: Expr) -> dict[str, Expr]:
    """bid.x, bid.y, bid.z of linear tile ``t`` over ``grid`` (x fastest)."""
    out: dict[str, Expr] = {}
    stride: Expr = 1
    for axis, g in zip("xyz", grid):
        q = t if stride == 1 else Bin("//", t, stride)
        out[f"bid.{axis}"] = q if axis == "xyz"[len(grid) - 1] else Bin("%", q, g)
        stride = g if stride == 1 else Bin("*", stride, g)
    return out


def _tiles(grid: tuple[Expr, ...]) -> Expr:
    total: Expr = grid[0]
    for g in grid[1:]:
        total = Bin("*", total, g)
    return total


def _let_names_in_views(nodes: tuple[Node, ...]) -> set[str]:
    """Names (bindings, loop variables) that some view or ring-data slot of ``nodes`` uses."""
    out: set[str] = set()
    for n in walk_nodes(nodes):
        for kind, a in zip((o.kind for o in REGISTRY[n.op].operands), n.args):
            if kind == "view":
                out |= view_syms(a)
    return out


def persistent(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Turn a grid of one CTA per output tile into a persistent grid walking the tiles.

    Before (warp-specialized GEMM)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
        with role("producer", warps=(0, 4), regs=40):
            for kt in range(cdiv(K, BK)):
                wait(empty[kt % S], phase=(kt // S + 1) % 2)
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
        with role("consumer", warps=(4, 12), regs=232):
            acc = rmem(f32, (BM, BN))
            for kt in range(cdiv(K, BK)):
                wait(full[kt % S], phase=kt // S % 2)
                ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After::

        @kernel(grid=(min(cdiv(N, BN) * cdiv(M, BM), num_sms),), ...)
        with role("producer", warps=(0, 4), regs=40):
            for t in range(bid.x, cdiv(N, BN) * cdiv(M, BM), ncta.x):
                for kt in range(cdiv(K, BK)):
                    wait(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=...)
                    ...
                    tma_load(a_s[...], a[tile(t // cdiv(N, BN), BM), tile(kt, BK)], bar=full[...])
        with role("consumer", warps=(4, 12), regs=232):
            for t in range(bid.x, cdiv(N, BN) * cdiv(M, BM), ncta.x):
                acc = rmem(f32, (BM, BN))
                for kt in range(cdiv(K, BK)):
                    wait(full[((t - bid.x) // ncta.x * cdiv(K, BK) + kt) % S], phase=...)
                    ...
                store(c[tile(t // cdiv(N, BN), BM), tile(t % cdiv(N, BN), BN)], acc)

    A barrier waited once per kernel (a resident operand's ``x_full[0]``, phase 0) becomes a two-slot ring
    per tile with an ``x_empty`` the consumers arrive on after the tile; the resident tiles get a second set
    of slots. Precondition: warp roles only at the top level (after allocations), a grid of one CTA per
    tile (no tile loop yet, no cluster), each role's work one top-level loop. Applies to gemm_bf16,
    tinygemm, kmeans_assign and knn_topk after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles: persistence walks tiles in a producer and "
                                                         "its consumers")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in _syms_of(n) or "num_sms" in _syms_of(n) for n in walk_nodes(p.body)) and
                  not any("num_sms" in symbols(g) for g in p.grid), "the kernel already walks tiles (ncta / num_sms)")
    refuse_unless(all(n.op in (Op.SMEM, Op.RMEM, Op.MBARRIER, Op.LET, Op.ROLE) for n in p.body),
                  "statements outside the roles besides allocations")
    taken: set[str] = set()

    def name(base: str) -> str:
        n = fresh(p, base, taken)
        taken.add(n)
        return n

    t = name("t")
    tiles = _tiles(p.grid)
    coords = _tile_coords(p.grid, Sym(t))
    lt = Bin("//", Bin("-", Sym(t), Sym("bid.x")), Sym("ncta.x"))       # tiles this CTA walked before t
    bars = {n.result for n in p.body if n.op is Op.MBARRIER}
    once = _once_barriers(p, bars)       # waited once per kernel: a resident operand's
    resident = _resident_bufs(p, once)
    empties = {b: name(b.replace("full", "empty") if "full" in b else f"{b}_empty") for b in once}
    cons_wg = sum((r.args[1][1] - r.args[1][0]) // 4 for r in p.body if r.op is Op.ROLE
                  and any(m.op is Op.WGMMA for m in walk_nodes(r.body)))

    per_tile = _consumer_trips(p, bars - once)

    def role_body(r: Node) -> tuple[Node, ...]:
        # the role's ring loop: the top-level loop whose waits or copies use a ring (not a once barrier)
        ring_loops = [n for n in r.body if n.op is Op.FOR and any(
            m.op in _BAR_SLOT_OPS and m.args[_BAR_SLOT_OPS[m.op][0]].buf in bars - once for m in walk_nodes(n.body))]
        refuse_unless(len(ring_loops) <= 1, f"role {r.args[0]} runs its rings in {len(ring_loops)} top-level loops")
        count: dict[str, Expr] = {}
        if ring_loops:
            lp = ring_loops[0]
            s0, stop, st = loop_range(lp)
            refuse_unless(s0 == 0 and st == 1, "a role's ring loop does not count from 0 in steps of 1")
            refuse_unless(_extent_over(stop, per_tile) is not None, f"role {r.args[0]}'s ring loop runs "
                          f"{fmt_expr(stop)} trips, not the consumers' {fmt_expr(per_tile)} (or a few more)")
            # every role counts tiles by the consumers' trips, a lagged producer's extra trip included
            count = {lp.args[0]: Bin("+", Bin("*", lt, per_tile), Sym(lp.args[0]))}
        view_names = _let_names_in_views(r.body)
        body = tuple(map_exprs(n, lambda e: subst_expr(e, coords)) for n in r.body)
        if ring_loops:
            # inside the ring loop its variable becomes the running count; a ring slot named after the loop
            # (pipeline_wgmma's last release) is offset by the tiles walked before
            offset = Bin("*", lt, per_tile)
            body = tuple(_bar_exprs(n, bars, count, view_names) if n.op is Op.FOR and n.args[0] == ring_loops[0].args[0]
                         else _offset_ring_slots(n, bars - once, offset) for n in body)
        if once:
            body = _ring_once(body, once, empties, resident, lt, producer=_is_prod(r))
        return body

    new_body: list[Node] = []
    for n in p.body:
        if n.op is Op.ROLE:
            body = role_body(n)
            loop = stmts(f"for {t} in range(bid.x, {fmt_expr(tiles)}, ncta.x):\n    pass")[0]
            new_body.append(replace(n, body=(replace(loop, body=body),)))
        elif n.op is Op.MBARRIER and n.result in once:
            new_body += [stmt(f"{n.result} = mbarrier(2)"),
                         stmt(f"{empties[n.result]} = mbarrier(2, arrivals={cons_wg})")]
        elif n.op is Op.SMEM and n.result in resident:
            new_body.append(replace(n, attrs=tuple(sorted({**dict(n.attrs), "stages": 2 * n.attr("stages")}.items()))))
        else:
            new_body.append(n)
    grid = (Call("min", (tiles, Sym("num_sms"))),)
    return replace(p, grid=grid, body=tuple(new_body))


def _extent_over(stop: Expr, base: Expr | None) -> int | None:
    """How many trips ``stop`` runs past ``base`` (``base`` itself: 0; ``base + 1``: 1), else None."""
    if base is None or stop == base:
        return 0
    if isinstance(stop, Bin) and stop.op == "+" and stop.a == base and isinstance(stop.b, int):
        return stop.b
    return None


def _consumer_trips(p: Program, rings: set[str]) -> Expr | None:
    """The extent of the consumers' ring loop (None without one)."""
    for r in p.body:
        if r.op is Op.ROLE and any(m.op is Op.WGMMA for m in walk_nodes(r.body)):
            for n in r.body:
                if n.op is Op.FOR and any(m.op in _BAR_SLOT_OPS and m.args[_BAR_SLOT_OPS[m.op][0]].buf in rings
                                          for m in walk_nodes(n.body)):
                    return loop_range(n)[1]
    return None


def _syms_of(n: Node) -> set[str]:
    out: set[str] = set()
    map_exprs(replace(n, body=()), lambda e: (out.update(symbols(e)), e)[1])
    return out


def _is_prod(r: Node) -> bool:
    return any(m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) for m in walk_nodes(r.body))


def _once_barriers(p: Program, bars: set[str]) -> set[str]:
    """Barriers every wait of which is at a role's top level with a constant slot and phase 0."""
    out = set()
    for b in bars:
        waits = [(r, n) for r in p.body if r.op is Op.ROLE for n in walk_nodes(r.body)
                 if n.op is Op.WAIT and n.args[0].buf == b]
        if waits and all(n in r.body and n.args[1] == 0 and n.args[0].index == 0 for r, n in waits):
            out.add(b)
    return out


def _resident_bufs(p: Program, once: set[str]) -> dict[str, int]:
    """The smem tiles filled through a once-waited barrier, with their stage counts."""
    bufs = {n.args[0].buf for n in walk_nodes(p.body) if n.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR)
            and n.args[2].buf in once}
    return {n.result: n.attr("stages") for n in p.body if n.op is Op.SMEM and n.result in bufs}


def _bar_exprs(n: Node, bars: set[str], count: dict[str, Expr], view_names: set[str]) -> Node:
    """Continue ring counts across tiles: the role loop's variable becomes its running count in barrier
    slots and phases, in ring-data slots indexed by a barrier's count, and in bindings only such use."""
    if not count:
        return n

    def slot_fix(a, kind: str):
        if kind == "slot" and isinstance(a, Slot) and a.index is not None:
            return Slot(a.buf, subst_expr(a.index, count))
        return a

    def fix(m: Node) -> Node:
        if m.op is Op.LET and m.args[0] not in view_names:
            m = replace(m, args=(m.args[0], subst_expr(m.args[1], count)))
        elif m.op is Op.WAIT and m.args[0].buf in bars:
            m = replace(m, args=(slot_fix(m.args[0], "slot"), subst_expr(m.args[1], count)))
        elif m.op in _BAR_SLOT_OPS or m.op in (Op.WGMMA, Op.ARGMIN_BIAS, Op.TOPK_BIAS, Op.SQNORM_ROWS):
            kinds = [o.kind for o in REGISTRY[m.op].operands]
            m = replace(m, args=tuple(slot_fix(a, k) for k, a in zip(kinds, m.args)))
        return replace(m, body=tuple(fix(b) for b in m.body))

    return fix(n)


def _offset_ring_slots(n: Node, rings: set[str], offset: Expr) -> Node:
    """A ring slot ``c % S`` named outside the ring loop becomes ``(offset + c) % S``."""
    kinds = [o.kind for o in REGISTRY[n.op].operands]
    args = []
    for k, a in zip(kinds, n.args):
        if k == "slot" and isinstance(a, Slot) and a.buf in rings and isinstance(a.index, Bin) and a.index.op == "%":
            a = Slot(a.buf, Bin("%", Bin("+", offset, a.index.a), a.index.b))
        args.append(a)
    return replace(n, args=tuple(args), body=tuple(_offset_ring_slots(b, rings, offset) for b in n.body))


def _ring_once(body: tuple[Node, ...], once: set[str], empties: dict[str, str], resident: dict[str, int],
               lt: Expr, producer: bool) -> tuple[Node, ...]:
    """Per-tile barriers for what was waited once per kernel: slot lt % 2, parity lt // 2 % 2; the producer
    waits for the consumers to release the slot before its first copy; resident tiles of a tile sit in its
    half of the (doubled) slots."""
    ltx = fmt_expr(lt)

    def res_slot(m: Node) -> Node:
        kinds = [o.kind for o in REGISTRY[m.op].operands]
        args = []
        for k, a in zip(kinds, m.args):
            if k == "slot" and isinstance(a, Slot) and a.index is not None:
                if a.buf in resident:
                    a = Slot(a.buf, Bin("+", Bin("*", Bin("%", lt, 2), resident[a.buf]), a.index))
                elif a.buf in once:
                    a = Slot(a.buf, Bin("%", lt, 2))
            args.append(a)
        return replace(m, args=tuple(args), body=tuple(res_slot(b) for b in m.body))

    def fills_once(n: Node) -> bool:
        return any((m.op in (Op.TMA_LOAD, Op.CP_ASYNC_BAR) and m.args[2].buf in once) or
                   (m.op is Op.EXPECT_TX and m.args[0].buf in once) for m in walk_nodes((n,)))

    out: list[Node] = []
    waited = False
    for n in body:
        if n.op is Op.WAIT and n.args[0].buf in once:
            out.append(stmt(f"wait({n.args[0].buf}[{ltx} % 2], phase={ltx} // 2 % 2)"))
            continue
        if producer and not waited and fills_once(n):
            out += [stmt(f"wait({empties[b]}[{ltx} % 2], phase=({ltx} // 2 + 1) % 2)") for b in sorted(once)]
            waited = True
        out.append(res_slot(n))
    if not producer:
        out += [stmt(f"arrive({empties[b]}[{ltx} % 2])") for b in sorted(once)]
    return tuple(out)


# ------------------------------------------------------------------ split-K

SPLITS = (2, 4, 8)


def split_k(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split the reduction over a new grid dimension; each CTA adds its partial sum into the zeroed output.

    Before (warp-specialized GEMM: one CTA per output tile walks all of K)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
            for kt in range(cdiv(K, BK)):
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
            ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After (SPLIT CTAs per tile along z, each a share of the K tiles)::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM), SPLIT), ...)
            for kt in range(max(min(cdiv(cdiv(K, BK), SPLIT), cdiv(K, BK) - bid.z * cdiv(cdiv(K, BK), SPLIT)), 0)):
                ...
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(bid.z * cdiv(cdiv(K, BK), SPLIT) + kt, BK)], ...)
            ...
            atomic_add(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    For outputs the harness zeroes before each launch (the zeroing is timed with the kernel): a small-M
    GEMM whose tiles alone cannot fill the GPU. Precondition: warp roles whose ring loop is the reduction
    (no candidate loop), a grid of at most two dimensions, no tile loop or cluster, the accumulator stored
    once. Applies to gemm_bf16 and tinygemm after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(len(p.grid) <= 2, "the grid already has three dimensions")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in _syms_of(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    roles = [n for n in p.body if n.op is Op.ROLE]
    loops = []
    for r in roles:
        ls = [n for n in r.body if n.op is Op.FOR]
        refuse_unless(len(ls) == 1, f"role {r.args[0]} has {len(ls)} top-level loops, not one reduction loop")
        refuse_unless(not any(m.op is Op.FOR for m in ls[0].body), "the reduction loop holds a loop (a candidate "
                                                                   "loop's epilogue would be split too)")
        loops.append(ls[0])
    stops = {fmt_expr(loop_range(lp)[1]) for lp in loops}
    refuse_unless(len(stops) == 1, "the roles' loops do not share one extent")
    stores = [n for r in roles for n in walk_nodes(r.body) if n.op is Op.STORE]
    accs = {n.args[0] for r in roles for n in walk_nodes(r.body) if n.op is Op.WGMMA}
    refuse_unless(len(stores) == 1 and stores[0].args[1] in accs, "the accumulator is not stored once")
    split = fresh(p, "SPLIT")
    extent = loop_range(loops[0])[1]
    ch = Call("cdiv", (extent, Sym(split)))
    z = Sym(f"bid.{'xyz'[len(p.grid)]}")
    share = Call("max", (Call("min", (ch, Bin("-", extent, Bin("*", z, ch)))), 0))

    def fix_views(n: Node, var: str) -> Node:
        kinds = [o.kind for o in REGISTRY[n.op].operands]
        env = {var: Bin("+", Bin("*", z, ch), Sym(var))}
        args = tuple(subst_view(a, env) if k == "view" else a for k, a in zip(kinds, n.args))
        return replace(n, args=args, body=tuple(fix_views(b, var) for b in n.body))

    def fix_role(r: Node) -> Node:
        out = []
        for n in r.body:
            if n.op is Op.FOR:
                var = n.args[0]
                n = replace(fix_views(n, var), args=(var, share) + tuple(n.args[2:]))
            elif n.op is Op.STORE:
                n = stmt(f"atomic_add({fmt_view(n.args[0])}, {n.args[1]})")
            out.append(n)
        return replace(r, body=tuple(out))

    body = tuple(fix_role(n) if n.op is Op.ROLE else n for n in p.body)
    return replace(p, grid=p.grid + (Sym(split),), body=body).with_consts(**{split: int(rng.choice(SPLITS))})


# ------------------------------------------------------------------ split over a cluster

def cluster_split(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split the roles' streamed loop over the CTAs of a cluster and merge their results through shared memory.

    A grid with too few output tiles to fill the GPU (knn_topk's 32 query tiles; a small-M GEMM) gets SPLIT
    CTAs per tile along a new grid dimension, clustered: each streams its share of the loop, publishes what
    it holds (the sorted top-k lists, or the partial accumulator) to its shared memory, and after a
    ``cluster_sync()`` each CTA merges its share of the rows from every CTA of the cluster (distributed shared
    memory) and stores them. No atomics and no zeroed output.

    Before (warp-specialized knn_topk)::

        @kernel(grid=(cdiv(Q, BQ),), ...)
        with role("consumer", warps=(4, 12), regs=232):
            ...
            for nt in range(cdiv(N, BN)):
                ...
                topk_bias(top_v, top_i, dot, nrm_s, base=nt * BN, limit=N)
            store(idx[tile(bid.x, BQ), tile(0, KMAX)], top_i)

    After::

        @kernel(grid=(cdiv(Q, BQ), SPLIT), ...)
        cluster((1, SPLIT, 1))
        pub_v = smem(f32, (BQ, KMAX))
        pub_i = smem(i32, (BQ, KMAX))
        with role("producer", ...):
            for nt in range(max(min(cdiv(cdiv(N, BN), SPLIT), cdiv(N, BN) - bid.y * cdiv(cdiv(N, BN), SPLIT)), 0)):
                ... db[tile(bid.y * cdiv(cdiv(N, BN), SPLIT) + nt, BN), ...] ...
        with role("consumer", ...):
            for nt in range(max(min(...), 0)):
                ...
                topk_bias(top_v, top_i, dot, nrm_s, base=(bid.y * cdiv(cdiv(N, BN), SPLIT) + nt) * BN, limit=N)
            topk_publish(pub_v, pub_i, top_v, top_i)
        cluster_sync()
        topk_cluster_merge(idx[tile(bid.x, BQ), tile(0, KMAX)], pub_v, pub_i)
        cluster_sync()

    A GEMM's consumer publishes its accumulator instead (``acc_publish``) and the cluster sums the partial
    tiles (``acc_cluster_reduce``). Precondition: warp roles, each with one top-level loop of one extent (the
    stream to split), a grid of one or two dimensions without a tile loop or cluster, and every consumer
    store one of a top-k index list or of a wgmma accumulator. Applies to knn_topk and to gemm_bf16 and
    tinygemm after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(len(p.grid) <= 2, "the grid already has three dimensions")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "already a cluster launch")
    refuse_unless(not any("ncta.x" in _syms_of(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    roles = [n for n in p.body if n.op is Op.ROLE]
    loops = []
    for r in roles:
        ls = [n for n in r.body if n.op is Op.FOR and any(m.op is Op.WAIT for m in walk_nodes(n.body))]
        refuse_unless(len(ls) == 1, f"role {r.args[0]} streams in {len(ls)} top-level loops, not one")
        s0, _, st = loop_range(ls[0])
        refuse_unless(s0 == 0 and st == 1, "the streamed loop does not count from 0 in steps of 1")
        loops.append(ls[0])
    cons_loop = next((lp for r, lp in zip(roles, loops) if any(m.op is Op.WGMMA for m in walk_nodes(r.body))), None)
    refuse_unless(cons_loop is not None, "no consumer loop issuing wgmma")
    base_extent = loop_range(cons_loop)[1]
    refuse_unless(all(_extent_over(loop_range(lp)[1], base_extent) is not None for lp in loops),
                  "the roles' loops do not run the consumers' trips (or a few more)")
    allocs = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    accs = {n.args[0] for r in roles for n in walk_nodes(r.body) if n.op is Op.WGMMA}
    topk = {n.args[1]: n.args[0] for r in roles for n in walk_nodes(r.body) if n.op is Op.TOPK_BIAS}
    stores = [(r, n) for r in roles for n in r.body if n.op is Op.STORE]
    refuse_unless(bool(stores), "no store after the streamed loop to merge")
    for r, n in stores:
        refuse_unless(n.args[1] in accs or n.args[1] in topk,
                      f"`{n.args[1]}` is neither a wgmma accumulator nor a top-k index list: no cluster merge for it")
    refuse_unless(not (topk and any(n.args[1] in accs for _, n in stores)), "a mix of top-k and accumulator stores")
    taken: set[str] = set()

    def name(base: str) -> str:
        n = fresh(p, base, taken)
        taken.add(n)
        return n

    split = name("SPLIT")
    axis = "xyz"[len(p.grid)]
    y = Sym(f"bid.{axis}")
    extent = base_extent
    ch = Call("cdiv", (extent, Sym(split)))
    share = Call("max", (Call("min", (ch, Bin("-", extent, Bin("*", y, ch)))), 0))
    start = Bin("*", y, ch)
    pubs: list[tuple[str, ...]] = []
    merges: list[Node] = []

    def shift(n: Node, var: str) -> Node:
        """Views and epilogue bases of the loop use the CTA's first tile plus the loop variable."""
        env = {var: Bin("+", start, Sym(var))}
        kinds = [o.kind for o in REGISTRY[n.op].operands]
        names = [o.name for o in REGISTRY[n.op].operands]
        args = []
        for k, nm, a in zip(kinds, names, n.args):
            if k == "view":
                a = subst_view(a, env)
            elif k == "expr" and nm == "base":
                a = subst_expr(a, env)
            args.append(a)
        return replace(n, args=tuple(args), body=tuple(shift(b, var) for b in n.body))

    def fix_role(r: Node) -> Node:
        out = []
        for n in r.body:
            if n.op is Op.FOR and n in loops:
                # the share replaces the stream's extent in the bounds and in the body's conditions on it
                n = shift(replace_expr(n, extent, share), n.args[0])
            elif n.op is Op.STORE and n.args[1] in topk:
                vals, idxs = topk[n.args[1]], n.args[1]
                rows, kmax = (fmt_expr(d) for d in allocs[idxs].args[1])
                pv, pi = name("pub_v"), name("pub_i")
                pubs.append((f"{pv} = smem(f32, ({rows}, {kmax}))", f"{pi} = smem(i32, ({rows}, {kmax}))"))
                merges.append(stmt(f"topk_cluster_merge({fmt_view(n.args[0])}, {pv}, {pi})"))
                n = stmt(f"topk_publish({pv}, {pi}, {vals}, {idxs})")
            elif n.op is Op.STORE:
                rows, cols = (fmt_expr(d) for d in allocs[n.args[1]].args[1])
                part = name("part_s")
                pubs.append((f"{part} = smem(f32, ({rows}, {cols}))",))
                merges.append(stmt(f"acc_cluster_reduce({fmt_view(n.args[0])}, {part})"))
                n = stmt(f"acc_publish({part}, {n.args[1]})")
            out.append(n)
        return replace(r, body=tuple(out))

    new_roles = {id(r): fix_role(r) for r in roles}
    dims = ", ".join(split if a == axis else "1" for a in "xyz")
    body: list[Node] = [stmt(f"cluster(({dims}))")]
    for n in p.body:
        if n.op is Op.ROLE and n is roles[0]:
            body += [x for group in pubs for x in stmts("\n".join(group))]
        body.append(new_roles.get(id(n), n))
    body += [stmt("cluster_sync()")] + merges + [stmt("cluster_sync()")]
    return replace(p, grid=p.grid + (Sym(split),), body=tuple(body)).with_consts(**{split: int(rng.choice((2, 3, 4)))})


# ------------------------------------------------------------------ TMA multicast over a cluster

def multicast(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Pair neighbouring CTAs in a cluster and copy the operand they share once, into both, by TMA multicast.

    Two CTAs with consecutive ``bid.x`` read the same tile of an operand whose window does not use ``bid.x``
    (a GEMM's row panel of A; kmeans_assign's centroids and their norms): the even one issues its copy with
    ``multicast=3`` and the box lands in both CTAs' slots and on both CTAs' barriers; each CTA's consumers
    release a slot on both CTAs' ``empty`` barriers (``arrive(..., multicast=3)``), since the shared box may
    be refilled only when both have read it.

    Before::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
        empty = mbarrier(S, arrivals=2)
        with role("producer", warps=(0, 4), regs=40):
            ...
            expect_tx(full[kt % S], BM * BK * 2 + BK * BN * 2)
            tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S])
            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x, BN)], bar=full[kt % S])
        with role("consumer", warps=(4, 12), regs=232):
            ...
            arrive(empty[kt % S])

    After::

        @kernel(grid=(cdiv(cdiv(N, BN), 2) * 2, cdiv(M, BM)), ...)
        cluster((2, 1, 1))
        empty = mbarrier(S, arrivals=4)
        cluster_sync()
        with role("producer", warps=(0, 4), regs=40):
            ...
            expect_tx(full[kt % S], BM * BK * 2 + BK * BN * 2)
            if bid.x % 2 == 0:
                tma_load(a_s[kt % S], a[tile(bid.y, BM), tile(kt, BK)], bar=full[kt % S], multicast=3)
            tma_load(b_s[kt % S], b[tile(kt, BK), tile(bid.x, BN)], bar=full[kt % S])
        with role("consumer", warps=(4, 12), regs=232):
            ...
            arrive(empty[kt % S], multicast=3)
        cluster_sync()

    Precondition: TMA producers, warp roles, no cluster and no tile loop yet, a grid of at least two
    dimensions, and a copy whose window does not use ``bid.x`` while another operand's does. Applies to
    gemm_bf16 and kmeans_assign after ``warp_specialize`` and ``tma``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "already a cluster launch")
    refuse_unless(len(p.grid) >= 2, "a one-dimensional grid: no neighbour along x shares a tile")
    refuse_unless(not any("ncta.x" in _syms_of(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    refuse_unless(not any(n.op is Op.CP_ASYNC_BAR for n in walk_nodes(p.body)), "cp.async producers: multicast is "
                                                                              "a TMA copy")
    loads = [n for n in walk_nodes(p.body) if n.op is Op.TMA_LOAD]
    shared = [n for n in loads if "bid.x" not in view_syms(n.args[1])]
    own = [n for n in loads if "bid.x" in view_syms(n.args[1])]
    refuse_unless(bool(shared) and bool(own), "no copy shared by CTAs along x beside one that is not")
    # the ring barriers the shared copies complete on: their releases go to both CTAs
    rings = {n.args[2].buf for n in shared}
    empties = {m.args[0].buf for r in p.body if r.op is Op.ROLE for m in walk_nodes(r.body)
               if m.op is Op.WAIT and m.args[0].buf not in rings}
    # a ring's empty barrier: waited by the producer before a shared copy into the ring's slots
    prod = next(r for r in p.body if r.op is Op.ROLE and any(m.op is Op.TMA_LOAD for m in walk_nodes(r.body)))
    release = set()
    for blk in walk_nodes(prod.body):
        for i, m in enumerate(blk.body):
            if m.op is Op.TMA_LOAD and m in shared:
                prior = [x for x in blk.body[:i] if x.op is Op.WAIT and x.args[0].buf in empties]
                release |= {x.args[0].buf for x in prior}
    for i, m in enumerate(prod.body):
        if m.op is Op.TMA_LOAD and m in shared:
            release |= {x.args[0].buf for x in prod.body[:i] if x.op is Op.WAIT and x.args[0].buf in empties}
    shared_ids = {id(n) for n in shared}

    def fix(n: Node, in_consumer: bool) -> tuple[Node, ...]:
        if n.body:
            n = replace(n, body=tuple(x for m in n.body for x in fix(m, in_consumer)))
        if n.op is Op.TMA_LOAD and id(n) in shared_ids:
            cast = stmt(f"tma_load({_slot(n.args[0])}, {fmt_view(n.args[1])}, bar={_slot(n.args[2])}, multicast=3)")
            return (replace(stmt("if bid.x % 2 == 0:\n    pass"), body=(cast,)),)
        if in_consumer and n.op is Op.ARRIVE and n.args[0].buf in release and not n.attr("multicast"):
            return (stmt(f"arrive({_slot(n.args[0])}, multicast=3)"),)
        return (n,)

    body: list[Node] = [stmt("cluster((2, 1, 1))")]
    first_role = True
    for n in p.body:
        if n.op is Op.MBARRIER and n.result in release:
            n = replace(n, attrs=tuple(sorted({**dict(n.attrs), "arrivals": 2 * n.attr("arrivals")}.items())))
        if n.op is Op.ROLE:
            if first_role:
                body.append(stmt("cluster_sync()"))
                first_role = False
            consumer = any(m.op is Op.WGMMA for m in walk_nodes(n.body))
            n = replace(n, body=tuple(x for m in n.body for x in fix(m, consumer)))
        body.append(n)
    body.append(stmt("cluster_sync()"))
    gx = Bin("*", Call("cdiv", (p.grid[0], 2)), 2)
    return replace(p, grid=(gx,) + tuple(p.grid[1:]), body=tuple(body))


def _slot(s: Slot) -> str:
    return s.buf if s.index is None else f"{s.buf}[{fmt_expr(s.index)}]"


# ------------------------------------------------------------------ grouped tile order

GROUPS = (4, 8, 16)


def group_tiles(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Launch a two-dimensional grid of tiles as one dimension walked in groups of G tile rows.

    CTAs launched together then share G row panels of one operand and a few column panels of the other, so
    those stay in L2 while they are read (row-major order streams a whole row of column panels first).

    Before::

        @kernel(grid=(cdiv(N, BN), cdiv(M, BM)), ...)
            ... a[tile(bid.y, BM), tile(kt, BK)] ... b[tile(kt, BK), tile(bid.x, BN)] ...
            store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)

    After (``t`` = bid.x of the one-dimensional grid; ``gy`` = cdiv(M, BM), ``gx`` = cdiv(N, BN))::

        @kernel(grid=(cdiv(N, BN) * cdiv(M, BM),), consts={..., "G": 16})
            row = t // (G * gx) * G + t % (G * gx) % min(gy - t // (G * gx) * G, G)
            col = t % (G * gx) // min(gy - t // (G * gx) * G, G)
            ... a[tile(row, BM), ...] ... b[..., tile(col, BN)] ... store(c[tile(row, BM), tile(col, BN)], acc)

    (written out where ``bid.y`` and ``bid.x`` were). A later ``persistent`` walks the same order. Precondition:
    a grid of exactly two dimensions, no cluster, no tile loop, bid.z unused. Applies to gemm_bf16, tinygemm
    and kmeans_assign (CTA-collective or warp-specialized).
    """
    refuse_unless(len(p.grid) == 2, f"a grid of {len(p.grid)} dimensions, not two")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in _syms_of(n) or "bid.z" in _syms_of(n) for n in walk_nodes(p.body)),
                  "a tile loop or a third grid coordinate")
    g = fresh(p, "G")
    gx, gy = p.grid
    t = Sym("bid.x")
    span = Bin("*", Sym(g), gx)
    first = Bin("*", Bin("//", t, span), Sym(g))
    height = Call("min", (Bin("-", gy, first), Sym(g)))
    row = Bin("+", first, Bin("%", Bin("%", t, span), height))
    col = Bin("//", Bin("%", t, span), height)
    # substitute both coordinates at once: bid.x appears inside the new expressions
    body = tuple(map_exprs(n, lambda e: _swap_coords(e, row, col)) for n in p.body)
    return replace(p, grid=(Bin("*", gx, gy),), body=body).with_consts(**{g: int(rng.choice(GROUPS))})


def _swap_coords(e: Expr, row: Expr, col: Expr) -> Expr:
    if isinstance(e, Sym):
        return row if e.name == "bid.y" else col if e.name == "bid.x" else e
    if isinstance(e, Bin):
        return Bin(e.op, _swap_coords(e.a, row, col), _swap_coords(e.b, row, col))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_swap_coords(a, row, col) for a in e.args))
    from cake_core.ir.expr import Cmp
    if isinstance(e, Cmp):
        return Cmp(e.op, _swap_coords(e.a, row, col), _swap_coords(e.b, row, col))
    return e
