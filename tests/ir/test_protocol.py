"""The protocol checker on the warp-specialized GEMM: planted deadlock, ring-slot race and tx mismatch, with witnesses."""
import time
from pathlib import Path

from cake_core.ir.check import check_text
from cake_core.targets import get_arch
from cake_core.ir.protocol import check_protocol
from cake_core.ir.text import parse_program
from cake_core.ir.verify import build_ctx
from cake_core.problems import corpus_file, corpus_files

SEED = corpus_file("gemm_bf16_ws.cake").read_text()
WGMMA = "            wgmma(acc, a_s[kt % S], b_s[kt % S])\n"
WAIT0 = "            wgmma_wait(0)\n"
ARRIVE = "            arrive(empty[kt % S])\n"


def _protocol(text: str):
    return check_protocol(build_ctx(parse_program(text), get_arch("sm_90a")))


def _plant(old: str, new: str) -> str:
    assert old in SEED
    return SEED.replace(old, new, 1)


def test_the_ws_gemm_passes():
    assert _protocol(SEED) == []
    assert [d.rule for d in check_text(SEED) if d.rule.startswith("protocol.")] == []


def test_planted_deadlock_names_barrier_phase_roles_and_lines():
    text = _plant("phase=(kt // S + 1) % 2", "phase=kt // S % 2")     # producer forgets the parity-1 start
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert d.line == 9 and d.path == "role[producer].for[kt].wait"
    assert "empty[0]" in d.message and "parity 0" in d.message
    assert any("role producer: wait at line 9 (trip kt=0) on empty[0]" in w for w in d.witness)
    assert any("role consumer: wait at line 16 (trip kt=0) on full[0] for the phase of parity 0" in w
               for w in d.witness)


def test_planted_write_after_read_race_on_a_ring_slot():
    # the consumer releases the slot before its wgmma reads it
    text = _plant(WGMMA + WAIT0 + ARRIVE, ARRIVE + WGMMA + WAIT0)
    hits = [d for d in _protocol(text) if d.rule == "protocol.slot_reuse"]
    assert hits and hits[0].line == 11 and "a_s[0]" in hits[0].message
    assert "read: wgmma at line 18 (role consumer, trip kt=0)" in hits[0].witness
    assert "write: tma_load at line 11 (role producer, trip kt=4)" in hits[0].witness


def test_release_while_wgmma_in_flight_is_a_race():
    text = _plant(WAIT0, "")
    d = next(d for d in _protocol(text) if d.rule == "protocol.slot_reuse")
    assert d.line == 11 and "in flight" in d.message
    assert "read: wgmma at line 17 (role consumer, trip kt=0)" in d.witness


def test_wrong_expect_tx_byte_count():
    text = _plant("(BM * BK + BK * BN) * 2", "BM * BK * 2")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.tx_mismatch"]
    assert d.line == 10 and "expects 16384" in d.message and "24576" in d.message
    assert "expect_tx: line 10 (role producer, trip kt=0) expects 16384 B" in d.witness
    assert "copy: tma_load at line 12 (role producer, trip kt=0) lands 8192 B" in d.witness


def test_too_many_expected_bytes_stall_the_phase():
    text = _plant("(BM * BK + BK * BN) * 2", "(BM * BK + BK * BN) * 4")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.tx_mismatch"]
    assert d.line == 10 and "never completes" in d.message
    assert any("wait at line 16" in d.message or "line 16" in w for w in d.witness + (d.message,))


def test_read_before_the_full_wait():
    text = _plant("            wait(full[kt % S], phase=kt // S % 2)\n", "")
    d = next(d for d in _protocol(text) if d.rule == "protocol.read_before_ready")
    assert d.line == 16 and "a_s[0]" in d.message
    assert any("read: wgmma at line 16 (role consumer, trip kt=0)" in w for w in d.witness)


def test_ring_wraps_in_the_simulation():
    # 4 stages: the symbolic K gives (4 + 2) * 128 / 64 = 12 trips, so the ring wraps; a producer whose
    # empty waits are right only for the first pass around the ring deadlocks on the wrap
    text = _plant("phase=(kt // S + 1) % 2", "phase=1")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert d.line == 9 and any("role producer: wait at line 9 (trip kt=4) on empty[0]" in w for w in d.witness)


def test_a_simulation_past_its_step_budget_is_undecided_an_error():
    # a loop of 50,000x the k-trips cannot be simulated whole: the checker says so as an error, never silence
    huge = SEED.replace("range(cdiv(K, BK))", "range(cdiv(K, BK) * 50000)")
    (d,) = [d for d in check_text(huge, "huge.cake") if d.rule == "protocol.undecided"]
    assert d.severity.value == "error" and "100,000 simulated ops" in d.message and d.line in (8, 9, 10, 11, 12)
    assert not [d for d in check_text(SEED) if d.rule == "protocol.undecided"]
    # a deadlock within the budget is still found, and then the check is decided
    stuck = huge.replace("            arrive(empty[kt % S])\n", "")
    assert stuck != huge
    rules = {d.rule for d in check_text(stuck)}
    assert "protocol.deadlock" in rules and "protocol.undecided" not in rules


def test_an_op_the_simulation_cannot_evaluate_is_undecided_with_its_reason():
    # the wait phase names an undefined symbol: shapes.symbols reports it, and the checker does not pass quietly
    text = _plant("phase=kt // S % 2", "phase=kz // S % 2")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.undecided"]
    assert d.line == 16 and "`kz` has no value here" in d.message and d.path.endswith("wait")


def test_a_deadlock_is_reported_at_the_producers_phase_whatever_the_role_order():
    # the consumer declared first: its full wait blocks first, but the mistake is the producer's empty phase
    prod = SEED[SEED.index('    with role("producer"'):SEED.index('    with role("consumer"')]
    swapped = SEED.replace(prod, "") + prod
    assert _protocol(swapped) == []
    text = swapped.replace("phase=(kt // S + 1) % 2", "phase=kt // S % 2")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "wait(empty" in ln)
    assert d.line == line and d.path == "role[producer].for[kt].wait"
    assert "with the other parity at this wait the roles finish" in d.message and "blocks consumer" in d.message
    assert any(w.startswith("role consumer: wait at line") for w in d.witness)      # both sides named
    assert any(w.startswith("role producer: wait at line") for w in d.witness)


def test_a_deadlock_only_at_a_ragged_dimension_is_found():
    # the producer loads K // BK tiles, the consumer waits for cdiv(K, BK): equal at tile multiples only
    text = SEED.replace("        for kt in range(cdiv(K, BK)):\n            wait(empty",
                        "        for kt in range(K // BK):\n            wait(empty", 1)
    assert text != SEED
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert d.line == 16 and "full[" in d.message
    assert any(w.startswith("launch: K=") and "K=769" in w for w in d.witness)


def test_a_deadlock_only_in_a_cta_other_than_the_first_is_found():
    text = _plant(ARRIVE, "            if bid.x == 0:\n                arrive(empty[kt % S])\n")
    hits = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert hits and "first CTA of the run (1, 0, 0)" in hits[0].witness[-1]


def test_a_slot_index_out_of_range_at_some_trip():
    # kt % S - 1 lies in [-1, S - 2]: below its slots at kt = 0 (the verifier's bound only catches the top end)
    text = _plant("tma_load(a_s[kt % S]", "tma_load(a_s[kt % S - 1]")
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.slot_range"]
    assert d.line == 11 and "at -1" in d.message and "trip kt=0" in d.witness[0]


def test_every_corpus_kernel_decides():
    for p in corpus_files("*.cake"):
        assert _protocol(p.read_text()) == [], p.name


def test_an_accumulator_read_before_its_wgmma_is_waited_for():
    # the interpreter runs wgmma synchronously, so only this check sees the race
    n256 = corpus_file("gemm_bf16_ws_n256.cake").read_text()
    assert not [d for d in check_text(n256) if d.rule == "protocol.acc_in_flight"]
    racy = n256.replace("        wgmma_wait(0)\n", "", 1)
    hits = [d for d in check_text(racy, "racy.cake") if d.rule == "protocol.acc_in_flight"]
    assert hits and hits[0].line == 21 and "store reads accumulator `acc`" in hits[0].message
    assert "wgmma at line 17" in hits[0].message and hits[0].hint.startswith("wgmma_wait(n)")
    # waiting for all but the newest group is not enough when the newest writes the tile read
    kws = corpus_file("kmeans_assign_ws.cake").read_text()
    early = kws.replace("            wgmma_wait(2)\n", "            wgmma_wait(3)\n")
    assert [d.line for d in check_text(early) if d.rule == "protocol.acc_in_flight"] == [42]   # the argmin


def test_a_barrier_completes_the_phases_of_many_arrivals_at_once():
    # one arrive of a role of a huge warp range on a barrier of one arrival: as many phases as arrivals beyond
    # the pending one, in one step (completing them one by one would not finish)
    from cake_core.ir.protocol_state import Bar
    b = Bar(arrivals=1, pending=1)
    b.pending -= 10 ** 12
    b.settle()
    assert (b.done, b.pending) == (10 ** 12, 1)
    b = Bar(arrivals=2, pending=2, tx=64)
    b.pending -= 2
    b.settle()
    assert b.done == 0                   # the bytes are not in yet
    b.tx = 0
    b.settle()
    assert (b.done, b.pending) == (1, 2)


def test_a_role_of_a_huge_warp_range_is_refused_without_simulating_each_warpgroup():
    # fuzz seed 11, mutant 2785: a role moved to warps (0, 10**6) arrives 250,000 times at once
    text = _plant('warps=(4, 12)', 'warps=(4, 4000000004)')
    rules = {d.rule for d in check_text(text) if d.is_error}
    assert "role.bounds" in rules


def test_a_ring_of_a_million_barriers_is_undecided_within_seconds():
    # the barriers indexed by the trip, not the ring slot: every wait passes a fresh barrier, so the producer's
    # barriers seen grow with the trips. Judging a refill must not walk all of them (32 s of CPU did, on the
    # 2-core box): the reader's few arrives since its read are walked instead, and the budget ends the check
    text = (SEED.replace("full = mbarrier(S)", "full = mbarrier(1000000)")
            .replace("empty = mbarrier(S, arrivals=2)", "empty = mbarrier(1000000, arrivals=2)")
            .replace("wait(empty[kt % S], phase=(kt // S + 1) % 2)", "wait(empty[kt], phase=1)")
            .replace("wait(full[kt % S], phase=kt // S % 2)", "wait(full[kt], phase=0)")
            .replace("full[kt % S]", "full[kt]").replace("arrive(empty[kt % S])", "arrive(empty[kt])")
            .replace("range(cdiv(K, BK))", "range(cdiv(K, BK) * 1000)"))
    assert "kt % S]" in text and "full[kt % S]" not in text and "empty[kt % S]" not in text
    t0 = time.process_time()
    rules = [d.rule for d in _protocol(text)]
    assert time.process_time() - t0 < 10
    assert rules == ["protocol.undecided"]


def test_a_ring_past_the_checkers_limit_is_undecided_at_once_and_one_at_it_is_run_around():
    # fuzz seed 11, mutant 2637: a barrier of a million slots that the kernel indexes at 0 only; the dims were sized
    # for every ring to wrap, and the simulation spent its whole step budget (5 s of CPU) before saying undecided
    from cake_core.ir.protocol import MAX_RING
    def with_barriers(count: int) -> str:
        return _plant("empty = mbarrier(S, arrivals=2)", f"empty = mbarrier(S, arrivals=2)\n    turn = mbarrier({count})")
    assert _protocol(with_barriers(MAX_RING)) == []
    for count in (MAX_RING + 1, 1000000):
        t0 = time.process_time()
        found = _protocol(with_barriers(count))
        assert time.process_time() - t0 < 1
        assert [d.rule for d in found] == ["protocol.undecided"]
        assert f"a ring of {count} slots" in found[0].message


def test_a_program_refused_by_another_rule_spends_a_smaller_budget_and_no_undecided_of_its_own(monkeypatch):
    # the same 50,000x loop beside an error another rule reports: the simulation stops at REFUSED_STEPS with no
    # protocol verdict (the program is refused already; its protocol is checked in full once the error is fixed)
    import cake_core.ir.protocol as protocol
    huge = SEED.replace("range(cdiv(K, BK))", "range(cdiv(K, BK) * 50000)")
    bad = huge.replace("regs=232", "regs=7")
    rules = {d.rule for d in check_text(bad, "bad.cake")}
    assert rules == {"setmaxnreg.value"}, rules
    budgets = []
    real = protocol.Budget
    monkeypatch.setattr(protocol, "Budget", lambda limit: budgets.append(real(limit)) or budgets[-1])
    ctx = build_ctx(parse_program(huge), get_arch("sm_90a"))
    ctx.refused = True
    assert check_protocol(ctx) == []
    assert budgets[0].limit == protocol.REFUSED_STEPS and budgets[0].used == protocol.REFUSED_STEPS + 1
    # a protocol finding within the smaller budget is still reported beside the other error
    stuck = bad.replace("            arrive(empty[kt % S])\n", "")
    rules = {d.rule for d in check_text(stuck)}
    assert "protocol.deadlock" in rules and "setmaxnreg.value" in rules and "protocol.undecided" not in rules
