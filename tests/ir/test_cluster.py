"""2-CTA clusters with TMA multicast: the B tile loaded once per cluster and multicast to both CTAs, ring slots
released in both CTAs (arrive(multicast=...)); the interpreter runs a cluster's CTAs concurrently, the protocol
checker simulates both CTAs, and the cluster rules (resources.cluster, cluster.sync) on planted mistakes. The
ping-pong kmeans kernel of a cluster (centroid tiles multicast, a ring of x tiles per output tile) for the
races that show only at one tile of a dimension or with one CTA's producer ahead of its peer's."""
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.interp import InterpFault
from cake_core.ir.protocol import check_protocol
from cake_core.targets import get_arch
from cake_core.ir.text import parse_program
from cake_core.ir.verify import build_ctx
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
MC = corpus_file("gemm_bf16_persistent_mc.cake").read_text()
PP_MC = corpus_file("kmeans_assign_pingpong_mc.cake").read_text()
GEMM = get_problem("gemm_bf16")
RELEASE = "kt + S - 1) % S], multicast=3)"                                   # the in-loop release, both CTAs
LAST = "cdiv(K, BK) + S - 1) % S], multicast=3)"                             # the tile's last slot, both CTAs
B_LOAD = "kt) % S], multicast=3)\n"                                          # rank 0 multicasts B


def _protocol(text: str):
    return check_protocol(build_ctx(parse_program(text), get_arch("sm_90a")))


def _plant(old: str, new: str, text: str = MC) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_the_multicast_seed_is_canonical_and_passes_every_rule():
    assert parse_program(MC).text() == MC
    assert check_text(MC) == []


def test_the_multicast_seed_matches_the_oracle_in_the_interpreter():
    shapes = [{"M": 96, "N": 80, "K": 72}, {"M": 128, "N": 256, "K": 64}, {"M": 200, "N": 72, "K": 136},
              {"M": 129, "N": 264, "K": 520}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72},
              {"M": 300, "N": 1000, "K": 24}]
    checks = check_on_cpu(parse_program(MC), GEMM, shapes, seed=17)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_the_interpreter_runs_more_clusters_than_one():
    p = parse_program(MC)
    shape = {"M": 1000, "N": 600, "K": 136}            # 4 tile-row pairs x 3 tile columns = 12 cluster tiles
    assert interp.grid_size(p, shape, num_sms=6) == (6,)
    rng = np.random.default_rng(3)
    x = GEMM.make_inputs(shape, rng)
    out = {"c": np.full((1000, 600), np.nan, np.float32)}
    interp.run(p, shape, x, out, num_sms=6)
    assert np.allclose(out["c"], GEMM.oracle(x)["c"], rtol=1e-3, atol=1e-2)


def test_a_grid_that_is_not_whole_clusters_faults():
    odd = _plant("num_sms // 2) * 2,)", "num_sms // 2) * 2 + 1,)")
    x = GEMM.make_inputs({"M": 256, "N": 256, "K": 64}, np.random.default_rng(0))
    with pytest.raises(InterpFault, match="whole number of clusters"):
        interp.run(parse_program(odd), {"M": 256, "N": 256, "K": 64}, x, {"c": np.zeros((256, 256), np.float32)})


def test_releasing_a_slot_in_one_cta_only_is_a_deadlock():
    # the peer's producer waits for 4 arrivals on its empty barrier; 2 come
    found = [d for d in _protocol(_plant(RELEASE, "kt + S - 1) % S])")) if d.rule == "protocol.deadlock"]
    assert found and "@0" in found[0].message and any("producer@1" in w for w in found[0].witness)
    assert "protocol.deadlock" in [d.rule for d in _protocol(_plant(LAST, "cdiv(K, BK) + S - 1) % S])"))]


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_a_local_release_is_a_race_on_the_peers_slot():
    # every release local and 2 arrivals a phase: each producer waits for its own consumers only, and rank 0's
    # multicast overwrites rank 1's b_s slot while rank 1's wgmma may still read it
    text = _plant(RELEASE, "kt + S - 1) % S])")
    text = _plant(LAST, "cdiv(K, BK) + S - 1) % S])", text)
    text = _plant("empty = mbarrier(S, arrivals=4)", "empty = mbarrier(S, arrivals=2)", text)
    errors = [d for d in check_text(text) if d.is_error]
    assert [d.rule for d in errors] == ["protocol.multicast_reuse"], [(d.rule, d.message) for d in errors]
    d = errors[0]
    assert d.line == _line(text, "tma_load(b_s[")                   # at the multicast copy
    assert "multicast tma_load of CTA 0 overwrites smem slot b_s[0] of CTA 1" in d.message
    assert "releases it on CTA 1's barriers only (empty[0]@1" in d.message
    assert any("role producer@0, CTA 0, trip t=0, kt=4" in w for w in d.witness)
    assert any("role consumer@1, CTA 1, trip t=0, kt=0" in w for w in d.witness)
    assert "multicast=0x3" in d.hint


def test_a_producer_without_its_empty_wait_overwrites_the_peers_slot():
    # the producers no longer wait on the empty ring: rank 0's multicast refills b_s in both CTAs while their
    # consumers may still read it; the peer's slot is named apart from the own CTA's
    text = "".join(ln for ln in MC.splitlines(keepends=True) if not ln.lstrip().startswith("wait(empty["))
    assert text != MC
    hits = [d for d in check_text(text) if d.rule == "protocol.multicast_reuse"]
    assert hits and hits[0].line == _line(text, "tma_load(b_s[")
    assert "smem slot b_s[0] of CTA 1" in hits[0].message and "CTA 0" in hits[0].message
    assert any("role consumer@1, CTA 1, trip t=0, kt=0" in w for w in hits[0].witness)
    own = [d for d in check_text(text) if d.rule == "protocol.slot_reuse"]
    assert any("b_s@0[0]" in d.message for d in own)


def test_a_multicast_copy_into_released_slots_passes():
    # the rule's twin: the seed (releases on both CTAs' barriers, waited for by the multicasting producer)
    assert not [d for d in check_text(MC) if d.rule.startswith("protocol.")]


def test_b_loaded_without_multicast_starves_the_peer():
    text = _plant(B_LOAD, "kt) % S])\n")
    rules = [d.rule for d in _protocol(text)]
    assert "protocol.tx_mismatch" in rules


def test_remote_arrivals_count_once_per_cluster_cta():
    assert "mbarrier.arrivals" not in [d.rule for d in check_text(MC)]
    text = _plant("empty = mbarrier(S, arrivals=4)", "empty = mbarrier(S, arrivals=2)")
    assert "mbarrier.arrivals" in [d.rule for d in check_text(text)]


def test_cluster_sync_before_remote_writes_and_before_exit():
    assert "cluster.sync" not in [d.rule for d in check_text(MC)]
    no_start = _plant("    empty = mbarrier(S, arrivals=4)\n    cluster_sync()\n", "    empty = mbarrier(S, arrivals=4)\n")
    no_end = MC[:MC.rindex("    cluster_sync()")]
    for text in (no_start, no_end):
        assert "cluster.sync" in [d.rule for d in check_text(text)]


def test_an_arrive_mask_beyond_the_cluster():
    text = _plant(RELEASE, "kt + S - 1) % S], multicast=7)")
    assert "resources.cluster" in [d.rule for d in check_text(text)]


def _drop(text: str, start: str) -> str:
    """``text`` without the one line whose statement starts with ``start``."""
    lines = text.splitlines(keepends=True)
    assert sum(ln.lstrip().startswith(start) for ln in lines) == 1, start
    return "".join(ln for ln in lines if not ln.lstrip().startswith(start))


def test_the_pingpong_multicast_kernel_passes():
    # its x tiles are released by the consumers' x_empty arrive and, earlier, by the arrives of the centroid
    # rings that follow their reads: a read is released by every later arrive of its role, not the first alone
    assert check_text(PP_MC) == []


def test_an_x_tile_refilled_without_its_empty_wait_is_found_at_one_tile_of_k():
    # with K at one centroid tile pair the inner ring no longer orders the refill of x after the reads: only
    # the x_empty wait did, and the launch with K = 1 shows it
    text = _drop(PP_MC, "wait(x_empty[")
    hits = [d for d in check_text(text) if d.rule == "protocol.slot_reuse"]
    assert hits and hits[0].line == _line(text, "tma_load(x0[")
    assert "smem slot x0@1[0]" in hits[0].message
    assert any("role consumer0@1" in w for w in hits[0].witness)
    assert any(w.startswith("launch: ") and "K=1," in w for w in hits[0].witness)


def test_a_consumer_that_never_releases_its_x_tile_is_found():
    # consumer0 no longer arrives on x_empty (one arrival a phase left): the producer refills x0 under its reads
    lines = PP_MC.splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("arrive(x_empty["))
    text = _plant("x_empty = mbarrier(2, arrivals=2)", "x_empty = mbarrier(2, arrivals=1)",
                  "".join(lines[:first] + lines[first + 1:]))
    hits = [d for d in check_text(text) if d.rule == "protocol.slot_reuse"]
    assert hits and "x0@" in hits[0].message and any("role consumer0@" in w for w in hits[0].witness)


def test_a_producer_running_ahead_of_its_peer_overfills_a_phase():
    # rank 1 issues no centroid copy, only its expect_tx: without its empty_a wait it may expect the bytes of
    # round r + S before the multicast copy of round r lands, two expect_tx in one phase of full_a. Only the
    # schedule in which rank 1's producer runs ahead of rank 0's shows it
    lines = PP_MC.splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("wait(empty_a["))
    pad = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    text = "".join(lines[:i] + [f"{pad}if bid.x % 2 == 0:\n", "    " + lines[i]] + lines[i + 1:])
    hits = [d for d in check_text(text) if d.rule == "protocol.tx_mismatch"]
    assert hits and "full_a[0]@1" in hits[0].message
    assert any(w.endswith("schedule producer@1 greedy") for w in hits[0].witness)
