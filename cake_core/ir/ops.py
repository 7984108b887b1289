"""The IR's one node type, ``Node``, over the op registry.

An op's declaration (``opdef.OpDef``, one per op in ``ops_core`` / ``ops_async`` / ``ops_compute``,
assembled in ``registry``) says what its operands and attributes are, what it does to the memory they name,
whether it binds a result or opens a block, its interpreter semantics, its cost class and its documentation
(the reference that people and the LLM agent read is generated from it). A ``Node`` is one statement: the
op, its operands in declaration order and its non-default attributes.

The op vocabulary is re-exported here (``Op``, ``OpDef``, ``View``, ``Tile``, ``Full``, ``At``, ``Slot``,
``REGISTRY``, ``for_args``, ``loop_range``) so that ``from cake_core.ir.ops import ...`` reaches all of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cake_core.ir.opdef import AttrSpec, At, Effect, Family, Full, Index, Op, OpDef, Operand, Slot, Tile, View
from cake_core.ir.registry import REGISTRY, opdef
from cake_core.ir.tree import for_args, loop_range

__all__ = ["Node", "make_attrs", "Op", "OpDef", "Operand", "AttrSpec", "Family", "Effect", "REGISTRY", "opdef", "View",
           "Tile", "Full", "At", "Index", "Slot", "for_args", "loop_range"]


@dataclass(frozen=True)
class Node:
    """One statement. ``args`` follow the OpDef's operands; ``attrs`` are the
    non-default attributes, sorted by name (so equal programs are equal)."""

    op: Op
    args: tuple[Any, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    result: str | None = None
    body: tuple["Node", ...] = ()
    line: int = field(default=0, compare=False)
    col: int = field(default=0, compare=False)

    @property
    def decl(self) -> OpDef:
        return REGISTRY[self.op]

    def attr(self, name: str) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return REGISTRY[self.op].attrs[name].default

    def arg(self, name: str) -> Any:
        return self.args[REGISTRY[self.op].index_of(name)]


def make_attrs(op: Op, given: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Canonical attrs: drop defaults, sort by name."""
    specs = REGISTRY[op].attrs
    return tuple(sorted((k, v) for k, v in given.items() if k not in specs or v != specs[k].default))
