"""The protocol checker: simulate one CTA's warp roles at op level and report deadlocks and races.

No data moves. Each role is a coroutine over its ops; the scheduler gives
every unfinished role one op per turn (a fair interleaving, so a producer
that does not wait cannot run arbitrarily far ahead and hide a race). Problem
dimensions get small values, ``(stages + 2) * largest const``, so that every
ring wraps at least once; grid coordinates are 0.

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
(a copy into a slot whose earlier reads the writer has not seen released).
Each carries a witness naming both sides: op, line, role and trip.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from cake_core.ir.expr import UnboundSymbol, evaluate
from cake_core.ir.ops import Node, Op
from cake_core.ir.ops_async import Slot
from cake_core.outcome import Diagnostic, Severity

MAX_STEPS = 200_000     # ops simulated at most (a bound on the checker's time, not a finding)
RULE_IDS = ("protocol.deadlock", "protocol.tx_mismatch", "protocol.read_before_ready", "protocol.slot_reuse")


class _Abort(Exception):
    """The program is malformed in a way other rules report; the checker stays silent."""


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
    release: tuple[str, int, Node, str] | None = None   # (barrier key, phase, arrive node, trip)


@dataclass
class _Fill:
    role: str
    node: Node
    trip: str
    bar: str | None          # barrier key the bytes complete on (None: an ordinary write)
    phase: int


@dataclass
class _Role:
    name: str
    wgs: int
    env: dict[str, Any]
    gen: Iterator[Node | None] | None = None
    seen: dict[str, int] = field(default_factory=dict)
    inflight: list[list[_Read]] = field(default_factory=list)   # wgmma groups not yet waited for
    done_reads: list[_Read] = field(default_factory=list)       # completed, not yet released
    blocked: Node | None = None
    loops: list[str] = field(default_factory=list)
    published: list[tuple[str, int]] = field(default_factory=list)   # smem written by the role's threads

    def trip(self) -> str:
        return ", ".join(f"{v}={self.env[v]}" for v in self.loops) or "-"


class _Sim:
    def __init__(self, ctx: Any):
        self.ctx = ctx
        prog = ctx.program
        consts = prog.const_env
        stages = [n.attr("stages") for n, _, _ in ctx.nodes if n.op is Op.SMEM]
        stages += [self._static(n.args[0], consts) for n, _, _ in ctx.nodes if n.op is Op.MBARRIER]
        big = max([v for v in consts.values() if isinstance(v, int)] + [1])
        dim = (max(stages + [1]) + 2) * big
        self.env0: dict[str, Any] = {**{d: dim for d in ctx.dims}, **consts, "bid.x": 0, "bid.y": 0, "bid.z": 0}
        self.bars: dict[str, list[_Bar]] = {}
        self.stages: dict[str, int] = {n.result: n.attr("stages") for n, _, _ in ctx.nodes if n.op is Op.SMEM}
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
    def bar(self, r: _Role, s: Slot) -> tuple[str, _Bar]:
        bars = self.bars.get(s.buf)
        if bars is None:
            raise _Abort()
        i = self.ev(r, s.index) if s.index is not None else 0
        if not 0 <= i < len(bars):
            raise _Abort()
        return f"{s.buf}[{i}]", bars[i]

    def slot(self, r: _Role, s: Slot | str) -> tuple[str, int]:
        if isinstance(s, str):
            return s, 0
        if s.index is None:
            return s.buf, 0
        i = self.ev(r, s.index)
        if not 0 <= i < max(self.stages.get(s.buf, 1), 1):
            raise _Abort()
        return s.buf, i

    def is_smem(self, name: str) -> bool:
        t = self.ctx.buffers.get(name)
        return t is not None and t.space.value == "smem"

    def box_bytes(self, n: Node) -> int:
        t = self.ctx.buffers.get(n.arg("dst").buf)
        if t is None:
            raise _Abort()
        numel = 1
        for d in t.shape:
            numel *= self._static(d, self.ctx.consts)
        return numel * t.dtype.bytes

    @staticmethod
    def sname(key: tuple[str, int]) -> str:
        return f"{key[0]}[{key[1]}]"

    # ------------------------------------------------------------ accesses
    def read(self, r: _Role, n: Node, s: Slot | str, inflight: list[_Read] | None) -> None:
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
        self.reads.setdefault(key, []).append(rd)
        (inflight if inflight is not None else r.done_reads).append(rd)

    def write(self, r: _Role, n: Node, s: Slot | str, bar: str | None, phase: int) -> None:
        if isinstance(s, str) and not self.is_smem(s):
            return
        key = self.slot(r, s)
        for rd in self.reads.get(key, []):
            if rd.role == r.name:
                continue
            rel = rd.release
            if rel is not None and r.seen.get(rel[0], 0) > rel[1]:
                continue
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

    def release(self, r: _Role, key: str, phase: int, n: Node) -> None:
        for rd in r.done_reads:
            rd.release = (key, phase, n, r.trip())
        r.done_reads = []

    # ------------------------------------------------------------ execution
    def steps_of(self, r: _Role, nodes: tuple[Node, ...]) -> Iterator[Node | None]:
        for n in nodes:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise _Abort()
            op = n.op
            if op is Op.FOR:
                var = n.args[0]
                r.loops.append(var)
                for i in range(self.ev(r, n.args[1])):
                    r.env[var] = i
                    yield from self.steps_of(r, n.body)
                r.loops.pop()
                r.env.pop(var, None)
                continue
            if op is Op.IF:
                if self.ev(r, n.args[0]):
                    yield from self.steps_of(r, n.body)
                continue
            if op is Op.WAIT:
                key, b = self.bar(r, n.arg("bar"))
                parity = self.ev(r, n.arg("phase")) % 2
                while b.done % 2 == parity:
                    r.blocked = n
                    yield n
                r.blocked = None
                r.seen[key] = max(r.seen.get(key, 0), b.done)
            elif op is Op.MBARRIER:
                cnt = self.ev(r, n.args[0])
                self.bars[n.result] = [_Bar(n.attr("arrivals"), n.attr("arrivals")) for _ in range(cnt)]
            elif op is Op.ARRIVE:
                key, b = self.bar(r, n.arg("bar"))
                self.release(r, key, b.done, n)
                self.publish(r, key, b.done)
                b.pending -= r.wgs
                b.settle()
            elif op is Op.EXPECT_TX:
                key, b = self.bar(r, n.arg("bar"))
                nbytes = self.ev(r, n.arg("bytes"))
                self.release(r, key, b.done, n)
                b.expects.append((n, r.name, r.trip(), nbytes))
                b.tx += nbytes
                b.pending -= 1
                b.settle()
            elif op is Op.TMA_LOAD:
                key, b = self.bar(r, n.arg("bar"))
                nbytes = self.box_bytes(n)
                pe, pl = b.prev
                if not b.expects and pe and pe[-1][1] == r.name and pe[-1][2] == r.trip():
                    self.tx_mismatch(key, b.done - 1, pe, pl + [(n, r.name, r.trip(), nbytes)],
                                     f"the phase completed early, and this copy's {nbytes} B land in phase {b.done}")
                self.write(r, n, n.arg("dst"), key, b.done)
                b.landed.append((n, r.name, r.trip(), nbytes))
                b.tx -= nbytes
                b.settle()
            elif op is Op.CP_ASYNC:
                self.write(r, n, n.arg("dst"), None, 0)
            elif op is Op.LOAD:
                self.write(r, n, n.arg("dst"), None, 0)
            elif op in (Op.WGMMA, Op.TCGEN05_MMA):
                group: list[_Read] = []
                self.read(r, n, n.arg("a"), group)
                self.read(r, n, n.arg("b"), group)
                r.inflight.append(group)
            elif op is Op.WGMMA_WAIT:
                keep = max(self.ev(r, n.args[0]), 0)
                while len(r.inflight) > keep:
                    r.done_reads.extend(r.inflight.pop(0))
            elif op is Op.MMA:
                self.read(r, n, n.arg("a"), None)
                self.read(r, n, n.arg("b"), None)
            elif op is Op.STORE:
                self.read(r, n, n.arg("src"), None)
            elif op in (Op.ARGMIN_BIAS, Op.TOPK_BIAS):
                self.read(r, n, n.arg("bias"), None)
            elif op is Op.SQNORM_ROWS:
                self.read(r, n, n.arg("src"), None)
                if n.attr("accumulate"):
                    self.read(r, n, n.arg("dst"), None)
                self.write(r, n, n.arg("dst"), None, 0)
                r.published.append(self.slot(r, n.arg("dst")))
            elif op is Op.TMA_STORE:
                self.read(r, n, n.arg("src"), None)
            elif op is Op.ROLE:
                raise _Abort()      # nested roles: rules report them
            yield None

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
        i = 0
        cta = _Role("cta", -(-self.ctx.program.threads // 128), dict(self.env0))
        while i < len(body):
            if body[i].op is Op.ROLE:
                j = i
                while j < len(body) and body[j].op is Op.ROLE:
                    j += 1
                group = []
                for rn in body[i:j]:
                    lo, hi = rn.args[1]
                    r = _Role(rn.args[0], max(-(-(hi - lo) // 4), 1), dict(cta.env))
                    r.seen = dict(cta.seen)
                    r.gen = self.steps_of(r, rn.body)
                    group.append(r)
                if not self.run_group(group):
                    return
                for r in group:
                    for k, v in r.seen.items():
                        cta.seen[k] = max(cta.seen.get(k, 0), v)
                i = j
                continue
            cta.gen = self.steps_of(cta, (body[i],))
            if not self.run_group([cta]):
                return
            i += 1


def check_protocol(ctx: Any) -> list[Diagnostic]:
    """All protocol findings of a verifier context (``verify.Ctx``); silent where other rules must speak first."""
    if not any(n.op in (Op.MBARRIER, Op.ROLE, Op.TMA_LOAD) for n, _, _ in ctx.nodes):
        return []
    try:
        sim = _Sim(ctx)
    except _Abort:
        return []
    try:
        sim.run(ctx.program.body)
    except _Stop:
        pass
    except (_Abort, KeyError, IndexError, TypeError, ValueError, ZeroDivisionError):
        return []
    return sim.diags
