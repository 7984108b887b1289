"""Tactics: pure IR -> IR rewrites the tactic agent composes; the table at the bottom is the whole set.

A tactic is ``tactic(program, rng, bounds=None) -> Program``: ``rng`` makes its choices (a stage count, a
tile size), ``bounds`` gives the largest value of each problem dimension over the run's search shapes (a
resident operand sizes its slots to cover them; held-out shapes are never among them). When its
precondition does not hold it raises :class:`Refused` with the reason, which the agent records.

Two kinds:
- **structural** tactics change which ops a kernel is made of: the MMA atom (``mma_sync``;
  ``warp_specialize`` to wgmma), the copy engine (``warp_specialize``'s cp.async ring, ``tma``), warp
  roles (``warp_specialize``, ``pingpong``), what stays in shared memory (``resident``), how wgmma
  overlaps (``batch_wgmma``, ``pipeline_wgmma``), the grid (``persistent``, ``split_k``) and the epilogue
  (``warp_specialize`` fuses scores and merges into the fragment epilogues); each documents its
  precondition and the IR before and after in its own module;
- **knob** tactics move constants within what the kernel's structure allows: tile sizes (``retile``:
  wgmma's N in 64..256, the others powers of two), ring depths (``restage``: a ring's constant and its
  buffers' stages together), other schedule constants (``retune``), thread counts, unrolling, CTAs per
  SM, guards.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

import numpy as np

from cake_core.agents.rewrite import Refused, map_nodes, refuse_unless, set_attrs, walk_nodes
from cake_core.agents.tactics_copy import resident, tma
from cake_core.agents.tactics_cluster import cluster_split, multicast
from cake_core.agents.tactics_early import hoist_loads
from cake_core.agents.tactics_grid import grid_loop, grid_order, group_tiles, split_k
from cake_core.agents.tactics_prefetch import prefetch
from cake_core.agents.tactics_registers import registers
from cake_core.agents.scan import split_state
from cake_core.agents.tactics_sync import drop_syncs
from cake_core.agents.tactics_persistent import persistent
from cake_core.agents.tactics_sched import batch_wgmma, consumer_warpgroups, pingpong, pipeline_wgmma
from cake_core.agents.tactics_ws import WGMMA_N, warp_specialize, wgmma_consts
from cake_core.ir.expr import Bin, Sym, symbols
from cake_core.ir.ops import Node, Op, Slot
from cake_core.ir.program import Program
from cake_core.ir.verify import RULES, build_ctx
from cake_core.targets import find_arch

TILE_SIZES = (16, 32, 64, 128, 256)
THREAD_COUNTS = (64, 128, 256, 512)
Tactic = Callable[..., Program]
Bounds = Mapping[str, int]


def _loops(nodes: tuple[Node, ...]) -> list[Node]:
    return [n for n in walk_nodes(nodes) if n.op is Op.FOR]


def _has_roles(p: Program) -> bool:
    return any(n.op is Op.ROLE for n in p.body)


# ------------------------------------------------------------------ what a constant is for

def ring_consts(p: Program) -> set[str]:
    """Constants that size a ring: the modulus of a slot index (``kt % S``) or the extent of a loop whose
    variable indexes slots (``for dt in range(RD): ... x_s[dt]``). They move only with their buffers'
    stages (``restage``)."""
    out: set[str] = set()
    loop_extent: dict[str, str] = {}
    for n in walk_nodes(p.body):
        if n.op is Op.FOR and isinstance(n.arg("extent"), Sym) and n.arg("extent").name in p.const_env:
            loop_extent[n.arg("var")] = n.arg("extent").name
    for n in walk_nodes(p.body):
        for a in n.args:
            if isinstance(a, Slot) and a.index is not None:
                e = a.index
                if isinstance(e, Bin) and e.op == "%" and isinstance(e.b, Sym) and e.b.name in p.const_env:
                    out.add(e.b.name)
                for s in symbols(e):
                    if s in loop_extent:
                        out.add(loop_extent[s])
        if n.op is Op.MBARRIER and isinstance(n.arg("count"), Sym):
            out.add(n.arg("count").name)
    return out


# ------------------------------------------------------------------ knob tactics

def retile(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Move one tile constant (BM, BN, BK...) to a neighbouring legal size: a power of two in a
    CTA-collective kernel; wgmma's N among 64, 128, 192, 256; wgmma's rows and reduction span stay (their
    warpgroups and swizzle decide them)."""
    fixed, n_dims = wgmma_consts(p)
    rings = ring_consts(p)
    names = [k for k, _ in p.consts if k.startswith("B") and k not in fixed and k not in rings]
    refuse_unless(bool(names), "no tile constant that the kernel's structure lets move")
    k = names[int(rng.integers(len(names)))]
    cur = p.const_env[k]
    if k in n_dims:
        options = [s for s in WGMMA_N if s != cur and abs(WGMMA_N.index(s) - WGMMA_N.index(cur)) == 1] \
            if cur in WGMMA_N else list(WGMMA_N)
    else:
        options = [s for s in TILE_SIZES if s != cur and (s == cur * 2 or s * 2 == cur)]
    refuse_unless(bool(options), f"{k} = {cur} has no legal neighbour")
    return p.with_consts(**{k: int(rng.choice(options))})


def rethread(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Change the CTA's thread count (CTA-collective kernels: roles fix theirs) to one the verifier's resource
    rules (``resources.*``: registers per thread, register tiles split evenly over the threads, shared memory,
    CTAs per SM) accept, asked of each count before one is drawn; refused, with the reason, when none is.

    Before::  ``@kernel(..., threads=128)`` with ``a_r = rmem(bf16, (BM, BK))``, BM * BK = 256
    After::   ``@kernel(..., threads=256)`` -- never 512, which would leave half a thread's element
    """
    refuse_unless(not _has_roles(p), "warp roles fix the thread count")
    arch = find_arch(p.target)
    fits = [t for t in THREAD_COUNTS if t != p.threads
            and (arch is None or not _resource_faults(replace(p, threads=t), arch))]
    refuse_unless(bool(fits), f"no other thread count of {THREAD_COUNTS} passes the verifier's resource rules")
    return replace(p, threads=int(rng.choice(fits)))


def _resource_faults(p: Program, arch) -> list:
    """The diagnostics of the verifier's ``resources.*`` rules on ``p``."""
    ctx = build_ctx(p, arch)
    return [d for k, r in RULES.items() if k.startswith("resources.") for d in r.check(ctx)]


def unroll(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Set the unroll factor of the loops to a new value."""
    current = {n.attr("unroll") for n in _loops(p.body)}
    refuse_unless(bool(current), "no loops")
    factor = int(rng.choice([f for f in (1, 2, 4) if {f} != current]))
    return replace(p, body=map_nodes(p.body, lambda n: set_attrs(n, unroll=factor) if n.op is Op.FOR else n))


def retune(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Move one schedule constant that is neither a tile size nor a ring's depth (tile-order group G,
    split or CTA counts...) to a neighbour: +-1 below 8, else x2 or /2."""
    rings = ring_consts(p)
    names = [k for k, _ in p.consts if not k.startswith("B") and k not in rings]
    refuse_unless(bool(names), "no schedule constant besides tiles and ring depths")
    k = names[int(rng.integers(len(names)))]
    cur = p.const_env[k]
    options = [v for v in ((cur - 1, cur + 1) if cur < 8 else (cur // 2, cur * 2)) if v >= 1 and v != cur]
    return p.with_consts(**{k: int(rng.choice(options))})


def restage(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Deepen or shorten a ring: its constant (``S``) and the stages of every buffer indexed ``... % S``
    move together, so no slot index leaves its buffer."""
    cands = sorted(k for k in ring_consts(p) if any(_mod_of(a) == k for n in walk_nodes(p.body)
                                                     for a in n.args if isinstance(a, Slot)))
    refuse_unless(bool(cands), "no ring indexed modulo a constant")
    k = cands[int(rng.integers(len(cands)))]
    cur = p.const_env[k]
    new = int(rng.choice([v for v in (cur - 1, cur + 1) if 2 <= v <= 8]))
    bufs = {a.buf for n in walk_nodes(p.body) for a in n.args if isinstance(a, Slot) and _mod_of(a) == k}

    def fix(n: Node) -> Node:
        if n.op is Op.SMEM and n.result in bufs:
            st = n.attr("stages")
            refuse_unless(st % cur == 0, f"`{n.result}` has {st} stages, not a multiple of {k} = {cur}")
            return set_attrs(n, stages=st // cur * new)
        return n
    return replace(p, body=map_nodes(p.body, fix)).with_consts(**{k: new})


def _mod_of(a: Slot) -> str | None:
    e = a.index
    while isinstance(e, Bin) and e.op in ("*", "+"):      # x0[it % S * 2 + 1]: the ring's index is inside
        e = e.a
    return e.b.name if isinstance(e, Bin) and e.op == "%" and isinstance(e.b, Sym) else None


def occupancy(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Ask for another number of CTAs sharing an SM (``ctas_per_sm``; 0 leaves it to the compiler): more
    CTAs cap the registers per thread and keep more memory requests in flight (1 is what the compiler
    assumes without it, so it is not offered). Programs with setmaxnreg roles own their SM and are left
    alone."""
    refuse_unless(not any(n.op is Op.ROLE and n.attr("regs") for n in p.body), "setmaxnreg roles own their SM")
    arch = find_arch(p.target)
    refuse_unless(arch is not None, f"no target data for {p.target}")
    fits = arch.max_threads_per_sm // p.threads
    options = [c for c in range(0, min(fits, 4) + 1) if c != p.ctas_per_sm and c != 1]
    refuse_unless(bool(options), "no other CTA count fits")
    return replace(p, ctas_per_sm=int(rng.choice(options)))


def drop_guards(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Remove the bounds checks of loads and stores: fewer instructions, correct only when every dimension
    is a tile multiple."""
    out = replace(p, body=map_nodes(p.body, lambda n: set_attrs(n, guard=False)
                                     if n.op in (Op.LOAD, Op.STORE) else n))
    refuse_unless(out != p, "no guarded loads or stores")
    return out


# ------------------------------------------------------------------ structural: the MMA atom

def mma_sync(p: Program, rng: np.random.Generator, bounds: Bounds | None = None) -> Program:
    """Scalar FMA to tensor-core ``mma.sync`` for every CTA-collective ``mma`` of smem tiles: m16n8k16 atoms for
    16-bit operands, three m16n8k8 tf32 products an atom for f32 ones (3xTF32: fp32's accuracy).

    Before::

        mma(dot, x_s, ct_s)

    After::

        mma(dot, x_s, ct_s, atom="mma_sync")

    The accumulator takes the fragment layout, which mma, store and the elementwise ops read (each slot at its
    coordinates): where another op (the running argmin or top-k of a distance kernel) reads it, the lowering
    refuses the child (``lower.acc_layout``). The tactic does not look past the mma it rewrites; catching that
    before the lower stage is left to the verifier's rules (a rule mined from such failures does, see
    ``tests/core/test_harness_kinds.py``).
    Precondition: an ``mma`` with ``atom="fma"`` on smem operands of one dtype, bf16, f16 or f32 (the contraction
    seeds: a GEMM, an argmin or a top-k epilogue; a chunked scan's f32 products) whose accumulator rows are a const
    or a multiple of the atom's 16 (a literal one-row accumulator, a token's vector times a weight tile, fits no
    atom whatever the knobs do); its tiles must split into the atoms over the warps, which the verifier checks.
    """
    tiles = {n.result: n for n in walk_nodes(p.body) if n.op in (Op.SMEM, Op.RMEM) and n.result}
    dtypes = {name: n.arg("dtype") for name, n in tiles.items()}
    arch = find_arch(p.target)
    atom_m = arch.mma_sync.m if arch is not None else 16

    def takes(n) -> bool:
        """Operands mma.sync takes: smem tiles of one dtype, bf16 or f16, or f32 (as tf32 products)."""
        a, b = (tiles.get(_buf_name(x)) for x in (n.arg("a"), n.arg("b")))
        kinds = {getattr(dtypes.get(_buf_name(x)), "value", "") for x in (n.arg("a"), n.arg("b"))}
        return a is not None and b is not None and a.op is Op.SMEM and b.op is Op.SMEM and len(kinds) == 1 \
            and kinds <= {"bf16", "f16", "f32"}

    def rows_fixed_off_atom(n) -> bool:
        """The accumulator's rows are a number no knob moves (not a const) and no atom's rows divide."""
        acc = tiles.get(_buf_name(n.arg("acc")))
        rows = acc.arg("shape")[0] if acc is not None else None
        return isinstance(rows, int) and rows % atom_m != 0

    fma = [n for n in walk_nodes(p.body) if n.op is Op.MMA and n.attr("atom") == "fma"]
    refuse_unless(bool(fma), "no mma with the fma atom")
    wide = [n for n in fma if takes(n)]
    refuse_unless(bool(wide), "no fma mma multiplies two smem tiles of one dtype mma.sync takes (bf16, f16, f32)")
    found = [n for n in wide if not rows_fixed_off_atom(n)]
    refuse_unless(bool(found), f"every such fma mma accumulates into a fixed number of rows that {atom_m}, the "
                               "mma.sync atom's rows, does not divide (a one-row accumulator: a token's vector)")
    return replace(p, body=map_nodes(p.body, lambda n: set_attrs(n, atom="mma_sync") if n.op is Op.MMA
                                     and n.attr("atom") == "fma" and takes(n) and not rows_fixed_off_atom(n)
                                     else n))


def _buf_name(operand) -> str:
    """The buffer an operand names (a name, or a view of one)."""
    return operand if isinstance(operand, str) else getattr(operand, "buf", "")


TACTICS: dict[str, Tactic] = {
    # structural
    "mma_sync": mma_sync,                # scalar FMA -> mma.sync tensor cores (CTA-collective)
    "warp_specialize": warp_specialize,  # loads + mma -> cp.async producer + wgmma consumer, fused epilogue
    "tma": tma,                          # cp.async ring -> TMA with expect_tx
    "resident": resident,                # an operand the candidate loop does not change, copied once
    "batch_wgmma": batch_wgmma,          # a tile's wgmmas issued back to back, one wait
    "pipeline_wgmma": pipeline_wgmma,    # one wgmma kept in flight across reduction steps
    "pingpong": pingpong,                # two consumers taking turns on the tensor cores
    "consumer_warpgroups": consumer_warpgroups,  # one consumer warpgroup <-> two, over 64 <-> 128 rows
    "persistent": persistent,            # one CTA per SM walking the tiles, rings carried across
    "split_k": split_k,                  # the reduction split over CTAs, atomics into the zeroed output
    "cluster_split": cluster_split,      # the stream split over a cluster, merged through shared memory
    "multicast": multicast,              # a tile two neighbouring CTAs share, copied once into both
    "group_tiles": group_tiles,          # a 2-D grid launched in groups of G tile rows (L2 reuse)
    "grid_order": grid_order,            # the coordinate along the largest tensor's contiguous axis moved to x
    "grid_loop": grid_loop,              # an independent loop's trips spread over CTAs (a grid dimension)
    "split_state": split_state,          # a scan state's independent columns cut into blocks, a CTA each
    "prefetch": prefetch,                # a role-free loop's copies issued a trip ahead (cp.async, two buffers)
    "hoist_loads": hoist_loads,          # a role-free kernel's top-level loads issued as early as they can be
    "registers": registers,              # an smem tile only its owners touch, moved into registers
    "drop_syncs": drop_syncs,            # the CTA barriers that order no smem access and no global write, removed
    # knobs
    "retile": retile,                    # tile sizes within the atom's constraints
    "restage": restage,                  # ring depth with its buffers' stages
    "retune": retune,                    # other schedule constants
    "rethread": rethread,                # threads per CTA
    "unroll": unroll,                    # loop unrolling
    "occupancy": occupancy,              # CTAs per SM
    "drop_guards": drop_guards,          # no tail predication (risky on ragged shapes)
}
STRUCTURAL = ("mma_sync", "warp_specialize", "tma", "resident", "batch_wgmma", "pipeline_wgmma", "pingpong",
              "consumer_warpgroups", "persistent", "split_k", "cluster_split", "multicast", "group_tiles",
              "grid_loop", "prefetch", "registers", "drop_syncs", "split_state", "grid_order",
              "hoist_loads")


def apply(name: str, p: Program, rng: np.random.Generator, bounds: Bounds | None = None,
          table: Mapping[str, Tactic] | None = None) -> Program | Refused:
    """Run tactic ``name`` on ``p``: the new program, or the refusal (its precondition's reason). A rewrite
    that leaves the program as it was is a refusal too."""
    fn = (table or TACTICS)[name]
    try:
        out = fn(p, rng, bounds=bounds)
    except Refused as r:
        return r
    if out == p:
        return Refused("the rewrite leaves the program unchanged")
    return out
