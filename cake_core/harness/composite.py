"""Composite ops: a named sequence of existing ops, defined as data, expanded before the pipeline sees it.

A composite is what the primitive miner promotes from a recurring op pattern: a name, its operands (each
a buffer, a ring slot, a gmem view or an index expression) and its expansion, IR statements over the
operand names::

    Composite("load2_sync_mma_sync", (("dst", "buf"), ("src", "view"), ("dst2", "buf"), ("src2", "view"),
                                      ("acc", "buf")),
              ("load(dst, src)", "load(dst2, src2)", "sync()", "mma(acc, dst, dst2)", "sync()"))

A kernel calls it as a statement, ``load2_sync_mma_sync(a_s, a[tile(bid.y, BM), tile(kt, BK)], b_s,
b[tile(kt, BK), tile(bid.x, BN)], acc)``. :func:`expand` rewrites the text before it is parsed: each call
becomes its expansion on the call's own line (the statements joined by ``;``), so the parser, the
verifier, the interpreter, the lowering and the cost model all see existing ops only (the expansion *is*
the composite's semantics, lowering and cost) and every diagnostic keeps the line of the call.
:func:`contract` goes the other way: it writes a program with each occurrence of the pattern replaced by
a call, and only when that text expands back to the same program. The text is read with ``ast`` and
never executed.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from cake_core.harness.errors import HarnessDataError
from cake_core.ir.expr import FUNCS, Sym
from cake_core.ir.ops import REGISTRY, Node, Op, View
from cake_core.ir.ops import Slot
from cake_core.ir.program import Program
from cake_core.ir.text import parse, print_program
from cake_core.outcome import Diagnostic, Severity

OPERAND_KINDS = ("buf", "slot", "view", "expr")
_RESERVED = {o.value for o in Op} | set(FUNCS) | {"tile", "range", "role", "kernel", "bid", "ncta", "inf", "ninf",
                                                  "gmem", "num_sms", "True", "False", "None"}
_FREE_NAMES = {"bid", "ncta", "inf", "ninf"}   # what an expansion may name besides its operands


@dataclass(frozen=True)
class Composite:
    name: str
    operands: tuple[tuple[str, str], ...]     # (operand name, kind), in call order
    body: tuple[str, ...]                     # the expansion: one op statement each, over the operand names
    summary: str = ""

    def key(self) -> str:
        """The expansion's identity, whatever the composite and its operands are called."""
        return template_key(self.body, [n for n, _ in self.operands], dict(self.operands))

    def signature(self) -> str:
        return f"{self.name}({', '.join(f'{n}: {k}' for n, k in self.operands)})"

    def reference(self) -> str:
        """The composite as the IR reference documents an op."""
        body = "\n".join(f"    {s}" for s in self.body)
        return (f"### `{self.signature()}` (composite)\n\n{self.summary}\n\nExpands to (the same kernel as "
                f"writing these statements in its place):\n\n{body}\n")

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "operands": [list(o) for o in self.operands], "body": list(self.body),
                "summary": self.summary}

    @staticmethod
    def from_data(d: Any) -> "Composite":
        """Read and check a definition: a malformed one raises HarnessDataError saying what is wrong."""
        if not isinstance(d, dict):
            raise HarnessDataError(f"a composite is an object with name, operands and body; got {str(d)[:80]}")
        name = d.get("name")
        if not (isinstance(name, str) and name.isidentifier() and name not in _RESERVED):
            raise HarnessDataError(f"composite name `{name}` must be an identifier that is not an op, an index "
                                   "function or a keyword of the IR")
        ops = d.get("operands")
        if not (isinstance(ops, list) and all(isinstance(o, (list, tuple)) and len(o) == 2 for o in ops)):
            raise HarnessDataError(f"composite `{name}`: operands are [name, kind] pairs")
        operands = tuple((str(n), str(k)) for n, k in ops)
        names = [n for n, _ in operands]
        for n, k in operands:
            if not n.isidentifier() or n in _RESERVED:
                raise HarnessDataError(f"composite `{name}`: operand `{n}` must be an identifier that is not an "
                                       "op or IR keyword")
            if k not in OPERAND_KINDS:
                raise HarnessDataError(f"composite `{name}`: operand `{n}` has kind `{k}`; kinds are "
                                       f"{', '.join(OPERAND_KINDS)}")
        if len(set(names)) != len(names):
            raise HarnessDataError(f"composite `{name}`: operand names repeat")
        body = d.get("body")
        if not (isinstance(body, list) and body and all(isinstance(s, str) for s in body)):
            raise HarnessDataError(f"composite `{name}`: body is a non-empty list of IR statements")
        used: set[str] = set()
        for s in body:
            used |= _check_statement(name, s, set(names))
        unused = [n for n in names if n not in used]
        if unused:
            raise HarnessDataError(f"composite `{name}`: operands {', '.join(unused)} are never used in its body")
        return Composite(name, operands, tuple(body), str(d.get("summary", "")))


def _check_statement(name: str, s: str, operands: set[str]) -> set[str]:
    """The operand names statement ``s`` uses; raises if it is not one call of a registered op."""
    try:
        mod = ast.parse(s)
    except SyntaxError:
        raise HarnessDataError(f"composite `{name}`: `{s}` is not an IR statement") from None
    if len(mod.body) != 1 or not isinstance(mod.body[0], ast.Expr) or not isinstance(mod.body[0].value, ast.Call) \
            or not isinstance(mod.body[0].value.func, ast.Name):
        raise HarnessDataError(f"composite `{name}`: `{s}` must be one op call")
    op = mod.body[0].value.func.id
    d = next((REGISTRY[o] for o in Op if o.value == op), None)
    if d is None or d.block or d.result or d.op is Op.LET:
        raise HarnessDataError(f"composite `{name}`: `{op}` is not an op a composite may expand to (a registered "
                               "op that binds no result and opens no block)")
    used = set()
    for node in ast.walk(mod.body[0].value):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            continue
        if isinstance(node, ast.Name):
            if node.id in operands:
                used.add(node.id)
            elif node.id not in _FREE_NAMES and not _is_call_name(mod, node):
                raise HarnessDataError(f"composite `{name}`: `{s}` names `{node.id}`, which is not an operand; "
                                       "an expansion sees its operands only")
    return used


def _is_call_name(mod: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(mod))


def _rename(stmt: str, names: dict[str, str]) -> str:
    tree = ast.parse(stmt)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names and not _is_call_name(tree, node):
            node.id = names[node.id]
    return ast.unparse(tree)


def used_names(body: Sequence[str], names: Sequence[str]) -> list[str]:
    """Which of ``names`` the statements use, in order of first use."""
    order: list[str] = []
    for s in body:
        tree = ast.parse(s)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in names and node.id not in order \
                    and not _is_call_name(tree, node):
                order.append(node.id)
    return order


def template_key(body: Sequence[str], operand_order: Sequence[str], kinds: dict[str, str]) -> str:
    """Operands renamed ``_0, _1...`` by first use in the body, so that renaming changes nothing."""
    order = used_names(body, list(kinds))
    order += [n for n in operand_order if n not in order]
    canon = {n: f"_{i}" for i, n in enumerate(order)}
    return json.dumps({"body": [_rename(s, canon) for s in body], "kinds": [kinds[n] for n in order]})


# ------------------------------------------------------------------ patterns in programs

def is_pattern_node(n: Node) -> bool:
    """Nodes a composite may stand for: op statements that bind nothing and open no block."""
    d = REGISTRY[n.op]
    return not (d.block or d.result or n.op is Op.LET)


@dataclass(frozen=True)
class Occurrence:
    """A run of nodes in one block, abstracted: their template over placeholders and what each binds."""

    nodes: tuple[Node, ...]
    body: tuple[str, ...]                     # statements over placeholder names
    operands: tuple[tuple[str, str], ...]     # (placeholder, kind) by first use
    bindings: tuple[Any, ...]                 # the buffer, slot, view or expression each placeholder stands for

    def key(self) -> str:
        return template_key(self.body, [n for n, _ in self.operands], dict(self.operands))


def _print_node(n: Node) -> str:
    prog = Program("_", "sm_90a", (1,), 32, (), (), (n,))
    return print_program(prog).splitlines()[2].strip()


def abstract(nodes: Sequence[Node]) -> Occurrence:
    """The template of ``nodes`` (pattern nodes of one block, in order): every buffer, slot, view and index
    expression operand becomes a placeholder, equal values sharing one; attributes stay as written."""
    values: list[Any] = []
    kinds: list[str] = []
    names: list[str] = []
    stmts = []
    for n in nodes:
        d = REGISTRY[n.op]
        args = []
        for oname, kind, a in ((o.name, o.kind, x) for o, x in zip(d.operands, n.args)):
            if kind not in OPERAND_KINDS:
                args.append(a)
                continue
            if a in values:
                i = values.index(a)
            else:
                i = len(values)
                values.append(a)
                kinds.append(kind)
                names.append(_fresh(oname, names))
            p = names[i]
            args.append({"buf": p, "slot": Slot(p), "expr": Sym(p), "view": View(p, ())}[kind])
        stmts.append(_print_node(Node(n.op, tuple(args), n.attrs)).replace("[]", ""))
    return Occurrence(tuple(nodes), tuple(stmts), tuple(zip(names, kinds)), tuple(values))


def _fresh(base: str, taken: list[str]) -> str:
    base = base if base not in _RESERVED else base + "_"
    name, k = base, 2
    while name in taken or name in _RESERVED:
        name, k = f"{base}{k}", k + 1
    return name


def windows(program: Program, lengths: range) -> list[Occurrence]:
    """Every run of consecutive pattern nodes of each block with a length in ``lengths``, abstracted."""
    out: list[Occurrence] = []

    def block(nodes: tuple[Node, ...]) -> None:
        run: list[Node] = []
        for n in nodes + (None,):          # None closes the last run
            if n is not None and is_pattern_node(n):
                run.append(n)
                continue
            for i in range(len(run)):
                for size in lengths:
                    if i + size <= len(run):
                        out.append(abstract(run[i:i + size]))
            run = []
            if n is not None and n.body:
                block(n.body)
    block(program.body)
    return out


def composite_name(nodes: Sequence[Node], taken: Sequence[str] = ()) -> str:
    """A name from the ops it stands for, runs counted: ``load2_sync_mma_sync``."""
    parts: list[str] = []
    ops = [n.op.value for n in nodes]
    i = 0
    while i < len(ops):
        j = i
        while j < len(ops) and ops[j] == ops[i]:
            j += 1
        parts.append(ops[i] + (str(j - i) if j - i > 1 else ""))
        i = j
    return _fresh("_".join(parts), list(taken))


# ------------------------------------------------------------------ expansion

@dataclass(frozen=True)
class Expansion:
    text: str                               # the IR text with every composite call expanded, line for line
    diagnostics: tuple[Diagnostic, ...] = ()
    used: tuple[str, ...] = ()              # composites called, in order of their calls


def expand(text: str, composites: Sequence[Composite]) -> Expansion:
    """Rewrite every statement that calls a composite into its expansion, on the call's line.

    Text that does not parse as Python, or calls no composite, comes back as it was (the parser says
    what is wrong with it). A call with the wrong operands is left in place with a diagnostic.
    """
    by_name = {c.name: c for c in composites}
    if not by_name or not any(re.search(rf"\b{re.escape(n)}\s*\(", text) for n in by_name):
        return Expansion(text)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return Expansion(text)
    lines = text.split("\n")
    diags: list[Diagnostic] = []
    used: list[str] = []
    for stmt in _statements(tree):
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in by_name):
            continue
        comp = by_name[stmt.value.func.id]
        call = stmt.value
        where = (stmt.lineno, stmt.col_offset + 1)
        problem = _call_problem(comp, call)
        first, last = stmt.lineno - 1, (stmt.end_lineno or stmt.lineno) - 1
        head, tail = lines[first][:stmt.col_offset], lines[last][stmt.end_col_offset or 0:]
        if problem is None and (head.strip() or tail.strip() and not tail.strip().startswith("#")):
            problem = ("composite.placement", f"write the call of composite `{comp.name}` on lines of its own",
                       "put each composite call on its own line(s)")
        if problem is not None:
            diags.append(Diagnostic(problem[0], Severity.ERROR, problem[1], *where, comp.name, problem[2]))
            continue
        args = dict(zip((n for n, _ in comp.operands), call.args))
        lines[first] = head + "; ".join(_substitute(s, args) for s in comp.body)
        for i in range(first + 1, last + 1):
            lines[i] = ""
        used.append(comp.name)
    return Expansion("\n".join(lines), tuple(diags), tuple(used))


def _statements(tree: ast.AST):
    for node in ast.walk(tree):
        for fld in ("body", "orelse"):
            for s in getattr(node, fld, []) or []:
                if isinstance(s, ast.stmt):
                    yield s


def _call_problem(comp: Composite, call: ast.Call) -> tuple[str, str, str] | None:
    want = ", ".join(f"{n}: {k}" for n, k in comp.operands)
    if call.keywords or len(call.args) != len(comp.operands):
        return ("composite.arity", f"composite `{comp.name}` takes {len(comp.operands)} positional operands "
                f"({want}), got {len(call.args)}" + (" and keywords" if call.keywords else ""),
                f"call it as {comp.signature()}")
    for (n, kind), a in zip(comp.operands, call.args):
        ok = {"buf": isinstance(a, ast.Name),
              "slot": isinstance(a, ast.Name) or isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name),
              "view": isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name),
              "expr": not isinstance(a, (ast.Subscript, ast.Starred))}[kind]
        if not ok:
            return ("composite.operand", f"operand `{n}` of composite `{comp.name}` must be a {kind}, got "
                    f"`{ast.unparse(a)}`", f"call it as {comp.signature()}")
    return None


def _substitute(stmt: str, args: dict[str, ast.expr]) -> str:
    tree = ast.parse(stmt)

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return copy.deepcopy(args[node.id]) if node.id in args else node

        def visit_Call(self, node: ast.Call) -> ast.AST:
            node.args = [self.visit(a) for a in node.args]
            node.keywords = [self.visit(k) for k in node.keywords]
            return node
    return ast.unparse(Sub().visit(tree))


# ------------------------------------------------------------------ contraction

def contract(program: Program, composites: Sequence[Composite]) -> str:
    """``program``'s text with every occurrence of each composite's pattern written as a call.

    Occurrences are taken left to right without overlap, composites in the order given. The text is
    returned only if it expands back to ``program``; otherwise (and where nothing matches) the plain text.
    """
    plain = program.text()
    if not composites:
        return plain
    reparsed = parse(plain).program
    if reparsed is None:
        return plain
    lines = plain.split("\n")
    changed = False
    for comp in composites:
        size, key = len(comp.body), comp.key()
        taken: set[int] = set()
        for occ in windows(reparsed, range(size, size + 1)):
            span = [n.line for n in occ.nodes]
            if occ.key() != key or taken & set(span) or any(lines[i - 1] == "" for i in span):
                continue
            call = _call_text(comp, occ)
            if call is None:
                continue
            indent = lines[span[0] - 1][: len(lines[span[0] - 1]) - len(lines[span[0] - 1].lstrip())]
            lines[span[0] - 1] = indent + call
            for i in span[1:]:
                lines[i - 1] = ""
            taken |= set(span)
            changed = True
    if not changed:
        return plain
    text = "\n".join(x for i, x in enumerate(lines) if x != "" or i == len(lines) - 1)
    back = parse(expand(text, composites).text).program
    return text if back is not None and back == program else plain


def _call_text(comp: Composite, occ: Occurrence) -> str | None:
    """The call for ``occ`` (whose key is ``comp``'s): operands match by order of first use in the body,
    each written as the printed statement that first uses it writes it."""
    comp_order = used_names(comp.body, [n for n, _ in comp.operands])
    occ_order = used_names(occ.body, [n for n, _ in occ.operands])
    texts = {p: _operand_text(occ, p) for p in occ_order}
    if any(t is None for t in texts.values()):
        return None
    return f"{comp.name}({', '.join(texts[occ_order[comp_order.index(n)]] for n, _ in comp.operands)})"


def _operand_text(occ: Occurrence, placeholder: str) -> str | None:
    """The source text of what ``placeholder`` binds, from the first statement using it."""
    for stmt, n in zip(occ.body, occ.nodes):
        tmpl = ast.parse(stmt).body[0].value
        real = ast.parse(_print_node(n)).body[0].value
        for t, r in zip(list(tmpl.args) + [k.value for k in tmpl.keywords],
                        list(real.args) + [k.value for k in real.keywords]):
            if isinstance(t, ast.Name) and t.id == placeholder:
                return ast.unparse(r)
    return None
