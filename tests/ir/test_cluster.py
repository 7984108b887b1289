"""2-CTA clusters with TMA multicast: the B tile loaded once per cluster and multicast to both CTAs, ring slots
released in both CTAs (arrive(multicast=...)); the interpreter runs a cluster's CTAs concurrently, the protocol
checker simulates both CTAs, and the cluster rules (resources.cluster, cluster.sync) on planted mistakes."""
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


def test_a_local_release_is_a_race_on_the_peers_slot():
    # every release local and 2 arrivals a phase: each producer waits for its own consumers only, and rank 0's
    # multicast overwrites rank 1's b_s slot while rank 1's wgmma may still read it
    text = _plant(RELEASE, "kt + S - 1) % S])")
    text = _plant(LAST, "cdiv(K, BK) + S - 1) % S])", text)
    text = _plant("empty = mbarrier(S, arrivals=4)", "empty = mbarrier(S, arrivals=2)", text)
    hits = [d for d in _protocol(text) if d.rule == "protocol.slot_reuse"]
    assert hits and "b_s@1" in hits[0].message
    assert any("role producer@0" in w for w in hits[0].witness) and any("role consumer@1" in w for w in hits[0].witness)


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
