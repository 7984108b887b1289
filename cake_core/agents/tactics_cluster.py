"""Cluster tactics on warp-specialized programs: work split over a cluster's CTAs, operands shared by multicast.

``cluster_split`` gives an output tile several CTAs of one cluster, each streaming its share of the loop, and
merges what they hold through distributed shared memory. ``multicast`` pairs neighbouring CTAs that read the
same tile of an operand and lands one TMA copy in both.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (namer, node_syms, refuse_unless, replace_expr, stmt, stmts, subst_expr,
                                      subst_view, trips_past, view_syms, walk_nodes)
from cake_core.agents.tactics_grid import refuse_unless_sums_add
from cake_core.ir.expr import Bin, Call, Sym, fmt_expr
from cake_core.ir.ops import REGISTRY, Node, Op, Slot, loop_range
from cake_core.ir.program import Program
from cake_core.ir.printer import fmt_view


# ------------------------------------------------------------------ split over a cluster

def cluster_split(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Split the roles' streamed loop over the CTAs of a cluster and merge their results through shared memory.

    A grid with too few output tiles to fill the GPU (a top-k epilogue's 32 query tiles; a small-M GEMM) gets SPLIT
    CTAs per tile along a new grid dimension, clustered: each streams its share of the loop, publishes what
    it holds (the sorted top-k lists, or the partial accumulator) to its shared memory, and after a
    ``cluster_sync()`` each CTA merges its share of the rows from every CTA of the cluster (distributed shared
    memory) and stores them. No atomics and no zeroed output.

    Before (a warp-specialized top-k epilogue)::

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
    store one of a top-k index list or of a wgmma accumulator. Applies to a top-k epilogue and to a GEMM
    after ``warp_specialize``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(len(p.grid) <= 2, "the grid already has three dimensions")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "already a cluster launch")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    roles = [n for n in p.body if n.op is Op.ROLE]
    loops = []
    for r in roles:
        ls = [n for n in r.body if n.op is Op.FOR and any(m.op is Op.WAIT for m in walk_nodes(n.body))]
        refuse_unless(len(ls) == 1, f"role {r.arg('name')} streams in {len(ls)} top-level loops, not one")
        s0, _, st = loop_range(ls[0])
        refuse_unless(s0 == 0 and st == 1, "the streamed loop does not count from 0 in steps of 1")
        loops.append(ls[0])
    cons_loop = next((lp for r, lp in zip(roles, loops) if any(m.op is Op.WGMMA for m in walk_nodes(r.body))), None)
    refuse_unless(cons_loop is not None, "no consumer loop issuing wgmma")
    base_extent = loop_range(cons_loop)[1]
    refuse_unless(all(trips_past(loop_range(lp)[1], base_extent) is not None for lp in loops),
                  "the roles' loops do not run the consumers' trips (or a few more)")
    allocs = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    accs = {n.arg("acc") for r in roles for n in walk_nodes(r.body) if n.op is Op.WGMMA}
    topk = {n.arg("top_i"): n.arg("top_v") for r in roles for n in walk_nodes(r.body) if n.op is Op.TOPK_BIAS}
    stores = [(r, n) for r in roles for n in r.body if n.op is Op.STORE]
    refuse_unless(bool(stores), "no store after the streamed loop to merge")
    for r, n in stores:
        src = n.arg("src")
        refuse_unless(src in accs or src in topk,
                      f"`{src}` is neither a wgmma accumulator nor a top-k index list: no cluster merge for it")
    refuse_unless(not (topk and any(n.arg("src") in accs for _, n in stores)), "a mix of top-k and accumulator stores")
    if not topk:
        refuse_unless_sums_add(roles)
    name = namer(p)

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
                n = shift(replace_expr(n, extent, share), n.arg("var"))
            elif n.op is Op.STORE and n.arg("src") in topk:
                vals, idxs = topk[n.arg("src")], n.arg("src")
                rows, kmax = (fmt_expr(d) for d in allocs[idxs].arg("shape"))
                pv, pi = name("pub_v"), name("pub_i")
                pubs.append((f"{pv} = smem(f32, ({rows}, {kmax}))", f"{pi} = smem(i32, ({rows}, {kmax}))"))
                merges.append(stmt(f"topk_cluster_merge({fmt_view(n.arg('dst'))}, {pv}, {pi})"))
                n = stmt(f"topk_publish({pv}, {pi}, {vals}, {idxs})")
            elif n.op is Op.STORE:
                rows, cols = (fmt_expr(d) for d in allocs[n.arg("src")].arg("shape"))
                part = name("part_s")
                pubs.append((f"{part} = smem(f32, ({rows}, {cols}))",))
                merges.append(stmt(f"acc_cluster_reduce({fmt_view(n.arg('dst'))}, {part})"))
                n = stmt(f"acc_publish({part}, {n.arg('src')})")
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
    (a GEMM's row panel of A; an argmin-epilogue contraction's centroids and their norms): the even one issues
    its copy with ``multicast=3`` and the box lands in both CTAs' slots and on both CTAs' barriers; each CTA's
    consumers release a slot on both CTAs' ``empty`` barriers (``arrive(..., multicast=3)``), since the shared
    box may be refilled only when both have read it.

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
    a GEMM and an argmin-epilogue contraction after ``warp_specialize`` and ``tma``.
    """
    refuse_unless(any(n.op is Op.ROLE for n in p.body), "no warp roles")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "already a cluster launch")
    refuse_unless(len(p.grid) >= 2, "a one-dimensional grid: no neighbour along x shares a tile")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    refuse_unless(not any(n.op is Op.CP_ASYNC_BAR for n in walk_nodes(p.body)), "cp.async producers: multicast is "
                                                                              "a TMA copy")
    loads = [n for n in walk_nodes(p.body) if n.op is Op.TMA_LOAD]
    shared = [n for n in loads if "bid.x" not in view_syms(n.arg("src"))]
    own = [n for n in loads if "bid.x" in view_syms(n.arg("src"))]
    refuse_unless(bool(shared) and bool(own), "no copy shared by CTAs along x beside one that is not")
    # the ring barriers the shared copies complete on: their releases go to both CTAs
    rings = {n.arg("bar").buf for n in shared}
    empties = {m.arg("bar").buf for r in p.body if r.op is Op.ROLE for m in walk_nodes(r.body)
               if m.op is Op.WAIT and m.arg("bar").buf not in rings}
    # a ring's empty barrier: waited by the producer before a shared copy into the ring's slots
    prod = next(r for r in p.body if r.op is Op.ROLE and any(m.op is Op.TMA_LOAD for m in walk_nodes(r.body)))
    release = set()
    for blk in walk_nodes(prod.body):
        for i, m in enumerate(blk.body):
            if m.op is Op.TMA_LOAD and m in shared:
                prior = [x for x in blk.body[:i] if x.op is Op.WAIT and x.arg("bar").buf in empties]
                release |= {x.arg("bar").buf for x in prior}
    for i, m in enumerate(prod.body):
        if m.op is Op.TMA_LOAD and m in shared:
            release |= {x.arg("bar").buf for x in prod.body[:i] if x.op is Op.WAIT and x.arg("bar").buf in empties}
    shared_ids = {id(n) for n in shared}

    def fix(n: Node, in_consumer: bool) -> tuple[Node, ...]:
        if n.body:
            n = replace(n, body=tuple(x for m in n.body for x in fix(m, in_consumer)))
        if n.op is Op.TMA_LOAD and id(n) in shared_ids:
            cast = stmt(f"tma_load({_slot(n.arg('dst'))}, {fmt_view(n.arg('src'))}, bar={_slot(n.arg('bar'))}, "
                        "multicast=3)")
            return (replace(stmt("if bid.x % 2 == 0:\n    pass"), body=(cast,)),)
        if in_consumer and n.op is Op.ARRIVE and n.arg("bar").buf in release and not n.attr("multicast"):
            return (stmt(f"arrive({_slot(n.arg('bar'))}, multicast=3)"),)
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
