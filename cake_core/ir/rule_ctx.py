"""The verifier's context and rule type: what every rule module imports (``verify`` runs them).

``build_ctx`` makes the symbol table once (:class:`Ctx`: buffers, roles, dims, the target's
:class:`~cake_core.targets.Arch`); a rule is a small function ``(Ctx) -> Iterable[Diagnostic]`` that a
module's :class:`RuleSet` records with a stable id, a family, a summary and the ops it guards (the
reference lists a rule under each of them). ``verify.py`` assembles the rule sets of the rule modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from cake_core.ir.expr import Expr, fmt_expr, symbols, try_evaluate
from cake_core.ir.fragments import Layout, layouts_on
from cake_core.ir.opdef import Alloc
from cake_core.ir.ops import REGISTRY, Full, Node, Op, Tile, View
from cake_core.ir.program import Program, walk
from cake_core.ir.smem_layout import SmemLayout, smem_layout
from cake_core.ir.types import MemSpace, TileType
from cake_core.outcome import Diagnostic, Severity
from cake_core.targets import Arch


# ------------------------------------------------------------------ context

@dataclass
class Ctx:
    program: Program
    target: Arch
    buffers: dict[str, TileType] = field(default_factory=dict)      # params and allocations
    defined_at: dict[str, Node] = field(default_factory=dict)
    nodes: list[tuple[Node, str, frozenset[str]]] = field(default_factory=list)  # node, path, index names in scope
    dims: set[str] = field(default_factory=set)                      # problem dims (param shape symbols)
    role_of: dict[int, Node] = field(default_factory=dict)           # id(node) -> the role block it runs in
    shapes: tuple[dict[str, int], ...] = ()                         # the run's shapes, when known
    rules: dict[str, "Rule"] = field(default_factory=dict)         # the rules run (their default severities)
    refused: bool = False     # another rule already reported an error (the protocol checker, run last, spends less)

    def diag(self, rule_id: str, node: Node | None, message: str, hint: str = "", path: str = "",
             witness: Sequence[str] = (), severity: Severity | None = None) -> Diagnostic:
        r = self.rules.get(rule_id)
        sev = severity or (r.severity if r else Severity.ERROR)
        line = node.line if node is not None else self.program.line
        col = node.col if node is not None else 1
        return Diagnostic(rule_id, sev, message, line, col, path, hint, tuple(witness))

    @property
    def consts(self) -> dict[str, int]:
        return self.program.const_env

    def static(self, e: Expr) -> int | None:
        v = try_evaluate(e, self.consts)
        return int(v) if v is not None else None

    def static_numel(self, shape: Sequence[Expr]) -> int | None:
        """Elements of a shape known at compile time; None if a dimension is not."""
        numel = 1
        for d in shape:
            v = self.static(d)
            if v is None:
                return None
            numel *= v
        return numel

    def threads_of(self, n: Node) -> int:
        """Threads that execute ``n``: its role's warps, or the whole CTA outside roles."""
        r = self.role_of.get(id(n))
        if r is None:
            return self.program.threads
        lo, hi = r.args[1]
        return max(hi - lo, 0) * self.target.warp_size

    def warpgroups_of(self, n: Node) -> int:
        """Warpgroups that execute ``n`` (a partial warpgroup counts as one)."""
        return max(-(-self.threads_of(n) // self.target.warpgroup_threads), 1)

    def swizzle_of(self, name: str) -> int:
        """The swizzle an smem tile was allocated with (0 for anything else)."""
        n = self.defined_at.get(name)
        return n.attr("swizzle") if n is not None and "swizzle" in REGISTRY[n.op].attrs else 0

    def buf_of(self, operand: Any) -> TileType | None:
        name = operand.buf if isinstance(operand, View) else operand
        return self.buffers.get(name)


def build_ctx(program: Program, target: Arch) -> Ctx:
    """The symbol table of ``program`` for the architecture ``target``."""
    ctx = Ctx(program, target)
    for p in program.params:
        ctx.buffers[p.name] = p.type
        for d in p.type.shape:
            ctx.dims |= symbols(d) - set(program.const_env)
    for top in program.body:
        if top.op is Op.ROLE:
            for n, _, _ in walk(top.body):
                ctx.role_of[id(n)] = top
    for n, path, scope in walk(program.body):
        ctx.nodes.append((n, path, scope))
        alloc = REGISTRY[n.op].allocates
        if n.result and n.result not in ctx.buffers and alloc in (Alloc.SMEM, Alloc.RMEM):
            space = MemSpace(alloc.value)
            stages = n.attr("stages") if "stages" in REGISTRY[n.op].attrs else 1
            ctx.buffers[n.result] = TileType(n.args[0], n.args[1], space, stages=stages)
            ctx.defined_at[n.result] = n
    return ctx


# ------------------------------------------------------------------ registry

@dataclass(frozen=True)
class Rule:
    id: str
    family: str
    summary: str
    severity: Severity
    check: Callable[[Ctx], Iterable[Diagnostic]]
    guards: frozenset[Op] = frozenset()      # the ops it checks (none: a whole-program rule)


class RuleSet:
    """The rules of one module, in definition order: ``@RULESET.rule(id, family, summary, guards=...)``."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def rule(self, rule_id: str, family: str, summary: str, severity: Severity = Severity.ERROR,
             guards: Iterable[Op] = ()):
        def deco(fn: Callable[[Ctx], Iterable[Diagnostic]]) -> Callable[[Ctx], Iterable[Diagnostic]]:
            self.rules.append(Rule(rule_id, family, summary, severity, fn, frozenset(guards)))
            return fn
        return deco


def view_extent(ctx: Ctx, v: View) -> tuple[Expr, ...] | None:
    """The shape of the window a view selects (``At`` dims dropped); None if the rank is wrong."""
    t = ctx.buffers.get(v.buf)
    if t is None or len(v.index) != t.rank:
        return None
    out: list[Expr] = []
    for i, d in zip(v.index, t.shape):
        if isinstance(i, Tile):
            out.append(i.size)
        elif isinstance(i, Full):
            out.append(d)
    return tuple(out)


def same_extent(ctx: Ctx, a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        vx, vy = ctx.static(x), ctx.static(y)
        if vx is not None and vy is not None:
            if vx != vy:
                return False
        elif x != y:
            return False
    return True


def stages_of(ctx: "Ctx", name: str) -> int:
    """The ring depth a tile was allocated with (``stages=``; 1 when not given)."""
    at = ctx.defined_at.get(name)
    return at.attr("stages") if at is not None and "stages" in at.decl.attrs else 1


def fmt_shape(ctx: Ctx, s: Sequence[Expr]) -> str:
    parts = []
    for d in s:
        v = ctx.static(d)
        parts.append(str(v) if v is not None else fmt_expr(d))
    return "(" + ", ".join(parts) + ")"


def smem(ctx: Ctx) -> SmemLayout:
    """The CTA's shared-memory layout, the one the lowering emits (``ir.smem_layout``), computed once."""
    got = ctx.__dict__.get("_smem_layout")
    if got is None:
        got = ctx.__dict__["_smem_layout"] = smem_layout(ctx.program, ctx.target)
    return got


def smem_bytes(ctx: Ctx) -> int | None:
    """Shared memory of one CTA as launched: tiles, mbarriers, scratch and alignment gaps (None if a size is not
    static)."""
    return smem(ctx).total


def rmem_words_per_thread(ctx: Ctx) -> int | None:
    """Register words per thread of the rmem tiles: roles run on disjoint warps, so the most any one role holds,
    plus the tiles allocated outside the roles (held by every thread)."""
    shared, per_role = 0, {}
    for n, _, _ in ctx.nodes:
        if REGISTRY[n.op].allocates is Alloc.RMEM:
            numel = ctx.static_numel(n.args[1])
            if numel is None:
                return None
            threads = ctx.threads_of(n)
            if threads <= 0:
                return None         # a role without warps: role.bounds (or resources.threads) reports it
            words = -(-numel * max(n.args[0].bytes, 4) // 4 // threads)
            if getattr(layouts(ctx).get(n.result), "kind", None) == "rows":
                words = 2           # a row vector: the thread's 2 rows, held by each thread of their quad
            r = ctx.role_of.get(id(n))
            if r is None:
                shared += words
            else:
                per_role[id(r)] = per_role.get(id(r), 0) + words
    return shared + max(per_role.values(), default=0)


def layouts(ctx: Ctx) -> dict[str, Layout]:
    """The rmem tiles the roles hold in the wgmma fragment layout (``ir.fragments``), computed once."""
    got = ctx.__dict__.get("_layouts")
    if got is None:
        got = ctx.__dict__["_layouts"] = layouts_on(ctx.program, ctx.target)
    return got
