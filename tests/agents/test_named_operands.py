"""Tactics, the mainloop recogniser and the cost model address a node's operands by their declared names.

An op's operands are named in its declaration (``buf("dst", ...)``, ``value("var", ...)``), and a node is read
with ``n.arg("dst")`` and rewritten with ``rewrite.with_args(n, dst=...)``: code that reads ``n.args[0]`` or
rebuilds ``args=(n.args[0], x, n.args[2])`` is silently wrong once an op's operands are reordered or one is
added. Every module of cake_core/agents and cake_core/model is read with ``ast``; what a positional access
looks like:

- a subscript of ``.args``: ``n.args[0]``, ``n.args[-1]``, ``n.args[1:3]``, ``n.args[table[n.op]]``;
- tuple unpacking of ``.args``: ``acc, a, b = n.args``;
- ``args=`` given a tuple display: ``replace(n, args=(var, stop) + n.args[2:])``.

Walking every operand with its declaration (``zip(REGISTRY[n.op].operands, n.args)``) names none by position
and is allowed.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("cake_core/agents", "cake_core/model")


def _is_args(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "args"


def _has_tuple(node: ast.AST) -> bool:
    """A tuple display, or one joined to something with ``+``."""
    if isinstance(node, ast.Tuple):
        return True
    return isinstance(node, ast.BinOp) and (_has_tuple(node.left) or _has_tuple(node.right))


def positional_operands(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every positional operand access in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Subscript) and _is_args(node.value):
            what = f"`{ast.unparse(node)}` reads an operand by position"
        elif isinstance(node, ast.Assign) and _is_args(node.value) and any(
                isinstance(t, (ast.Tuple, ast.List)) for t in node.targets):
            what = f"`{ast.unparse(node)}` unpacks the operands by position"
        elif isinstance(node, ast.keyword) and node.arg == "args" and _has_tuple(node.value):
            what = f"`args={ast.unparse(node.value)}` rebuilds the operands by position"
        else:
            continue
        out.append((node.lineno, node.col_offset, f"{filename}:{node.lineno}: {what}"))
    return [what for _, _, what in sorted(out)]


def test_agents_and_model_address_operands_by_name():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += positional_operands(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "operands addressed by position (use n.arg(name) and rewrite.with_args(n, name=...)):\n" \
        + "\n".join(found)


def test_a_planted_positional_access_is_found_with_its_line():
    src = textwrap.dedent("""\
        def tactic(n, m, c):
            dst = n.arg("dst")
            bar = n.args[2]
            tail = n.args[1:]
            last = m.args[-1]
            acc, a, b = m.args
            c = replace(c, args=(c.arg("var"), 4) + tuple(c.args[2:]))
            return with_args(n, src=bar), [k for k, a in zip(kinds, n.args)]
        """)
    found = positional_operands(src, "planted.py")
    assert [f.split(":")[1] for f in found] == ["3", "4", "5", "6", "7", "7"], found
    assert found[0] == "planted.py:3: `n.args[2]` reads an operand by position"
    assert "unpacks" in found[3] and "rebuilds" in found[4] and "c.args[2:]" in found[5]


def test_named_access_passes():
    src = textwrap.dedent("""\
        def tactic(n, kinds):
            m = with_args(n, extent=n.arg("extent"), start=0)
            walked = tuple(f(k, a) for k, a in zip(kinds, n.args))
            return replace(m, args=walked), n.arg("shape")[0], len(n.args)
        """)
    assert positional_operands(src) == []
