"""The protocol checker: simulate one CTA's warp roles at op level and report deadlocks and races.

No data moves. Each role is a coroutine over its ops; the scheduler gives
every unfinished role one op per turn (a fair interleaving, so a producer
that does not wait cannot run arbitrarily far ahead and hide a race). Problem
dimensions get small values, ``(stages + 2) * largest const``, so that every
ring wraps at least once (with loops in loops, a second run adds 1 to every
dimension: odd inner trip counts); grid coordinates are 0, and a grid sized by
``num_sms`` is launched on 2 SMs (``ncta.x`` = 2 for a persistent kernel:
CTA 0 walks every second tile, its ring phases carried across tiles).

A kernel with a ``cluster((cx, cy, cz))`` is simulated as the CTAs of one
cluster (rank = x + cx * (y + cy * z), bid = (x, y, z)), every role of every
CTA in the same fair turn order: a multicast ``tma_load`` fills the slot and
lands its bytes on the barrier of each CTA in its mask, an
``arrive(multicast=mask)`` arrives on each, and keys in witnesses carry the
CTA (``empty[0]@1``). Each CTA counts the ``cluster_sync()`` it has passed:
``topk_publish`` writes its smem tiles in the writer's count, and a
``topk_cluster_merge`` that reads them from any CTA of the cluster must come
after a later one (the barrier orders the writes before the reads), and the
owner must pass one more after the read before exiting.

State tracked:
- mbarrier slots: completed phases, pending arrivals, transaction bytes, and
  the expect_tx / copies of the current phase (for the witness);
- per role, ``seen[bar]``: completed phases of ``bar`` the role has observed
  through a wait that returned (``wait`` is try_wait.parity);
- per smem slot, the last copy that filled it (its barrier and the phase the
  bytes land in) and the reads since, each with the arrive that released it.
  wgmma reads stay in flight until the role's ``wgmma_wait`` retires them; an
  arrive releases only the role's completed reads.

Findings (rule ids, all errors): ``protocol.deadlock`` (every unfinished role
blocked), ``protocol.tx_mismatch`` (a blocked barrier has its arrivals but its
transaction bytes do not balance), ``protocol.read_before_ready`` (a read of a
slot whose filling copy the reader has not waited for), ``protocol.slot_reuse``
(a copy into a slot whose earlier reads the writer has not seen released),
``protocol.cluster_read`` (a read of a cluster CTA's smem not ordered after its
write, or its owner free to exit before it, by a ``cluster_sync()``).
and ``protocol.proxy_fence`` (a wgmma reads a slot that ``cp_async_bar`` filled, generic-proxy
writes, without a ``fence_async`` between the reader's wait and the read).
Each carries a witness naming both sides: op, line, role and trip.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator

from cake_core.ir.expr import Cmp, Sym, UnboundSymbol, evaluate, try_evaluate
from cake_core.ir.opdef import Alloc, BarrierUse, ByAttr, Completion, Effect, Operand, Proxy, Slot, SyncKind
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.tree import is_persistent_loop, loop_range
from cake_core.outcome import Diagnostic, Severity

MAX_STEPS = 200_000     # ops simulated at most (a bound on the checker's time, not a finding)
PROTOCOL_NUM_SMS = 2    # num_sms in the simulated launch: a persistent CTA walks every second tile
PERSISTENT_TRIPS = 4    # tiles a persistent CTA walks here: ring phases carry across them, and the roles'
                        # op count stays within MAX_STEPS (every role's tile loop is cut at the same trip)
RULE_IDS = ("protocol.deadlock", "protocol.tx_mismatch", "protocol.read_before_ready", "protocol.slot_reuse",
            "protocol.cluster_read", "protocol.proxy_fence", "protocol.incomplete", "protocol.acc_in_flight")


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
def _plan(op: Op) -> _Plan:
    d = REGISTRY[op]
    bar = next(((i, o.barrier) for i, o in enumerate(d.operands) if o.barrier is not None), None)
    fixed = None if any(isinstance(o.effect, ByAttr) for o in d.operands) else _accesses(d.operands, None)
    return _Plan(d.operands, bar, d.completion is Completion.MMA_GROUP, fixed)


def _barrier(n: Node) -> tuple[BarrierUse, Slot] | None:
    """The barrier operand of ``n`` and what ``n`` does with it (None without one)."""
    b = _plan(n.op).barrier
    return (b[1], n.args[b[0]]) if b is not None else None


class _Abort(Exception):
    """The program is malformed in a way other rules report; the checker stays silent."""


class _Budget(_Abort):
    """The simulation ran past MAX_STEPS: what it did not reach is unchecked, and the checker says so."""


class _Stop(Exception):
    """A finding after which the protocol no longer means anything (the rest would be its echoes)."""


@dataclass
class _Bar:
    arrivals: int
    pending: int
    tx: int = 0
    done: int = 0
    expects: list = field(default_factory=list)    # (node, role, trip, bytes) of the current phase
    landed: list = field(default_factory=list)     # (node, role, trip, bytes) of the current phase
    prev: tuple = ([], [])                          # expects and landed of the last completed phase

    def settle(self) -> None:
        while self.pending <= 0 and self.tx == 0:
            self.done += 1
            self.pending += self.arrivals
            self.prev = (self.expects, self.landed)
            self.expects, self.landed = [], []


@dataclass
class _Read:
    role: str
    node: Node
    trip: str
    releases: list = field(default_factory=list)   # (barrier key, phase, arrive node, trip) of each release


@dataclass
class _Fill:
    role: str
    node: Node
    trip: str
    bar: str | None          # barrier key the bytes complete on (None: an ordinary write)
    phase: int
    generic: bool = False    # generic-proxy writes (cp_async_bar): async-proxy readers fence after the wait


@dataclass
class _Role:
    name: str
    wgs: int
    env: dict[str, Any]
    rank: int = 0            # the CTA's rank in its cluster
    gen: Iterator[Node | None] | None = None
    seen: dict[str, int] = field(default_factory=dict)
    fenced: dict[str, int] = field(default_factory=dict)       # seen as of the role's last fence_async
    inflight: list[list[_Read]] = field(default_factory=list)   # wgmma groups not yet waited for
    inflight_acc: list[tuple[str, Node]] = field(default_factory=list)   # each such group's accumulator
    done_reads: list[_Read] = field(default_factory=list)       # completed, not yet released
    blocked: Node | None = None
    loops: list[str] = field(default_factory=list)
    published: list[tuple[str, int]] = field(default_factory=list)   # smem written by the role's threads

    def trip(self) -> str:
        return ", ".join(f"{v}={self.env[v]}" for v in self.loops) or "-"


class _Sim:
    def __init__(self, ctx: Any, ragged: int = 0, dim: int | None = None):
        self.ctx = ctx
        prog = ctx.program
        consts = prog.const_env
        stages = [n.attr("stages") for n, _, _ in ctx.nodes if n.decl.allocates is Alloc.SMEM]
        stages += [self._static(n.args[0], consts) for n, _, _ in ctx.nodes if n.decl.allocates is Alloc.MBARRIER]
        big = max([v for v in consts.values() if isinstance(v, int)] + [1])
        if dim is None:
            dim = (max(stages + [1]) + 2) * big + ragged
        self.env0: dict[str, Any] = {**{d: dim for d in ctx.dims}, **consts, "bid.x": 0, "bid.y": 0, "bid.z": 0}
        # a persistent grid (min(tiles, num_sms)) on PROTOCOL_NUM_SMS SMs: CTA 0 walks several tiles, so
        # ring phases are followed across tile boundaries
        grid = [self._static(g, {**self.env0, "num_sms": PROTOCOL_NUM_SMS}) for g in prog.grid]
        grid += [1] * (3 - len(grid))
        self.env0.update({"ncta.x": grid[0], "ncta.y": grid[1], "ncta.z": grid[2]})
        self.bars: dict[str, list[_Bar]] = {}      # mbarrier name (@rank in a cluster) -> slots
        self.cluster_dims = _cluster_dims(ctx)
        self.cluster = self.cluster_dims[0] * self.cluster_dims[1] * self.cluster_dims[2]
        self.syncs: dict[int, int] = {}                          # rank -> cluster_sync()s passed
        self.published: dict[tuple[str, int], tuple[int, Node, str]] = {}   # (tile, rank) -> (syncs, op, role)
        self.remote: list[tuple[int, int, int, Node]] = []       # (owner, reader, reader's syncs, op)
        self.stages: dict[str, int] = {n.result: n.attr("stages") for n, _, _ in ctx.nodes
                                       if n.decl.allocates is Alloc.SMEM}
        self.fills: dict[tuple[str, int], _Fill] = {}
        self.reads: dict[tuple[str, int], list[_Read]] = {}
        self.diags: list[Diagnostic] = []
        self.reported: set = set()
        self.steps = 0
        self.paths = {id(n): p for n, p, _ in ctx.nodes}

    @staticmethod
    def _static(e: Any, env: dict) -> int:
        try:
            return int(evaluate(e, env))
        except (UnboundSymbol, ZeroDivisionError, TypeError):
            raise _Abort() from None

    def ev(self, r: _Role, e: Any) -> int:
        return self._static(e, r.env)

    # ------------------------------------------------------------ reports
    def report(self, rule: str, node: Node, key: tuple, message: str, witness: list[str], hint: str) -> None:
        if (rule, key) in self.reported:
            return
        self.reported.add((rule, key))
        self.diags.append(Diagnostic(rule, Severity.ERROR, message, node.line, node.col,
                                     self.paths.get(id(node), ""), hint, tuple(witness)))

    # ------------------------------------------------------------ operands
    def at(self, rank: int) -> str:
        """The suffix naming a CTA of the cluster in barrier and slot keys ('' without a cluster)."""
        return f"@{rank}" if self.cluster > 1 else ""

    def targets(self, r: _Role, n: Node) -> list[int]:
        """The CTAs a copy or an arrive reaches: the multicast mask's, else the role's own."""
        mask = n.attr("multicast")
        if not mask:
            return [r.rank]
        if mask >> self.cluster:
            raise _Abort()          # resources.cluster reports it
        return [k for k in range(self.cluster) if mask >> k & 1]

    def bar(self, r: _Role, s: Slot, rank: int | None = None) -> tuple[str, _Bar]:
        """A barrier slot, indexed in ``r``'s environment, of CTA ``rank`` (default: ``r``'s own)."""
        at = self.at(r.rank if rank is None else rank)
        bars = self.bars.get(s.buf + at)
        if bars is None:
            raise _Abort()
        i = self.ev(r, s.index) if s.index is not None else 0
        if not 0 <= i < len(bars):
            raise _Abort()
        return f"{s.buf}[{i}]{at}", bars[i]

    def slot(self, r: _Role, s: Slot | str, rank: int | None = None) -> tuple[str, int]:
        at = self.at(r.rank if rank is None else rank)
        if isinstance(s, str):
            return s + at, 0
        if s.index is None:
            return s.buf + at, 0
        i = self.ev(r, s.index)
        if not 0 <= i < max(self.stages.get(s.buf, 1), 1):
            raise _Abort()
        return s.buf + at, i

    def is_smem(self, name: str) -> bool:
        t = self.ctx.buffers.get(name)
        return t is not None and t.space.value == "smem"

    def box_bytes(self, n: Node, dst: Slot) -> int:
        """The bytes a copy into the slot ``dst`` lands (a ``rows`` attribute: its first rows only)."""
        t = self.ctx.buffers.get(dst.buf)
        if t is None:
            raise _Abort()
        dims = [self._static(d, self.ctx.consts) for d in t.shape]
        if "rows" in n.decl.attrs and n.attr("rows"):       # only the first rows of the box land
            dims[0] = min(dims[0], n.attr("rows"))
        numel = 1
        for d in dims:
            numel *= d
        return numel * t.dtype.bytes

    @staticmethod
    def sname(key: tuple[str, int]) -> str:
        return f"{key[0]}[{key[1]}]"

    # ------------------------------------------------------------ accesses
    def read(self, r: _Role, n: Node, s: Slot | str, inflight: list[_Read] | None, async_proxy: bool = False) -> None:
        if isinstance(s, str) and not self.is_smem(s):
            return
        key = self.slot(r, s)
        fill = self.fills.get(key)
        rd = _Read(r.name, n, r.trip())
        if fill is None:
            self.report("protocol.read_before_ready", n, (n.line, "never"),
                        f"{n.op.value} reads smem slot {self.sname(key)} before any copy has filled it",
                        [f"read: {n.op.value} at line {n.line} (role {r.name}, trip {rd.trip})",
                         f"no copy into {self.sname(key)} has been issued yet"],
                        "wait on the full barrier of this slot before reading it")
        elif fill.bar is not None and r.seen.get(fill.bar, 0) <= fill.phase:
            self.report("protocol.read_before_ready", n, (n.line, fill.node.line),
                        f"{n.op.value} reads smem slot {self.sname(key)} before waiting for the copy that fills "
                        f"it (phase {fill.phase} of {fill.bar})",
                        [f"copy: {fill.node.op.value} at line {fill.node.line} (role {fill.role}, trip {fill.trip}) "
                         f"completes on {fill.bar} phase {fill.phase}",
                         f"read: {n.op.value} at line {n.line} (role {r.name}, trip {rd.trip}) has seen "
                         f"{r.seen.get(fill.bar, 0)} completed phases of {fill.bar}"],
                        f"wait(…, phase=…) on {fill.bar.split('[')[0]} for this slot before the read")
        elif async_proxy and fill.generic and r.fenced.get(fill.bar, 0) <= fill.phase:
            self.report("protocol.proxy_fence", n, (n.line, fill.node.line),
                        f"{n.op.value} reads smem slot {self.sname(key)} through the async proxy, but the "
                        f"{fill.node.op.value} that filled it wrote through the generic proxy and no fence_async() "
                        f"follows the wait on {fill.bar}",
                        [f"copy: {fill.node.op.value} at line {fill.node.line} (role {fill.role}, trip {fill.trip}) "
                         f"completes on {fill.bar} phase {fill.phase}",
                         f"read: {n.op.value} at line {n.line} (role {r.name}, trip {rd.trip}) without a "
                         "fence_async() since that phase was seen"],
                        "fence_async() after the wait on the full barrier, before the wgmma")
        self.reads.setdefault(key, []).append(rd)
        (inflight if inflight is not None else r.done_reads).append(rd)

    def write(self, r: _Role, n: Node, s: Slot | str, bar: str | None, phase: int, rank: int | None = None) -> None:
        if isinstance(s, str) and not self.is_smem(s):
            return
        key = self.slot(r, s, rank)
        for rd in self.reads.get(key, []):
            if rd.role == r.name:
                continue
            if any(r.seen.get(k, 0) > ph for k, ph, _, _ in rd.releases):
                continue
            rel = rd.releases[0] if rd.releases else None
            if rel is None:
                why = "it was never released (no arrive after the read completed" + \
                      (": a wgmma is still in flight, wgmma_wait first)" if any(rd in g for rr in self.roles
                                                                               for g in rr.inflight) else ")")
            else:
                why = (f"it was released by arrive at line {rel[2].line} (trip {rel[3]}) on {rel[0]} phase "
                       f"{rel[1]}, which the writer has not waited for")
            self.report("protocol.slot_reuse", n, (n.line, rd.node.line),
                        f"{n.op.value} overwrites smem slot {self.sname(key)} while an earlier read may still "
                        f"use it: {why}",
                        [f"read: {rd.node.op.value} at line {rd.node.line} (role {rd.role}, trip {rd.trip})",
                         f"write: {n.op.value} at line {n.line} (role {r.name}, trip {r.trip()})"],
                        "the consumer arrives on the empty barrier after its reads complete, and the producer "
                        "waits on it before refilling the slot")
        self.reads[key] = []
        self.fills[key] = _Fill(r.name, n, r.trip(), bar, phase)

    def publish(self, r: _Role, key: str, phase: int) -> None:
        """Slots the role's threads wrote (sqnorm_rows) count as filled by this arrival's phase."""
        for slot in r.published:
            f = self.fills.get(slot)
            if f is not None and f.role == r.name and f.bar is None:
                self.fills[slot] = _Fill(f.role, f.node, f.trip, key, phase)
        r.published = []

    def release(self, r: _Role, phases: list[tuple[str, int]], n: Node) -> None:
        """The role's completed reads are released through these (barrier key, phase) pairs."""
        for rd in r.done_reads:
            rd.releases += [(key, phase, n, r.trip()) for key, phase in phases]
        r.done_reads = []

    # ------------------------------------------------------------ execution
    def steps_of(self, r: _Role, nodes: tuple[Node, ...]) -> Iterator[Node | None]:
        for n in nodes:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise _Budget()
            op = n.op
            if op is Op.FOR:
                var = n.args[0]
                r.loops.append(var)
                start, stop, step = (self.ev(r, x) for x in loop_range(n))
                if step < 1:
                    raise _Abort()      # control.loop_step reports it
                trips = range(start, stop, step)
                if is_persistent_loop(n):
                    trips = trips[:PERSISTENT_TRIPS]
                for i in trips:
                    r.env[var] = i
                    yield from self.steps_of(r, n.body)
                r.loops.pop()
                r.env.pop(var, None)
                continue
            if op is Op.IF:
                if self.ev(r, n.args[0]):
                    yield from self.steps_of(r, n.body)
                continue
            if n.decl.bind is not None:     # a binding: no memory effect, so not a turn of its own (bindings
                r.env.update(n.decl.bind(n, lambda e: self.ev(r, e)))   # leave the interleaving as it was)
                continue
            waits = _barrier(n)
            if waits is not None and waits[0] is BarrierUse.WAIT:
                key, b = self.bar(r, waits[1])
                parity = self.ev(r, n.arg("phase")) % 2
                while b.done % 2 == parity:
                    r.blocked = n
                    yield n
                r.blocked = None
                r.seen[key] = max(r.seen.get(key, 0), b.done)
            else:
                self.effects(r, n)
            yield None

    def effects(self, r: _Role, n: Node) -> None:
        """What one op does to barriers, smem slots, accumulators and the cluster, read from its declaration:
        its barrier operand's use, its sync kind, its operands' effects, proxy and completion."""
        d = REGISTRY[n.op]
        if n.op is Op.ROLE:
            raise _Abort()      # nested roles: rules report them
        if d.allocates is Alloc.MBARRIER:
            cnt = self.ev(r, n.args[0])
            self.bars[n.result + self.at(r.rank)] = [_Bar(n.attr("arrivals"), n.attr("arrivals")) for _ in range(cnt)]
            return
        bar = _barrier(n)
        if bar is not None and bar[0] is BarrierUse.ARRIVE:     # on the role's own barrier, or each of the mask's
            hit = [self.bar(r, bar[1], k) for k in self.targets(r, n)]
            self.release(r, [(key, b.done) for key, b in hit], n)
            for key, b in hit[:1] if self.cluster == 1 else [h for h in hit if h[0].endswith(self.at(r.rank))]:
                self.publish(r, key, b.done)      # smem the role's threads wrote is ready with this phase
            for _, b in hit:
                b.pending -= r.wgs
                b.settle()
        elif bar is not None and bar[0] is BarrierUse.EXPECT_TX:
            key, b = self.bar(r, bar[1])
            nbytes = self.ev(r, n.arg("bytes"))
            self.release(r, [(key, b.done)], n)
            b.expects.append((n, r.name, r.trip(), nbytes))
            b.tx += nbytes
            b.pending -= 1
            b.settle()
        if d.sync is SyncKind.PROXY_FENCE:
            r.fenced = dict(r.seen)
        elif d.sync is SyncKind.MMA_WAIT:
            keep = max(self.ev(r, n.args[0]), 0)
            while len(r.inflight) > keep:
                r.done_reads.extend(r.inflight.pop(0))
                r.inflight_acc.pop(0)
        elif d.sync is SyncKind.CLUSTER:
            self.syncs[r.rank] = self.syncs.get(r.rank, 0) + 1
        plan = _plan(n.op)
        acc = plan.accesses(n)
        if not plan.issued:      # reading an accumulator whose wgmma may still run
            for i in acc.acc_reads:
                self.acc_ready(r, n, n.args[i])
        group: list[_Read] | None = [] if plan.issued else None
        for i in acc.reads + acc.read_writes:      # plain reads first, then the reads of read-writes
            self.read(r, n, n.args[i], group, d.proxy is Proxy.ASYNC)
        for i in acc.writes:
            self.lands(r, n, n.args[i], bar)
        if plan.issued:
            r.inflight.append(group)
            r.inflight_acc.append((n.args[acc.acc_write] if acc.acc_write is not None else None, n))
        for i in acc.publishes:
            self.published[(n.args[i], r.rank)] = (self.syncs.get(r.rank, 0), n, r.name)
        if acc.cluster_reads:
            self.cluster_read(r, n, [n.args[i] for i in acc.cluster_reads])

    def lands(self, r: _Role, n: Node, s: Slot | str, bar: tuple[BarrierUse, Slot] | None) -> None:
        """A write of ``s`` by ``n``: its bytes complete a transaction on the barrier (TMA, into each CTA of a
        multicast mask), land with the barrier's phase (cp_async_bar), or are plain writes of the role's threads,
        made ready by the role's next arrive."""
        if bar is not None and bar[0] is BarrierUse.COMPLETE_TX:
            nbytes = self.box_bytes(n, s)
            for rank in self.targets(r, n):
                key, b = self.bar(r, bar[1], rank)
                pe, pl = b.prev
                if not b.expects and pe and pe[-1][1] == r.name and pe[-1][2] == r.trip():
                    self.tx_mismatch(key, b.done - 1, pe, pl + [(n, r.name, r.trip(), nbytes)],
                                     f"the phase completed early, and this copy's {nbytes} B land in phase "
                                     f"{b.done}")
                self.write(r, n, s, key, b.done, rank)
                b.landed.append((n, r.name, r.trip(), nbytes))
                b.tx -= nbytes
                b.settle()
        elif bar is not None and bar[0] is BarrierUse.TRACK:
            key, b = self.bar(r, bar[1])
            self.write(r, n, s, key, b.done)
            self.fills[self.slot(r, s)].generic = n.decl.proxy is Proxy.GENERIC
        else:
            self.write(r, n, s, None, 0)
            if n.decl.completion is Completion.ISSUE and (not isinstance(s, str) or self.is_smem(s)):
                r.published.append(self.slot(r, s))

    def acc_ready(self, r: _Role, n: Node, acc: str) -> None:
        """An op that reads a wgmma accumulator: no wgmma group writing it may still be in flight."""
        pending = [w for a, w in r.inflight_acc if a == acc]
        if pending:
            self.report("protocol.acc_in_flight", n, (n.line, acc),
                        f"{n.op.value} reads accumulator `{acc}` while the wgmma at line {pending[-1].line} that "
                        f"writes it may still be running ({len(r.inflight)} wgmma group(s) in flight here)",
                        [f"write: wgmma at line {pending[-1].line} (role {r.name}, trip {r.trip()})",
                         f"read: {n.op.value} at line {n.line}"],
                        "wgmma_wait(n) first, with n at most the number of wgmma groups committed after it")

    def cluster_read(self, r: _Role, n: Node, tiles: list[str]) -> None:
        """topk_cluster_merge (acc_cluster_reduce) reads pub_v / pub_i (part) of every CTA of the cluster: each
        must have been written before a cluster_sync() that the reader has passed since."""
        mine = self.syncs.get(r.rank, 0)
        for owner in range(self.cluster):
            self.remote.append((owner, r.rank, mine, n))
            for tile in tiles:
                w = self.published.get((tile, owner))
                if w is None or w[0] < mine:
                    continue
                self.report("protocol.cluster_read", n, (n.line, "sync"),
                            f"{n.op.value} reads `{tile}` of cluster CTA {owner} with no cluster_sync() between "
                            f"its write and the read: the writing threads may not have finished",
                            [f"write: {w[1].op.value} at line {w[1].line} (role {w[2]}) after {w[0]} cluster_sync()",
                             f"read: {n.op.value} at line {n.line} (CTA {r.rank}) after {mine} cluster_sync()"],
                            "put cluster_sync() at the top level between the roles and the merge")
                return

    def exits(self) -> None:
        """Every CTA exits after its last cluster_sync(): one past each read of its smem by a peer."""
        for owner, reader, at, n in self.remote:
            if owner != reader and self.syncs.get(owner, 0) <= at:
                self.report("protocol.cluster_read", n, (n.line, "exit"),
                            f"{n.op.value} in CTA {reader} reads the smem of cluster CTA {owner}, which may exit "
                            f"(and free it) before the read: no cluster_sync() after the read",
                            [f"read: {n.op.value} at line {n.line} (CTA {reader}) after {at} cluster_sync()",
                             f"CTA {owner} exits after {self.syncs.get(owner, 0)} cluster_sync()"],
                            "end the kernel with cluster_sync() after the merge")
                return

    def run_group(self, roles: list[_Role]) -> bool:
        """Run roles concurrently, one op each per turn; False after a deadlock was reported."""
        self.roles = roles
        live = list(roles)
        while live:
            progressed = False
            for r in list(live):
                try:
                    got = next(r.gen)
                except StopIteration:
                    live.remove(r)
                    progressed = True
                    continue
                if got is None:
                    progressed = True
            if live and not progressed and all(r.blocked is not None for r in live):
                self.deadlock(live, roles)
                return False
        return True

    def deadlock(self, live: list[_Role], roles: list[_Role]) -> None:
        waits = []
        for r in live:
            n = r.blocked
            key, b = self.bar(r, n.arg("bar"))
            waits.append((r, n, key, b, self.ev(r, n.arg("phase")) % 2))
        for r, n, key, b, parity in waits:          # a phase that has its arrivals but not its bytes
            if b.tx != 0 and (b.pending <= 0 or b.landed):
                self.tx_mismatch(key, b.done, b.expects, b.landed,
                                 f"the phase never completes: the wait at line {n.line} (role {r.name}, trip "
                                 f"{r.trip()}) never returns", stop=False)
                return
        r0, n0, key0, b0, p0 = waits[0]
        finished = [r.name for r in roles if r not in live]
        wit = [f"role {r.name}: wait at line {n.line} (trip {r.trip()}) on {key} for the phase of parity {p} "
               f"({b.done} phases completed, {b.pending} of {b.arrivals} arrivals pending)"
               for r, n, key, b, p in waits]
        if finished:
            wit.append(f"finished: {', '.join(finished)}")
        self.report("protocol.deadlock", n0, (n0.line,),
                    f"deadlock: every role is blocked; {r0.name} waits on {key0} for parity {p0} at line "
                    f"{n0.line}, which no remaining arrive can complete", wit,
                    "check the wait phases (a producer starts its empty waits at parity 1) and that every "
                    "barrier gets its arrivals")

    def tx_mismatch(self, key: str, phase: int, expects: list, landed: list, effect: str, stop: bool = True) -> None:
        exp, got = sum(x[3] for x in expects), sum(x[3] for x in landed)
        at = expects[0][0] if expects else landed[0][0]
        wit = [f"expect_tx: line {x[0].line} (role {x[1]}, trip {x[2]}) expects {x[3]} B" for x in expects]
        wit += [f"copy: {x[0].op.value} at line {x[0].line} (role {x[1]}, trip {x[2]}) lands {x[3]} B"
                for x in landed]
        self.report("protocol.tx_mismatch", at, (at.line, key.split("[")[0]),
                    f"{key} phase {phase} expects {exp} transaction bytes but its copies land {got} B: {effect}",
                    wit, f"expect_tx the bytes of the boxes that signal this barrier ({got} B)")
        if stop:
            raise _Stop()

    def run(self, body: tuple[Node, ...]) -> None:
        """The kernel's top level; in a cluster, one CTA per rank (cluster 0: bid.x = rank for a
        cluster((n, 1, 1))), their roles all concurrent."""
        i = 0
        ctas = []
        cx, cy, _ = self.cluster_dims
        for rank in range(self.cluster):
            env = dict(self.env0)
            env["bid.x"], env["bid.y"], env["bid.z"] = rank % cx, rank // cx % cy, rank // (cx * cy)
            ctas.append(_Role("cta" + self.at(rank), -(-self.ctx.program.threads // self.ctx.target.warpgroup_threads),
                              env, rank))
        while i < len(body):
            if body[i].op is Op.ROLE:
                j = i
                while j < len(body) and body[j].op is Op.ROLE:
                    j += 1
                group = []
                for cta in ctas:
                    for rn in body[i:j]:
                        lo, hi = rn.args[1]
                        r = _Role(rn.args[0] + self.at(cta.rank),
                                  max(-(-(hi - lo) // self.ctx.target.warpgroup_warps), 1), dict(cta.env), cta.rank)
                        r.seen = dict(cta.seen)
                        r.gen = self.steps_of(r, rn.body)
                        group.append(r)
                if not self.run_group(group):
                    return
                for r in group:
                    cta = ctas[r.rank]
                    for k, v in r.seen.items():
                        cta.seen[k] = max(cta.seen.get(k, 0), v)
                i = j
                continue
            for cta in ctas:
                cta.gen = self.steps_of(cta, (body[i],))
                if not self.run_group([cta]):
                    return
            i += 1
        self.exits()


def check_protocol(ctx: Any) -> list[Diagnostic]:
    """All protocol findings of a verifier context (``verify.Ctx``); silent where other rules must speak first."""
    if not any(n.op is Op.ROLE or n.decl.allocates is Alloc.MBARRIER for n, _, _ in ctx.nodes):
        return []
    # Loops in loops (a persistent tile loop around the k-loop): run again with every dimension one
    # past a tile multiple, so that the inner trip count is odd and a ring phase that restarts with
    # each outer trip, instead of carrying a running count, falls out of step with the ring.
    # An `if` on a problem dimension (tinygemm_rows loads 8 rows of A when M <= 8): run again with the
    # dimensions at each value where such a condition turns, so that every branch is simulated.
    found: list[Diagnostic] = []
    runs = [(r, None) for r in ((0, 1) if _nested_loops(ctx) else (0,))] + [(0, d) for d in _dim_turns(ctx)]
    for ragged, dim in runs:
        try:
            sim = _Sim(ctx, ragged, dim)
            sim.run(ctx.program.body)
        except _Stop:
            pass
        except _Budget:
            return sim.diags + [_incomplete(ctx)]
        except (_Abort, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
            return found
        found = sim.diags
        if found:
            break
    return found


def _incomplete(ctx: Any) -> Diagnostic:
    """A warning that the simulation stopped at its step budget: no finding is not a clean bill."""
    return Diagnostic("protocol.incomplete", Severity.WARNING,
                      f"the protocol checker stopped after {MAX_STEPS:,} simulated ops: deadlocks, races and phase "
                      "errors past that point were not checked", ctx.program.line or 1, 0, "",
                      "the checker runs every loop trip with small dims: a large constant loop extent (or many "
                      "persistent tiles) exhausts it; a smaller constant, or a loop over a dim, keeps it whole")


def _cluster_dims(ctx: Any) -> tuple[int, int, int]:
    """The cluster shape simulated (at most the target's largest cluster); (1, 1, 1) without one or for a malformed
    one."""
    for n in ctx.program.body:
        if n.op is Op.CLUSTER:
            try:
                dims = [int(evaluate(d, ctx.consts)) for d in n.args[0]] + [1, 1]
            except (UnboundSymbol, TypeError):
                return (1, 1, 1)
            cx, cy, cz = dims[:3]
            ok = len(n.args[0]) <= 3 and min(cx, cy, cz) >= 1 and cx * cy * cz <= ctx.target.max_cluster_size
            return (cx, cy, cz) if ok else (1, 1, 1)
    return (1, 1, 1)


def _dim_turns(ctx: Any) -> list[int]:
    """The values of the problem dimensions at which an `if` comparing one of them with a constant turns:
    c and c + 1 for each such condition (constants folded)."""
    out: set[int] = set()
    for n, _, _ in ctx.nodes:
        c = n.args[0] if n.op is Op.IF and n.args else None
        if not isinstance(c, Cmp):
            continue
        for x, y in ((c.a, c.b), (c.b, c.a)):
            v = try_evaluate(y, ctx.consts) if isinstance(x, Sym) and x.name in ctx.dims else None
            if isinstance(v, int) and v > 0:
                out |= {v, v + 1}
    return sorted(out)


def _nested_loops(ctx: Any) -> bool:
    return any(n.op is Op.FOR and any(m.op is Op.FOR for m in n.body) for n, _, _ in ctx.nodes)
