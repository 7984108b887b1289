"""``registers``: a shared-memory tile that only its owners touch, moved into registers.

A role-free kernel keeps its working tiles in shared memory: every elementwise op reads and writes them there,
each separated from the next by a barrier. An rmem tile is spread over the CTA's threads (element e in thread
e % THREADS), and the ops that read and write it element for element in that layout (a load from global memory, a
store, an elementwise op on tiles of its shape or broadcasting smem vectors onto it) run on the registers of the
thread that owns each element, with no shared-memory traffic; a reduction of it along lines each thread's
elements fall on combines those elements in registers first and exchanges only the partials
(``scratch.reduce_partials``).

Before (the state tile of a gated delta rule decode, and its product with the key)::

    s_t = smem(f32, (TK, BV))
    t = smem(f32, (TK, BV))
    ...
    load(s_t, s[bid.y, bid.x, tile(0, TK), tile(vt, BV)])
    ewise(s_t, s_t, a_c, fn="mul")
    sync()
    ewise(t, s_t, k_c, fn="mul")
    sync()
    reduce(u, t, axis=0)

After (one call moves one tile; a second call can move ``t``)::

    s_t = rmem(f32, (TK, BV))
    ...

Precondition: a role-free kernel with no cluster (a role's rmem tiles are its own); an smem tile of one stage, no
swizzle, a static shape whose elements the CTA's threads divide; every op that names it takes an rmem tile there
(its declaration's spaces: no copy engine, no slot or window of it) and touches only the elements each thread owns
(``scratch.staged_operands`` names no exchange of it, or a reduction ``reduce_partials`` splits over its owners);
and the kernel, with the tile in registers, verifies with no error the original did not have (the register
budget, ``resources.rmem_split``). One tile a call, chosen at random among those that qualify; the refusal names
each tile and why not.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import map_nodes, refuse_unless, walk_nodes
from cake_core.ir.expr import try_evaluate
from cake_core.ir.opdef import buffer_name
from cake_core.ir.ops import Node, Op
from cake_core.ir.program import Program
from cake_core.ir.scratch import reduce_partials, staged_operands
from cake_core.ir.shapes import norm_axis
from cake_core.ir.types import MemSpace, TileType
from cake_core.ir.verify import verify
from cake_core.targets import find_arch
from cake_core.ir.rule_ctx import build_ctx


def registers(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    refuse_unless(not any(n.op in (Op.ROLE, Op.CLUSTER) for n in walk_nodes(p.body)),
                  "warp roles or a cluster: a role's register tiles are its own")
    arch = find_arch(p.target)
    refuse_unless(arch is not None, f"unknown target `{p.target}`")
    types = build_ctx(p, arch).buffers
    before = {(d.rule, d.line) for d in verify(p) if d.is_error}
    reasons, eligible = [], []
    for n in walk_nodes(p.body):
        if n.op is Op.SMEM:
            why = _not_movable(p, n, types) or _new_errors(p, n.result, before)
            (reasons.append(f"`{n.result}` (line {n.line}): {why}") if why else eligible.append(n.result))
    refuse_unless(bool(reasons or eligible), "no smem tile")
    refuse_unless(bool(eligible), "; ".join(reasons))
    return promote(p, eligible[int(rng.integers(len(eligible)))])


def promote(p: Program, name: str) -> Program:
    """``p`` with the smem tile ``name`` declared as an rmem tile of the same dtype and shape."""
    def to_rmem(n: Node) -> Node:
        return replace(n, op=Op.RMEM, attrs=()) if n.op is Op.SMEM and n.result == name else n
    return replace(p, body=map_nodes(p.body, to_rmem))


def _not_movable(p: Program, decl: Node, types: dict[str, TileType]) -> str | None:
    name = decl.result
    if decl.attr("stages") != 1 or decl.attr("swizzle"):
        return "a ring or a swizzled tile (the copy engines' layout)"
    shape = tuple(try_evaluate(d, p.const_env) for d in decl.arg("shape"))
    if any(d is None for d in shape):
        return "its shape is not static"
    numel = int(np.prod([int(d) for d in shape]))
    if numel % p.threads:
        return f"{numel} elements do not split evenly over {p.threads} threads"
    moved = {**types, name: replace(types[name], space=MemSpace.RMEM)}

    def static(t: TileType) -> tuple[int, ...] | None:
        dims = tuple(try_evaluate(d, p.const_env) for d in t.shape)
        return None if any(d is None for d in dims) else tuple(int(d) for d in dims)

    for n in walk_nodes(p.body):
        if n.op in (Op.SMEM, Op.RMEM) or not n.args:
            continue
        for o, a in zip(n.decl.operands, n.args):
            if buffer_name(a) != name or not o.memory:
                continue
            if o.kind != "buf" or MemSpace.RMEM not in o.space:
                return f"`{n.op.value}` (line {n.line}) takes it as `{o.name}` in " \
                       f"{'/'.join(s.value for s in o.space) or 'a window'}"
        if name not in staged_operands(n, moved.get, static):
            continue
        if n.op is Op.REDUCE and buffer_name(n.arg("src")) == name and buffer_name(n.arg("dst")) != name \
                and reduce_partials(shape, norm_axis(n.attr("axis"), len(shape)), p.threads,
                                    types[name].dtype.bytes) is not None:
            continue
        return f"`{n.op.value}` (line {n.line}) moves its elements between threads"
    return None


def _new_errors(p: Program, name: str, before: set[tuple[str, int]]) -> str | None:
    """Why the kernel with ``name`` in registers is worse off: a verifier error the original did not have."""
    new = [d for d in verify(promote(p, name)) if d.is_error and (d.rule, d.line) not in before]
    return f"in registers it fails {new[0].rule}: {new[0].message}" if new else None
