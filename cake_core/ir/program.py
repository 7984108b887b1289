"""A Cake IR program (one kernel) and the builder API that makes one from Python.

The canonical text (``print_program``) is the identity: ``Program.hash`` is the
hash of that text, used by the warehouse and every cache.
"""
from __future__ import annotations

import hashlib
from functools import cached_property
from dataclasses import dataclass, field, replace
from typing import Any

from cake_core.ir.expr import Expr
from cake_core.ir.ops import Node, Op, make_attrs
from cake_core.ir.printer import print_program
from cake_core.ir.tree import for_args, walk
from cake_core.ir.types import DType, MemSpace, TileType

__all__ = ["Param", "Program", "Builder", "walk"]


@dataclass(frozen=True)
class Param:
    name: str
    type: TileType
    line: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Program:
    name: str
    target: str
    grid: tuple[Expr, ...]
    threads: int
    consts: tuple[tuple[str, int], ...]
    params: tuple[Param, ...]
    body: tuple[Node, ...]
    line: int = field(default=0, compare=False)
    ctas_per_sm: int = 0          # @kernel(ctas_per_sm=N): co-resident CTAs the compiler must leave room for

    @property
    def const_env(self) -> dict[str, int]:
        return dict(self.consts)

    def text(self) -> str:
        return self._printed

    @cached_property
    def _printed(self) -> str:
        # a Program never changes (a rewrite makes a new one), so its text and hash are worked out once
        return print_program(self)

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()[:16]

    def with_consts(self, **updates: int) -> "Program":
        env = dict(self.consts)
        env.update(updates)
        return replace(self, consts=tuple(sorted(env.items())))

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


class Builder:
    """Make programs from Python; the result equals what the parser makes of the same text.

    >>> b = Builder("k", target="sm_90a", grid=(1,), threads=128)
    >>> x = b.param("x", DType.F32, (Sym("N"),))
    """

    def __init__(self, name: str, *, target: str, grid: tuple[Expr, ...], threads: int,
                 consts: dict[str, int] | None = None):
        self.name, self.target, self.grid, self.threads = name, target, tuple(grid), threads
        self.consts = tuple(sorted((consts or {}).items()))
        self.params: list[Param] = []
        self._stack: list[list[Node]] = [[]]

    def param(self, name: str, dtype: DType, shape: tuple[Expr, ...]) -> str:
        self.params.append(Param(name, TileType(dtype, tuple(shape), MemSpace.GMEM)))
        return name

    def emit(self, op: Op, *args: Any, result: str | None = None, **attrs: Any) -> str | None:
        self._stack[-1].append(Node(op, tuple(args), make_attrs(op, attrs), result))
        return result

    def let(self, var: str, value: Expr) -> str:
        """``var = value``: bind an index expression for the rest of the current block."""
        self._stack[-1].append(Node(Op.LET, (var, value)))
        return var

    def loop(self, var: str, extent: Expr, start: Expr = 0, step: Expr = 1, **attrs: Any) -> "_Loop":
        """``for var in range(extent)``, or ``range(start, extent, step)``."""
        return _Loop(self, var, (extent, start, step), attrs)

    def build(self) -> Program:
        assert len(self._stack) == 1, "unclosed loop"
        return Program(self.name, self.target, self.grid, self.threads, self.consts,
                       tuple(self.params), tuple(self._stack[0]))


class _Loop:
    def __init__(self, b: Builder, var: str, bounds: tuple[Expr, Expr, Expr], attrs: dict[str, Any]):
        self.b, self.var, self.bounds, self.attrs = b, var, bounds, attrs    # (stop, start, step)

    def __enter__(self) -> str:
        self.b._stack.append([])
        return self.var

    def __exit__(self, *exc: object) -> None:
        body = tuple(self.b._stack.pop())
        self.b._stack[-1].append(Node(Op.FOR, for_args(self.var, *self.bounds), make_attrs(Op.FOR, self.attrs),
                                      None, body))
