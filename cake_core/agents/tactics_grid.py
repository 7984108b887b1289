"""Grid tactics: split-K over a new grid dimension, an independent loop onto the grid, and a grouped order of a
two-dimensional grid's tiles.

``split_k`` gives each CTA a share of the reduction and adds its partial sum into the zeroed output;
``grid_loop`` spreads the trips of a loop whose trips share nothing over CTAs (a role-free kernel's outer loop);
``group_tiles`` walks the tiles in groups of tile rows so that CTAs launched together share operand panels in
L2. The persistent grid is ``tactics_persistent``'s, the cluster tactics are ``tactics_cluster``'s.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import (Refused, buf_args, carried_reads, fresh, map_exprs, node_syms, refuse_unless,
                                      stmt, subst_expr, subst_node, subst_view, tiles_written, view_syms, walk_nodes,
                                      with_args)
from cake_core.ir.domain import GRID_LIMITS
from cake_core.ir.expr import Bin, Call, Expr, Sym, fmt_expr, symbols, try_evaluate
from cake_core.ir.opdef import Effect, buffer_name
from cake_core.ir.ops import REGISTRY, At, Node, Op, Tile, loop_range
from cake_core.ir.program import Program
from cake_core.ir.registry import COMPUTE_OPS
from cake_core.ir.printer import fmt_view


# ------------------------------------------------------------------ split-K

SPLITS = (2, 4, 8)


def refuse_unless_sums_add(roles: list[Node]) -> None:
    """Refuse a split of the reduction unless the roles' accumulators are sums of wgmma products alone: the CTAs'
    partial sums add up then. An op that writes an accumulator (an online softmax's rescale, a mask) or a register
    A (probabilities computed from an earlier product) makes the result a non-linear function of the reduction."""
    wgmmas = [m for r in roles for m in walk_nodes(r.body) if m.op is Op.WGMMA]
    fed = {m.arg("acc") for m in wgmmas} | {m.arg("a").buf for m in wgmmas}
    for n in (m for r in roles for m in walk_nodes(r.body) if m.op in COMPUTE_OPS):
        writes = {a for o, a in zip(REGISTRY[n.op].operands, n.args) if o.kind == "buf" and o.effect_of(n).modifies}
        refuse_unless(not writes & fed, f"`{n.op.value}` (line {n.line}) writes {', '.join(sorted(writes & fed))}, "
                                        "which a wgmma accumulates into or reads: the result is no sum of products "
                                        "over the reduction, so partial sums over shares of it would not add up")


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
    once. Applies to a GEMM's seed after ``warp_specialize``.

    A role-free (CTA-collective) kernel is split by ``split_collective``.
    """
    if not any(n.op is Op.ROLE for n in p.body):
        return split_collective(p, rng)
    refuse_unless(len(p.grid) <= 2, "the grid already has three dimensions")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    roles = [n for n in p.body if n.op is Op.ROLE]
    loops = []
    for r in roles:
        ls = [n for n in r.body if n.op is Op.FOR]
        refuse_unless(len(ls) == 1, f"role {r.arg('name')} has {len(ls)} top-level loops, not one reduction loop")
        refuse_unless(not any(m.op is Op.FOR for m in ls[0].body), "the reduction loop holds a loop (a candidate "
                                                                   "loop's epilogue would be split too)")
        loops.append(ls[0])
    stops = {fmt_expr(loop_range(lp)[1]) for lp in loops}
    refuse_unless(len(stops) == 1, "the roles' loops do not share one extent")
    stores = [n for r in roles for n in walk_nodes(r.body) if n.op is Op.STORE]
    accs = {n.arg("acc") for r in roles for n in walk_nodes(r.body) if n.op is Op.WGMMA}
    refuse_unless(len(stores) == 1 and stores[0].arg("src") in accs, "the accumulator is not stored once")
    refuse_unless_sums_add(roles)
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
                n = with_args(fix_views(n, n.arg("var")), extent=share)
            elif n.op is Op.STORE:
                n = stmt(f"atomic_add({fmt_view(n.arg('dst'))}, {n.arg('src')})")
            out.append(n)
        return replace(r, body=tuple(out))

    body = tuple(fix_role(n) if n.op is Op.ROLE else n for n in p.body)
    return replace(p, grid=p.grid + (Sym(split),), body=body).with_consts(**{split: int(rng.choice(SPLITS))})


def split_collective(p: Program, rng: np.random.Generator) -> Program:
    """Split-K of a role-free kernel: its one reduction loop (the loop whose body holds the ``mma``) walks a share
    of its trips in each of SPLIT CTAs, and the accumulator leaves through atomic adds into the zeroed output.

    Before (a grouped GEMM over gathered rows: one CTA per row tile, expert and column tile walks all of K)::

        @kernel(grid=(cdiv(T, BM), E, cdiv(N, BN)), ...)
            ...
            if bid.x * BM < end - start:
                fill(acc)
                for kt in range(cdiv(K, BK)):
                    gather(a_s, x[:, tile(kt, BK)], perm, base=start + bid.x * BM, limit=end)
                    load(b_s, w[bid.y, tile(kt, BK), tile(bid.z, BN)])
                    ...
                    mma(acc, a_s, b_s)
                ...
                scatter_add(y[:, tile(bid.z, BN)], rows, acc, base=start + bid.x * BM, limit=end)

    After (a grid of three dimensions takes the split in z: the old z coordinate is ``bid.z // SPLIT``)::

        @kernel(grid=(cdiv(T, BM), E, cdiv(N, BN) * SPLIT), ...)
            ...
                for kt in range(max(min(cdiv(cdiv(K, BK), SPLIT), cdiv(K, BK) - bid.z % SPLIT * ...), 0)):
                    gather(a_s, x[:, tile(bid.z % SPLIT * cdiv(cdiv(K, BK), SPLIT) + kt, BK)], perm, ...)
                ...
                scatter_add(y[:, tile(bid.z // SPLIT, BN)], rows, acc, ...)

    Precondition: one loop holds the ``mma`` and no loop; it is nested in no loop (a candidate loop's epilogue
    would see partial sums) and counts from 0 in steps of 1; besides its ``mma`` only fills write the accumulator,
    and after the loop the accumulator is only added into gmem (``scatter_add``, ``atomic_add``) or stored (the
    store becomes an atomic add into the output the harness zeroes); no other tile is carried from trip to trip;
    nothing else adds into gmem (it would add once per CTA of the split); no cluster or persistent tile loop.
    """
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    reds = _reduction_loops(p.body, nested=False)
    refuse_unless(bool(reds), "no loop holds an mma: no reduction to split")
    refuse_unless(len(reds) == 1, f"{len(reds)} loops hold an mma; the split takes one reduction loop")
    red, nested = reds[0]
    refuse_unless(not nested, f"the reduction loop (line {red.line}) is nested in a loop: a candidate loop's "
                              "epilogue would see partial sums")
    refuse_unless(not any(m.op is Op.FOR for m in walk_nodes(red.body)), "the reduction loop holds a loop")
    start, extent, step = loop_range(red)
    refuse_unless(start == 0 and step == 1, "the reduction loop does not count from 0 in steps of 1")
    refuse_unless(not any(c in p.const_env and c.startswith("SPLIT") for c in symbols(extent)),
                  "the reduction is split already (a second split multiplies the CTAs without new work per CTA)")
    mmas = [n for n in red.body if n.op is Op.MMA]
    acc = mmas[0].arg("acc")
    refuse_unless(all(m.arg("acc") == acc for m in mmas), "the reduction's mmas add into different accumulators")
    inside = {id(n) for n in walk_nodes(red.body)}
    carried = _read_before_written(red.body, tiles_written(red.body) - {acc}, set())
    refuse_unless(not carried, carried)
    params = {q.name for q in p.params}
    for n in walk_nodes(p.body):
        for o, a in zip(n.decl.operands, n.args):
            name = buffer_name(a) if o.kind in ("buf", "slot", "view") else None
            mods = o.memory and any(e.modifies for e in o.effects)
            if name == acc and mods and id(n) not in inside and n.op is not Op.FILL:
                raise Refused(f"`{n.op.value}` (line {n.line}) writes the accumulator `{acc}` besides the mma: the "
                              "result is no sum of products, so partial sums over shares of it would not add up")
            gmem = o.kind == "view" or (o.kind == "buf" and a in params)
            if gmem and Effect.ATOMIC_ADD in o.effects and acc not in buf_args(n):
                raise Refused(f"the {n.op.value} at line {n.line} adds something other than the accumulator into "
                              "gmem: it would add once per CTA of the split")
    after = [n for n in walk_nodes(p.body) if id(n) not in inside and acc in buf_args(n) and n.op is not Op.FILL]
    for n in after:
        adds = any(a == acc for o, a in zip(n.decl.operands, n.args) if o.kind == "buf" and o.effect_of(n).reads) \
            and any(Effect.ATOMIC_ADD in o.effects for o in n.decl.operands if o.kind == "view")
        refuse_unless(adds or n.op is Op.STORE,
                      f"the accumulator feeds `{n.op.value}` (line {n.line}): only atomic adds into gmem (or a "
                      "store, made one) take partial sums")
    split = fresh(p, "SPLIT")
    body = p.body
    if len(p.grid) < 3:
        ks, grid = Sym(f"bid.{'xyz'[len(p.grid)]}"), p.grid + (Sym(split),)
    else:      # fold into z: the old z coordinate is bid.z // SPLIT, the share bid.z % SPLIT
        body = tuple(map_exprs(n, lambda e: subst_expr(e, {"bid.z": Bin("//", Sym("bid.z"), Sym(split)),
                                                           "ncta.z": Bin("//", Sym("ncta.z"), Sym(split))}))
                     for n in body)
        ks, grid = Bin("%", Sym("bid.z"), Sym(split)), p.grid[:2] + (Bin("*", p.grid[2], Sym(split)),)
    ch = Call("cdiv", (extent, Sym(split)))
    share = Call("max", (Call("min", (ch, Bin("-", extent, Bin("*", ks, ch)))), 0))
    var = red.arg("var")

    def fix(n: Node) -> Node:
        if n.op is Op.FOR and any(m.op is Op.MMA for m in n.body):
            inner = tuple(subst_node(b, {var: Bin("+", Bin("*", ks, ch), Sym(var))}) for b in n.body)
            return replace(with_args(n, extent=share), body=inner)
        if n.op is Op.STORE and n.arg("src") == acc:
            return stmt(f"atomic_add({fmt_view(n.arg('dst'))}, {acc})")
        return replace(n, body=tuple(fix(b) for b in n.body))

    return replace(p, grid=grid, body=tuple(fix(n) for n in body)).with_consts(**{split: int(rng.choice(SPLITS))})


def _reduction_loops(nodes: tuple[Node, ...], nested: bool) -> list[tuple[Node, bool]]:
    """The loops whose own body holds an mma, each with whether a loop encloses it."""
    out = []
    for n in nodes:
        if n.op is Op.FOR and any(m.op is Op.MMA for m in n.body):
            out.append((n, nested))
        out += _reduction_loops(n.body, nested or n.op is Op.FOR)
    return out


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
    a grid of exactly two dimensions, no cluster, no tile loop, bid.z unused. Applies to a GEMM and to an
    argmin-epilogue contraction (CTA-collective or warp-specialized).
    """
    refuse_unless(len(p.grid) == 2, f"a grid of {len(p.grid)} dimensions, not two")
    refuse_unless(not any(n.op is Op.CLUSTER for n in p.body), "a cluster launch is left as it is")
    refuse_unless(not any("ncta.x" in node_syms(n) or "bid.z" in node_syms(n) for n in walk_nodes(p.body)),
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


# ------------------------------------------------------------------ a loop onto the grid

def grid_loop(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Spread the trips of an independent top-level loop over CTAs: a new grid dimension (or, with three
    already, the z dimension times the trips), the loop variable its CTA coordinate.

    Before (one CTA per token walks its k experts)::

        @kernel(grid=(M,), ...)
            ... routing ...
            for j in range(k):
                scalar(e, top_i[0, j], max=E - 1)
                ...
                atomic_add(out[tile(bid.x, 1), tile(nt, BN)], acc_o)

    After (one CTA per token and expert; each runs what precedes the loop itself)::

        @kernel(grid=(M, k), ...)
            ... routing ...
            scalar(e, top_i[0, bid.y], max=E - 1)
            ...

    Precondition: the loop's trips are independent. A trip is independent when it writes gmem only with atomic
    adds or into windows that name the loop variable, reads every tile the loop writes only after writing it in
    the same trip (nothing carried from trip to trip), and leaves no tile read after the loop; what runs outside
    the loop runs in every CTA, so it may store (the same values) but not add into gmem. The loop's extent must
    be a grid extent (consts and dimensions); kernels with warp roles or clusters are left to ``split_k`` and the
    cluster tactics.
    """
    refuse_unless(not any(n.op in (Op.ROLE, Op.CLUSTER) for n in p.body), "warp roles or a cluster: split_k and "
                                                                          "the cluster tactics spread those")
    refuse_unless(not any("ncta.x" in node_syms(n) for n in walk_nodes(p.body)), "a persistent tile loop")
    dims_consts = set(p.const_env) | {str(s) for q in p.params for d in q.type.shape for s in symbols(d)}
    reasons, eligible = [], []
    for i, n in enumerate(p.body):
        if n.op is not Op.FOR:
            continue
        why = _not_independent(p, i, dims_consts)
        (reasons.append(f"loop `{n.arg('var')}` (line {n.line}): {why}") if why else eligible.append(i))
    refuse_unless(bool(reasons or eligible), "no top-level loop")
    refuse_unless(bool(eligible), "; ".join(reasons))
    i = eligible[int(rng.integers(len(eligible)))]
    loop = p.body[i]
    extent = loop_range(loop)[1]
    body = p.body
    if len(p.grid) < 3:
        coord, grid = Sym(f"bid.{'xyz'[len(p.grid)]}"), p.grid + (extent,)
    else:      # fold into z: the old z coordinate is bid.z // extent, the trip bid.z % extent
        body = tuple(map_exprs(n, lambda e: subst_expr(e, {"bid.z": Bin("//", Sym("bid.z"), extent),
                                                           "ncta.z": Bin("//", Sym("ncta.z"), extent)}))
                     for n in body)
        loop = body[i]
        coord, grid = Bin("%", Sym("bid.z"), extent), p.grid[:2] + (Bin("*", p.grid[2], extent),)
    lifted = tuple(subst_node(b, {loop.arg("var"): coord}) for b in loop.body)
    return replace(p, grid=grid, body=body[:i] + lifted + body[i + 1:])


def _not_independent(p: Program, i: int, grid_names: set[str]) -> str:
    """Why top-level loop ``p.body[i]`` cannot be spread over CTAs ('' when it can)."""
    loop = p.body[i]
    start, stop, step = loop_range(loop)
    if start != 0 or step != 1:
        return "not a plain range(extent)"
    if not symbols(stop) <= grid_names:
        return f"its extent {fmt_expr(stop)} is not a grid extent (consts and dimensions only)"
    var = loop.arg("var")
    params = {q.name for q in p.params}
    gmem = lambda o, a: o.kind == "view" or (o.kind == "buf" and a in params)     # noqa: E731
    for n in walk_nodes(p.body[:i] + p.body[i + 1:]):
        if any(gmem(o, a) and Effect.ATOMIC_ADD in o.effects for o, a in zip(n.decl.operands, n.args)):
            return f"the {n.op.value} at line {n.line}, outside the loop, would add once per CTA"
    local = {n.result for n in walk_nodes(loop.body) if n.result}
    for n in walk_nodes(loop.body):
        for o, a in zip(n.decl.operands, n.args):
            effects = o.effects
            if gmem(o, a) and any(e.modifies for e in effects):
                if all(e is Effect.ATOMIC_ADD for e in effects) or (o.kind == "view" and var in view_syms(a)):
                    continue
                return f"its {n.op.value} at line {n.line} writes {fmt_view(a) if o.kind == 'view' else a} on " \
                       "every trip"
    written = tiles_written(loop.body)
    carried = _read_before_written(loop.body, written - local, set())
    if carried:
        return carried
    after = [n for n in walk_nodes(p.body[i + 1:]) if set(buf_args(n)) & (written - local)]
    reads_after = [n for n in after if any(o.memory and any(e.reads for e in o.effects) and buffer_name(a) in written
                                           for o, a in zip(n.decl.operands, n.args))]
    if reads_after:
        n = reads_after[0]
        return f"line {n.line} reads after the loop what its last trip left ({n.op.value})"
    return ""


def _read_before_written(nodes: tuple[Node, ...], written: set[str], done: set[str]) -> str:
    """The first read (in program order) of a tile the loop writes, before this trip wrote it ('' when none)."""
    carried = carried_reads(nodes, written, done)
    if not carried:
        return ""
    name, n = carried[0]
    return f"line {n.line} ({n.op.value}) reads `{name}` before the trip writes it: carried from the trip before"


# ------------------------------------------------------------------ the grid's order

UNBOUNDED_GUESS = 256        # a dimension's size when the search gave no bound for it


def grid_order(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Put on the grid's x dimension the CTA coordinate that walks the contiguous axis of the largest tensor.

    CTAs are launched x first. When the coordinate that tiles a tensor's innermost axis is y or z, CTAs launched
    together read narrow strips of rows far apart, and the rest of each row is read much later by CTAs of
    another wave: DRAM pages are opened again and again, and bandwidth falls well below its peak on a
    memory-bound kernel (a decode kernel streaming its state).

    Before (a head's state columns in blocks of BV, the blocks of one head in different waves)::

        @kernel(grid=(H, B, cdiv(DV, BV)), ...)
            load(s_t, s[bid.y, bid.x, tile(0, TK), tile(bid.z, BV)])

    After (the blocks of one row side by side; the other coordinates keep their order)::

        @kernel(grid=(cdiv(DV, BV), H, B), ...)
            load(s_t, s[bid.z, bid.y, tile(0, TK), tile(bid.x, BV)])

    ``ncta.*`` moves with its coordinate. The largest tensor is ranked by its elements at the search's largest
    shape (the ``bounds``). Precondition: a grid of two or three dimensions, no cluster (its shape follows the
    grid's axes), the largest tensor's innermost axis tiled by one CTA coordinate, not x; the extents that move
    to y and z must fit 65535 CTAs at the search's largest shape.
    """
    refuse_unless(len(p.grid) >= 2, f"a grid of {len(p.grid)} dimension: nothing to order")
    refuse_unless(not any(n.op is Op.CLUSTER for n in walk_nodes(p.body)), "a cluster launch follows the grid's axes")
    env = {**{s: UNBOUNDED_GUESS for q in p.params for d in q.type.shape for s in symbols(d)},
           **(bounds or {}), **p.const_env}
    params = {q.name: q for q in p.params}
    inner: dict[str, set[str]] = {}        # tensor -> the CTA coordinates in its views' innermost index
    for n in walk_nodes(p.body):
        for o, a in zip(n.decl.operands, n.args):
            if o.kind == "view" and a.buf in params and len(a.index) == len(params[a.buf].type.shape):
                last = a.index[-1]
                syms = set().union(*(symbols(e) for e in last.exprs())) if isinstance(last, Tile) else \
                    symbols(last.index) if isinstance(last, At) else set()
                inner.setdefault(a.buf, set()).update(s for s in syms if s.startswith("bid."))
    refuse_unless(bool(inner), "no gmem tensor is read or written through a view")

    def elements(name: str) -> float:
        v = 1.0
        for d in params[name].type.shape:
            v *= try_evaluate(d, env) or UNBOUNDED_GUESS
        return v

    largest = max(inner, key=lambda t: (elements(t), t))
    coords = inner[largest]
    refuse_unless("bid.x" not in coords, f"`{largest}`'s innermost axis is already tiled along x")
    refuse_unless(len(coords) == 1, f"`{largest}`'s innermost axis is "
                  + ("not tiled by a CTA coordinate" if not coords else f"tiled by {', '.join(sorted(coords))}"))
    axis = "xyz".index(next(iter(coords))[-1])
    order = (axis,) + tuple(a for a in range(len(p.grid)) if a != axis)        # new position i <- old order[i]
    grid = tuple(p.grid[a] for a in order)
    for i, extent in enumerate(grid[1:], start=1):
        v = try_evaluate(extent, env)
        refuse_unless(v is None or v <= GRID_LIMITS[i], f"{fmt_expr(extent)} = {int(v or 0)} CTAs along "
                      f"{'xyz'[i]} at the search's largest shape: more than {GRID_LIMITS[i]}")
    rename = {f"{kind}.{'xyz'[old]}": Sym(f"{kind}.{'xyz'[new]}") for new, old in enumerate(order)
              for kind in ("bid", "ncta")}
    body = tuple(map_exprs(n, lambda e: subst_expr(e, rename)) for n in p.body)
    return replace(p, grid=grid, body=body)
