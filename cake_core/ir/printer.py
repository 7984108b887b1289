"""The canonical text of a program: ``print_program`` (its hash is the program's identity).

``ir.text`` parses it back: ``parse(print_program(p)).program == p`` for every program.
"""
from __future__ import annotations

from typing import Any

from cake_core.ir.expr import Expr, fmt_expr
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, Tile, View, loop_range
from cake_core.ir.types import TileType


def print_program(p: Any) -> str:
    """The canonical text of the program ``p``."""
    consts = "{" + ", ".join(f'"{k}": {v}' for k, v in p.consts) + "}"
    grid = ", ".join(fmt_expr(g) for g in p.grid) + ("," if len(p.grid) == 1 else "")
    head = f'@kernel(target="{p.target}", grid=({grid}), threads={p.threads}'
    head += f", ctas_per_sm={p.ctas_per_sm}" if p.ctas_per_sm else ""
    head += f", consts={consts})" if p.consts else ")"
    params = ", ".join(f"{q.name}: {_fmt_param_type(q.type)}" for q in p.params)
    lines = [head, f"def {p.name}({params}):"]
    _print_block(p.body, 1, lines)
    return "\n".join(lines) + "\n"


def _fmt_param_type(t: TileType) -> str:
    return f"gmem[{t.dtype.value}, {_fmt_shape(t.shape)}]"


def _fmt_shape(s: tuple[Expr, ...]) -> str:
    return "(" + ", ".join(fmt_expr(d) for d in s) + ("," if len(s) == 1 else "") + ")"


def fmt_index(i: Tile | Full | At) -> str:
    """One index of a view as written: ``:``, ``tile(i, n)`` (with ``base=``/``limit=`` where set), or ``e``."""
    if isinstance(i, Full):
        return ":"
    if isinstance(i, Tile):
        extra = (f", base={fmt_expr(i.base)}" if i.base != 0 else "") + \
            (f", limit={fmt_expr(i.limit)}" if i.limit is not None else "")
        return f"tile({fmt_expr(i.index)}, {fmt_expr(i.size)}{extra})"
    return fmt_expr(i.index)


def fmt_view(v: View) -> str:
    return f"{v.buf}[{', '.join(fmt_index(i) for i in v.index)}]"


def _fmt_operand(kind: str, a: Any) -> str:
    if kind == "dtype":
        return a.value
    if kind == "shape":
        return _fmt_shape(a)
    if kind in ("buf", "name"):
        return a
    if kind == "view":
        return fmt_view(a)
    if kind == "slot":
        return a.buf if a.index is None else f"{a.buf}[{fmt_expr(a.index)}]"
    if kind == "str":
        return f'"{a}"'
    if kind == "warps":
        return f"({a[0]}, {a[1]})"
    return fmt_expr(a)


def fmt_attr(v: Any) -> str:
    """An attribute value as the text writes it: ``inf``, a quoted string, ``True``, ``64``."""
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return repr(v) if not isinstance(v, str) else f'"{v}"'


def _print_block(nodes: tuple[Node, ...], depth: int, lines: list[str]) -> None:
    pad = "    " * depth
    if not nodes:
        lines.append(pad + "pass")
    for n in nodes:
        d = REGISTRY[n.op]
        kws = [f"{k}={fmt_attr(v)}" for k, v in n.attrs]
        if n.op is Op.FOR:
            start, stop, step = loop_range(n)
            bounds = [fmt_expr(stop)] if len(n.args) == 2 else \
                [fmt_expr(start), fmt_expr(stop)] + ([fmt_expr(step)] if step != 1 else [])
            rng = ", ".join(bounds + kws)
            lines.append(f"{pad}for {n.args[0]} in range({rng}):")
            _print_block(n.body, depth + 1, lines)
            continue
        if n.op is Op.IF:
            lines.append(f"{pad}if {fmt_expr(n.args[0])}:")
            _print_block(n.body, depth + 1, lines)
            continue
        if n.op is Op.LET:
            lines.append(f"{pad}{n.args[0]} = {fmt_expr(n.args[1])}")
            continue
        args = [_fmt_operand(o.kind, a) if not o.keyword else f"{o.name}={_fmt_operand(o.kind, a)}"
                for o, a in zip(d.operands, n.args)] + kws
        if d.block:      # `with role(...):`
            lines.append(f"{pad}with {n.op.value}({', '.join(args)}):")
            _print_block(n.body, depth + 1, lines)
            continue
        call = f"{n.op.value}({', '.join(args)})"
        lines.append(f"{pad}{n.result} = {call}" if n.result else pad + call)
