"""What the protocol simulation (``ir.protocol_sim``) keeps: each op's plan, its outcomes, and its state.

- plans: what an op does to barriers, smem slots and accumulators, worked out once per op from its
  declaration (:func:`plan_of`, :func:`barrier_operand`), so the simulation has no list of ops of its own;
- outcomes: :class:`Undecided` (the simulation cannot go on), :class:`OutOfSteps` (its :class:`Budget` is
  spent), :class:`Stop` (a finding after which the rest would be echoes), :class:`Stuck` (a role blocked at
  a deadlock);
- state: mbarrier slots (:class:`Bar`, :class:`BarArray`), the fill and reads of an smem slot
  (:class:`Fill`, :class:`Read`) and each role's progress (:class:`Role`).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator

from cake_core.ir.opdef import BarrierUse, ByAttr, Completion, Effect, Operand, Slot
from cake_core.ir.ops import REGISTRY, Node, Op


@dataclass(frozen=True)
class _Accesses:
    """Which operands (by position) an op reads, read-writes and writes, as its declaration says."""

    acc_reads: tuple[int, ...]      # tiles it reads (an accumulator a wgmma may still be writing)
    acc_write: int | None           # the tile an async MMA writes (its accumulator)
    reads: tuple[int, ...]          # slots and smem tiles of its own CTA it only reads
    read_writes: tuple[int, ...]    # ... reads, then writes
    writes: tuple[int, ...]         # ... writes or adds into (read_writes included)
    publishes: tuple[int, ...]      # smem tiles it writes for the cluster's CTAs to read
    cluster_reads: tuple[int, ...]  # smem tiles it reads from every CTA of the cluster


@dataclass(frozen=True)
class _Plan:
    """What the simulation needs of an op's declaration (worked out once per op)."""

    operands: tuple[Operand, ...]
    barrier: tuple[int, BarrierUse] | None      # its barrier operand and what it does with it
    issued: bool                                # an async MMA: its reads stay in flight until a wgmma_wait
    fixed: _Accesses | None                     # its accesses, when no attribute selects an effect

    def accesses(self, n: Node) -> _Accesses:
        return self.fixed or _accesses(self.operands, n)


def _accesses(operands: tuple[Operand, ...], n: Node | None) -> _Accesses:
    eff = [(i, o, o.effect_of(n) if n is not None else o.effect) for i, o in enumerate(operands)]
    smem = [(i, e) for i, o, e in eff if o.memory and o.kind != "view" and not o.cluster]
    return _Accesses(tuple(i for i, o, e in eff if o.kind == "buf" and not o.cluster and e is Effect.READ),
                     next((i for i, o, e in eff if o.kind == "buf" and not o.cluster and e.modifies), None),
                     tuple(i for i, e in smem if e is Effect.READ), tuple(i for i, e in smem if e is Effect.READWRITE),
                     tuple(i for i, e in smem if e.modifies),
                     tuple(i for i, o, e in eff if o.cluster and e is Effect.WRITE),
                     tuple(i for i, o, e in eff if o.cluster and e is Effect.READ))


@lru_cache(maxsize=None)
def plan_of(op: Op) -> _Plan:
    d = REGISTRY[op]
    bar = next(((i, o.barrier) for i, o in enumerate(d.operands) if o.barrier is not None), None)
    fixed = None if any(isinstance(o.effect, ByAttr) for o in d.operands) else _accesses(d.operands, None)
    return _Plan(d.operands, bar, d.completion is Completion.MMA_GROUP, fixed)


def barrier_operand(n: Node) -> tuple[BarrierUse, Slot] | None:
    """The barrier operand of ``n`` and what ``n`` does with it (None without one)."""
    b = plan_of(n.op).barrier
    return (b[1], n.args[b[0]]) if b is not None else None


# ------------------------------------------------------------------ outcomes

class Undecided(Exception):
    """The simulation cannot go on: ``reason`` says why, ``node`` (when known) where."""

    def __init__(self, reason: str, node: Node | None = None):
        super().__init__(reason)
        self.reason, self.node = reason, node


class OutOfSteps(Undecided):
    """The check spent its step budget before this simulation ended."""


class Stop(Exception):
    """A finding after which the protocol no longer means anything (the rest would be its echoes)."""


class Budget:
    """Ops simulated, over every run of one check, up to ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def exhausted(self, node: Node) -> None:
        """Raised by the simulation once ``used`` (which it counts inline, an op at a time) passes ``limit``."""
        raise OutOfSteps(f"the check simulated {self.limit:,} ops", node)

    @property
    def left(self) -> int:
        return self.limit - self.used


# ------------------------------------------------------------------ state

@dataclass
class Bar:
    arrivals: int
    pending: int
    tx: int = 0
    done: int = 0
    expects: list = field(default_factory=list)    # (node, role, trip, bytes) of the current phase
    landed: list = field(default_factory=list)     # (node, role, trip, bytes) of the current phase
    prev: tuple = ([], [])                          # expects and landed of the last completed phase

    def settle(self) -> None:
        """Complete the phases the arrivals so far complete: one per ``arrivals`` of them once the bytes are in.
        At once, not one phase a step: a role of many warpgroups (a mutated warp range) arriving on a barrier of
        one arrival completes as many phases in one arrive."""
        if self.pending > 0 or self.tx != 0:
            return
        k = -self.pending // self.arrivals + 1      # arrivals >= 1 (the simulation refuses others)
        self.done += k
        self.pending += k * self.arrivals
        self.prev = (self.expects, self.landed) if k == 1 else ([], [])
        self.expects, self.landed = [], []


@dataclass
class BarArray:
    """An mbarrier array: ``count`` slots, each made when first touched."""

    count: int
    arrivals: int
    node: Node
    slots: dict[int, Bar] = field(default_factory=dict)

    def __getitem__(self, i: int) -> Bar:
        b = self.slots.get(i)
        if b is None:
            b = self.slots[i] = Bar(self.arrivals, self.arrivals)
        return b


@dataclass
class Arrives:
    """A role's arrives (and expect_tx arrivals) in order. An arrive releases every read its role completed before
    it, whichever barrier it is on: a writer is ordered after a read once it has seen the phase of some later
    arrive of the reader complete, and per barrier slot the first such arrive is the one to see (a later one
    completes a later phase)."""

    ops: list = field(default_factory=list)         # (arrive node, trip, ((barrier key, phase), ...)) of each
    by_key: dict = field(default_factory=dict)      # barrier key -> [(index in ops, phase)] of the arrives on it

    def add(self, node: Node, trip: Trip, phases: list[tuple[str, int]]) -> None:
        i = len(self.ops)
        self.ops.append((node, trip, tuple(phases)))
        for key, phase in phases:
            self.by_key.setdefault(key, []).append((i, phase))

    def release(self, since: int, seen: dict[str, int]) -> bool:
        """Whether a writer that has seen ``seen`` completed phases of each barrier slot is ordered after the reads
        completed before the ``since``-th arrive. Walks the shorter of the arrives from there and the barriers
        seen (either may grow with a ring of many barriers; the other stays short)."""
        if len(self.ops) - since > len(seen):
            return any(done > phase for key, done in seen.items()
                       for phase in [self.first_phase(since, key)] if phase is not None)
        first: set[str] = set()
        for _, _, phases in self.ops[since:]:
            for key, phase in phases:
                if key not in first:
                    first.add(key)
                    if seen.get(key, 0) > phase:
                        return True
        return False

    def first_phase(self, since: int, key: str) -> int | None:
        """The phase of ``key`` that the first arrive on it from the ``since``-th arrive on completes."""
        on = self.by_key.get(key)
        if not on or on[-1][0] < since:
            return None
        return on[bisect_left(on, (since, -1))][1]


@dataclass
class Read:
    role: str
    node: Node
    trip: Trip
    arrives: Arrives | None = None  # the reader's arrives once the read completed (None: a wgmma still in flight)
    since: int = 0                  # how many there were then: the arrives from there on release it

    def complete(self, arrives: Arrives) -> None:
        """The read is done (issued, or its wgmma group waited for): the reader's arrives from now on release it."""
        self.arrives, self.since = arrives, len(arrives.ops)

    def first_release(self) -> tuple | None:
        """(arrive node, trip, ((barrier key, phase), ...)) of the first arrive after the read completed."""
        if self.arrives is None or self.since >= len(self.arrives.ops):
            return None
        return self.arrives.ops[self.since]


@dataclass
class Fill:
    role: str
    node: Node
    trip: Trip
    bar: str | None          # barrier key the bytes complete on (None: an ordinary write)
    phase: int
    generic: bool = False    # generic-proxy writes (cp_async_bar): async-proxy readers fence after the wait
    own: bool = False        # written by the role's own threads and published by its arrive: visible to them already


@dataclass
class Role:
    name: str
    wgs: int
    env: dict[str, Any]
    rank: int = 0            # the CTA's rank in its cluster
    base: str = ""           # the role's name in the program (without the CTA suffix)
    gen: Iterator[Node | None] | None = None
    seen: dict[str, int] = field(default_factory=dict)
    fenced: dict[str, int] = field(default_factory=dict)       # seen as of the role's last fence_async
    inflight: list[list[Read]] = field(default_factory=list)   # wgmma groups not yet waited for
    inflight_acc: list[tuple[tuple[str, ...], Node]] = field(default_factory=list)   # each group's registers
    arrives: Arrives = field(default_factory=Arrives)          # its arrives: each releases the reads before it
    blocked: Node | None = None
    loops: list[str] = field(default_factory=list)
    published: list[tuple[str, int]] = field(default_factory=list)   # smem written by the role's threads

    def trip(self) -> Trip:
        return Trip(tuple((v, self.env[v]) for v in self.loops))


class Trip(tuple):
    """Where a role is: its enclosing loops' variables and values, outermost first. Kept as pairs (compared as
    such) and written out only when a finding names it: the simulation records one for every read and fill."""

    def __str__(self) -> str:
        return ", ".join(f"{v}={i}" for v, i in self) or "-"


@dataclass(frozen=True)
class Stuck:
    """One role blocked at a deadlock: its wait, the barrier slot and the parity it waits for."""

    role: str
    node: Node
    key: str
    done: int
    pending: int
    arrivals: int
    parity: int
    trip: Trip
    tx: int
