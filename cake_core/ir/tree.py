"""Walking a program's statement tree, and the loop forms: what every pass, checker and lowering shares.

Depends on the op vocabulary only (``opdef``), so that semantics and declarations may use it.
"""
from __future__ import annotations

from typing import Any, Iterator

from cake_core.ir.expr import Expr, Sym
from cake_core.ir.opdef import Op, Scope


def walk(nodes: tuple[Any, ...], path: str = "",
         scope: frozenset[str] = frozenset()) -> Iterator[tuple[Any, str, frozenset[str]]]:
    """Every node with its IR path (``for[kt].mma``) and the index names in scope there (loop
    variables of the enclosing loops, and bindings made earlier in this block or an enclosing
    one: the ``name`` operands their declarations scope), depth first, in program order."""
    counts: dict[str, int] = {}
    for n in nodes:
        key = n.op.value
        if n.op is Op.FOR:
            key = f"for[{n.args[0]}]"
        elif n.op is Op.LET:
            key = f"let[{n.args[0]}]"
        elif n.op is Op.IF:
            key = "if"
        elif n.op is Op.ROLE:
            key = f"role[{n.args[0]}]"
        elif n.result:
            key = f"{n.op.value}[{n.result}]"
        counts[key] = counts.get(key, 0) + 1
        here = f"{path}.{key}" if path else key
        if counts[key] > 1:
            here += f"#{counts[key]}"
        yield n, here, scope
        if n.body:      # a loop variable is visible in its body
            yield from walk(n.body, here, scope | set(n.decl.bound_names(n, Scope.BODY)))
        bound = n.decl.bound_names(n, Scope.BLOCK)
        if bound:       # a binding, to the rest of this block (not to the binding itself)
            scope = scope | set(bound)


def for_args(var: str, stop: Expr, start: Expr = 0, step: Expr = 1) -> tuple:
    """The canonical operands of a ``for``: ``(var, stop)`` for ``range(stop)``, else ``(var, stop, start, step)``."""
    return (var, stop) if start == 0 and step == 1 else (var, stop, start, step)


def loop_range(n: Any) -> tuple[Expr, Expr, Expr]:
    """``(start, stop, step)`` of a ``for`` node (``range(stop)`` is ``(0, stop, 1)``)."""
    return (0, n.args[1], 1) if len(n.args) == 2 else (n.args[2], n.args[1], n.args[3])


def is_persistent_loop(n: Any) -> bool:
    """A persistent tile loop: ``for t in range(bid.x, tiles, ncta.x)`` (each CTA walks every ncta.x-th tile)."""
    if n.op is not Op.FOR:
        return False
    start, _, step = loop_range(n)
    return step == Sym("ncta.x") and start == Sym("bid.x")
