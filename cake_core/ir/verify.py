"""The verifier: registered rules with stable ids, every diagnostic collected.

A rule is a small function ``(Ctx) -> Iterable[Diagnostic]`` registered with
``@rule(id, family, summary)``. ``verify`` builds the symbol table once
(``Ctx``), runs every rule, and returns all diagnostics sorted by line.
Learned rules (anything with ``diagnose(program, shapes) -> [Diagnostic]``,
``cake_core.harness.learned.LearnedRule``) come from approved harness versions
and run beside the built-in ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from cake_core.ir.expr import CTA_COORDS, Expr, Sym, fmt_expr, symbols, try_evaluate
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Tile, View
from cake_core.ir.program import Program, walk
from cake_core.ir.targets import known_targets, load_target
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.outcome import Diagnostic, Severity


# ------------------------------------------------------------------ context

@dataclass
class Ctx:
    program: Program
    target: dict[str, Any]
    buffers: dict[str, TileType] = field(default_factory=dict)      # params and allocations
    defined_at: dict[str, Node] = field(default_factory=dict)
    nodes: list[tuple[Node, str, frozenset[str]]] = field(default_factory=list)  # node, path, index names in scope
    dims: set[str] = field(default_factory=set)                      # problem dims (param shape symbols)
    role_of: dict[int, Node] = field(default_factory=dict)           # id(node) -> the role block it runs in
    shapes: tuple[dict[str, int], ...] = ()                         # the run's shapes, when known

    def diag(self, rule_id: str, node: Node | None, message: str, hint: str = "", path: str = "",
             witness: Sequence[str] = (), severity: Severity | None = None) -> Diagnostic:
        r = RULES.get(rule_id)
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
        return max(hi - lo, 0) * self.target["warp_size"]

    def buf_of(self, operand: Any) -> TileType | None:
        name = operand.buf if isinstance(operand, View) else operand
        return self.buffers.get(name)


def build_ctx(program: Program, target: dict[str, Any]) -> Ctx:
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
        if n.result and n.result not in ctx.buffers and n.op is not Op.MBARRIER:
            space = MemSpace.SMEM if n.op is Op.SMEM else MemSpace.RMEM
            stages = n.attr("stages") if n.op is Op.SMEM else 1
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


RULES: dict[str, Rule] = {}


def rule(rule_id: str, family: str, summary: str, severity: Severity = Severity.ERROR):
    def deco(fn: Callable[[Ctx], Iterable[Diagnostic]]) -> Callable[[Ctx], Iterable[Diagnostic]]:
        assert rule_id not in RULES, rule_id
        RULES[rule_id] = Rule(rule_id, family, summary, severity, fn)
        return fn
    return deco


class LearnedCheck(Protocol):
    """A rule from an approved harness version (``cake_core.harness.learned.LearnedRule``)."""

    id: str

    def diagnose(self, program: Program, shapes: Sequence[dict[str, int]]) -> list[Diagnostic]: ...


def verify(program: Program, target: str | None = None,
           learned: Sequence[LearnedCheck] = (), shapes: Sequence[dict[str, int]] = ()) -> list[Diagnostic]:
    """All diagnostics of ``program`` (built-in rules, then learned rules), sorted by line.

    ``shapes``, when given (the run's shape set), lets shape rules name a witness shape.
    """
    arch = target or program.target
    tdata = load_target(arch)
    if tdata is None:
        return [Diagnostic("target.unknown", Severity.ERROR, f"unknown target `{arch}`", program.line, 1, "",
                           f"known targets: {', '.join(known_targets())}")]
    ctx = build_ctx(program, tdata)
    ctx.shapes = tuple(shapes)
    out: list[Diagnostic] = []
    for r in RULES.values():
        out.extend(r.check(ctx))
    for lr in learned:
        out.extend(lr.diagnose(program, ctx.shapes))
    return sorted(out, key=lambda d: (d.line, d.col, d.rule))


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


def fmt_shape(ctx: Ctx, s: Sequence[Expr]) -> str:
    parts = []
    for d in s:
        v = ctx.static(d)
        parts.append(str(v) if v is not None else fmt_expr(d))
    return "(" + ", ".join(parts) + ")"


def smem_bytes(ctx: Ctx) -> int | None:
    """Shared memory of one CTA, each allocation aligned to the target's alignment."""
    align = ctx.target["smem_alloc_align_bytes"]
    total = 0
    for n, _, _ in ctx.nodes:
        if n.op is Op.SMEM:
            numel = ctx.static_numel(n.args[1])
            if numel is None:
                return None
            size = numel * n.args[0].bytes * n.attr("stages")
            total = -(-total // align) * align + size
    return total


def rmem_words_per_thread(ctx: Ctx) -> int | None:
    """Register words per thread of the rmem tiles: roles run on disjoint warps, so the most any one role holds,
    plus the tiles allocated outside the roles (held by every thread)."""
    shared, per_role = 0, {}
    for n, _, _ in ctx.nodes:
        if n.op is Op.RMEM:
            numel = ctx.static_numel(n.args[1])
            if numel is None:
                return None
            words = -(-numel * max(n.args[0].bytes, 4) // 4 // ctx.threads_of(n))
            r = ctx.role_of.get(id(n))
            if r is None:
                shared += words
            else:
                per_role[id(r)] = per_role.get(id(r), 0) + words
    return shared + max(per_role.values(), default=0)


from cake_core.ir import rules as _rules  # noqa: E402,F401  (registers the built-in rules)
from cake_core.ir import rules_async as _rules_async  # noqa: E402,F401
from cake_core.ir import rules_compute as _rules_compute  # noqa: E402,F401
from cake_core.ir import rules_topk as _rules_topk  # noqa: E402,F401
from cake_core.ir import rules_cluster as _rules_cluster  # noqa: E402,F401
from cake_core.ir import rules_let as _rules_let  # noqa: E402,F401
