"""The rule feature catalogue: what a mined verifier rule may say about a program and its run's shapes.

Every feature is a named scalar (int, float, bool or str); a mined rule is a conjunction of comparisons
over them (:mod:`cake_core.harness.predicate`). The families, by name prefix:

- ``op.`` op patterns, derived from the op registry (no op is named here): how often each op occurs
  (``op.wgmma``), with each value of its categorical attributes (``op.load.guard=False``,
  ``op.mma.atom=mma_sync``), the largest value of its integer attributes (``op.smem.stages.max``), in each
  role (``op.tma_load@producer``), inside loops over each problem dimension (``op.mma.loop.K``: a loop
  whose extent names ``K``) and the deepest loop nesting it sits in (``op.mma.depth``).
- ``order.`` op order: how often op B directly follows op A in one block (``order.sync>mma``).
- ``sched.`` the schedule: threads, CTAs per SM, grid rank, loops, their depth and unrolling, ring stages,
  roles with their warps and register budgets, persistence (a tile loop stepping by the CTA count), the
  cluster's CTAs.
- ``res.`` resources: shared memory per CTA in bytes, register words per thread of the rmem tiles, the
  roles' register budget times their threads.
- ``const.`` the program's consts.
- ``shape.`` shape relations, per problem dimension ``D`` that a gmem view tiles, over the run's shapes:
  ``shape.D.min`` / ``.max`` (sizes), ``.pow2`` (the largest power of two dividing every size: alignment),
  ``.tail`` (some size is not a multiple of a tile on ``D``), ``.min_tiles`` / ``.max_tiles`` (size over
  tile: the fewest and the most tiles a shape has along ``D``).
- ``view.`` view relations: ``view.fixed.max_tiles``, the most tiles (size over tile) of a dimension that a
  view covers with one tile at a fixed position, so that > 1 leaves part of the dimension untouched.
- ``ir.`` the stored IR feature summary (``cake_core.ir.features``), for rules of older harness versions;
  not offered to the miner.

Count families (``op.``, ``order.``) read 0 where a program has none; every other absent feature makes a
comparison false. Shape families exist only when the run's shapes are known.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from cake_core.ir.expr import CTA_COUNTS, Sym, symbols, try_evaluate
from cake_core.ir.ops import REGISTRY, Node, Op, Tile, View, loop_range
from cake_core.ir.program import Program
from cake_core.ir.verify import build_ctx, rmem_words_per_thread, smem_bytes
from cake_core.targets import find_arch

Value = int | float | bool | str
FAMILIES = ("op", "order", "sched", "res", "const", "shape", "view", "ir")
COUNT_FAMILIES = ("op", "order")
MINED_FAMILIES = ("op", "order", "sched", "res", "const", "shape", "view")
POW2_CAP = 1 << 12        # alignment above this is not a distinction any rule needs

_SCHED = {
    "sched.threads": "threads per CTA",
    "sched.ctas_per_sm": "the CTAs per SM the kernel asks room for",
    "sched.grid_rank": "the grid's rank",
    "sched.loops": "loops",
    "sched.loop_depth": "the deepest loop nesting",
    "sched.unroll": "the largest loop unroll factor",
    "sched.stages": "the deepest smem ring (stages)",
    "sched.roles": "warp roles",
    "sched.role_warps": "the most warps in one role",
    "sched.role_regs": "the largest register budget of a role",
    "sched.persistent": "a persistent tile loop (stepping by the CTA count)",
    "sched.cluster": "CTAs per cluster",
}
_RES = {
    "res.smem_bytes": "shared memory per CTA (bytes)",
    "res.rmem_words": "register words per thread of the rmem tiles",
    "res.role_regs_total": "the roles' register budgets times their threads",
}
_SHAPE = {
    "min": "the smallest `{d}` of the run's shapes",
    "max": "the largest `{d}` of the run's shapes",
    "pow2": "the largest power of two dividing every `{d}` of the run's shapes",
    "tail": "a shape of the run whose `{d}` is not a multiple of a tile along `{d}`",
    "min_tiles": "the fewest tiles (`{d}` / tile) a shape of the run has along `{d}`",
    "max_tiles": "the most tiles (`{d}` / tile) a shape of the run has along `{d}`",
}


@dataclass
class Catalogue:
    """The features of one program under one set of shapes, with the node each op feature first counted."""

    values: dict[str, Value] = field(default_factory=dict)
    sites: dict[str, Node] = field(default_factory=dict)

    def get(self, name: str) -> Value | None:
        return self.values.get(name, default_value(name))


def family(name: str) -> str:
    return name.split(".", 1)[0]


def default_value(name: str) -> Value | None:
    """What an absent feature reads as: 0 for counts, None (no comparison holds) for the rest."""
    return 0 if family(name) in COUNT_FAMILIES else None


def is_known(name: str) -> bool:
    return family(name) in FAMILIES and "." in name


def describe(name: str) -> str:
    """A phrase for a feature, as messages and hints use it."""
    fam, rest = name.split(".", 1)
    if fam == "op":
        if "@" in rest:
            op, role = rest.split("@", 1)
            return f"`{op}` ops in role `{role}`"
        parts = rest.split(".")
        if len(parts) == 1:
            return f"`{parts[0]}` ops"
        if parts[-1] == "depth":
            return f"the loop depth of the deepest `{parts[0]}`"
        if len(parts) == 3 and parts[1] == "loop":
            return f"`{parts[0]}` ops inside a loop over `{parts[2]}`"
        if parts[-1] == "max":
            return f"the largest `{parts[1]}` of a `{parts[0]}`"
        return f"`{parts[0]}` ops with {'.'.join(parts[1:])}"
    if fam == "order":
        a, b = rest.split(">", 1)
        return f"places where `{b}` directly follows `{a}`"
    if fam == "sched":
        return _SCHED.get(name, rest)
    if fam == "res":
        return _RES.get(name, rest)
    if fam == "const":
        return f"const `{rest}`"
    if fam == "shape":
        d, what = rest.rsplit(".", 1)
        return _SHAPE.get(what, "{d} " + what).format(d=d)
    if fam == "view" and rest == "fixed.max_tiles":
        return "the most tiles a dimension spans where a view covers it by one tile at a fixed position"
    return name


def catalogue(program: Program, shapes: Sequence[dict[str, int]] = ()) -> Catalogue:
    """Every catalogue feature of ``program``; shape and view relations over ``shapes`` when given."""
    cat = Catalogue()
    _ops(program, cat)
    _schedule(program, cat)
    _resources(program, cat)
    for k, v in program.consts:
        cat.values[f"const.{k}"] = v
    _shape_relations(program, shapes, cat)
    from cake_core.ir.features import features
    for k, v in features(program).items():
        if isinstance(v, (bool, int, float, str)):
            cat.values[f"ir.{k}"] = v
    return cat


# ------------------------------------------------------------------ op patterns

def _count(cat: Catalogue, name: str, node: Node) -> None:
    cat.values[name] = int(cat.values.get(name, 0)) + 1
    cat.sites.setdefault(name, node)


def _raise_max(cat: Catalogue, name: str, value: int | float, node: Node) -> None:
    if name not in cat.values or value > cat.values[name]:
        cat.values[name] = value
        cat.sites[name] = node


def _ops(program: Program, cat: Catalogue) -> None:
    dims = {s for p in program.params for d in p.type.shape for s in symbols(d)} - set(program.const_env)

    def block(nodes: tuple[Node, ...], depth: int, role: str | None, over: frozenset[str]) -> None:
        prev: Node | None = None
        for n in nodes:
            if n.op is Op.LET:           # a binding names an expression: it is not a step of the schedule
                continue
            d = REGISTRY[n.op]
            name = n.op.value
            _count(cat, f"op.{name}", n)
            _raise_max(cat, f"op.{name}.depth", depth, n)
            if role is not None:
                _count(cat, f"op.{name}@{role}", n)
            for dim in sorted(over):
                _count(cat, f"op.{name}.loop.{dim}", n)
            for attr, spec in d.attrs.items():
                v = n.attr(attr)
                if spec.kind in (bool, str) or spec.choices:
                    _count(cat, f"op.{name}.{attr}={v}", n)
                elif math.isfinite(v):       # an infinite fill value says nothing a rule could compare
                    _raise_max(cat, f"op.{name}.{attr}.max", v, n)
            if prev is not None:
                _count(cat, f"order.{prev.op.value}>{name}", n)
            prev = n
            if n.body:
                inner_role = n.args[0] if n.op is Op.ROLE else role
                inner = over | (symbols(loop_range(n)[1]) & dims if n.op is Op.FOR else set())
                block(n.body, depth + (n.op is Op.FOR), inner_role, frozenset(inner))
    block(program.body, 0, None, frozenset())


# ------------------------------------------------------------------ schedule and resources

def _nodes(nodes: tuple[Node, ...]) -> Iterable[tuple[Node, int]]:
    for n in nodes:
        yield n, 0
        for m, d in _nodes(n.body):
            yield m, d + (n.op is Op.FOR)


def _schedule(program: Program, cat: Catalogue) -> None:
    v = cat.values
    v["sched.threads"] = program.threads
    v["sched.ctas_per_sm"] = program.ctas_per_sm
    v["sched.grid_rank"] = len(program.grid)
    loops = [(n, d) for n, d in _nodes(program.body) if n.op is Op.FOR]
    v["sched.loops"] = len(loops)
    v["sched.loop_depth"] = max((d + 1 for _, d in loops), default=0)
    v["sched.unroll"] = max((n.attr("unroll") for n, _ in loops), default=0)
    v["sched.persistent"] = any(symbols(loop_range(n)[2]) & set(CTA_COUNTS) for n, _ in loops)
    all_nodes = [n for n, _ in _nodes(program.body)]
    v["sched.stages"] = max((n.attr("stages") for n in all_nodes if n.op is Op.SMEM), default=0)
    roles = [n for n in program.body if n.op is Op.ROLE]
    v["sched.roles"] = len(roles)
    v["sched.role_warps"] = max((hi - lo for lo, hi in (r.args[1] for r in roles)), default=0)
    v["sched.role_regs"] = max((r.attr("regs") for r in roles), default=0)
    cluster = next((n for n in all_nodes if n.op is Op.CLUSTER), None)
    dims = [try_evaluate(d, program.const_env) for d in cluster.args[0]] if cluster else []
    v["sched.cluster"] = math.prod(int(d) for d in dims) if dims and None not in dims else 1


def _resources(program: Program, cat: Catalogue) -> None:
    target = find_arch(program.target)
    if target is None:
        return
    ctx = build_ctx(program, target)
    smem = smem_bytes(ctx)
    if smem is not None:
        cat.values["res.smem_bytes"] = smem
    words = rmem_words_per_thread(ctx)
    if words is not None:
        cat.values["res.rmem_words"] = words
    roles = [n for n in program.body if n.op is Op.ROLE]
    cat.values["res.role_regs_total"] = sum(r.attr("regs") * (r.args[1][1] - r.args[1][0]) * target.warp_size
                                            for r in roles)


# ------------------------------------------------------------------ shape and view relations

@dataclass(frozen=True)
class _TiledDim:
    dim: str            # a problem dimension (a symbol of a gmem parameter's shape)
    size: int           # the tile size along it
    fixed: bool         # the tile's index is a constant: one tile at a fixed position
    node: Node


def _tiled_dims(program: Program) -> list[_TiledDim]:
    consts = program.const_env
    params = {p.name: p.type for p in program.params}
    out = []
    for n, _ in _nodes(program.body):
        d = REGISTRY[n.op]
        for oname, kind, arg in ((o.name, o.kind, x) for o, x in zip(d.operands, n.args)):
            if kind != "view" or not isinstance(arg, View) or arg.buf not in params:
                continue
            t = params[arg.buf]
            for i, dim in zip(arg.index, t.shape):
                if not (isinstance(i, Tile) and isinstance(dim, Sym) and dim.name not in consts):
                    continue
                size = try_evaluate(i.size, consts)
                if size is None or size < 1:
                    continue
                fixed = try_evaluate(i.index, consts) is not None
                out.append(_TiledDim(dim.name, int(size), fixed, n))
    return out


def _pow2(x: int) -> int:
    return min(x & -x, POW2_CAP) if x > 0 else 0


def _shape_relations(program: Program, shapes: Sequence[dict[str, int]], cat: Catalogue) -> None:
    if not shapes:
        return
    tiled = _tiled_dims(program)
    sizes: dict[str, list[int]] = {}
    for t in tiled:
        sizes.setdefault(t.dim, []).append(t.size)
    v = cat.values
    first = {}
    for t in tiled:
        first.setdefault(t.dim, t.node)
    for dim, tiles in sizes.items():
        vals = [int(s[dim]) for s in shapes if dim in s]
        if not vals:
            continue
        for what in _SHAPE:         # a shape relation points at the first view that tiles the dimension
            cat.sites[f"shape.{dim}.{what}"] = first[dim]
        v[f"shape.{dim}.min"] = min(vals)
        v[f"shape.{dim}.max"] = max(vals)
        pw = [_pow2(x) for x in vals]
        v[f"shape.{dim}.pow2"] = min(pw)
        v[f"shape.{dim}.tail"] = any(x % t for x in vals for t in tiles)
        v[f"shape.{dim}.min_tiles"] = round(min(vals) / max(tiles), 4)
        v[f"shape.{dim}.max_tiles"] = round(max(vals) / min(tiles), 4)
    fixed = [(t, max(int(s[t.dim]) for s in shapes if t.dim in s) / t.size)
             for t in tiled if t.fixed and any(t.dim in s for s in shapes)]
    if fixed:
        t, worst = max(fixed, key=lambda x: x[1])
        v["view.fixed.max_tiles"] = round(worst, 4)
        cat.sites["view.fixed.max_tiles"] = t.node

