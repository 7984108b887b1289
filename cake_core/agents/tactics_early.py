"""``hoist_loads``: a role-free kernel's global loads issued as early as their operands allow.

A kernel that loads a few small vectors, waits at a barrier, transforms them and only then loads its large tile
pays two global round trips one after the other. Issued first, the large tile's load is in flight while the
small ones come back: a load into registers blocks only where its registers are first read, and a load into
shared memory only the thread that stores what it read.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import buf_args, refuse_unless, view_syms, walk_nodes
from cake_core.ir.expr import try_evaluate
from cake_core.ir.opdef import Family
from cake_core.ir.ops import REGISTRY, Node, Op, View
from cake_core.ir.program import Program


def _defines(n: Node) -> set[str]:
    """The names ``n`` (or a node inside it) binds: a declared tile, a ``scalar``'s variable, a loop variable."""
    out: set[str] = set()
    for m in walk_nodes((n,)):
        if m.result:
            out.add(m.result)
        out |= {a for o, a in zip(REGISTRY[m.op].operands, m.args) if o.kind == "name"}
        if m.op is Op.FOR:
            out.add(m.arg("var"))
    return out


def _elements(p: Program) -> dict[str, float]:
    """Elements of each declared tile (inf where its shape does not evaluate)."""
    out = {}
    for n in walk_nodes(p.body):
        if n.op in (Op.SMEM, Op.RMEM):
            sizes = [try_evaluate(d, p.const_env) for d in n.arg("shape")]
            out[n.result] = math.prod(sizes) if all(v is not None for v in sizes) else math.inf
    return out


def _writer(nodes, tensor: str) -> Node | None:
    """The first node among ``nodes`` (or inside them) that writes, or adds into, gmem tensor ``tensor``."""
    for m in walk_nodes(tuple(nodes)):
        for o, a in zip(REGISTRY[m.op].operands, m.args):
            name = a.buf if isinstance(a, View) else a if o.kind == "buf" else None
            if name == tensor and o.effect_of(m).modifies:
                return m
    return None


def _blocks(n: Node, load: Node, elements: dict[str, float], first_write: Node | None, above_it: bool) -> str:
    """Why ``load`` cannot move above ``n`` ('' when it can); ``first_write``: the first statement that writes the
    tensor the load reads, ``above_it``: whether it comes before ``n``."""
    dst, src = load.arg("dst"), load.arg("src")
    if REGISTRY[n.op].family is Family.SYNC and first_write is not None and above_it:
        return (f"the barrier at line {n.line} orders the write of `{src.buf}` at line {first_write.line} before "
                "the load")
    if n.op is Op.LOAD and elements.get(n.arg("dst"), math.inf) >= elements.get(dst, math.inf):
        return f"line {n.line} loads a tile at least as large"
    if dst in _defines(n) or any(dst in buf_args(m) for m in walk_nodes((n,))):
        return f"line {n.line} ({n.op.value}) declares or touches `{dst}`"
    needed = view_syms(src) & _defines(n)
    if needed:
        return f"line {n.line} ({n.op.value}) binds {', '.join(sorted(needed))}, which the load's window reads"
    if (w := _writer((n,), src.buf)) is not None:
        return f"line {w.line} ({w.op.value}) writes `{src.buf}`, which the load reads"
    return ""


def hoist_loads(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    """Move each top-level gmem ``load`` of a role-free kernel up to just below the last statement it depends on.

    Before (the decode kernel: the state's load waits for the vectors' round trip, a barrier and their
    transforms)::

        s_t = rmem(f32, (TK, BV))
        ...
        load(q_r, q[...]); load(k_r, k[...]); load(g_r, g[...])
        sync()
        transpose(q_c, q_r); ...; unary(a_c, a_c, fn="exp")
        load(s_t, s[bid.y, bid.x, tile(0, TK), tile(bid.z, BV)])

    After (the state's load first, in flight while the vectors come back)::

        s_t = rmem(f32, (TK, BV))
        ...
        load(s_t, s[bid.y, bid.x, tile(0, TK), tile(bid.z, BV)])
        load(q_r, q[...]); load(k_r, k[...]); load(g_r, g[...])
        sync()
        ...

    A load moves above a statement that neither declares nor touches its destination tile, binds no name its
    window reads (a ``scalar`` read from gmem, a loop variable), writes nothing into the tensor it reads, is no
    barrier with a write of that tensor above it (the barrier orders another thread's write before the read)
    and is no load of a tile at least as large (the largest tile's load is issued first); it stays below the
    declarations. Loads move in program order, each as far as it can. Precondition: no warp roles (their
    copies are ordered by mbarriers, ``warp_specialize``'s), and at least one load that moves past a statement
    other than a declaration.
    """
    refuse_unless(not any(n.op is Op.ROLE for n in p.body), "warp roles: their copies are ordered by mbarriers")
    body = list(p.body)
    elements = _elements(p)
    moved, why = [], []
    for j in range(len(body)):
        load = body[j]
        if load.op is not Op.LOAD:
            continue
        writers = [k for k in range(j) if _writer((body[k],), load.arg("src").buf) is not None]
        first = body[writers[0]] if writers else None

        def blocks(k: int) -> str:      # why the load cannot move above body[k]
            return _blocks(body[k], load, elements, first, bool(writers) and writers[0] < k)
        i = j
        while i > 0 and not blocks(i - 1):
            i -= 1
        while i < j and REGISTRY[body[i].op].family is Family.ALLOC:
            i += 1                      # the declarations stay first
        if i == j:
            reason = blocks(j - 1) if j else "the first statement"
            why.append(f"line {load.line}: {reason or 'only declarations above it'}")
            continue
        body[i:j + 1] = [load] + body[i:j]
        moved.append(load)
    refuse_unless(bool(moved), "no top-level load can be issued earlier: " + ("; ".join(why) or "none"))
    return replace(p, body=tuple(body))
