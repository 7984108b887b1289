"""Index expressions: integers, symbols and a few arithmetic forms.

Symbols are problem dimensions (``M``, ``K``: known at run time), program
constants (``BM``: known at compile time), loop variables, the CTA
coordinates ``bid.x``, ``bid.y``, ``bid.z`` and the grid's CTA counts
``ncta.x``, ``ncta.y``, ``ncta.z`` (``gridDim``: what a persistent kernel's
tile loop steps by). The launch symbol ``num_sms`` (the SM count of the GPU
the kernel is launched on, supplied by the runtime) may appear in the grid
only: ``grid=(min(tiles, num_sms),)`` sizes a persistent kernel to the GPU.
Expressions are immutable and hashable; ``evaluate`` folds them under an
environment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union


@dataclass(frozen=True)
class Sym:
    name: str


@dataclass(frozen=True)
class Bin:
    op: str          # one of + - * // %
    a: "Expr"
    b: "Expr"


@dataclass(frozen=True)
class Call:
    fn: str          # cdiv, min, max
    args: tuple["Expr", ...]


@dataclass(frozen=True)
class Cmp:
    """A comparison of two index expressions: the condition of an ``if`` block."""

    op: str          # one of < <= > >= == !=
    a: "Expr"
    b: "Expr"


Expr = Union[int, float, Sym, Bin, Call, Cmp]

BINOPS = ("+", "-", "*", "//", "%")
CMPOPS = ("<", "<=", ">", ">=", "==", "!=")
FUNCS = {"cdiv": 2, "min": 2, "max": 2}
CTA_COORDS = ("bid.x", "bid.y", "bid.z")
CTA_COUNTS = ("ncta.x", "ncta.y", "ncta.z")     # gridDim: known per launch, uniform over the grid
LAUNCH_SYMBOLS = ("num_sms",)                    # supplied by the runtime at launch; grid expressions only
_PREC = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


class UnboundSymbol(Exception):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def evaluate(e: Expr, env: Mapping[str, int | float]) -> int | float:
    """Fold ``e`` to a number; raises UnboundSymbol for a symbol not in ``env``."""
    if isinstance(e, (int, float)):
        return e
    if isinstance(e, Sym):
        if e.name not in env:
            raise UnboundSymbol(e.name)
        return env[e.name]
    if isinstance(e, Bin):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op == "//":
            return a // b
        return a % b
    if isinstance(e, Cmp):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[e.op]
    if isinstance(e, Call):
        vals = [evaluate(x, env) for x in e.args]
        if e.fn == "cdiv":
            return -(-vals[0] // vals[1])
        return min(vals) if e.fn == "min" else max(vals)
    raise TypeError(f"not an expression: {e!r}")


def try_evaluate(e: Expr, env: Mapping[str, int | float]) -> int | float | None:
    try:
        return evaluate(e, env)
    except (UnboundSymbol, ZeroDivisionError):
        return None


def symbols(e: Expr) -> set[str]:
    if isinstance(e, Sym):
        return {e.name}
    if isinstance(e, (Bin, Cmp)):
        return symbols(e.a) | symbols(e.b)
    if isinstance(e, Call):
        out: set[str] = set()
        for a in e.args:
            out |= symbols(a)
        return out
    return set()


def substitute(e: Expr, env: Mapping[str, "Expr"]) -> Expr:
    """``e`` with each symbol named in ``env`` replaced by its expression (no folding)."""
    if isinstance(e, Sym):
        return env.get(e.name, e)
    if isinstance(e, Bin):
        return Bin(e.op, substitute(e.a, env), substitute(e.b, env))
    if isinstance(e, Cmp):
        return Cmp(e.op, substitute(e.a, env), substitute(e.b, env))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, env) for a in e.args))
    return e


def fmt_expr(e: Expr, parent_prec: int = 0) -> str:
    """Canonical text of an expression (fully determined by the tree)."""
    if isinstance(e, bool):
        return "True" if e else "False"
    if isinstance(e, (int, float)):
        return repr(e)
    if isinstance(e, Sym):
        return e.name
    if isinstance(e, Cmp):
        return f"{fmt_expr(e.a)} {e.op} {fmt_expr(e.b)}"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(fmt_expr(a) for a in e.args)})"
    if isinstance(e, Bin):
        p = _PREC[e.op]
        s = f"{fmt_expr(e.a, p)} {e.op} {fmt_expr(e.b, p + 1)}"
        return f"({s})" if p < parent_prec else s
    raise TypeError(f"not an expression: {e!r}")


def c_expr(e: Expr) -> str:
    """The expression as C++ (integer arithmetic; cdiv/min/max from the device header)."""
    if isinstance(e, bool):
        return "true" if e else "false"
    if isinstance(e, (int, float)):
        return repr(e)
    if isinstance(e, Sym):
        return e.name.replace("bid.", "blockIdx.").replace("ncta.", "gridDim.")
    if isinstance(e, Cmp):
        return f"({c_expr(e.a)} {e.op} {c_expr(e.b)})"
    if isinstance(e, Call):
        return f"cake_{e.fn}({', '.join(c_expr(a) for a in e.args)})"
    if isinstance(e, Bin):
        op = "/" if e.op == "//" else e.op
        return f"({c_expr(e.a)} {op} {c_expr(e.b)})"
    raise TypeError(f"not an expression: {e!r}")
