"""What every tactic uses to rewrite a program: refusals, IR snippets, node and const surgery.

A tactic is a pure function ``(Program, rng) -> Program``. When its precondition does not hold it
raises :class:`Refused` with the reason, which the agent keeps as data (the warehouse records it
with the tactic and the parent). New statements are written as IR text and parsed (``stmts``): the
text a tactic emits is the text its docstring shows, and the parser, never ``eval``, reads it.
"""
from __future__ import annotations

import textwrap
from dataclasses import replace
from typing import Callable, Iterable, Iterator

from cake_core.ir.expr import Bin, Call, Cmp, Expr, Sym, fmt_expr, symbols
from cake_core.ir.opdef import buffer_name
from cake_core.ir.ops import REGISTRY, At, Node, Op, Slot, Tile, View, make_attrs
from cake_core.ir.program import Program
from cake_core.ir.text import parse


class Refused(Exception):
    """A tactic's precondition does not hold for this program; ``reason`` says which and why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def refuse_unless(cond: bool, reason: str) -> None:
    if not cond:
        raise Refused(reason)


# ------------------------------------------------------------------ snippets

_HEAD = '@kernel(target="sm_90a", grid=(1,), threads=128)\ndef snippet():\n'


def stmts(src: str) -> tuple[Node, ...]:
    """Parse IR statements (an indented block of text) into nodes.

    >>> stmts("wait(full[it % S], phase=it // S % 2)")[0].op
    <Op.WAIT: 'wait'>
    """
    body = textwrap.indent(textwrap.dedent(src).strip("\n"), "    ")
    r = parse(_HEAD + body + "\n", "<tactic>")
    if r.program is None or any(d.is_error for d in r.diagnostics):
        detail = "; ".join(d.message for d in r.diagnostics) or "no program"
        raise ValueError(f"tactic snippet does not parse ({detail}):\n{src}")
    return r.program.body


def stmt(src: str) -> Node:
    (n,) = stmts(src)
    return n


def expr_text(e: Expr) -> str:
    return fmt_expr(e)


# ------------------------------------------------------------------ walking

def walk_nodes(nodes: tuple[Node, ...]) -> Iterator[Node]:
    """Every node, depth first, in program order."""
    for n in nodes:
        yield n
        yield from walk_nodes(n.body)


def map_nodes(nodes: tuple[Node, ...], fn: Callable[[Node], Node | tuple[Node, ...] | None]) -> tuple[Node, ...]:
    """Rebuild ``nodes`` bottom-up: ``fn`` gets each node (its body already mapped) and returns a node, a
    tuple of nodes (spliced in its place) or None (dropped)."""
    out: list[Node] = []
    for n in nodes:
        m = replace(n, body=map_nodes(n.body, fn)) if n.body else n
        r = fn(m)
        if r is None:
            continue
        out.extend(r if isinstance(r, tuple) else (r,))
    return tuple(out)


def has_op(nodes: tuple[Node, ...], *ops: Op) -> bool:
    return any(n.op in ops for n in walk_nodes(nodes))


def count_ops(nodes: tuple[Node, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in walk_nodes(nodes):
        out[n.op.value] = out.get(n.op.value, 0) + 1
    return out


def roles(p: Program) -> list[Node]:
    return [n for n in p.body if n.op is Op.ROLE]


def set_attrs(n: Node, **kv) -> Node:
    merged = dict(n.attrs)
    merged.update(kv)
    return replace(n, attrs=make_attrs(n.op, merged))


def with_args(node: Node, /, **named) -> Node:
    """``node`` with the operands given by name replaced (its other operands, attributes, result and body
    kept): a rewrite names the operand it changes, as ``n.arg(name)`` names the one it reads.

    >>> with_args(stmt("wait(full[0], phase=0)"), phase=1).args
    (Slot(buf='full', index=0), 1)
    """
    args = list(node.args)
    for name, a in named.items():
        args[node.decl.index_of(name)] = a
    return replace(node, args=tuple(args))


def buf_args(n: Node) -> list[str]:
    """The buffer names ``n`` names: buf operands, view buffers and ring-slot buffers."""
    out = []
    for kind, a in zip((o.kind for o in REGISTRY[n.op].operands), n.args):
        if kind == "buf":
            out.append(a)
        elif kind == "view":
            out.append(a.buf)
        elif kind == "slot":
            out.append(a.buf)
    return out


def tiles_written(nodes: tuple[Node, ...]) -> set[str]:
    """The tiles (and smem rings) the ops in ``nodes`` write or add into."""
    return {buffer_name(a) for n in walk_nodes(nodes) for o, a in zip(n.decl.operands, n.args)
            if o.kind in ("buf", "slot") and o.memory and any(e.modifies for e in o.effects)}


def carried_reads(nodes: tuple[Node, ...], written: set[str], done: set[str] | None = None) -> list[tuple[str, Node]]:
    """Each read (in program order) of a tile in ``written`` before the trip of the loop whose body is ``nodes``
    wrote it, as (tile, op): what the trip carries from the one before. ``done`` gathers the tiles written so far
    (a write under an ``if`` is not certain and does not count)."""
    done = set() if done is None else done
    out: list[tuple[str, Node]] = []
    for n in nodes:
        for o, a in zip(n.decl.operands, n.args):
            name = buffer_name(a)
            if o.kind in ("buf", "slot") and o.memory and any(e.reads for e in o.effects) and name in written \
                    and name not in done:
                out.append((name, n))
        if n.body:
            inner = set(done)
            out += carried_reads(n.body, written, inner)
            if n.op is Op.FOR:
                done |= inner        # the nested loop runs at least once where it matters; its writes stand
        for o, a in zip(n.decl.operands, n.args):
            if o.kind in ("buf", "slot") and o.memory and any(e.modifies for e in o.effects):
                done.add(buffer_name(a))
    return out


def uses(nodes: Iterable[Node], name: str) -> bool:
    return any(name in buf_args(n) for n in nodes)


# ------------------------------------------------------------------ expressions

def subst_expr(e: Expr, env: dict[str, Expr]) -> Expr:
    if isinstance(e, Sym):
        return env.get(e.name, e)
    if isinstance(e, (Bin, Cmp)):
        return type(e)(e.op, subst_expr(e.a, env), subst_expr(e.b, env))
    if isinstance(e, Call):
        return Call(e.fn, tuple(subst_expr(a, env) for a in e.args))
    return e


def subst_view(v: View, env: dict[str, Expr]) -> View:
    return View(v.buf, tuple(i.map(lambda e: subst_expr(e, env)) if isinstance(i, Tile)
                             else At(subst_expr(i.index, env)) if isinstance(i, At) else i for i in v.index))


def view_syms(v: View) -> set[str]:
    out: set[str] = set()
    for i in v.index:
        if isinstance(i, Tile):
            for e in i.exprs():
                out |= symbols(e)
        elif isinstance(i, At):
            out |= symbols(i.index)
    return out


def const_of(p: Program, e: Expr) -> str | None:
    """The name of the program constant ``e`` is, or None when it is not a bare constant."""
    return e.name if isinstance(e, Sym) and e.name in p.const_env else None


def fresh(p: Program, base: str, taken: set[str] | None = None) -> str:
    """A name not yet used for a buffer, const, binding or loop variable of ``p`` (nor in ``taken``)."""
    used = set(p.const_env) | {q.name for q in p.params} | set(taken or ())
    for n in walk_nodes(p.body):
        if n.result:
            used.add(n.result)
        if n.op in (Op.FOR, Op.LET):
            used.add(n.arg("var"))
    if base not in used:
        return base
    i = 1
    while f"{base}{i}" in used:
        i += 1
    return f"{base}{i}"


def namer(p: Program) -> Callable[[str], str]:
    """``name(base)``: a fresh name for ``p`` (see :func:`fresh`) that no earlier call of this namer returned."""
    taken: set[str] = set()

    def name(base: str) -> str:
        n = fresh(p, base, taken)
        taken.add(n)
        return n
    return name


def replace_expr_in(e: Expr, old: Expr, new: Expr) -> Expr:
    """``e`` with every subexpression equal to ``old`` replaced by ``new``."""
    if e == old:
        return new
    if isinstance(e, (Bin, Cmp)):
        return type(e)(e.op, replace_expr_in(e.a, old, new), replace_expr_in(e.b, old, new))
    if isinstance(e, Call):
        return Call(e.fn, tuple(replace_expr_in(a, old, new) for a in e.args))
    return e


def map_exprs(n: Node, fn: Callable[[Expr], Expr]) -> Node:
    """``n`` and its body with ``fn`` applied to every index expression its operands hold."""
    def one(kind: str, a):
        if kind in ("expr", "cond"):
            return fn(a)
        if kind == "shape":
            return tuple(fn(d) for d in a)
        if kind == "view":
            return View(a.buf, tuple(i.map(fn) if isinstance(i, Tile)
                                     else At(fn(i.index)) if isinstance(i, At) else i for i in a.index))
        if kind == "slot" and isinstance(a, Slot) and a.index is not None:
            return Slot(a.buf, fn(a.index))
        return a
    kinds = [o.kind for o in REGISTRY[n.op].operands]
    return replace(n, args=tuple(one(k, a) for k, a in zip(kinds, n.args)),
                   body=tuple(map_exprs(b, fn) for b in n.body))


def replace_expr(n: Node, old: Expr, new: Expr) -> Node:
    return map_exprs(n, lambda e: replace_expr_in(e, old, new))


def node_syms(n: Node) -> set[str]:
    """The symbols ``n``'s own operands mention (not its body's)."""
    out: set[str] = set()
    map_exprs(replace(n, body=()), lambda e: (out.update(symbols(e)), e)[1])
    return out


def trips_past(stop: Expr, base: Expr | None) -> int | None:
    """How many trips ``stop`` runs past ``base`` (``base`` itself: 0; ``base + 1``: 1), else None."""
    if base is None or stop == base:
        return 0
    if isinstance(stop, Bin) and stop.op == "+" and stop.a == base and isinstance(stop.b, int):
        return stop.b
    return None


def subst_node(n: Node, env: dict[str, Expr]) -> Node:
    """``n`` (and its body) with the symbols named in ``env`` replaced in every index expression."""
    return map_exprs(n, lambda e: subst_expr(e, env))
