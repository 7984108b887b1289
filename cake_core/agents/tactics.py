"""Tactics: pure IR → IR rewrites the tactic agent composes.

Each tactic takes a program and a random generator and returns a new program
(or None when it does not apply). The table at the bottom is the whole set;
a tactic proposal from the harness adds a row.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from cake_core.ir.ops import Node, Op, make_attrs
from cake_core.ir.program import Program
from cake_core.targets import find_arch

TILE_SIZES = (16, 32, 64, 128)
THREAD_COUNTS = (64, 128, 256, 512)
Tactic = Callable[[Program, np.random.Generator], "Program | None"]


def _map_nodes(nodes: tuple[Node, ...], fn: Callable[[Node], Node]) -> tuple[Node, ...]:
    return tuple(fn(replace(n, body=_map_nodes(n.body, fn)) if n.body else n) for n in nodes)


def _loops(nodes: tuple[Node, ...]) -> list[Node]:
    out = []
    for n in nodes:
        if n.op is Op.FOR:
            out.append(n)
        out += _loops(n.body)
    return out


def _set_attr(n: Node, **kv) -> Node:
    merged = dict(n.attrs)
    merged.update(kv)
    return replace(n, attrs=make_attrs(n.op, merged))


def retile(p: Program, rng: np.random.Generator) -> Program | None:
    """Move one tile constant (BM, BN, BK...) to a neighbouring power of two."""
    names = [k for k, _ in p.consts if k.startswith("B")]
    if not names:
        return None
    k = names[int(rng.integers(len(names)))]
    cur = p.const_env[k]
    options = [s for s in TILE_SIZES if s != cur and (s == cur * 2 or s * 2 == cur)]
    return p.with_consts(**{k: int(rng.choice(options))}) if options else None


def rethread(p: Program, rng: np.random.Generator) -> Program | None:
    """Change the CTA's thread count."""
    options = [t for t in THREAD_COUNTS if t != p.threads]
    return replace(p, threads=int(rng.choice(options)))


def unroll(p: Program, rng: np.random.Generator) -> Program | None:
    """Set the unroll factor of the loops to a new value."""
    current = {n.attr("unroll") for n in _loops(p.body)}
    if not current:
        return None
    factor = int(rng.choice([f for f in (1, 2, 4) if {f} != current]))
    return replace(p, body=_map_nodes(p.body, lambda n: _set_attr(n, unroll=factor) if n.op is Op.FOR else n))


def retune(p: Program, rng: np.random.Generator) -> Program | None:
    """Move one schedule knob that is not a tile size (ring depth S, tile-order group G, split or CTA
    counts...) to a neighbour: +-1 below 8, else x2 or /2. Knobs that break the program's invariants
    are stopped by the verifier, the interpreter or the gate, and the tactic's weight falls."""
    names = [k for k, _ in p.consts if not k.startswith("B")]
    if not names:
        return None
    k = names[int(rng.integers(len(names)))]
    cur = p.const_env[k]
    options = [v for v in ((cur - 1, cur + 1) if cur < 8 else (cur // 2, cur * 2)) if v >= 1 and v != cur]
    return p.with_consts(**{k: int(rng.choice(options))}) if options else None


def occupancy(p: Program, rng: np.random.Generator) -> Program | None:
    """Ask for another number of CTAs sharing an SM (``ctas_per_sm``; 0 leaves it to the compiler): more
    CTAs cap the registers per thread and keep more memory requests in flight (1 is what the compiler
    assumes without it, so it is not offered). Programs with setmaxnreg roles own their SM and are left
    alone."""
    if any(n.op is Op.ROLE and n.attr("regs") for n in p.body):
        return None
    arch = find_arch(p.target)
    if arch is None:
        return None          # no target data: the verifier refuses the program anyway
    fits = arch.max_threads_per_sm // p.threads
    options = [c for c in range(0, min(fits, 4) + 1) if c != p.ctas_per_sm and c != 1]
    return replace(p, ctas_per_sm=int(rng.choice(options))) if options else None


def drop_guards(p: Program, rng: np.random.Generator) -> Program | None:
    """Remove the bounds checks of loads and stores: fewer instructions, correct only when
    every dimension is a tile multiple."""
    out = replace(p, body=_map_nodes(p.body, lambda n: _set_attr(n, guard=False)
                                      if n.op in (Op.LOAD, Op.STORE) else n))
    return out if out != p else None


TACTICS: dict[str, Tactic] = {
    "retile": retile,            # tile sizes: reuse vs. occupancy
    "rethread": rethread,        # threads per CTA: registers per thread vs. parallelism
    "unroll": unroll,            # loop unrolling
    "retune": retune,            # schedule knobs of the fast paths: ring depth, tile order, splits
    "occupancy": occupancy,      # CTAs per SM: registers per thread vs. memory requests in flight
    "drop_guards": drop_guards,  # no tail predication (risky on ragged shapes)
}
