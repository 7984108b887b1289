"""The protocol checker's judging of smem slot accesses: a read before the copy that fills its slot is seen, a
refill while an earlier read may still use the slot (on this CTA, or on a peer a multicast copy reaches), a read
through the async proxy of a slot the generic proxy filled without a fence, and the releases (arrives) that order
them. A mixin of ``ir.protocol_sim.Sim``, whose state (``fills``, ``reads``, ``in_flight``) and lookups (``slot``,
``is_smem``, ``targets``, ``report``) it uses; see that module's docstring for the model.
"""
from __future__ import annotations

from cake_core.ir.opdef import Slot
from cake_core.ir.ops import Node
from cake_core.ir.protocol_state import Arrives, Fill, Read, Role


class SlotAccesses:
    """Reads, writes and releases of smem slots, judged against what each role has observed."""

    @staticmethod
    def sname(key: tuple[str, int]) -> str:
        return f"{key[0]}[{key[1]}]"

    def read(self, r: Role, n: Node, s: Slot | str, inflight: list[Read] | None, async_proxy: bool = False) -> None:
        if not self.is_smem(s if isinstance(s, str) else s.buf):
            return      # a register or global operand: its op's own rule reports the space (e.g. wgmma.operands)
        key = self.slot(r, n, s)
        fill = self.fills.get(key)
        rd = Read(r.name, n, r.trip())
        if fill is None:
            self.report("protocol.read_before_ready", n, (n.line, "never"),
                        f"{n.op.value} reads smem slot {self.sname(key)} before any copy has filled it",
                        [f"read: {n.op.value} at line {n.line} (role {r.name}, trip {rd.trip})",
                         f"no copy into {self.sname(key)} has been issued yet"],
                        "wait on the full barrier of this slot before reading it")
        elif fill.bar is not None and not (fill.own and fill.role == r.name) and r.seen.get(fill.bar, 0) <= fill.phase:
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
        if inflight is not None:
            inflight.append(rd)
        else:
            rd.complete(r.arrives)

    def write(self, r: Role, n: Node, s: Slot | str, bar: str | None, phase: int, rank: int | None = None) -> None:
        if isinstance(s, str) and not self.is_smem(s):
            return
        key = self.slot(r, n, s, rank)
        peer = rank is not None and rank != r.rank
        for rd in self.unreleased_reads(r, key):
            if peer:
                self.peer_reuse(r, n, key, rd, rank)
                continue
            self.report("protocol.slot_reuse", n, (n.line, rd.node.line),
                        f"{n.op.value} overwrites smem slot {self.sname(key)} while an earlier read may still "
                        f"use it: {self.unreleased(rd)}",
                        [f"read: {rd.node.op.value} at line {rd.node.line} (role {rd.role}, trip {rd.trip})",
                         f"write: {n.op.value} at line {n.line} (role {r.name}, trip {r.trip()})"],
                        "the consumer arrives on the empty barrier after its reads complete, and the producer "
                        "waits on it before refilling the slot")
        self.reads[key] = []
        self.fills[key] = Fill(r.name, n, r.trip(), bar, phase)

    def unreleased_reads(self, r: Role, key: tuple[str, int]) -> list[Read]:
        """The reads of slot ``key`` by other roles that no release orders a write of ``r`` after, in the order they
        were made. Being released is monotone in when a read completed (one completed earlier has every arrive of
        a later one after it), so each reader's point is found by bisection over its reads' completion points: a
        slot read on every trip costs a few judgements, not one a read."""
        reads = [rd for rd in self.reads.get(key, []) if rd.role != r.name]
        points: dict[int, tuple[Arrives, set[int]]] = {}
        for rd in reads:
            if rd.arrives is not None:
                points.setdefault(id(rd.arrives), (rd.arrives, set()))[1].add(rd.since)
        upto = {}       # reader's arrives -> the latest completion point that is released (-1: none)
        for k, (arrives, sinces) in points.items():
            xs = sorted(sinces)
            lo, hi = 0, len(xs)
            while lo < hi:
                mid = (lo + hi) // 2
                if arrives.release(xs[mid], r.seen):
                    lo = mid + 1
                else:
                    hi = mid
            upto[k] = xs[lo - 1] if lo else -1
        return [rd for rd in reads if rd.arrives is None or rd.since > upto[id(rd.arrives)]]

    def unreleased(self, rd: Read) -> str:
        """Why no release of ``rd`` orders a write after it (the writer has seen none of its phases)."""
        rel = rd.first_release()
        if rel is None:
            return "it was never released (no arrive after the read completed" + \
                   (": a wgmma is still in flight, wgmma_wait first)" if id(rd) in self.in_flight else ")")
        return (f"it was released by arrive at line {rel[0].line} (trip {rel[1]}) on {rel[2][0][0]} phase "
                f"{rel[2][0][1]}, which the writer has not waited for")

    def peer_reuse(self, r: Role, n: Node, key: tuple[str, int], rd: Read, rank: int) -> None:
        """A multicast copy of ``r``'s CTA overwrites slot ``key`` of the peer CTA ``rank`` while the peer's read
        ``rd`` may still use it: the copying CTA's producer can only wait on its own barriers, so the peer's readers
        must release the slot on one of them (an arrive whose mask holds the copying CTA)."""
        slot = f"{key[0].split('@')[0]}[{key[1]}]"
        rel = rd.first_release()
        on_copier = rd.arrives is not None and any(k.rsplit("@", 1)[-1] == str(r.rank) for k in rd.arrives.by_key)
        why = self.unreleased(rd) if rel is None or on_copier else (
            f"the reader releases it on CTA {rank}'s barriers only ({rel[2][0][0]} at line {rel[0].line}), never "
            f"on one of CTA {r.rank}, whose producer issues the copy")
        self.report("protocol.multicast_reuse", n, (n.line, rd.node.line),
                    f"multicast {n.op.value} of CTA {r.rank} overwrites smem slot {slot} of CTA {rank} while "
                    f"{rd.role} may still read it (trip {rd.trip}): {why}",
                    [f"write: {n.op.value} at line {n.line} (role {r.name}, CTA {r.rank}, trip {r.trip()}) into "
                     f"{slot} of CTAs {self.targets(r, n)} (multicast={n.attr('multicast'):#x})",
                     f"read: {rd.node.op.value} at line {rd.node.line} (role {rd.role}, CTA {rank}, trip {rd.trip}) "
                     f"of {self.sname(key)}"],
                    f"the readers of every CTA in the mask arrive on CTA {r.rank}'s empty barrier for this slot "
                    f"(arrive(empty[...], multicast={n.attr('multicast'):#x}), counted in its arrivals) after their "
                    f"reads complete, and CTA {r.rank}'s producer waits on it before the multicast copy")

    def publish(self, r: Role, key: str, phase: int) -> None:
        """Slots the role's threads wrote (sqnorm_rows) count as filled by this arrival's phase."""
        for slot in r.published:
            f = self.fills.get(slot)
            if f is not None and f.role == r.name and f.bar is None:
                self.fills[slot] = Fill(f.role, f.node, f.trip, key, phase, own=True)
        r.published = []

    def release(self, r: Role, phases: list[tuple[str, int]], n: Node) -> None:
        """An arrive of ``r`` on these (barrier key, phase) pairs: it releases every read the role completed before
        it (``Arrives`` keeps them; a read is released by all the later arrives, not only the first)."""
        r.arrives.add(n, r.trip(), phases)
