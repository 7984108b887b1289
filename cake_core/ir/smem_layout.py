"""The shared-memory layout of one CTA: where each smem tile, mbarrier array and scratch region lies.

:func:`smem_layout` lays the kernel's dynamic shared memory out in program order, the order the lowering
emits the statements in, and is the only place that does: the lowering takes every offset from it
(``lower_tile.lower_smem``, ``lower_async.lower_mbarrier``, ``lower_compute``'s staging) and requests
``total`` bytes at launch; the verifier checks the same ``total`` against ``Arch.smem_per_cta_bytes``
(``resources.smem``, ``compute.scratch_smem``, ``resources.ctas_per_sm``). What it places:

- an smem tile at the next multiple of ``Arch.smem_alloc_align_bytes``, or of
  ``Arch.tma.swizzle_smem_align_bytes`` for a swizzle-128 tile (its pattern is address-based, so the tile
  starts on a whole pattern), ``stages`` copies of its shape;
- an mbarrier array at the next multiple of ``Arch.mbarrier_bytes``, that many bytes per barrier;
- the scratch of a statement that exchanges rmem elements between threads (``scratch.scratch_bytes``), at
  the next ``smem_alloc_align_bytes`` multiple. A run of
  such statements with nothing allocated between them shares one region, sized for the largest: each
  statement's scratch is dead once it returns.

``total`` is the end of the last region rounded up to ``smem_alloc_align_bytes``, alignment gaps included;
None when a tile or barrier count is not a positive compile-time constant (``shapes.static`` says so).
Names are scoped as the lowering scopes them (a block's allocations are visible in it and the blocks nested
in it), so a staged operand resolves to the tile the lowering stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable

from cake_core.ir.expr import try_evaluate
from cake_core.ir.fragments import layouts_on
from cake_core.ir.opdef import Alloc
from cake_core.ir.scratch import scratch_bytes
from cake_core.ir.types import MemSpace, Swizzle, TileType
from cake_core.targets import Arch

TILE, MBARRIER, SCRATCH = "tile", "mbarrier", "scratch"


@dataclass(frozen=True)
class Region:
    """One placed piece of shared memory."""

    kind: str          # TILE, MBARRIER or SCRATCH
    name: str          # the tile or barrier array; for scratch, the op
    node: Any          # the statement that allocates (or, for scratch, needs) it
    offset: int
    nbytes: int        # this statement's bytes (a shared scratch region is as large as its largest user)
    gap: int = 0       # padding before it, to its alignment

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True)
class SmemLayout:
    regions: tuple[Region, ...]
    top: int                       # end of the placed regions
    total: int | None              # bytes to request at launch; None when a size is not static
    unsized: tuple[Any, ...] = ()  # allocations whose size is not a positive compile-time constant

    @cached_property
    def _by_node(self) -> dict[int, Region]:
        return {id(r.node): r for r in self.regions}

    def region(self, node: Any) -> Region | None:
        """The region that ``node`` allocates or stages through (None if it has none)."""
        return self._by_node.get(id(node))

    def bytes_of(self, *kinds: str) -> int:
        return sum(r.nbytes for r in self.regions if r.kind in kinds)

    @property
    def gaps(self) -> int:
        return sum(r.gap for r in self.regions)

    def breakdown(self) -> str:
        """``tiles 98304 B + mbarriers 64 B + scratch 0 B + alignment 960 B``: the witness of the total."""
        return (f"tiles {self.bytes_of(TILE)} B + mbarriers {self.bytes_of(MBARRIER)} B + scratch "
                f"{self._scratch_extent()} B + alignment {self.gaps} B")

    def _scratch_extent(self) -> int:
        seen: dict[int, int] = {}
        for r in self.regions:
            if r.kind == SCRATCH:
                seen[r.offset] = max(seen.get(r.offset, 0), r.nbytes)
        return sum(seen.values())

    def first_past(self, limit: int) -> Region | None:
        """The first region that ends past ``limit`` bytes."""
        return next((r for r in self.regions if r.end > limit), None)


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


def _static(e: Any, consts: dict[str, int]) -> int | None:
    v = try_evaluate(e, consts)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def _static_shape(shape: Iterable[Any], consts: dict[str, int]) -> tuple[int, ...] | None:
    out = []
    for d in shape:
        v = _static(d, consts)
        if v is None:
            return None
        out.append(v)
    return tuple(out)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def smem_layout(program: Any, arch: Arch) -> SmemLayout:
    """The shared-memory layout of ``program`` on ``arch`` (see the module docstring)."""
    consts = program.const_env
    held = layouts_on(program, arch)
    regions: list[Region] = []
    unsized: list[Any] = []
    state = {"top": 0, "scratch": None}       # scratch: (offset, size) of the region the last statement used
    align = arch.smem_alloc_align_bytes

    def place(kind: str, name: str, n: Any, at_align: int, nbytes: int) -> None:
        top = state["top"]
        off = _round_up(top, at_align)
        regions.append(Region(kind, name, n, off, nbytes, off - top))
        state["top"] = off + nbytes

    def visit(nodes: tuple[Any, ...], scopes: list[dict[str, TileType]]) -> None:
        def lookup(name: str) -> TileType | None:
            for s in reversed(scopes):
                if name in s:
                    return s[name]
            return None

        for n in nodes:
            d = n.decl
            if d.allocates in (Alloc.SMEM, Alloc.RMEM):
                dtype, shape = n.args[0], n.args[1]
                static = _static_shape(shape, consts)
                stages = n.attr("stages") if "stages" in d.attrs else 1
                if d.allocates is Alloc.SMEM:
                    if static is None or not isinstance(stages, int) or stages < 1:
                        unsized.append(n)
                    else:
                        at = arch.tma.swizzle_smem_align_bytes if n.attr("swizzle") == Swizzle.B128 else align
                        place(TILE, n.result, n, max(at, align), stages * _numel(static) * dtype.bytes)
                if n.result:
                    scopes[-1][n.result] = TileType(dtype, tuple(shape), MemSpace(d.allocates.value),
                                                    stages=stages if isinstance(stages, int) else 1)
            elif d.allocates is Alloc.MBARRIER:
                count = _static(n.args[0], consts)
                if count is None:
                    unsized.append(n)
                else:
                    place(MBARRIER, n.result or "", n, arch.mbarrier_bytes, arch.mbarrier_bytes * count)
            else:
                need = scratch_bytes(n, lookup, lambda t: _static_shape(t.shape, consts), held) if n.args else 0
                if need:
                    region = state["scratch"]
                    if region is None or region[0] + region[1] != state["top"]:
                        region = (_round_up(state["top"], align), 0)
                    off, size = region[0], max(region[1], need)
                    regions.append(Region(SCRATCH, n.op.value, n, off, need, 0 if region[1] else off - state["top"]))
                    state["scratch"] = (off, size)
                    state["top"] = off + size
            if n.body:
                visit(n.body, scopes + [{}])

    visit(program.body, [{}])
    top = state["top"]
    return SmemLayout(tuple(regions), top, None if unsized else _round_up(top, align), tuple(unsized))
