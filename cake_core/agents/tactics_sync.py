"""``drop_syncs``: the CTA barriers that order nothing, removed.

A role-free kernel written op by op puts a ``sync()`` after every step, as the shared-memory tiles it started with
needed. Once tiles live in registers (``registers``), or where consecutive ops touch different tiles, many of those
barriers order no shared-memory access: each costs every warp a wait for the slowest. ``drop_syncs`` removes, in
program order, each ``sync()`` whose removal leaves the races rule (``races.smem``: read-after-write and
write-after-read of every smem tile, cp.async copies landing at their wait, loop bodies followed into the next
trip) with nothing new to report, and that separates no global-memory write from the statements around it (a
barrier between a store and a load of the same tensor by other threads orders them; the rule does not follow
global memory, so those barriers stay).

Before (the decode state in registers; the broadcast vectors were written before the loop)::

    ewise(s_t, s_t, a_c, fn="mul")
    sync()
    ewise(t, s_t, k_c, fn="mul")
    sync()
    reduce(u, t, axis=0)

After::

    ewise(s_t, s_t, a_c, fn="mul")
    ewise(t, s_t, k_c, fn="mul")
    reduce(u, t, axis=0)

Precondition: a role-free kernel with no cluster (a role's barriers are mbarriers, the protocol checker's), at
least one ``sync()`` that orders nothing by the rule above. Every such barrier goes in one call (the choice is
forced; ``rng`` is not used).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from cake_core.agents.rewrite import refuse_unless, walk_nodes
from cake_core.ir.opdef import buffer_name
from cake_core.ir.ops import Node, Op
from cake_core.ir.program import Program
from cake_core.ir.types import MemSpace
from cake_core.ir.verify import RULES, build_ctx
from cake_core.targets import find_arch


def drop_syncs(p: Program, rng: np.random.Generator, bounds=None) -> Program:
    refuse_unless(not any(n.op in (Op.ROLE, Op.CLUSTER) for n in walk_nodes(p.body)),
                  "warp roles or a cluster: their barriers are mbarriers")
    refuse_unless(find_arch(p.target) is not None, f"unknown target `{p.target}`")
    total = sum(n.op is Op.SYNC for n in walk_nodes(p.body))
    refuse_unless(total > 0, "no sync()")
    gmem = {a.name for a in p.params if a.type.space is MemSpace.GMEM}
    races = _races(p)
    i = dropped = 0
    while i < total - dropped:
        child, segment = _without(p, i)
        if not any(_writes_gmem(n, gmem) for s in segment for n in walk_nodes((s,))) and _races(child) <= races:
            p, dropped = child, dropped + 1
        else:
            i += 1
    refuse_unless(dropped > 0, f"each of the {total} sync() orders an smem access (races.smem) or a global write")
    return p


def _races(p: Program) -> set[str]:
    """The races.smem findings of ``p`` (that rule alone: it runs once per barrier tried)."""
    return {d.message for d in RULES["races.smem"].check(build_ctx(p, find_arch(p.target)))}


def _writes_gmem(n: Node, gmem: set[str]) -> bool:
    return any(o.memory and buffer_name(a) in gmem and any(e.modifies for e in o.effects)
               for o, a in zip(n.decl.operands, n.args))


def _without(p: Program, index: int) -> tuple[Program, tuple[Node, ...]]:
    """``p`` without its ``index``-th sync() (program order), and the statements that barrier separated: those
    between the syncs before and after it in its block (the whole block of a loop body where it is the first or
    the last: the trips wrap around)."""
    seen = -1
    segment: tuple[Node, ...] = ()

    def block(nodes: tuple[Node, ...], loop: bool) -> tuple[Node, ...]:
        nonlocal seen, segment
        out: list[Node] = []
        for j, n in enumerate(nodes):
            if n.op is Op.SYNC:
                seen += 1
                if seen == index:
                    syncs = [k for k, m in enumerate(nodes) if m.op is Op.SYNC]
                    before = [k for k in syncs if k < j]
                    after = [k for k in syncs if k > j]
                    if loop and not (before and after):
                        segment = nodes
                    else:
                        segment = nodes[(before[-1] + 1 if before else 0):(after[0] if after else len(nodes))]
                    continue
            out.append(replace(n, body=block(n.body, n.op is Op.FOR)) if n.body else n)
        return tuple(out)

    return replace(p, body=block(p.body, False)), segment
