"""The op vocabulary: the ``Op`` enum, what a declaration says about an op, and the operand values.

One op is one :class:`OpDef` (declared in ``ops_core``, ``ops_async`` or ``ops_compute``, assembled in
``registry``). Its declaration carries, once:

- its :class:`Family`: every group of ops another module needs (the compute ops, the axis ops, the MMA ops,
  the async copies...) is a set of families (``registry.ops_of``);
- its operands (:class:`Operand`): kind (what the parser accepts), :class:`Effect` on the memory the operand
  names (read, written, added into), the memory spaces it may live in, whether it names an mbarrier and what
  the op does with it (:class:`BarrierUse`), whether it holds indices, a tile the cluster exchanges, or
  elements that move between threads (:class:`Exchange`); whether an output may alias a source;
- how its shared-memory accesses are ordered (:class:`Ordering`), which proxy they go through
  (:class:`Proxy`) and when they complete (:class:`Completion`); the synchronisation it is (:class:`SyncKind`);
- its interpreter semantics (a function of the CTA state and the node, defined beside the declaration) and
  its :class:`CostClass`; for an op that binds index names (``let`` and any other), the function that gives
  their values (``bind``), which the interpreter, the protocol checker and the cost model evaluate alike, and
  whether the value is read from memory within a declared ``[0, max]`` (``data_dependent``: ``scalar``,
  ``fetch_add``, ``compact``); the shared memory it uses for itself (``scratch_bytes``);
- its documentation (summary, example, preconditions), from which ``docs/ops.md`` is generated.

The verifier rules, the protocol checker, features, the reference and the cost model read these fields
instead of keeping lists of ops; the lowering keeps one dispatch per op (``lower/dispatch.py``).

This module depends on the standard library and ``expr``/``types`` only: declarations and semantics import
it without importing ``ops`` (where ``Node`` reads the assembled registry).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from cake_core.ir.expr import Bin, Expr
from cake_core.ir.types import MemSpace


class Op(str, enum.Enum):
    """Every op of the IR; its value (the name the text form writes) is the member's name in lower case."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list) -> str:
        return name.lower()

    # -- allocation
    SMEM = enum.auto()
    RMEM = enum.auto()
    MBARRIER = enum.auto()
    # -- copies: gmem <-> smem <-> rmem, synchronous and asynchronous
    LOAD = enum.auto()
    STORE = enum.auto()
    TMA_LOAD = enum.auto()
    TMA_STORE = enum.auto()
    CP_ASYNC = enum.auto()
    CP_ASYNC_BAR = enum.auto()
    # -- synchronisation: CTA barrier, mbarriers, fences, wait groups, clusters
    SYNC = enum.auto()
    EXPECT_TX = enum.auto()
    ARRIVE = enum.auto()
    WAIT = enum.auto()
    CP_ASYNC_WAIT = enum.auto()
    FENCE_ASYNC = enum.auto()
    ROLE_SYNC = enum.auto()
    WGMMA_WAIT = enum.auto()
    CLUSTER_SYNC = enum.auto()
    # -- matrix multiply-accumulate
    MMA = enum.auto()
    WGMMA = enum.auto()
    TCGEN05_MMA = enum.auto()
    # -- structure
    FOR = enum.auto()
    IF = enum.auto()
    LET = enum.auto()
    TILE_ORDER = enum.auto()
    SCALAR = enum.auto()
    FETCH_ADD = enum.auto()
    COMPACT = enum.auto()
    GATHER = enum.auto()
    ROLE = enum.auto()
    CLUSTER = enum.auto()
    # -- elementwise tile math
    FILL = enum.auto()
    CAST = enum.auto()
    UNARY = enum.auto()
    EWISE = enum.auto()
    SELECT = enum.auto()
    IOTA = enum.auto()
    TRANSPOSE = enum.auto()
    TRISOLVE = enum.auto()
    # -- reductions along an axis
    REDUCE = enum.auto()
    SCAN = enum.auto()
    ARGMIN = enum.auto()
    ARGMAX = enum.auto()
    # -- running arg-min / top-k over candidate tiles
    ARGMIN_UPDATE = enum.auto()
    TOPK_MERGE = enum.auto()
    # -- atomic adds into gmem (or a privatised smem tile)
    ATOMIC_ADD = enum.auto()
    SCATTER_ADD = enum.auto()
    # -- segment sums of gathered rows
    GATHER_ADD = enum.auto()
    # -- fused epilogues on a wgmma accumulator, row norms of a landed tile
    ARGMIN_BIAS = enum.auto()
    TOPK_BIAS = enum.auto()
    TOPK_SHIFT = enum.auto()
    SQNORM_ROWS = enum.auto()
    # -- exchanges between the CTAs of a cluster
    TOPK_PUBLISH = enum.auto()
    TOPK_CLUSTER_MERGE = enum.auto()
    ACC_PUBLISH = enum.auto()
    ACC_CLUSTER_REDUCE = enum.auto()


class Family(str, enum.Enum):
    """What kind of op it is: the reference's sections, and every op group other modules use."""

    ALLOC = "allocation"
    COPY = "copies"
    SYNC = "synchronisation"
    MMA = "matrix multiply-accumulate"
    STRUCTURE = "structure"
    ELEMENTWISE = "elementwise tile math"
    AXIS = "reductions along an axis"
    RUNNING = "running arg-min / top-k"
    ATOMIC = "atomic adds"
    GATHER = "gathered segment sums"
    EPILOGUE = "fused epilogues and row norms"
    CLUSTER = "cluster exchanges"


class Effect(str, enum.Enum):
    """What an op does to the memory an operand names."""

    NONE = "none"              # names no memory (a dtype, a shape, an index expression), or an mbarrier
    READ = "read"
    WRITE = "write"
    READWRITE = "read and write"
    ATOMIC_ADD = "atomic add"  # adds with atomics: adds of several threads into one element commute
    OWNED_ADD = "owned add"    # the warp that owns a row adds into it, in program order: owned adds commute

    @property
    def reads(self) -> bool:
        return self in (Effect.READ, Effect.READWRITE)

    @property
    def writes(self) -> bool:
        return self in (Effect.WRITE, Effect.READWRITE)

    @property
    def modifies(self) -> bool:
        """It writes or adds into the memory."""
        return self.writes or self in (Effect.ATOMIC_ADD, Effect.OWNED_ADD)


@dataclass(frozen=True)
class ByAttr:
    """An effect an attribute selects (``owner="warp"``: an owned add; ``accumulate=True``: read, then write)."""

    attr: str
    effects: tuple[tuple[Any, Effect], ...]

    def __call__(self, n: Any) -> Effect:
        return dict(self.effects)[n.attr(self.attr)]


class Exchange(str, enum.Enum):
    """Whether an operand's elements move between threads (an rmem one is then staged through smem scratch that
    the lowering allocates and the verifier counts)."""

    NONE = "none"
    ALWAYS = "always"            # a reduction, a running merge, a transposed source, a scatter index
    BROADCAST = "when broadcast"  # an ewise source whose shape is not the destination's


class Scope(str, enum.Enum):
    """Where the name a ``name`` operand binds is visible."""

    BODY = "the op's body"                        # a loop variable
    BLOCK = "the rest of the op's block"          # a binding: later statements and the blocks nested in them


class BarrierUse(str, enum.Enum):
    """What an op does with the mbarrier slot an operand names."""

    ARRIVE = "arrives (one arrival per warpgroup of the role)"
    EXPECT_TX = "arrives once and expects transaction bytes"
    COMPLETE_TX = "its copy's bytes complete a transaction on it"
    TRACK = "its copies complete with the barrier's phase, without an arrival of their own"
    WAIT = "waits for a phase"


@dataclass(frozen=True)
class Operand:
    """One operand of an op: the kind the parser reads (dtype, shape, buf, view, expr, cond, name, slot, str,
    warps), the effect on the memory it names, the spaces that memory may live in, and its roles."""

    name: str
    kind: str
    effect: Effect | ByAttr = Effect.NONE
    space: tuple[MemSpace, ...] = ()
    barrier: BarrierUse | None = None    # an mbarrier slot, and what the op does with it
    index: bool = False                  # holds i32 indices (argmin's idx, scatter_add's idx...)
    predicate: bool = False              # a condition, tested against 0 and never written into an output
    cluster: bool = False                # an smem tile the cluster's CTAs exchange (published, then read)
    exchange: Exchange = Exchange.NONE   # its elements move between threads
    binds: Scope | None = None           # a ``name`` operand: the index name it binds, and where it is visible
    keyword: bool = False                # written `name=value`, after the positional operands

    def effect_of(self, n: Any) -> Effect:
        return self.effect(n) if isinstance(self.effect, ByAttr) else self.effect

    @property
    def effects(self) -> tuple[Effect, ...]:
        """Every effect it may have: its one, or one per value of the attribute that selects it."""
        return tuple(e for _, e in self.effect.effects) if isinstance(self.effect, ByAttr) else (self.effect,)

    @property
    def memory(self) -> bool:
        """Whether it names a tile, a window or a slot (not an mbarrier, not a value)."""
        return self.kind in ("buf", "view", "slot") and self.barrier is None


@dataclass(frozen=True)
class AttrSpec:
    kind: type            # bool, int, float, str
    default: Any
    choices: tuple = ()   # allowed values, empty = any of kind


class Ordering(str, enum.Enum):
    """What orders an op's shared-memory accesses against other ops'."""

    BARRIER = "a CTA barrier, sync(): its threads touch each other's elements (races.smem follows it)"
    INTERNAL = "itself: CTA barriers inside it, or each thread touching the elements it owns"
    ASYNC = "mbarriers, wait groups, fences and cluster syncs (the protocol checker follows it)"
    NONE = "nothing to order: it touches no tile"


class Proxy(str, enum.Enum):
    """The memory proxy its shared-memory accesses go through (the async proxy needs a fence after generic
    writes)."""

    GENERIC = "generic"
    ASYNC = "async"


class Completion(str, enum.Enum):
    """When its accesses are complete."""

    ISSUE = "when the op returns"
    BARRIER = "when the phase of its barrier operand completes"
    MMA_GROUP = "at the wgmma_wait that retires its commit group"
    COPY_GROUP = "at the cp_async_wait that retires its group"


class SyncKind(str, enum.Enum):
    """The synchronisation an op is."""

    CTA = "CTA-wide barrier"
    ROLE = "barrier of one warp role's threads"
    PROXY_FENCE = "orders generic-proxy smem writes before async-proxy reads"
    MMA_WAIT = "retires wgmma commit groups"
    COPY_WAIT = "retires cp.async groups"
    CLUSTER = "cluster-wide barrier"


class Alloc(str, enum.Enum):
    """What an allocating op's result is."""

    SMEM = "smem"
    RMEM = "rmem"
    MBARRIER = "mbarrier"


class CostClass(str, enum.Enum):
    """How the cost model charges an op (``model.charges`` has one hook per class)."""

    FREE = "free"              # no FLOPs and no gmem bytes: allocation, barriers, fences, waits, smem-only
    STRUCTURE = "structure"    # a block the estimator walks (for, if, role)
    BIND = "bind"              # a binding: its value joins the estimator's environment
    COPY = "copy"              # the gmem bytes of its view operand
    MMA = "mma"                # 2 * M * N * K FLOPs of its atom (operands acc (M, N), a (M, K))
    SIMT = "simt"              # one SIMT op per element of the tile it writes
    EPILOGUE = "epilogue"      # a few SIMT ops per element of the accumulator it reads
    ROW_REDUCE = "row reduce"  # a multiply-add per element of the tile it reads
    GATHER = "gather"          # the source window's bytes and an add per element
    ROW_GATHER = "row gather"  # the rows it gathers (the destination tile's bytes) and their indices


Semantics = Callable[[Any, Any], None]     # (the interpreter's CTA state, the node) -> None
# (the node, an evaluator of index expressions) -> the value of each name it binds for the rest of its block
Binding = Callable[[Any, Callable[[Expr], int]], dict[str, int]]


@dataclass(frozen=True)
class OpDef:
    """One op's declaration (see the module docstring)."""

    op: Op
    family: Family
    operands: tuple[Operand, ...]
    semantics: Semantics
    cost: CostClass
    attrs: dict[str, AttrSpec] = field(default_factory=dict)
    result: bool = False                   # binds `name = op(...)`
    block: bool = False                    # has a body
    allocates: Alloc | None = None
    in_place: bool = True                  # an output may name one of its sources
    ordering: Ordering = Ordering.NONE
    proxy: Proxy = Proxy.GENERIC
    completion: Completion = Completion.ISSUE
    sync: SyncKind | None = None
    bind: Binding | None = None            # an op that binds index names (Scope.BLOCK operands): their values
    # its `var` binds a value read from memory, declared within [0, max] (its `max` operand): readers without
    # memory take it at max (``bind``), the interval analysis over [0, max], the protocol checker at 0 besides
    data_dependent: bool = False
    scratch_bytes: int = 0                 # shared memory it uses itself, placed in the scratch region
    keeps_per_row: int | None = None       # a running merge: candidates kept per row (None: the state's columns)
    atom: str = ""                         # an MMA op's atom when no `atom` attribute chooses it
    engine: str = ""                       # a copy's engine: "plain", "cp_async" or "tma"
    # its smem accesses follow a swizzled tile's layout (TMA's and wgmma's: 128-byte spans, 16-byte chunk k of
    # row r at chunk k ^ (r % 8)); the other ops address a tile row-major, whatever its swizzle (layout.swizzle)
    swizzle: bool = False
    summary: str = ""
    example: str = ""
    preconditions: tuple[str, ...] = ()

    @property
    def keyword_operands(self) -> tuple[str, ...]:
        """Operands written ``name=value``, after the positional ones."""
        return tuple(o.name for o in self.operands if o.keyword)

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {o.name: i for i, o in enumerate(self.operands)}

    def operand(self, name: str) -> Operand:
        return self.operands[self.index_of(name)]

    def index_of(self, name: str) -> int:
        """The position of operand ``name``; KeyError naming the op's operands when it has none of that name."""
        try:
            return self._positions[name]
        except KeyError:
            raise KeyError(f"`{self.op.value}` has no operand `{name}` (its operands: "
                           f"{', '.join(o.name for o in self.operands) or 'none'})") from None

    def bound_names(self, n: Any, scope: Scope) -> list[str]:
        """The names node ``n`` binds with this scope."""
        return [a for o, a in zip(self.operands, n.args) if o.binds is scope]

    def atom_of(self, n: Any) -> str:
        """The MMA atom node ``n`` issues: its ``atom`` attribute, else the op's own."""
        return n.attr("atom") if "atom" in self.attrs else self.atom


# ------------------------------------------------------------- operand helpers

_TILE = (MemSpace.SMEM, MemSpace.RMEM)


def buf(name: str, effect: Effect | ByAttr, space: tuple[MemSpace, ...] = _TILE, **kw: Any) -> Operand:
    """A tile operand named by its buffer (``acc``)."""
    return Operand(name, "buf", effect, space, **kw)


def view(name: str, effect: Effect | ByAttr, space: tuple[MemSpace, ...] = (MemSpace.GMEM,), **kw: Any) -> Operand:
    """A window of a tensor (``a[tile(i, BM), :]``)."""
    return Operand(name, "view", effect, space, **kw)


def slot(name: str, effect: Effect | ByAttr, **kw: Any) -> Operand:
    """An smem tile or one slot of its ring (``a_s[kt % S]``)."""
    return Operand(name, "slot", effect, (MemSpace.SMEM,), **kw)


def barrier(name: str, use: BarrierUse, **kw: Any) -> Operand:
    """An mbarrier slot (``full[kt % S]``)."""
    return Operand(name, "slot", Effect.NONE, (MemSpace.SMEM,), barrier=use, **kw)


def value(name: str, kind: str = "expr", **kw: Any) -> Operand:
    """An operand that names no memory: an index expression (default), a dtype, a shape, a name..."""
    return Operand(name, kind, **kw)


# --------------------------------------------------------------------- views

@dataclass(frozen=True)
class Tile:
    """``tile(i, n)``: elements [i*n, i*n + n) of a dimension; ``tile(i, n, base=b, limit=l)``: elements
    [b + i*n, b + i*n + n), of which those at l or past it are outside the window as those past the tensor's
    edge are (a load reads zeros there, a store skips them): a window at any offset, stopped at a sequence's
    end (``tile(c, BT, base=bos, limit=eos)``, bos and eos read from cu_seqlens)."""

    index: Expr
    size: Expr
    base: Expr = 0
    limit: Expr | None = None

    @property
    def start(self) -> Expr:
        """The window's first element along the dimension: ``base + index * size``."""
        first = Bin("*", self.index, self.size)
        return first if self.base == 0 else Bin("+", self.base, first)

    @property
    def offset(self) -> bool:
        """Whether the window has a base or a limit (not a plain ``tile(i, n)``)."""
        return self.base != 0 or self.limit is not None

    def exprs(self) -> list[Expr]:
        """Every index expression the window holds."""
        return [self.index, self.size, self.base] + ([] if self.limit is None else [self.limit])

    def map(self, fn: Any) -> "Tile":
        """The window with ``fn`` applied to each of its expressions."""
        return Tile(fn(self.index), fn(self.size), fn(self.base) if self.base != 0 else 0,
                    None if self.limit is None else fn(self.limit))


@dataclass(frozen=True)
class Full:
    """``:`` — the whole dimension."""


@dataclass(frozen=True)
class At:
    """A single index of a dimension (the dimension is dropped)."""

    index: Expr


Index = Tile | Full | At


@dataclass(frozen=True)
class View:
    """A rectangular window of a gmem buffer: ``buf[index, ...]``."""

    buf: str
    index: tuple[Index, ...]


@dataclass(frozen=True)
class Slot:
    """``buf`` or ``buf[index]``: one slot of a ring (an smem tile with stages, or an mbarrier array)."""

    buf: str
    index: Expr | None = None


def buffer_name(a: Any) -> str | None:
    """The buffer an operand value names: a tile's name, a view's or a slot's buffer (None for values)."""
    if isinstance(a, (View, Slot)):
        return a.buf
    return a if isinstance(a, str) else None
