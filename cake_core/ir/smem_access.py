"""Accesses of ops to shared-memory tiles, by kind, from their operands' declared effects: what the race rule
(``rules.races.smem``) orders with barriers."""
from __future__ import annotations

from typing import Callable, Iterable

from cake_core.ir.opdef import Effect, Operand, buffer_name
from cake_core.ir.ops import Node, Op
from cake_core.ir.rule_ctx import Ctx

# a node's (declared operand, argument) pairs: the caller's reading of the declarations
Operands = Callable[[Node], Iterable[tuple[Operand, object]]]

_KIND = {Effect.READ: ("read",), Effect.WRITE: ("write",), Effect.READWRITE: ("read", "write"),
         Effect.ATOMIC_ADD: ("atomic",), Effect.OWNED_ADD: ("owned",)}


def owned_accesses(ctx: Ctx, n: Node, smem: set[str], operands: Operands) -> set[tuple[str, str]]:
    """The accesses of an elementwise op to smem tiles at the element its destination's thread map gives each
    thread: the destination, and each source of the destination's shape (not a transpose's source)."""
    def shape(t) -> tuple:
        return tuple(d if v is None else v for d in t.shape for v in (ctx.static(d),))
    dst_t = ctx.buffers.get(buffer_name(n.args[0]))
    if dst_t is None:
        return set()
    out: set[tuple[str, str]] = set()
    for i, (o, a) in enumerate(operands(n)):
        name = buffer_name(a) if o.kind == "buf" else None
        t = ctx.buffers.get(name) if name in smem else None
        if t is None or (n.op is Op.TRANSPOSE and i > 0) or shape(t) != shape(dst_t):
            continue
        out.update((k, name) for k in _KIND.get(o.effect_of(n), ()))
    return out


def smem_accesses(n: Node, smem: set[str], operands: Operands) -> list[tuple[str, str]]:
    """The ``(kind, tile)`` accesses of ``n`` to the smem tiles ``smem``, from its operands' declared effects:
    read, write, "atomic" (atomic adds: several threads' adds into one tile do not race with each other, only
    with plain reads and writes) and "owned" (every owned add gives target row k to the same warp, which adds
    in program order: owned adds do not race with each other, only with atomics and with plain reads and
    writes). Plain accesses come first, then the adds, each in operand order."""
    plain: list[tuple[str, str]] = []
    adds: list[tuple[str, str]] = []
    for o, a in operands(n):
        name = getattr(a, "buf", a) if o.memory else None
        if name not in smem:
            continue
        kinds = _KIND.get(o.effect_of(n), ())
        (adds if o.effect_of(n) in (Effect.ATOMIC_ADD, Effect.OWNED_ADD) else plain).extend((k, name) for k in kinds)
    return plain + adds


def conflict(a: str, b: str) -> bool:
    """Two unordered accesses to one smem tile race unless both only read or both are atomic adds; a cp.async copy
    still landing ("landing": past a barrier, its group not yet retired) races with the reads after it."""
    if "landing" in (a, b):
        return "read" in (a, b)
    return a != b or a == "write"
