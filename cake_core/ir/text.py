"""Cake IR text form: a Python-syntax subset parsed with ``ast``, never executed.

``parse`` collects every syntax-level mistake as a Diagnostic (``parse.*``
rules) with line, column and a hint, and keeps going past a bad statement so
the agent sees all of them at once. ``print_program`` (``ir.printer``) writes the
canonical text; ``parse(print_program(p)).program == p`` for every program.

An assignment is an op call when its right side calls an op (``a_s = smem(...)``,
any plain-named call other than the index functions cdiv/min/max), and
otherwise a binding (``let``) of an index expression: ``kt0 = t * cdiv(K, BK)``.

    @kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=256, consts={"BK": 32, "BM": 64, "BN": 64})
    def gemm(a: gmem[bf16, (M, K)], b: gmem[bf16, (K, N)], c: gmem[f32, (M, N)]):
        acc = rmem(f32, (BM, BN))
        ...
"""
from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from typing import Any

from cake_core.errors import CakeError
from cake_core.ir.expr import BINOPS, FUNCS, Bin, Call, Cmp, Expr, Sym
from cake_core.ir.ops import REGISTRY, At, Full, Node, Op, OpDef, Slot, Tile, View, for_args, make_attrs
from cake_core.ir.printer import fmt_attr, print_program  # noqa: F401 - the text form's two directions
from cake_core.ir.program import Param, Program
from cake_core.ir.types import DType, MemSpace, TileType
from cake_core.outcome import Diagnostic, Severity

_AST_BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_AST_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_KERNEL_KEYS = ("target", "grid", "threads", "ctas_per_sm", "consts")
_FALLBACK_HINT = {
    "parse.kernel": 'the header reads @kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=256, '
                    'consts={"BM": 64})',
    "parse.for": "loops read `for kt in range(cdiv(K, BK)):`",
    "parse.assign": "write `name = op(...)`, or `name = expr` to bind an index expression",
    "parse.view": "views read a[tile(bid.y, BM), :]",
    "parse.role": 'roles read `with role("producer", warps=(0, 4), regs=40):`',
}


@dataclass
class ParseResult:
    program: Program | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.program is not None and not any(d.is_error for d in self.diagnostics)


_NOT_LITERAL = object()
_INF = {"inf": float("inf"), "ninf": float("-inf")}   # ninf: the spelling older texts used for -inf


def _literal(v: ast.expr, is_float: bool) -> Any:
    """An attribute's literal value: a constant, a negated number, or (float attributes) ``inf``, ``-inf``,
    ``ninf``; else ``_NOT_LITERAL``. ``-inf`` is accepted because the printer writes it."""
    neg = isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub)
    x = v.operand if neg else v
    if isinstance(x, ast.Constant):
        if not neg:
            return x.value
        if type(x.value) in (int, float):
            return -x.value
    elif isinstance(x, ast.Name) and is_float and x.id in _INF:
        return -_INF[x.id] if neg else _INF[x.id]
    return _NOT_LITERAL


class IRSyntaxError(CakeError):
    def __init__(self, diagnostics: list[Diagnostic], filename: str, source: str):
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.format(filename, source) for d in diagnostics))


class _Bad(Exception):
    """One statement-level parse error; the parser records it and moves on."""

    def __init__(self, rule: str, node: ast.AST | None, message: str, hint: str = ""):
        super().__init__(message)
        self.rule, self.node, self.message, self.hint = rule, node, message, hint


def parse(text: str, filename: str = "<ir>") -> ParseResult:
    """Parse IR text; never raises for bad input (the diagnostics say what is wrong)."""
    try:
        mod = ast.parse(text, filename=filename)
    except SyntaxError as e:
        return ParseResult(None, [Diagnostic("parse.syntax", Severity.ERROR, e.msg or "invalid syntax",
                                             e.lineno or 0, (e.offset or 0), "",
                                             "Cake IR is a Python-syntax subset: check brackets, colons "
                                             "and indentation on this line")])
    return _Parser().module(mod)


def parse_program(text: str, filename: str = "<ir>") -> Program:
    """Parse or raise IRSyntaxError (for programs written by people and tests)."""
    r = parse(text, filename)
    if not r.ok:
        raise IRSyntaxError(r.diagnostics, filename, text)
    assert r.program is not None
    return r.program


class _Parser:
    def __init__(self) -> None:
        self.diags: list[Diagnostic] = []

    def bad(self, e: _Bad) -> None:
        n = e.node
        self.diags.append(Diagnostic(e.rule, Severity.ERROR, e.message,
                                     getattr(n, "lineno", 0), getattr(n, "col_offset", -1) + 1,
                                     "", e.hint or _FALLBACK_HINT.get(e.rule, "`cake ops` shows every op with an example")))

    # ---------------------------------------------------------- module level
    def module(self, mod: ast.Module) -> ParseResult:
        fns = [s for s in mod.body if isinstance(s, ast.FunctionDef)]
        for s in mod.body:
            if not isinstance(s, ast.FunctionDef):
                self.bad(_Bad("parse.toplevel", s, "only one `@kernel def` may appear at the top level",
                              "remove this statement or move it into the kernel body"))
        if len(fns) != 1:
            self.bad(_Bad("parse.toplevel", fns[1] if len(fns) > 1 else None,
                          f"expected exactly one kernel function, found {len(fns)}",
                          "write one `@kernel(...)` decorated `def` per file"))
            return ParseResult(None, self.diags)
        fn = fns[0]
        try:
            kw = self.decorator(fn)
        except _Bad as e:
            self.bad(e)
            return ParseResult(None, self.diags)
        params = []
        for a in fn.args.args:
            try:
                params.append(self.param(a))
            except _Bad as e:
                self.bad(e)
        body = self.block(fn.body)
        prog = Program(fn.name, kw["target"], kw["grid"], kw["threads"], kw["consts"],
                       tuple(params), body, fn.decorator_list[0].lineno, kw["ctas_per_sm"])
        return ParseResult(prog, self.diags)

    def decorator(self, fn: ast.FunctionDef) -> dict[str, Any]:
        decs = [d for d in fn.decorator_list
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "kernel"]
        if len(decs) != 1 or len(fn.decorator_list) != 1:
            raise _Bad("parse.kernel", fn, "the kernel needs exactly one `@kernel(...)` decorator",
                       'write @kernel(target="sm_90a", grid=(...), threads=N)')
        d = decs[0]
        if d.args:
            raise _Bad("parse.kernel", d, "@kernel takes keyword arguments only",
                       "name them: target=, grid=, threads=, ctas_per_sm=, consts=")
        kw = {k.arg: k.value for k in d.keywords}
        for k in kw:
            if k not in _KERNEL_KEYS:
                raise _Bad("parse.kernel", d, f"unknown @kernel argument `{k}`",
                           f"allowed: {', '.join(_KERNEL_KEYS)}")
        for k in ("target", "grid", "threads"):
            if k not in kw:
                raise _Bad("parse.kernel", d, f"@kernel is missing `{k}=`",
                           'e.g. @kernel(target="sm_90a", grid=(cdiv(N, 64),), threads=128)')
        t = kw["target"]
        if not (isinstance(t, ast.Constant) and isinstance(t.value, str)):
            raise _Bad("parse.kernel", t, "target must be a string such as \"sm_90a\"")
        g = kw["grid"]
        grid = tuple(self.expr(e) for e in (g.elts if isinstance(g, ast.Tuple) else [g]))
        if not 1 <= len(grid) <= 3:
            raise _Bad("parse.kernel", g, f"grid has {len(grid)} dimensions; 1 to 3 allowed")
        th = kw["threads"]
        if not (isinstance(th, ast.Constant) and type(th.value) is int):
            raise _Bad("parse.kernel", th, "threads must be an integer literal")
        ctas = 0
        if "ctas_per_sm" in kw:
            cv = kw["ctas_per_sm"]
            if not (isinstance(cv, ast.Constant) and type(cv.value) is int and cv.value >= 1):
                raise _Bad("parse.kernel", cv, "ctas_per_sm must be a positive integer literal",
                           "e.g. ctas_per_sm=3: registers are capped so that 3 CTAs fit on one SM")
            ctas = cv.value
        consts: dict[str, int] = {}
        if "consts" in kw:
            c = kw["consts"]
            if not isinstance(c, ast.Dict):
                raise _Bad("parse.kernel", c, 'consts must be a dict literal such as {"BM": 64}')
            for k, v in zip(c.keys, c.values):
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.isidentifier()):
                    raise _Bad("parse.kernel", k or c, "const names must be identifier strings")
                if not (isinstance(v, ast.Constant) and type(v.value) is int):
                    raise _Bad("parse.kernel", v, f"const {k.value} must be an integer literal")
                consts[k.value] = v.value
        return {"target": t.value, "grid": grid, "threads": th.value, "ctas_per_sm": ctas,
                "consts": tuple(sorted(consts.items()))}

    def param(self, a: ast.arg) -> Param:
        ann = a.annotation
        hint = f"annotate it as gmem[bf16, (M, K)]"
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)):
            raise _Bad("parse.param", a, f"parameter `{a.arg}` needs a type annotation", hint)
        if ann.value.id != "gmem":
            raise _Bad("parse.param", ann, f"kernel parameters live in gmem, not `{ann.value.id}`", hint)
        parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if len(parts) != 2:
            raise _Bad("parse.param", ann, f"gmem[...] takes a dtype and a shape tuple", hint)
        return Param(a.arg, TileType(self.dtype(parts[0]), self.shape(parts[1]), MemSpace.GMEM),
                     a.lineno)

    # ------------------------------------------------------------ statements
    def block(self, stmts: list[ast.stmt]) -> tuple[Node, ...]:
        out = []
        for s in stmts:
            try:
                n = self.stmt(s)
                if n is not None:
                    out.append(n)
            except _Bad as e:
                self.bad(e)
        return tuple(out)

    def stmt(self, s: ast.stmt) -> Node | None:
        if isinstance(s, ast.Pass):
            return None
        if isinstance(s, ast.For):
            if not isinstance(s.target, ast.Name):
                raise _Bad("parse.for", s.target, "a loop variable must be a plain name")
            it = s.iter
            if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                    and 1 <= len(it.args) <= 3):
                raise _Bad("parse.for", it, "loops are `for v in range(extent):` or `range(start, stop, step)`",
                           "write the extent as an index expression, e.g. range(cdiv(K, BK)); a persistent "
                           "tile loop reads range(bid.x, tiles, ncta.x)")
            if s.orelse:
                raise _Bad("parse.for", s, "for-else is not part of Cake IR")
            attrs = self.attrs(REGISTRY[Op.FOR], it.keywords, it)
            bounds = [self.expr(x) for x in it.args]
            if len(bounds) == 1:
                args = (s.target.id, bounds[0])
            else:
                args = for_args(s.target.id, bounds[1], bounds[0], bounds[2] if len(bounds) == 3 else 1)
            return Node(Op.FOR, args, attrs, None, self.block(s.body), s.lineno, s.col_offset + 1)
        if isinstance(s, ast.With):
            return self.with_role(s)
        if isinstance(s, ast.If):
            if s.orelse:
                raise _Bad("parse.if", s.orelse[0], "`else` is not part of Cake IR",
                           "write a second `if` with the opposite comparison")
            return Node(Op.IF, (self.cond(s.test),), (), None, self.block(s.body), s.lineno, s.col_offset + 1)
        if isinstance(s, ast.Assign):
            if len(s.targets) != 1 or not isinstance(s.targets[0], ast.Name):
                raise _Bad("parse.assign", s, "assign to exactly one plain name")
            if _is_op_call(s.value):
                return self.call(s.value, s.targets[0].id, s)
            # anything else on the right is an index expression: a binding (`let`)
            return Node(Op.LET, (s.targets[0].id, self.expr(s.value)), (), None, (), s.lineno, s.col_offset + 1)
        if isinstance(s, ast.Expr):
            return self.call(s.value, None, s)
        raise _Bad("parse.statement", s, f"`{type(s).__name__}` statements are not part of Cake IR",
                   "statements are op calls, `name = op(...)`, bindings `name = expr`, `for v in range(n):` "
                   "loops, `if a < b:` and `with role(...):` blocks")

    def with_role(self, s: ast.With) -> Node:
        """``with role("name", warps=(lo, hi), regs=R):`` — a block op like ``for``."""
        hint = 'write `with role("producer", warps=(0, 4), regs=40):`'
        if len(s.items) != 1 or s.items[0].optional_vars is not None:
            raise _Bad("parse.role", s, "a with-statement holds exactly one role(...) and no `as`", hint)
        c = s.items[0].context_expr
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "role"):
            raise _Bad("parse.role", c, "only `with role(...):` blocks are part of Cake IR", hint)
        d = REGISTRY[Op.ROLE]
        return Node(Op.ROLE, self.operands(d, c), self.attrs(d, [k for k in c.keywords if k.arg not in
                                                                 d.keyword_operands], c),
                    None, self.block(s.body), s.lineno, s.col_offset + 1)

    def operands(self, d: OpDef, c: ast.Call) -> tuple:
        """Positional operands, then the keyword operands (``bar=``, ``phase=``) by name."""
        npos = len(d.operands) - len(d.keyword_operands)
        name = d.op.value
        kw = {k.arg: k.value for k in c.keywords if k.arg in d.keyword_operands}
        missing = [k for k in d.keyword_operands if k not in kw]
        if len(c.args) != npos or missing:
            want = ", ".join(o.name if not o.keyword else f"{o.name}=..." for o in d.operands)
            got = f"{len(c.args)}" + (f", without {', '.join(m + '=' for m in missing)}" if missing else "")
            raise _Bad("parse.arity", c, f"`{name}` takes {npos} operands then {len(d.keyword_operands)} keyword "
                                         f"operands ({want}), got {got}" if d.keyword_operands else
                       f"`{name}` takes {len(d.operands)} operands ({want}), got {len(c.args)}",
                       f"example: {d.example}")
        given = list(c.args) + [kw[k] for k in d.keyword_operands]
        return tuple(self.operand(o.kind, a, name, o.name) for o, a in zip(d.operands, given))

    def call(self, c: ast.expr, result: str | None, s: ast.stmt) -> Node:
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Name)):
            raise _Bad("parse.statement", c, "a statement must be an op call such as load(dst, src)")
        name = c.func.id
        try:
            d = REGISTRY[Op(name)]
        except ValueError:
            close = difflib.get_close_matches(name, [o.value for o in Op if o not in (Op.FOR, Op.LET)], n=3)
            raise _Bad("parse.unknown_op", c, f"unknown op `{name}`",
                       f"did you mean {', '.join(close)}? (`cake ops` lists every op)" if close
                       else "`cake ops` lists every op") from None
        if d.block:
            raise _Bad("parse.statement", c, f"`{name}` opens a block; use it as a statement header")
        if d.op is Op.LET:
            raise _Bad("parse.statement", c, "a binding is written `name = expr`, not `let(...)`",
                       f"e.g. {d.example}")
        if d.result and result is None:
            raise _Bad("parse.result", c, f"`{name}` makes a value: bind it, `x = {name}(...)`")
        if not d.result and result is not None:
            raise _Bad("parse.result", c, f"`{name}` returns nothing; call it without `{result} =`")
        args = self.operands(d, c)
        kws = [k for k in c.keywords if k.arg not in d.keyword_operands]
        return Node(d.op, args, self.attrs(d, kws, c), result, (), s.lineno, s.col_offset + 1)

    def attrs(self, d: OpDef, keywords: list[ast.keyword], where: ast.AST) -> tuple:
        given: dict[str, Any] = {}
        for k in keywords:
            if k.arg not in d.attrs:
                allowed = ", ".join(d.attrs) or "none"
                raise _Bad("parse.attr", k.value, f"`{d.op.value}` has no attribute `{k.arg}`",
                           f"its attributes: {allowed}")
            spec = d.attrs[k.arg]
            v = k.value
            val = _literal(v, spec.kind is float)
            if val is _NOT_LITERAL:
                raise _Bad("parse.attr", v, f"attribute `{k.arg}` must be a literal",
                           f"write e.g. {k.arg}={fmt_attr(spec.default)}")
            if spec.kind is float and type(val) is int:
                val = float(val)
            if type(val) is not spec.kind:
                raise _Bad("parse.type", v, f"attribute `{k.arg}` of `{d.op.value}` is a "
                                            f"{spec.kind.__name__}, got {type(val).__name__}",
                           f"write e.g. {k.arg}={fmt_attr(spec.choices[-1] if spec.choices else spec.default)}")
            if spec.choices and val not in spec.choices:
                raise _Bad("parse.attr", v, f"`{k.arg}={val!r}` is not allowed",
                           f"choose one of {', '.join(map(repr, spec.choices))}")
            given[k.arg] = val
        return make_attrs(d.op, given)

    # -------------------------------------------------------------- operands
    def operand(self, kind: str, a: ast.expr, op: str, oname: str) -> Any:
        if kind == "dtype":
            return self.dtype(a)
        if kind == "shape":
            return self.shape(a)
        if kind == "buf":
            if not isinstance(a, ast.Name):
                raise _Bad("parse.type", a, f"operand `{oname}` of `{op}` must be a buffer name")
            return a.id
        if kind == "name":
            if not isinstance(a, ast.Name):
                raise _Bad("parse.type", a, f"operand `{oname}` of `{op}` is a new name it binds, such as `tm`")
            return a.id
        if kind == "view":
            return self.view(a, op, oname)
        if kind == "expr":
            return self.expr(a)
        if kind == "slot":
            if isinstance(a, ast.Name):
                return Slot(a.id)
            if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and not isinstance(a.slice, ast.Tuple):
                return Slot(a.value.id, self.expr(a.slice))
            raise _Bad("parse.type", a, f"operand `{oname}` of `{op}` must be a buffer or a ring slot such as "
                                        "a_s[kt % S]")
        if kind == "str":
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.isidentifier():
                return a.value
            raise _Bad("parse.type", a, f"operand `{oname}` of `{op}` must be a string naming it, e.g. \"producer\"")
        if kind == "warps":
            if (isinstance(a, ast.Tuple) and len(a.elts) == 2
                    and all(isinstance(e, ast.Constant) and type(e.value) is int for e in a.elts)):
                return (a.elts[0].value, a.elts[1].value)
            raise _Bad("parse.type", a, f"`{oname}` of `{op}` is a pair of integers (first warp, end warp)",
                       "e.g. warps=(0, 4) for warpgroup 0")
        raise AssertionError(kind)

    def dtype(self, a: ast.expr) -> DType:
        if isinstance(a, ast.Name):
            try:
                return DType(a.id)
            except ValueError:
                pass
        raise _Bad("parse.type", a, f"`{ast.unparse(a)}` is not a dtype",
                   f"dtypes: {', '.join(d.value for d in DType)}")

    def shape(self, a: ast.expr) -> tuple[Expr, ...]:
        if not isinstance(a, ast.Tuple):
            raise _Bad("parse.type", a, "a shape is a tuple such as (BM, BK) or (N,)")
        return tuple(self.expr(e) for e in a.elts)

    def view(self, a: ast.expr, op: str, oname: str) -> View:
        if not (isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name)):
            raise _Bad("parse.type", a, f"operand `{oname}` of `{op}` must be a gmem view such as "
                                        f"a[tile(bid.y, BM), :]")
        parts = a.slice.elts if isinstance(a.slice, ast.Tuple) else [a.slice]
        index = []
        for p in parts:
            if isinstance(p, ast.Slice):
                if p.lower or p.upper or p.step:
                    raise _Bad("parse.view", p, "only `:` slices are allowed; use tile(i, n) for windows")
                index.append(Full())
            elif isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id == "tile":
                if len(p.args) != 2:
                    raise _Bad("parse.arity", p, "tile takes two operands: tile(index, size), and optionally "
                                                 "base= and limit=")
                kw = {}
                for k in p.keywords:
                    if k.arg not in ("base", "limit") or k.arg in kw:
                        raise _Bad("parse.attr", k.value, f"tile takes base= and limit= (once each), not "
                                                          f"{k.arg or '**'}=", "e.g. tile(c, BT, base=bos, limit=eos)")
                    kw[k.arg] = self.expr(k.value)
                index.append(Tile(self.expr(p.args[0]), self.expr(p.args[1]), kw.get("base", 0), kw.get("limit")))
            else:
                index.append(At(self.expr(p)))
        return View(a.value.id, tuple(index))

    def cond(self, a: ast.expr) -> Cmp:
        if not (isinstance(a, ast.Compare) and len(a.ops) == 1 and type(a.ops[0]) in _AST_CMP):
            raise _Bad("parse.if", a, "an `if` condition is one comparison of index expressions",
                       "e.g. `if kt < cdiv(K, BK) - 1:`; nest ifs for `and`")
        return Cmp(_AST_CMP[type(a.ops[0])], self.expr(a.left), self.expr(a.comparators[0]))

    def expr(self, a: ast.expr) -> Expr:
        if isinstance(a, ast.Constant) and type(a.value) in (int, float):
            return a.value
        if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub):
            v = self.expr(a.operand)
            if isinstance(v, (int, float)):
                return -v
            return Bin("-", 0, v)
        if isinstance(a, ast.Name):
            return Sym(a.id)
        if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id in ("bid", "ncta") \
                and a.attr in ("x", "y", "z"):
            return Sym(f"{a.value.id}.{a.attr}")
        if isinstance(a, ast.BinOp) and type(a.op) in _AST_BINOP:
            return Bin(_AST_BINOP[type(a.op)], self.expr(a.left), self.expr(a.right))
        if isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id in FUNCS:
            if len(a.args) != FUNCS[a.func.id] or a.keywords:
                raise _Bad("parse.arity", a, f"{a.func.id} takes {FUNCS[a.func.id]} operands")
            return Call(a.func.id, tuple(self.expr(x) for x in a.args))
        raise _Bad("parse.expr", a, f"`{ast.unparse(a)}` is not an index expression",
                   f"use integers, names, bid.x/y/z, ncta.x/y/z, {' '.join(BINOPS)} and {', '.join(FUNCS)}()")


def _is_op_call(v: ast.expr) -> bool:
    """``name = op(...)`` (an op, known or not) rather than ``name = expr``: a call of a plain name that
    is not one of the index functions (cdiv, min, max)."""
    return isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id not in FUNCS
