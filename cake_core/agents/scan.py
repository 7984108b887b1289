"""Chunked scans with a carried state: recognising the loop, and spreading the state's independent columns over CTAs.

A scan streams its input chunk by chunk past a state that every trip reads and then rewrites; the state is
loaded (or filled) before the loop and stored after it, and each trip may store an output window of its own.
The KDA seeds are scans (a token at a time; the chunked KDA kernels: 64 tokens at a time, with the UT
transform inside)::

    load(s_t, s[bid.y, bid.x, tile(0, TK), tile(0, TV)])      # the state, before the loop
    for c in range(cdiv(T, BT)):
        load(f_a, g[bid.y, tile(c, BT), bid.x, tile(0, TK)])  # streamed: the window moves with `c`
        ...
        mma(acc_x, f_b, s_t)                                  # read before the trip writes it: carried
        ...
        store(o[bid.y, tile(c, BT), bid.x, tile(0, TV)], acc_o)
        cast(s_t, acc_s)                                      # the new state
    store(s[bid.y, bid.x, tile(0, TK), tile(0, TV)], s_t)

``find_scan`` returns that structure as data or raises ``Refused`` naming what does not fit.

``split_state`` is the scan's grid tactic. A trip's work on one column of the KDA state never meets another
column's: the state's columns are multiplied as an mma's B (or its accumulator's columns), scaled by per-row
vectors and stored; nothing reduces across them. Such an axis can be cut into blocks, one CTA per block, each
scanning its block of columns with the whole of everything else (the chunk's row-side work, recomputed in
each CTA). The analysis follows every tile's values through the program, a version per write (a tile reused
for k, then v, then q holds three values with three layouts), and unites the axes each op connects: an
elementwise op its operands' equal axes (a size-1 axis broadcasts), ``mma`` the accumulator's rows with A's
and its columns with B's, ``transpose`` crosswise, a load or store the tile's axes with the tensor's
dimensions. The axes an op mixes (mma's contraction, a reduction's or scan's axis, an iota's axis, a
triangular solve's rows) may not hold the split columns, nor may any axis an op outside that list touches.
The state's axis whose class holds none of those, reaches the tensors only through ``tile(0, E)`` windows
and has extent E in every tile is split: a new constant (half of E) sizes it, its windows become
``tile(bid.z, ·)`` (the new grid dimension's coordinate) and the grid gains ``cdiv(dim, ·)`` CTAs there. A
tile whose versions hold the split columns only some of the time (the reused staging tile) gets a second,
narrower tile for those versions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cake_core.agents.rewrite import (Refused, carried_reads, map_exprs, namer, node_syms, refuse_unless, subst_expr,
                                      tiles_written, view_syms, walk_nodes, with_args)
from cake_core.ir.expr import Bin, Call, Sym, fmt_expr, symbols, try_evaluate
from cake_core.ir.ops import REGISTRY, Full, Node, Op, Tile, View
from cake_core.ir.program import Program

_ELEMENTWISE = frozenset({Op.EWISE, Op.UNARY, Op.CAST, Op.SELECT, Op.FILL})
_NO_TILES = frozenset({Op.SYNC, Op.LET})
MIN_BLOCK = 16                 # the narrowest column block split_state makes
_BLOCK = "split.block"         # stands for the block's coordinate while the windows are rewritten


@dataclass(frozen=True)
class Scan:
    """A chunked scan (see the module docstring)."""

    index: int                   # the loop's position in the kernel's body
    loop: Node
    carried: tuple[str, ...]     # tiles a trip reads before it writes them, and writes: the state
    streamed: tuple[Node, ...]   # loads whose window moves with the loop variable
    emitted: tuple[Node, ...]    # stores whose window moves with the loop variable


def find_scan(p: Program) -> Scan:
    """The chunked scan of a role-free program, or ``Refused``."""
    refuse_unless(not any(n.op in (Op.ROLE, Op.CLUSTER) for n in p.body), "warp roles or a cluster: a scan is "
                                                                           "recognised in a role-free kernel")
    loops = [i for i, n in enumerate(p.body) if n.op is Op.FOR]
    refuse_unless(len(loops) == 1, f"the kernel's top level has {len(loops)} loops; a scan is one loop over chunks")
    i = loops[0]
    loop, before = p.body[i], p.body[:i]
    refuse_unless(not any(n.op is Op.FOR for n in walk_nodes(loop.body)), "the chunk loop holds another loop")
    var = loop.arg("var")
    local = {n.result for n in walk_nodes(loop.body) if n.result}
    carried = list(dict.fromkeys(name for name, _ in carried_reads(loop.body, tiles_written(loop.body) - local)))
    refuse_unless(bool(carried), f"loop `{var}` (line {loop.line}) carries nothing from trip to trip: its trips are "
                                 "independent (grid_loop spreads them over CTAs)")
    set_before = tiles_written(before)
    filled = {n.result for n in before if n.op is Op.RMEM and n.attr("fill") is not None}
    for c in carried:
        refuse_unless(c in set_before | filled, f"the carried tile `{c}` is read on the first trip before anything "
                                                "writes it")
    streamed = tuple(n for n in walk_nodes(loop.body) if n.op is Op.LOAD and var in view_syms(n.arg("src")))
    refuse_unless(bool(streamed), f"loop `{var}` loads no window that moves with it: nothing is streamed")
    emitted = tuple(n for n in walk_nodes(loop.body) if n.op is Op.STORE and var in view_syms(n.arg("dst")))
    return Scan(i, loop, tuple(carried), streamed, emitted)


# ------------------------------------------------------------------ which axes hold which columns


class _Axes:
    """Union-find over tile-version axes ``("t", version, axis)`` and tensor dimensions ``("d", tensor, dim)``;
    ``mixed`` holds the keys whose class may not be split, with why."""

    def __init__(self) -> None:
        self.parent: dict[tuple, tuple] = {}
        self.mixed: dict[tuple, str] = {}

    def find(self, k: tuple) -> tuple:
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: tuple, b: tuple) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def mix(self, k: tuple, why: str) -> None:
        self.find(k)
        self.mixed.setdefault(k, why)

    def members(self, k: tuple) -> list[tuple]:
        root = self.find(k)
        return [m for m in list(self.parent) if self.find(m) == root]


@dataclass
class _Flow:
    """The versions of every tile through the program: which version each operand of each statement names."""

    p: Program
    axes: _Axes
    buf_of: dict[int, str]                    # version -> its tile
    shape: dict[str, tuple[int, ...]]         # tile -> its extents
    cur: dict[str, int]
    uses: dict[tuple, int]                    # (statement path, operand index) -> version
    views: list[tuple[str, int, object, int]]  # (tensor, dim, index, line) of every gmem access
    entry: dict[tuple, dict[str, int]]        # loop path -> the version of each tile its first trip starts with

    def new(self, buf: str) -> int:
        v = len(self.buf_of)
        self.buf_of[v] = buf
        return v

    def ext(self, v: int) -> tuple[int, ...]:
        return self.shape[self.buf_of[v]]

    def key(self, v: int, axis: int) -> tuple:
        return ("t", v, axis)

    def mix_all(self, v: int, why: str) -> None:
        for a in range(len(self.ext(v))):
            self.axes.mix(self.key(v, a), why)


def _flow(p: Program) -> _Flow:
    f = _Flow(p, _Axes(), {}, {}, {}, {}, [], {})
    for n in walk_nodes(p.body):
        if n.op in (Op.SMEM, Op.RMEM):
            ext = tuple(try_evaluate(d, p.const_env) for d in n.arg("shape"))
            f.shape[n.result] = tuple(-1 if x is None else x for x in ext)
    _walk(f, p.body, ())
    return f


def _walk(f: _Flow, nodes: tuple[Node, ...], path: tuple[int, ...]) -> None:
    for i, n in enumerate(nodes):
        here = path + (i,)
        if n.op in (Op.SMEM, Op.RMEM):
            f.cur[n.result] = f.new(n.result)
            if n.op is Op.SMEM and n.attr("stages") != 1:
                f.mix_all(f.cur[n.result], f"`{n.result}` is a ring")
        elif n.op in (Op.FOR, Op.IF):
            before = f.entry[here] = dict(f.cur)
            _walk(f, n.body, here)
            for b, v in f.cur.items():       # a loop's next trip (or the path past an if) sees either version
                if b in before and before[b] != v:
                    for a in range(len(f.ext(v))):
                        f.axes.union(f.key(before[b], a), f.key(v, a))
        elif n.op not in _NO_TILES:
            _op(f, n, here)


def _gmem_axes(f: _Flow, view: View, v: int, line: int) -> None:
    """Unite tile version ``v``'s axes with the dimensions its window spans (a single index drops one)."""
    spans = [(d, ix) for d, ix in enumerate(view.index) if isinstance(ix, (Tile, Full))]
    for d, ix in enumerate(view.index):
        f.views.append((view.buf, d, ix, line))
    ext = f.ext(v)
    tiled = [(d, ix) for d, ix in spans if not (isinstance(ix, Tile) and try_evaluate(ix.size, f.p.const_env) == 1)] \
        if len(spans) != len(ext) else spans
    if len(spans) == len(ext):
        for a, (d, _) in enumerate(spans):
            f.axes.union(f.key(v, a), ("d", view.buf, d))
    elif len([x for x in ext if x != 1]) == len(tiled):
        for a, (d, _) in zip([a for a, x in enumerate(ext) if x != 1], tiled):
            f.axes.union(f.key(v, a), ("d", view.buf, d))
    else:
        f.mix_all(v, f"`{f.buf_of[v]}`'s axes do not match its window on `{view.buf}` (line {line})")
        for d, _ in spans:
            f.axes.mix(("d", view.buf, d), f"a window on `{view.buf}` (line {line}) the analysis cannot follow")


def _broadcast(f: _Flow, dst: int, src: int, line: int) -> None:
    """Unite the axes an elementwise op lines up (trailing axes first, as numpy does; a size-1 axis broadcasts)."""
    de, se = f.ext(dst), f.ext(src)
    for k in range(1, min(len(de), len(se)) + 1):
        a, b = len(de) - k, len(se) - k
        if de[a] == se[b]:
            f.axes.union(f.key(dst, a), f.key(src, b))
        elif se[b] != 1:
            f.axes.mix(f.key(dst, a), f"line {line} lines up axes of different extents")
            f.axes.mix(f.key(src, b), f"line {line} lines up axes of different extents")


def _op(f: _Flow, n: Node, here: tuple[int, ...]) -> None:
    ops = REGISTRY[n.op].operands
    read: dict[str, int] = {}
    for j, (o, a) in enumerate(zip(ops, n.args)):
        if o.kind == "view" and isinstance(a, View):
            if n.op not in (Op.LOAD, Op.STORE):
                for d, ix in enumerate(a.index):
                    f.views.append((a.buf, d, ix, n.line))
                    f.axes.mix(("d", a.buf, d), f"`{n.op.value}` (line {n.line}) reads `{a.buf}`")
            continue
        if o.kind in ("buf", "slot") and not isinstance(a, str) and a is not None:
            name = getattr(a, "buf", None)
            if name in f.cur:
                f.mix_all(f.cur[name], f"`{n.op.value}` (line {n.line}) names a slot of `{name}`")
            continue
        if o.kind == "buf" and isinstance(a, str) and a in f.cur and o.effect_of(n).reads:
            read[o.name] = f.cur[a]
            f.uses[(here, j)] = f.cur[a]
    wrote: dict[str, int] = {}
    for j, (o, a) in enumerate(zip(ops, n.args)):
        if o.kind == "buf" and isinstance(a, str) and a in f.cur and o.effect_of(n).modifies:
            v = f.new(a)
            f.cur[a] = wrote[o.name] = v
            f.uses[(here, j)] = v
    _connect(f, n, read, wrote)


def _connect(f: _Flow, n: Node, read: dict[str, int], wrote: dict[str, int]) -> None:
    k, line = f.key, n.line
    two = all(len(f.ext(v)) == 2 for v in (*read.values(), *wrote.values()))
    if n.op in _ELEMENTWISE:
        (dst,) = wrote.values()
        for src in read.values():
            _broadcast(f, dst, src, line)
    elif n.op is Op.MMA and two:
        acc, old, a, b = wrote["acc"], read["acc"], read["a"], read["b"]
        f.axes.union(k(acc, 0), k(old, 0)), f.axes.union(k(acc, 1), k(old, 1))
        f.axes.union(k(acc, 0), k(a, 0)), f.axes.union(k(acc, 1), k(b, 1))
        f.axes.mix(k(a, 1), f"mma (line {line}) contracts it"), f.axes.mix(k(b, 0), f"mma (line {line}) contracts it")
    elif n.op in (Op.REDUCE, Op.SCAN) and len(f.ext(wrote["dst"])) == len(f.ext(read["src"])):
        dst, src, ax = wrote["dst"], read["src"], n.attr("axis")
        for a in range(len(f.ext(dst))):
            if a == ax:
                f.axes.mix(k(src, a), f"`{n.op.value}` (line {line}) runs along it")
                f.axes.mix(k(dst, a), f"`{n.op.value}` (line {line}) runs along it")
            else:
                f.axes.union(k(dst, a), k(src, a))
    elif n.op is Op.TRANSPOSE and two:
        f.axes.union(k(wrote["dst"], 0), k(read["src"], 1)), f.axes.union(k(wrote["dst"], 1), k(read["src"], 0))
    elif n.op is Op.IOTA:
        f.axes.mix(k(wrote["dst"], n.attr("axis")), f"iota (line {line}) counts along it")
    elif n.op is Op.TRISOLVE and two:
        x, old = wrote["x"], read["x"]
        f.axes.union(k(x, 1), k(old, 1))
        for v in (x, old):
            f.axes.mix(k(v, 0), f"trisolve (line {line}) solves along it")
        f.mix_all(read["l"], f"trisolve (line {line}) solves with it")
    elif n.op is Op.LOAD:
        _gmem_axes(f, n.arg("src"), wrote["dst"], line)
    elif n.op is Op.STORE:
        _gmem_axes(f, n.arg("dst"), read["src"], line)
    else:
        for v in (*read.values(), *wrote.values()):
            f.mix_all(v, f"`{n.op.value}` (line {line}) is not followed column by column")


# ------------------------------------------------------------------ the split


@dataclass(frozen=True)
class _Split:
    keys: frozenset                  # the class's keys
    extent: int                      # every tile axis and window in it spans this many elements
    dim: object                      # the tensors' extent of the split dimension (an expression)


def _splittable(f: _Flow, seed: tuple) -> _Split | str:
    members = f.axes.members(seed)
    why = next((f.axes.mixed[m] for m in members if m in f.axes.mixed), None)
    if why:
        return f"the columns meet: {why}"
    dims = {(m[1], m[2]) for m in members if m[0] == "d"}
    if not dims:
        return "its columns never reach a tensor"
    extents = {f.ext(m[1])[m[2]] for m in members if m[0] == "t"}
    if len(extents) != 1:
        return f"its columns have several extents ({sorted(extents)})"
    (extent,) = extents
    for buf, d, ix, line in f.views:
        if (buf, d) not in dims:
            continue
        if not (isinstance(ix, Tile) and ix.index == 0 and ix.base == 0 and ix.limit is None
                and try_evaluate(ix.size, f.p.const_env) == extent):
            return f"`{buf}` is indexed along it at line {line} other than tile(0, {extent})"
    params = {q.name: q for q in f.p.params}
    sizes = {fmt_expr(params[b].type.shape[d]) for b, d in dims}
    if len(sizes) != 1:
        return f"its tensors' dimensions differ ({', '.join(sorted(sizes))})"
    if extent < 2 * MIN_BLOCK or extent % 2:
        return f"{extent} columns: halves narrower than {MIN_BLOCK}"
    b, d = next(iter(dims))
    return _Split(frozenset(members), extent, params[b].type.shape[d])


def split_state(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Cut a scan state's independent columns into blocks, one CTA per block along a new grid dimension.

    Before (one CTA per head scans all 128 columns of its state)::

        @kernel(grid=(H, B), consts={"TV": 128, ...})
            s_t = smem(f32, (TK, TV))
            load(s_t, s[bid.y, bid.x, tile(0, TK), tile(0, TV)])
            ...

    After (two CTAs per head, each scanning 64 columns; the row-side work of a chunk is done in both)::

        @kernel(grid=(H, B, cdiv(DV, BV)), consts={"BV": 64, "TV": 128, ...})
            s_t = smem(f32, (TK, BV))
            load(s_t, s[bid.y, bid.x, tile(0, TK), tile(bid.z, BV)])
            ...

    With three grid dimensions already, the blocks fold into z, as ``grid_loop`` folds trips: the old z
    coordinate is ``bid.z // cdiv(DV, BV)``, the block ``bid.z % cdiv(DV, BV)``.

    Precondition: a chunked scan (``find_scan``), with a new grid dimension's coordinate (``bid.y`` or
    ``bid.z``) not yet read where the grid has fewer than three, and an axis of its state whose columns the
    program never mixes (see the module docstring). The block is half the axis; the kernel then serves that
    dimension at any extent (the last block's tail is guarded like any window's).
    """
    scan = find_scan(p)
    if len(p.grid) < 3:
        coord = f"bid.{'xyz'[len(p.grid)]}"
        refuse_unless(not any(coord in node_syms(n) for n in walk_nodes(p.body)), f"the kernel reads {coord}")
    f = _flow(p)
    entry = f.entry[(scan.index,)]
    reasons, split = [], None
    for c in scan.carried:
        v = entry[c]
        for a in reversed(range(len(f.ext(v)))):
            got = _splittable(f, f.key(v, a))
            if isinstance(got, _Split):
                split = got
                break
            reasons.append(f"`{c}` axis {a}: {got}")
        if split:
            break
    if split is None:
        raise Refused("no state axis can be split: " + "; ".join(reasons))
    return _rewrite(p, f, split)


def _rewrite(p: Program, f: _Flow, split: _Split) -> Program:
    name = namer(p)
    block = name("BV")
    half = split.extent // 2
    # tile -> {version: the axes of it that hold split columns}
    held: dict[str, dict[int, frozenset[int]]] = {}
    used = set(f.uses.values())
    for v, b in f.buf_of.items():
        if v not in used:
            continue
        held.setdefault(b, {})[v] = frozenset(a for a in range(len(f.ext(v))) if f.key(v, a) in split.keys)
    decls = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM)}
    renamed: dict[int, str] = {}          # version -> the tile it lives in now
    new_decls: dict[str, list[Node]] = {}  # original tile -> the declarations that replace it
    for b, versions in held.items():
        sigs = {s for s in versions.values()}
        plain = frozenset() in sigs
        for s in sorted(sigs, key=sorted):
            if not s:
                continue
            target = name(f"{b}_b") if plain or len(sigs) > 1 else b
            d = decls[b]
            shape = tuple(Sym(block) if a in s else x for a, x in enumerate(d.arg("shape")))
            new_decls.setdefault(b, [d] if plain else []).append(replace(with_args(d, shape=shape), result=target))
            for v, sv in versions.items():
                if sv == s:
                    renamed[v] = target
    dims = {(m[1], m[2]) for m in split.keys if m[0] == "d"}

    def fix_view(view: View) -> View:
        return View(view.buf, tuple(Tile(Sym(_BLOCK), Sym(block)) if (view.buf, d) in dims else ix
                                    for d, ix in enumerate(view.index)))

    def rebuild(nodes: tuple[Node, ...], path: tuple[int, ...]) -> tuple[Node, ...]:
        out: list[Node] = []
        for i, n in enumerate(nodes):
            here = path + (i,)
            if n.op in (Op.SMEM, Op.RMEM) and n.result in new_decls:
                out += new_decls[n.result]
                continue
            args = list(n.args)
            for j, a in enumerate(args):
                if isinstance(a, View):
                    args[j] = fix_view(a)
                elif (here, j) in f.uses and f.uses[(here, j)] in renamed:
                    args[j] = renamed[f.uses[(here, j)]]
            out.append(replace(n, args=tuple(args), body=rebuild(n.body, here) if n.body else n.body))
        return tuple(out)

    blocks = Call("cdiv", (split.dim, Sym(block)))
    body = rebuild(p.body, ())
    if len(p.grid) < 3:
        grid, coord = p.grid + (blocks,), Sym(f"bid.{'xyz'[len(p.grid)]}")
    else:      # fold into z: the old z coordinate is bid.z // blocks, the block bid.z % blocks
        body = tuple(map_exprs(n, lambda e: subst_expr(e, {"bid.z": Bin("//", Sym("bid.z"), blocks),
                                                           "ncta.z": Bin("//", Sym("ncta.z"), blocks)}))
                     for n in body)
        grid, coord = p.grid[:2] + (Bin("*", p.grid[2], blocks),), Bin("%", Sym("bid.z"), blocks)
    body = tuple(map_exprs(n, lambda e: subst_expr(e, {_BLOCK: coord})) for n in body)
    before, after = _referenced(p.grid, p.body), _referenced(grid, body)
    consts = tuple((k, v) for k, v in p.consts if k in after or k not in before) + ((block, half),)
    return replace(p, grid=grid, body=body, consts=tuple(sorted(consts)))


def _referenced(grid: tuple, body: tuple[Node, ...]) -> set[str]:
    """The symbols a kernel's grid and statements name (a constant the split leaves unnamed is dropped)."""
    out = set().union(*(symbols(e) for e in grid))
    for n in walk_nodes(body):
        out |= node_syms(n)
    return out
