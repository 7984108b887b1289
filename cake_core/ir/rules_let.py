"""Verifier rules of bindings: family ``let``, with those of the bindings read from memory (``scalar``'s source,
``fetch_add``'s target, ``compact``'s tiles, each one's declared range, and where the CTA-wide ones may stand). A
binding is a name an op binds for the rest of its block (a ``name`` operand of ``Scope.BLOCK``): ``name = expr``
(``let``), or a name any other op declares so.

A binding is visible from the statement after it to the end of its block, nested blocks included
(``tree.walk`` puts it in their scope). Its name is new there: not a const, dim, parameter,
earlier buffer, launch symbol, loop variable or binding in scope. Its value is an integer index
expression; it may not split a group of sibling roles (they run concurrently only while adjacent).
An undefined name in a binding's value is ``shapes.symbols``' to report; a use of a bound name
outside its binding's scope is ``let.scope``'s (``shapes.symbols`` leaves those names alone).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from cake_core.ir.expr import LAUNCH_SYMBOLS, Bin, Call, Cmp, Expr, Sym, substitute, symbols
from cake_core.ir.opdef import Scope
from cake_core.ir.ops import REGISTRY, At, Node, Op
from cake_core.ir.passes import node_exprs
from cake_core.ir.rule_ctx import Ctx, RuleSet
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.outcome import Diagnostic

RULESET = RuleSet()
rule = RULESET.rule

BINDERS = frozenset(op for op, d in REGISTRY.items() if any(o.binds is Scope.BLOCK for o in d.operands))


def _bound(n: Node) -> list[str]:
    return n.decl.bound_names(n, Scope.BLOCK)


def bindings(ctx: Ctx) -> list[tuple[Node, str, frozenset[str]]]:
    """The binding nodes of the program, with their paths and the names in scope before them."""
    return [(n, p, s) for n, p, s in ctx.nodes if n.op in BINDERS]


def _scoped(nodes: tuple[Node, ...], loops: dict[str, Node], lets: dict[str, Node]
            ) -> Iterator[tuple[Node, dict[str, Node], dict[str, Node]]]:
    """Every node with the loop variables and the bindings visible to it (name -> defining node)."""
    for n in nodes:
        yield n, loops, lets
        if n.body:
            inner = {**loops, **{v: n for v in n.decl.bound_names(n, Scope.BODY)}}
            yield from _scoped(n.body, inner, lets)
        if n.op in BINDERS:
            lets = {**lets, **{v: n for v in _bound(n)}}


def bound_values(ctx: Ctx) -> dict[int, dict[str, Expr]]:
    """id(node) -> the bindings visible to it, each inlined to an expression over consts, dims, loop
    variables and CTA symbols (a name an op computes, such as a tile coordinate, stays a symbol): for rules
    that read an expression's form (a wait's parity)."""
    cached = ctx.__dict__.get("let_values")
    if cached is None:
        cached, values = {}, {}
        for n, _, lets in _scoped(ctx.program.body, {}, {}):
            env = {k: values.get((id(b), k), Sym(k)) for k, b in lets.items()}
            cached[id(n)] = env
            if n.op is Op.LET:
                values[(id(n), n.args[0])] = substitute(n.args[1], env)
        ctx.__dict__["let_values"] = cached
    return cached


@rule("let.shadow", "let", "a binding's name is already a const, dim, parameter, buffer, launch symbol or loop "
                           "variable", guards=BINDERS)
def _shadow(ctx: Ctx) -> Iterable[Diagnostic]:
    params = {p.name for p in ctx.program.params}
    paths = {id(n): p for n, p, _ in ctx.nodes}
    order = {id(n): i for i, (n, _, _) in enumerate(ctx.nodes)}
    for n, loops, _ in _scoped(ctx.program.body, {}, {}):
        if n.op not in BINDERS:
            continue
        for name in _bound(n):
            buf = ctx.defined_at.get(name)
            what = ("the const" if name in ctx.consts else "the problem dimension" if name in ctx.dims
                    else "the parameter" if name in params else "the launch symbol" if name in LAUNCH_SYMBOLS
                    else f"the loop variable (line {loops[name].line})" if name in loops
                    else f"the buffer (line {buf.line})" if buf is not None and order[id(buf)] < order[id(n)]
                    else None)
            if what:
                yield ctx.diag("let.shadow", n, f"binding `{name}` shadows {what} `{name}`", path=paths[id(n)],
                               hint="give the binding a name of its own, e.g. " + f"`{name}_i`")


@rule("let.redefined", "let", "a name is bound twice where the first binding is still visible", guards=BINDERS)
def _redefined(ctx: Ctx) -> Iterable[Diagnostic]:
    paths = {id(n): p for n, p, _ in ctx.nodes}
    for n, _, lets in _scoped(ctx.program.body, {}, {}):
        if n.op not in BINDERS:
            continue
        names = _bound(n)
        for i, name in enumerate(names):
            first = lets.get(name) or (n if name in names[:i] else None)
            if first is not None:
                yield ctx.diag("let.redefined", n, f"`{name}` is already bound at line {first.line}",
                               path=paths[id(n)], witness=[f"first bound at line {first.line}"],
                               hint="bindings are immutable: give this value a new name, or compute it from the "
                                    "first one inside the loop that needs it")


def _exprs(n: Node) -> list[Expr]:
    return node_exprs(n, slots=False) + ([n.args[0]] if n.op is Op.IF else [])


@rule("let.scope", "let", "a bound name is used before its binding or outside the block it is bound in",
      guards=BINDERS)
def _scope(ctx: Ctx) -> Iterable[Diagnostic]:
    bound: dict[str, list[Node]] = {}
    for n, _, _ in bindings(ctx):
        for name in _bound(n):
            bound.setdefault(name, []).append(n)
    if not bound:
        return
    base = set(ctx.consts) | ctx.dims
    for n, path, scope in ctx.nodes:
        used = set().union(*(symbols(e) for e in _exprs(n)))
        for name in sorted((used & set(bound)) - scope - base):
            later = [b for b in bound[name] if b.line >= n.line]
            if later:
                msg = f"`{name}` is used before its binding at line {later[0].line}"
                hint = f"move `{name} = ...` above this statement"
            else:
                b = bound[name][-1]
                msg = f"`{name}` is bound at line {b.line} in a block that has ended here"
                hint = "a binding is visible to the end of its block: bind it in the enclosing block instead"
            yield ctx.diag("let.scope", n, msg, path=path, hint=hint)


def _has_float(e: Expr) -> bool:
    if isinstance(e, float):
        return True
    if isinstance(e, (Bin, Cmp)):
        return _has_float(e.a) or _has_float(e.b)
    if isinstance(e, Call):
        return any(_has_float(a) for a in e.args)
    return False


@rule("let.value", "let", "a binding's value is an integer index expression (no float literal)", guards=BINDERS)
def _value(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in bindings(ctx):
        if any(_has_float(e) for e in node_exprs(n)):
            yield ctx.diag("let.value", n, f"binding `{', '.join(_bound(n))}` holds a float; bindings are integer "
                                           "indices", path=path,
                           hint="write the value with integers, consts and dims only")


@rule("let.placement", "let", "a binding between two sibling roles splits them (they run concurrently only "
                              "while adjacent)", guards=BINDERS)
def _placement(ctx: Ctx) -> Iterable[Diagnostic]:
    body = ctx.program.body
    paths = {id(n): p for n, p, _ in ctx.nodes}
    for i, n in enumerate(body):
        if n.op not in BINDERS:
            continue
        before = next((m for m in reversed(body[:i]) if m.op not in BINDERS), None)
        after = next((m for m in body[i + 1:] if m.op not in BINDERS), None)
        if before is not None and after is not None and before.op is Op.ROLE and after.op is Op.ROLE:
            yield ctx.diag("let.placement", n, f"binding `{', '.join(_bound(n))}` sits between the roles "
                                               f"`{before.args[0]}` and `{after.args[0]}`", path=paths[id(n)],
                           hint="bind it before the first role (every role sees it) or inside the roles that use it")


@rule("scalar.source", "let", "a scalar reads one element of an integer gmem tensor or plain smem tile",
      guards=(Op.SCALAR,))
def _scalar_source(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.SCALAR:
            continue
        var, v = n.arg("var"), n.arg("src")
        t = ctx.buffers.get(v.buf)
        if t is None:
            continue     # types.undefined names it
        if t.space not in (MemSpace.GMEM, MemSpace.SMEM):
            yield ctx.diag("scalar.source", n, f"scalar `{var}` reads `{v.buf}`, a {t.space.value} tile; it reads "
                                               "a gmem tensor or an smem tile", path=path,
                           hint="copy the value to an smem tile and sync() first (an rmem tile is spread over "
                                "the threads)")
        elif t.space is MemSpace.SMEM and not _plain_smem(ctx, v.buf, t):
            yield ctx.diag("scalar.source", n, f"scalar `{var}` reads `{v.buf}`, a "
                                               f"{'ring' if t.stages != 1 else 'swizzled'} smem tile; it reads a "
                                               "single-stage unswizzled one", path=path,
                           hint="copy the value to a plain smem tile (e.g. smem(i32, (1, K))) and sync() first")
        elif t.dtype not in (DType.I32, DType.I64):
            yield ctx.diag("scalar.source", n, f"scalar `{var}` reads `{v.buf}` of {t.dtype.value}; it reads i32 or "
                                               "i64 (an index, a count, an offset)", path=path,
                           hint="bounds and offsets are integers: read an integer tensor")
        elif len(v.index) == t.rank and not all(isinstance(i, At) for i in v.index):
            yield ctx.diag("scalar.source", n, f"scalar `{var}` reads a window of `{v.buf}`, not one element",
                           path=path, hint=f"index every dimension of `{v.buf}` with a single index, e.g. "
                                           f"`{v.buf}[{', '.join(['bid.x'] + ['0'] * (t.rank - 1))}]`")


def _declared_max(ctx: Ctx, op: Op, rule_id: str, hint: str) -> Iterator[Diagnostic]:
    """A data-dependent binding's ``max`` uses consts and dims only (known per shape, before the launch)."""
    known = set(ctx.consts) | ctx.dims
    for n, path, _ in ctx.nodes:
        if n.op is not op:
            continue
        hi = n.arg("max")
        other = sorted(symbols(hi) - known)
        if other or _has_float(hi):
            what = f"uses `{other[0]}`" if other else "holds a float"
            yield ctx.diag(rule_id, n, f"{op.value} `{n.arg('var')}`'s max {what}; the range must be known per "
                                       "shape, before the launch", path=path, hint=hint)


@rule("scalar.max", "let", "a scalar's declared maximum is an expression of consts and problem dimensions",
      guards=(Op.SCALAR,))
def _scalar_max(ctx: Ctx) -> Iterable[Diagnostic]:
    return _declared_max(ctx, Op.SCALAR, "scalar.max", "write it with consts and dims, e.g. `max=E - 1` for an "
                                                       "expert id")


@rule("fetch_add.target", "let", "a fetch_add adds into one element of an i32 gmem tensor or plain i32 smem tile",
      guards=(Op.FETCH_ADD,))
def _fetch_add_target(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.FETCH_ADD:
            continue
        var, v = n.arg("var"), n.arg("dst")
        t = ctx.buffers.get(v.buf)
        if t is None:
            continue     # types.undefined names it
        bad, hint = "", "fetch_add(slot, counts[e], 1, max=...) with counts: gmem[i32, (E,)] or smem(i32, (E,))"
        if t.space not in (MemSpace.GMEM, MemSpace.SMEM):
            bad = f"`{v.buf}` is a {t.space.value} tile; it adds into a gmem tensor or an smem tile"
            hint = "keep the counter in an smem tile (an rmem tile is spread over the threads)"
        elif t.space is MemSpace.SMEM and not _plain_smem(ctx, v.buf, t):
            bad = (f"`{v.buf}` is a {'ring' if t.stages != 1 else 'swizzled'} smem tile; it adds into a single-stage "
                   "unswizzled one")
            hint = "keep the counter in a plain smem tile, e.g. cur_s = smem(i32, (1,))"
        elif t.dtype is not DType.I32:
            bad = f"`{v.buf}` is {t.dtype.value}; it adds into i32 (a count, an offset)"
        elif len(v.index) == t.rank and not all(isinstance(i, At) for i in v.index):
            bad = f"it names a window of `{v.buf}`, not one element"
            hint = (f"index every dimension of `{v.buf}` with a single index, e.g. "
                    f"`{v.buf}[{', '.join(['bid.x'] + ['0'] * (t.rank - 1))}]`")
        if bad:
            yield ctx.diag("fetch_add.target", n, f"fetch_add `{var}`: {bad}", path=path, hint=hint)


@rule("fetch_add.max", "let", "a fetch_add's declared maximum is an expression of consts and problem dimensions",
      guards=(Op.FETCH_ADD,))
def _fetch_add_max(ctx: Ctx) -> Iterable[Diagnostic]:
    return _declared_max(ctx, Op.FETCH_ADD, "fetch_add.max", "write it with consts and dims, e.g. `max=M * k` for "
                                                             "a slot among M * k entries")


def _plain_smem(ctx: Ctx, name: str, t: TileType) -> bool:
    """A single-stage unswizzled smem tile (its elements at their row-major offsets)."""
    return t.space is MemSpace.SMEM and t.stages == 1 and not ctx.swizzle_of(name)


@rule("compact.operands", "let", "a compact reads a plain 1-D or 2-D smem tile of flags and writes the positions "
                                 "into a plain 1-D i32 smem tile at least as long", guards=(Op.COMPACT,))
def _compact_operands(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        if n.op is not Op.COMPACT:
            continue
        dst, flags = n.arg("dst"), n.arg("flags")
        d, f = ctx.buffers.get(dst), ctx.buffers.get(flags)
        if d is None or f is None:
            continue     # types.undefined names it
        bad = ""
        if not _plain_smem(ctx, flags, f) or f.rank not in (1, 2):
            bad = f"the flags `{flags}` are {f}; compact reads a 1-D or 2-D single-stage unswizzled smem tile"
        elif not _plain_smem(ctx, dst, d) or d.rank != 1 or d.dtype is not DType.I32:
            bad = f"`{dst}` is {d}; compact writes positions into a 1-D single-stage unswizzled i32 smem tile"
        elif dst == flags:
            bad = f"`{dst}` is both the flags and the positions; the positions go to a tile of their own"
        else:
            have, need = ctx.static_numel(d.shape), ctx.static_numel(f.shape)
            if have is not None and need is not None and have < need:
                bad = f"`{dst}` holds {have} positions and `{flags}` {need} flags, every one of which may be set"
        if bad:
            yield ctx.diag("compact.operands", n, f"compact `{n.arg('var')}`: {bad}", path=path,
                           hint="compact(n, pos_s, hit_s, base=..., limit=..., max=...) with hit_s = smem(i32, (BM, "
                                "KT)) and pos_s = smem(i32, (BM * KT,))")


@rule("compact.max", "let", "a compact's declared maximum is an expression of consts and problem dimensions",
      guards=(Op.COMPACT,))
def _compact_max(ctx: Ctx) -> Iterable[Diagnostic]:
    return _declared_max(ctx, Op.COMPACT, "compact.max", "write it with consts and dims, e.g. `max=BP` for the "
                                                         "flags of a (BP,) tile")


_CTA_WIDE = (Op.FETCH_ADD, Op.COMPACT)      # the bindings whose lowering synchronises the CTA


@rule("let.cta_wide", "let", "a fetch_add or compact runs on every thread of the CTA (CTA barriers inside): not in "
                             "a role", guards=_CTA_WIDE)
def _cta_wide(ctx: Ctx) -> Iterable[Diagnostic]:
    for n, path, _ in ctx.nodes:
        role = ctx.role_of.get(id(n))
        if n.op in _CTA_WIDE and role is not None:
            yield ctx.diag("let.cta_wide", n, f"{n.op.value} `{n.arg('var')}` inside role `{role.args[0]}`: every "
                                              "thread of the CTA runs it (its CTA barriers hand the value to them "
                                              "all), and a role's threads are only some of them", path=path,
                           hint="run it at the top level, before the roles (every role sees the name) or after them "
                                "and a sync()")
