"""The protocol checker's simulation: the roles of one cluster of CTAs (one CTA without a cluster) at op level.

No data moves. Each role is a coroutine over its ops; a :class:`Sim` runs one launch configuration (the
problem dimensions, the cluster's first CTA coordinates, a schedule) that ``ir.protocol`` chooses. The
schedule is fair (every unfinished role one op per turn) or greedy for one role (it runs as far as its waits
let it before any other role moves). Every op spends one step of a :class:`Budget` shared by all the runs of
a check.

A cluster's CTAs are simulated together (rank = x + cx * (y + cy * z), bid = origin + (x, y, z)), every role
of every CTA in the same turn order: a multicast ``tma_load`` fills the slot and lands its bytes on the
barrier of each CTA in its mask, an ``arrive(multicast=mask)`` arrives on each, and keys in witnesses carry
the CTA (``empty[0]@1``). Each CTA counts the ``cluster_sync()`` it has passed: ``topk_publish`` writes its
smem tiles in the writer's count, and a ``topk_cluster_merge`` that reads them from any CTA of the cluster
must come after a later one, and the owner must pass one more after the read before exiting.

State tracked:
- mbarrier slots (created when first touched, so an array's size costs nothing): completed phases, pending
  arrivals, transaction bytes, and the expect_tx / copies of the current phase (for the witness);
- per role, ``seen[bar]``: completed phases of ``bar`` the role has observed through a wait that returned
  (``wait`` is try_wait.parity);
- per smem slot, the last copy that filled it (its barrier and the phase the bytes land in) and the reads
  since; per role, its arrives in order. An arrive releases every read its role completed before it, on
  whichever barrier it is (a ring of x tiles is released by its own empty barrier and, as well, by the
  arrives of the inner ring that follow the reads). wgmma reads stay in flight until the role's
  ``wgmma_wait`` retires them; an arrive releases only the role's completed reads.

Races are judged by what a role has *observed* (the phases its waits returned on), not by how far the others
happen to be in the schedule: a read is ready when its reader has seen the phase its filling copy completes,
a slot may be refilled when its writer has seen the phase its readers released it in. Findings (rule ids, all
errors) are listed in ``ir.protocol``; each witness names both sides: op, line, role and trip. The records of
that state, each op's plan and the simulation's outcomes are in ``ir.protocol_state``; the judging of reads
and writes of smem slots in ``ir.protocol_slots``.
"""
from __future__ import annotations

from typing import Any, Iterator

from cake_core.ir.expr import Bin, Expr, UnboundSymbol, evaluate, symbols
from cake_core.ir.opdef import Alloc, BarrierUse, Completion, Proxy, Slot, SyncKind
from cake_core.ir.ops import REGISTRY, Node, Op
from cake_core.ir.protocol_slots import SlotAccesses
from cake_core.ir.protocol_state import (Bar, BarArray, Budget, Fill, Read, Role, Stop, Stuck, Undecided,
                                         barrier_operand, plan_of)
from cake_core.ir.tree import loop_range
from cake_core.ir.types import MemSpace
from cake_core.outcome import Diagnostic, Severity


SCALAR_AT_ZERO = "scalar@0"   # a configuration's key: every data-dependent binding binds 0, not its declared maximum


def _modifies_memory(n: Node) -> bool:
    """Whether ``n`` writes or adds into memory through one of its operands."""
    return any(o.memory and o.effect_of(n).modifies for o in n.decl.operands)


class Sim(SlotAccesses):
    """One launch configuration: ``env0`` (dims, consts, grid counts), the cluster's first CTA ``origin``, the
    cluster shape, a schedule (None: fair; a role name: that role greedy) and phase overrides (id of a wait
    -> the phase expression to use instead, for the deadlock's diagnosis)."""

    def __init__(self, ctx: Any, env0: dict[str, Any], origin: tuple[int, int, int],
                 cluster_dims: tuple[int, int, int], budget: Budget, schedule: str | None = None,
                 overrides: dict[int, Expr] | None = None):
        self.ctx = ctx
        self.env0 = env0
        self.origin = origin
        self.cluster_dims = cluster_dims
        self.cluster = cluster_dims[0] * cluster_dims[1] * cluster_dims[2]
        self.budget = budget
        self.schedule = schedule
        self.overrides = overrides or {}
        self.bars: dict[str, BarArray] = {}       # mbarrier name (@rank in a cluster) -> its slots
        self.syncs: dict[int, int] = {}                          # rank -> cluster_sync()s passed
        self.published: dict[tuple[str, int], tuple[int, Node, str]] = {}   # (tile, rank) -> (syncs, op, role)
        self.remote: list[tuple[int, int, int, Node]] = []       # (owner, reader, reader's syncs, op)
        self.stages: dict[str, int] = {n.result: n.attr("stages") for n, _, _ in ctx.nodes
                                       if n.decl.allocates is Alloc.SMEM}
        self.fills: dict[tuple[str, int], Fill] = {}
        self.reads: dict[tuple[str, int], list[Read]] = {}
        self.in_flight: set[int] = set()           # ids of the reads of every wgmma group not yet waited for
        self.diags: list[Diagnostic] = []
        self.reported: set = set()
        self.stuck: list[Stuck] = []               # the blocked roles of a deadlock, when one happened
        self.finished: list[str] = []              # roles that had ended when it happened
        self.paths = {id(n): p for n, p, _ in ctx.nodes}
        self.roles: list[Role] = []
        self.node: Node | None = None              # the op being simulated (where an Undecided points)
        # memoised evaluations (see ev), kept on the context: its program keeps every expression (and its id) alive
        # (the phase overrides too: they are kept there, so that no later expression reuses their ids)
        memo = ctx.__dict__.setdefault("_protocol_memo", ({}, {}, [], {}))
        self.syms: dict[int, tuple[str, ...]] = memo[0]
        self.evals: dict[tuple, int] = memo[1]
        memo[2].extend(self.overrides.values())
        self.accesses: dict[int, Any] = memo[3]    # id of an op -> its accesses (its attributes select effects)
        self.smem = {k for k, t in ctx.buffers.items() if t.space is MemSpace.SMEM}
        self.rmem = {k for k, t in ctx.buffers.items() if t.space is MemSpace.RMEM}

    def ev(self, r: Role, e: Any, cond: bool = False) -> int:
        """``e`` in ``r``'s environment: an integer (a truth value for an ``if`` condition, ``cond``).

        Values are memoised per expression and the values of its symbols (in ``evals``, shared by every run of
        a check): a ring index is evaluated by several ops of a trip, and again by every configuration."""
        if isinstance(e, int) and not isinstance(e, bool):
            return e
        names = self.syms.get(id(e))
        if names is None:
            names = self.syms[id(e)] = tuple(sorted(symbols(e)))
        key = (id(e), cond, *(r.env.get(k) for k in names))
        v = self.evals.get(key)
        if v is None:
            v = self.evals[key] = self._ev(r, e, cond)
        return v

    def _ev(self, r: Role, e: Any, cond: bool) -> int:
        try:
            v = evaluate(e, r.env)
        except UnboundSymbol as u:
            raise Undecided(f"`{u.name}` has no value here (shapes.symbols or let.scope says why)", self.node) \
                from None
        except ZeroDivisionError:
            raise Undecided(f"an index expression divides by zero at trip {r.trip()} (role {r.name})",
                            self.node) from None
        if cond and isinstance(v, (bool, int)):
            return int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise Undecided(f"an index expression is {v!r}, not an integer (types.index)", self.node)
        return v

    # ------------------------------------------------------------ reports
    def report(self, rule: str, node: Node, key: tuple, message: str, witness: list[str], hint: str) -> None:
        if (rule, key) in self.reported:
            return
        self.reported.add((rule, key))
        self.diags.append(Diagnostic(rule, Severity.ERROR, message, node.line, node.col,
                                     self.paths.get(id(node), ""), hint, tuple(witness)))

    def out_of_range(self, r: Role, node: Node, name: str, i: int, count: int, what: str) -> None:
        self.report("protocol.slot_range", node, (node.line, name),
                    f"{node.op.value} indexes {what} `{name}` at {i}: it has {count} slots",
                    [f"{node.op.value} at line {node.line} (role {r.name}, trip {r.trip()}): index {i}",
                     f"`{name}` holds slots 0..{count - 1}"],
                    f"index the ring modulo its {count} slots, e.g. [kt % {count}]")
        raise Stop()

    # ------------------------------------------------------------ operands
    def at(self, rank: int) -> str:
        """The suffix naming a CTA of the cluster in barrier and slot keys ('' without a cluster)."""
        return f"@{rank}" if self.cluster > 1 else ""

    def targets(self, r: Role, n: Node) -> list[int]:
        """The CTAs a copy or an arrive reaches: the multicast mask's, else the role's own."""
        mask = n.attr("multicast")
        if not mask:
            return [r.rank]
        if mask < 0 or mask >> self.cluster:
            raise Undecided(f"multicast mask {mask:#x} names CTAs outside the cluster of {self.cluster} "
                            "(resources.cluster)", n)
        return [k for k in range(self.cluster) if mask >> k & 1]

    def bar(self, r: Role, n: Node, s: Slot, rank: int | None = None) -> tuple[str, Bar]:
        """A barrier slot, indexed in ``r``'s environment, of CTA ``rank`` (default: ``r``'s own)."""
        at = self.at(r.rank if rank is None else rank)
        bars = self.bars.get(s.buf + at)
        if bars is None:
            raise Undecided(f"`{s.buf}` is not an mbarrier allocated before this op (types.undefined, "
                            "mbarrier.placement)", n)
        i = self.ev(r, s.index) if s.index is not None else 0
        if not 0 <= i < bars.count:
            self.out_of_range(r, n, s.buf, i, bars.count, "the mbarrier array")
        return f"{s.buf}[{i}]{at}", bars[i]

    def slot(self, r: Role, n: Node, s: Slot | str, rank: int | None = None) -> tuple[str, int]:
        at = self.at(r.rank if rank is None else rank)
        if isinstance(s, str):
            return s + at, 0
        if s.index is None:
            return s.buf + at, 0
        i = self.ev(r, s.index)
        count = max(self.stages.get(s.buf, 1), 1)
        if not 0 <= i < count:
            self.out_of_range(r, n, s.buf, i, count, "the smem ring")
        return s.buf + at, i

    def is_rmem(self, name: str) -> bool:
        return name in self.rmem

    def is_smem(self, name: str) -> bool:
        return name in self.smem

    def box_bytes(self, n: Node, dst: Slot) -> int:
        """The bytes a copy into the slot ``dst`` lands (a ``rows`` attribute: its first rows only)."""
        t = self.ctx.buffers.get(dst.buf)
        if t is None:
            raise Undecided(f"`{dst.buf}` is not an smem tile (types.undefined)", n)
        dims = []
        for d in t.shape:
            v = evaluate(d, self.ctx.consts) if not isinstance(d, int) else d
            if not isinstance(v, int) or v < 1:
                raise Undecided(f"`{dst.buf}` has no static shape (shapes.static)", n)
            dims.append(v)
        if "rows" in n.decl.attrs and n.attr("rows"):       # only the first rows of the box land
            dims[0] = min(dims[0], n.attr("rows"))
        numel = 1
        for d in dims:
            numel *= d
        return numel * t.dtype.bytes

    # ------------------------------------------------------------ execution
    def phase_of(self, n: Node) -> Expr:
        ph = n.arg("phase")
        return self.overrides.get(id(n), ph)

    def steps_of(self, r: Role, nodes: tuple[Node, ...]) -> Iterator[Node | None]:
        budget = self.budget
        for n in nodes:
            self.node = n
            budget.used += 1
            if budget.used > budget.limit:
                budget.exhausted(n)
            op = n.op
            if op is Op.FOR:
                var = n.args[0]
                r.loops.append(var)
                start, stop, step = (self.ev(r, x) for x in loop_range(n))
                if step < 1:
                    raise Undecided(f"loop `{var}` steps by {step} (control.loop_step)", n)
                for i in range(start, stop, step):
                    r.env[var] = i
                    yield from self.steps_of(r, n.body)
                r.loops.pop()
                r.env.pop(var, None)
                continue
            if op is Op.IF:
                if self.ev(r, n.args[0], cond=True):
                    yield from self.steps_of(r, n.body)
                continue
            if n.decl.bind is not None:
                if n.decl.data_dependent and self.env0.get(SCALAR_AT_ZERO):   # a value read from memory: its least
                    r.env[n.arg("var")] = 0
                else:
                    try:
                        r.env.update(n.decl.bind(n, lambda e: self.ev(r, e)))
                    except ValueError as e:
                        raise Undecided(f"`{n.op.value}` cannot bind its names at trip {r.trip()}: {e}", n) from None
                if not _modifies_memory(n):    # a pure binding is not a turn of its own (bindings leave the
                    continue                   # interleaving as it was); fetch_add and compact write memory
            waits = barrier_operand(n)
            if waits is not None and waits[0] is BarrierUse.WAIT:
                key, b = self.bar(r, n, waits[1])
                parity = self.ev(r, self.phase_of(n)) % 2
                while b.done % 2 == parity:
                    r.blocked = n
                    yield n
                    self.node = n
                r.blocked = None
                r.seen[key] = max(r.seen.get(key, 0), b.done)
            else:
                self.effects(r, n, waits)
            yield None

    def effects(self, r: Role, n: Node, bar: tuple[BarrierUse, Slot] | None) -> None:
        """What one op does to barriers, smem slots, accumulators and the cluster, read from its declaration:
        its barrier operand's use (``bar``), its sync kind, its operands' effects, proxy and completion."""
        d = REGISTRY[n.op]
        if n.op is Op.ROLE:
            raise Undecided(f"role `{n.args[0]}` is nested in a block (role.placement)", n)
        if d.allocates is Alloc.MBARRIER:
            cnt, arrivals = self.ev(r, n.args[0]), n.attr("arrivals")
            if cnt < 1 or not isinstance(arrivals, int) or arrivals < 1:
                raise Undecided(f"mbarrier `{n.result}` of {cnt} barriers with {arrivals} arrivals "
                                "(mbarrier.count)", n)
            self.bars[n.result + self.at(r.rank)] = BarArray(cnt, arrivals, n)
            return
        if bar is not None and bar[0] is BarrierUse.ARRIVE:     # on the role's own barrier, or each of the mask's
            hit = [self.bar(r, n, bar[1], k) for k in self.targets(r, n)]
            self.release(r, [(key, b.done) for key, b in hit], n)
            for key, b in hit[:1] if self.cluster == 1 else [h for h in hit if h[0].endswith(self.at(r.rank))]:
                self.publish(r, key, b.done)      # smem the role's threads wrote is ready with this phase
            for _, b in hit:
                b.pending -= r.wgs
                b.settle()
        elif bar is not None and bar[0] is BarrierUse.EXPECT_TX:
            key, b = self.bar(r, n, bar[1])
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
                done = r.inflight.pop(0)
                self.in_flight.difference_update(id(x) for x in done)
                for rd in done:
                    rd.complete(r.arrives)
                r.inflight_acc.pop(0)
        elif d.sync is SyncKind.CLUSTER:
            self.syncs[r.rank] = self.syncs.get(r.rank, 0) + 1
        plan = plan_of(n.op)
        acc = self.accesses.get(id(n))
        if acc is None:
            acc = self.accesses[id(n)] = plan.accesses(n)
        if not plan.issued:      # touching an accumulator whose wgmma may still run
            for i in acc.acc_reads:
                self.acc_ready(r, n, n.args[i])
            if acc.acc_write is not None and acc.acc_write not in acc.acc_reads:
                self.acc_ready(r, n, n.args[acc.acc_write], "writes")
        group: list[Read] | None = [] if plan.issued else None
        for i in acc.reads + acc.read_writes:      # plain reads first, then the reads of read-writes
            self.read(r, n, n.args[i], group, d.proxy is Proxy.ASYNC)
        for i in acc.writes:
            self.lands(r, n, n.args[i], bar)
        if plan.issued:
            r.inflight.append(group)
            self.in_flight.update(id(x) for x in group)
            # the registers it reads or writes until it completes: its accumulator, and a register A
            reads = [n.args[i] for i in acc.reads]
            regs = ((n.args[acc.acc_write],) if acc.acc_write is not None else ()) + \
                tuple(x.buf for x in reads if isinstance(x, Slot) and self.is_rmem(x.buf))
            r.inflight_acc.append((regs, n))
        for i in acc.publishes:
            self.published[(n.args[i], r.rank)] = (self.syncs.get(r.rank, 0), n, r.name)
        if acc.cluster_reads:
            self.cluster_read(r, n, [n.args[i] for i in acc.cluster_reads])

    def lands(self, r: Role, n: Node, s: Slot | str, bar: tuple[BarrierUse, Slot] | None) -> None:
        """A write of ``s`` by ``n``: its bytes complete a transaction on the barrier (TMA, into each CTA of a
        multicast mask), land with the barrier's phase (cp_async_bar), or are plain writes of the role's threads,
        made ready by the role's next arrive."""
        if bar is not None and bar[0] is BarrierUse.COMPLETE_TX:
            nbytes = self.box_bytes(n, s)
            for rank in self.targets(r, n):
                key, b = self.bar(r, n, bar[1], rank)
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
            key, b = self.bar(r, n, bar[1])
            self.write(r, n, s, key, b.done)
            self.fills[self.slot(r, n, s)].generic = n.decl.proxy is Proxy.GENERIC
        else:
            self.write(r, n, s, None, 0)
            if n.decl.completion is Completion.ISSUE and (not isinstance(s, str) or self.is_smem(s)):
                r.published.append(self.slot(r, n, s))

    def acc_ready(self, r: Role, n: Node, acc: str, verb: str = "reads") -> None:
        """An op that reads or writes a wgmma accumulator: no wgmma group writing it may still be in flight."""
        pending = [w for regs, w in r.inflight_acc if acc in regs]
        if pending:
            acc_of = pending[-1].arg("acc") == acc
            self.report("protocol.acc_in_flight", n, (n.line, acc),
                        f"{n.op.value} {verb} {'accumulator' if acc_of else 'register tile'} `{acc}` while the wgmma "
                        f"at line {pending[-1].line} that {'writes it' if acc_of else 'reads it as its register A'} "
                        f"may still be running ({len(r.inflight)} wgmma group(s) in flight here)",
                        [f"{'write' if acc_of else 'read'}: wgmma at line {pending[-1].line} (role {r.name}, "
                         f"trip {r.trip()})",
                         f"{verb[:-1]}: {n.op.value} at line {n.line}"],
                        "wgmma_wait(n) first, with n at most the number of wgmma groups committed after it")

    def cluster_read(self, r: Role, n: Node, tiles: list[str]) -> None:
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

    # ------------------------------------------------------------ scheduling
    def run_group(self, roles: list[Role]) -> bool:
        """Run roles concurrently; False after a deadlock. Fair: every unfinished role moves one op per turn.
        Greedy: the scheduled role moves whenever it can, the others (in order) only while it is blocked."""
        self.roles = roles
        self.in_flight = {id(x) for r in roles for g in r.inflight for x in g}
        live = list(roles)
        greedy = [r for r in live if self.schedule in (r.base, r.name)]
        while live:
            progressed = False
            for r in (greedy + [r for r in live if r not in greedy]) if greedy else list(live):
                try:
                    progressed = next(r.gen) is None or progressed
                except StopIteration:
                    live.remove(r)
                    if r in greedy:
                        greedy.remove(r)
                    progressed = True
                if greedy and progressed:
                    break           # back to the highest-priority role that can move
            if live and not progressed and all(r.blocked is not None for r in live):
                self.deadlock(live, roles)
                return False
        return True

    def deadlock(self, live: list[Role], roles: list[Role]) -> None:
        """Every unfinished role is blocked: a phase that has its arrivals but not its bytes is a tx mismatch;
        otherwise the blocked waits are kept in ``stuck`` for ``ir.protocol`` to diagnose."""
        waits = []
        for r in live:
            n = r.blocked
            key, b = self.bar(r, n, n.arg("bar"))
            waits.append((r, n, key, b, self.ev(r, self.phase_of(n)) % 2))
        for r, n, key, b, parity in waits:          # a phase that has its arrivals but not its bytes
            if b.tx != 0 and (b.pending <= 0 or b.landed):
                self.tx_mismatch(key, b.done, b.expects, b.landed,
                                 f"the phase never completes: the wait at line {n.line} (role {r.name}, trip "
                                 f"{r.trip()}) never returns", stop=False)
                return
        self.stuck = [Stuck(r.name, n, key, b.done, b.pending, b.arrivals, p, r.trip(), b.tx)
                      for r, n, key, b, p in waits]
        self.finished = [r.name for r in roles if r not in live]

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
            raise Stop()

    def run(self, body: tuple[Node, ...]) -> None:
        """The kernel's top level: one CTA per rank of the cluster (bid = origin + its coordinates in the
        cluster), their roles all concurrent. Raises Stop after a finding that ends the run."""
        i = 0
        ctas = []
        cx, cy, _ = self.cluster_dims
        ox, oy, oz = self.origin
        wg_threads = self.ctx.target.warpgroup_threads
        for rank in range(self.cluster):
            env = dict(self.env0)
            env["bid.x"], env["bid.y"], env["bid.z"] = ox + rank % cx, oy + rank // cx % cy, oz + rank // (cx * cy)
            ctas.append(Role("cta" + self.at(rank), max(-(-self.ctx.program.threads // wg_threads), 1), env, rank,
                             "cta"))
        while i < len(body):
            if body[i].op is Op.ROLE:
                j = i
                while j < len(body) and body[j].op is Op.ROLE:
                    j += 1
                group = []
                for cta in ctas:
                    for rn in body[i:j]:
                        lo, hi = rn.args[1]
                        r = Role(rn.args[0] + self.at(cta.rank),
                                 max(-(-(hi - lo) // self.ctx.target.warpgroup_warps), 1), dict(cta.env), cta.rank,
                                 rn.args[0])
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


def flipped(phase: Expr) -> Expr:
    """The other parity of a wait's phase expression."""
    return Bin("%", Bin("+", phase, 1), 2)
