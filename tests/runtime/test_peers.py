"""Peers and the row-subset oracle, on the CPU: the adapters refuse cleanly without torch, and the
oracle on a subset of rows agrees with the full oracle (and catches a wrong row)."""
from __future__ import annotations

import builtins
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from cake_core.errors import CakeError
from cake_core.problems import PROBLEMS, get_problem
from cake_core.ir.numeric import bf16_round
from cake_core.runtime.gate import pick_rows
from cake_core.runtime.peers import BF16_C_RTOL, PEERS, PeerUnavailable, make_peer

SMALL = {"gemm_bf16": {"M": 40, "N": 33, "K": 50}, "tinygemm": {"M": 9, "N": 70, "K": 40},
         "kmeans_assign": {"B": 3, "N": 77, "K": 20, "D": 9}, "kmeans_update": {"B": 3, "N": 200, "K": 13, "D": 7},
         "knn_topk": {"Q": 30, "N": 90, "D": 8, "k": 5}}


def _outputs(p, want):
    return {n: np.asarray(want[n]).copy() for n in p.outputs}


def test_every_problem_has_peers_and_a_small_shape_here():
    assert set(PEERS) == set(PROBLEMS) == set(SMALL)
    assert all(PEERS[n] for n in PEERS)


@pytest.fixture
def no_torch(monkeypatch):
    real = builtins.__import__

    def imp(name, *a, **k):
        if name == "torch" or name.startswith("torch.") or name.startswith("flash_kmeans"):
            raise ImportError(f"No module named '{name}' (test)")
        return real(name, *a, **k)

    for m in [m for m in sys.modules if m == "torch" or m.startswith(("torch.", "flash_kmeans"))]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setattr(builtins, "__import__", imp)


@pytest.mark.parametrize("problem,peer", [(p, n) for p, names in sorted(PEERS.items()) for n in names])
def test_peers_refuse_cleanly_without_torch(no_torch, problem, peer):
    p = get_problem(problem)
    x = p.make_inputs(SMALL[problem], np.random.default_rng(0))
    with pytest.raises(PeerUnavailable) as e:
        make_peer(problem, peer, x)
    msg = str(e.value)
    assert "PyTorch" in msg and "GPU machine" in msg


def test_unknown_problem_or_peer_is_a_cake_error():
    with pytest.raises(CakeError, match="no peers for problem"):
        make_peer("nope", "torch", {})
    with pytest.raises(CakeError, match="its peers: torch"):
        make_peer("knn_topk", "faiss", {})


@pytest.mark.parametrize("name", sorted(SMALL))
def test_subset_oracle_agrees_with_the_full_oracle(name):
    p = PROBLEMS[name]
    assert p.rows is not None
    shape = SMALL[name]
    x = p.make_inputs(shape, np.random.default_rng(3))
    full = p.oracle(x)
    got = _outputs(p, full)
    rows = pick_rows(p, shape, 7, seed=4)
    assert rows.size == min(7, p.rows.count(shape)) and np.all(np.diff(rows) > 0)
    sub = p.oracle_rows(x, rows)
    cut = p.take_rows(got, rows)
    for n in p.outputs:   # the same values the full oracle gives for those rows
        np.testing.assert_array_equal(np.asarray(cut[n], np.float64), np.asarray(sub[n], np.float64))
    ok, err, msg = p.compare(cut, sub)
    assert ok and err <= p.rtol, msg
    # all rows at once: the whole output
    every = np.arange(p.rows.count(shape))
    assert p.compare(p.take_rows(got, every), p.oracle_rows(x, every))[0]


def test_bench_table_and_floor_import_on_cpu():
    path = Path(__file__).resolve().parents[2] / "bench" / "corpus_vs_peers.py"
    spec = importlib.util.spec_from_file_location("corpus_vs_peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    p = get_problem("tinygemm")
    s = {"M": 1, "N": 8192, "K": 8192}
    assert mod.floor_ms(p, s) == pytest.approx(1e3 * p.bytes(s) / 4.22e12)       # the weight read
    assert mod.floor_ms(p, s) == pytest.approx(0.0318, rel=0.01)
    row = {"problem": "tinygemm", "shape_key": "M=1,N=8192,K=8192", "check": "full oracle", "floor_ms": 0.0318,
           "ours": [{"program": "seed", "median_ms": 0.5, "correct": True}],
           "peers": [{"peer": "torch.matmul", "median_ms": 0.05, "correct": True}]}
    lines = mod.table([row, {"problem": "knn_topk", "shape_key": "Q=1", "skipped": "deadline"}])
    assert "0.1x" in lines[2] and "6.36%" in lines[2] and "63.6%" in lines[2]
    assert "skipped: deadline" in lines[3]


def _bench_module():
    path = Path(__file__).resolve().parents[2] / "bench" / "corpus_vs_peers.py"
    spec = importlib.util.spec_from_file_location("corpus_vs_peers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_targets_take_our_fastest_correct_program_against_the_fastest_reference():
    mod = _bench_module()
    key = "B=32,N=65536,K=1024,D=128"

    def row(ours, peers, shape_key=key, problem="kmeans_assign"):
        return {"problem": problem, "shape_key": shape_key, "shape": {}, "floor_ms": 0.7,
                "ours": [{"program": n, "median_ms": ms, "correct": ok} for n, ms, ok in ours],
                "peers": [{"peer": f"{n} (its library)", "key": n, "median_ms": ms, "correct": ok}
                          for n, ms, ok in peers]}     # rows name a peer for people; targets go by key
    # a wrong program is never the best, however fast; the torch peer is not the reference
    lines, data = mod.verdicts([row([("seed", 30.0, True), ("fast_but_wrong", 0.1, False), ("ws", 1.0, True)],
                                    [("flash-kmeans", 1.58, True), ("torch", 0.5, True)])])
    r = data["kmeans_assign"]["rows"][0]
    assert (r["ours"], r["ref"], r["met"]) == ("ws", "flash-kmeans (its library)", True) and r["ratio"] == pytest.approx(1.58)
    assert r["pct_floor"] == pytest.approx(70.0)
    lines, data = mod.verdicts([row([("ws", 1.3, True)], [("flash-kmeans", 1.58, True)]),
                                row([("ws", 1.0, True)], [("flash-kmeans", 0.9, True)], shape_key="B=1,N=2,K=3,D=4")])
    assert data["kmeans_assign"]["rows"][0]["met"] is False          # 1.22x < 1.3x
    assert data["kmeans_assign"]["rows"][1]["met"] is None           # not a target row, still in the geomean
    assert data["kmeans_assign"]["geomean"] == pytest.approx((1.58 / 1.3 * 0.9) ** 0.5)
    assert "NO" in lines[-1] and "geomean" in lines[-1]
    # a shape where none of ours is correct, or one the deadline skipped, counts against the geomean
    good = row([("ws", 1.0, True)], [("flash-kmeans", 1.6, True)])
    lines, data = mod.verdicts([good, row([("seed", 17.0, False)], [("flash-kmeans", 0.36, True)], "B=4,N=1,K=1,D=100")])
    assert data["kmeans_assign"]["geomean"] == pytest.approx(1.6) and data["kmeans_assign"]["missing"] == ["B=4,N=1,K=1,D=100"]
    assert lines[-1].endswith("| NO |") and "1 without a ratio: B=4,N=1,K=1,D=100" in lines[-1]
    lines, _ = mod.verdicts([good, {"problem": "kmeans_assign", "shape_key": "B=9", "skipped": "deadline"}])
    assert lines[-1].endswith("| NO |") and "without a ratio: B=9" in lines[-1]
    lines, _ = mod.verdicts([good])
    assert lines[-1].endswith("| yes |")
    # tinygemm: within 15 % of the weight-read floor counts even below 1.3x cuBLAS
    s = {"M": 1, "N": 4096, "K": 4096}
    wf = mod.weight_floor_ms(s)
    near = row([("splitk", 1.1 * wf, True)], [("torch.mm_f32", 1.2 * wf, True)], "M=1,N=4096,K=4096", "tinygemm")
    far = row([("splitk", 1.3 * wf, True)], [("torch.mm_f32", 1.4 * wf, True)], "M=1,N=4096,K=4096", "tinygemm")
    near["shape"] = far["shape"] = s
    _, data = mod.verdicts([near, far])
    assert [r["met"] for r in data["tinygemm"]["rows"]] == [True, False]
    # no correct reference peer: the row says so and is not met
    lines, _ = mod.verdicts([row([("ws", 1.0, True)], [("flash-kmeans", 1.0, False)])])
    assert "no correct reference peer" in lines[-2] and lines[-2].endswith("no |")
    assert "geomean of 0 shapes" in lines[-1] and lines[-1].endswith("| NO |")


def test_a_bf16_c_passes_at_the_bf16_tolerance_not_at_the_fp32_one():
    """torch.matmul's bf16 C is right up to bf16 rounding: the fp32 tolerance calls it wrong."""
    p = get_problem("tinygemm")
    x = p.make_inputs({"M": 16, "N": 512, "K": 256}, np.random.default_rng(0))
    want = p.oracle(x)
    c_bf16 = bf16_round(want["c"].astype(np.float32))
    assert not p.compare({"c": c_bf16}, want)[0]
    import dataclasses
    assert dataclasses.replace(p, rtol=BF16_C_RTOL).compare({"c": c_bf16}, want)[0]
    wrong = c_bf16.copy()
    wrong[3, 7] += 0.05 * np.abs(want["c"]).max()
    assert not dataclasses.replace(p, rtol=BF16_C_RTOL).compare({"c": wrong}, want)[0]


def test_a_kernel_refused_before_launch_is_a_refused_row_and_a_crash_an_error_row():
    import types

    from cake_core.runtime.gpu import GPURefused
    from cake_core.runtime.tma import TMARefused
    mod = _bench_module()
    args = types.SimpleNamespace(seed=0, reps=20, warmup=3, timeout_s=5, timer="event")

    def fake(exc):
        def check_and_time(*a, **k):
            raise exc
        return types.SimpleNamespace(GPURefused=GPURefused, check_and_time=check_and_time)

    prog = {"compiled": None, "lowered": None}
    r = mod.run_ours(fake(TMARefused("`x` has a global stride of 200 B")), prog, None, None, {}, args)
    assert (r["outcome"], r["correct"]) == ("refused", None) and "200 B" in r["message"]
    r = mod.run_ours(fake(RuntimeError("illegal address")), prog, None, None, {}, args)
    assert (r["outcome"], r["correct"]) == ("error", False)
    # a refused row is not ours being wrong: it neither counts as our best nor fails the run
    lines, data = mod.verdicts([{"problem": "kmeans_assign", "shape_key": "B=4,N=1,K=1,D=100", "shape": {},
                                 "floor_ms": 0.1, "ours": [dict(r, program="ws", outcome="refused", correct=None)],
                                 "peers": [{"peer": "flash", "key": "flash-kmeans", "median_ms": 0.36,
                                            "correct": True}]}])
    assert data["kmeans_assign"]["missing"] == ["B=4,N=1,K=1,D=100"]


def test_an_unknown_timer_is_refused_before_the_peer_runs():
    from cake_core.runtime.peers import PeerRun, time_peer
    ran = []
    peer = PeerRun("tinygemm", "p", "lib", run=lambda i: ran.append(i), fetch=dict)
    with pytest.raises(ValueError, match="unknown timer 'wall'"):
        time_peer(peer, timer="wall")
    assert ran == []


@pytest.mark.gpu
@pytest.mark.parametrize("problem,peer", [("tinygemm", "torch.mm_f32"), ("kmeans_update", "flash-kmeans-sorted")])
def test_a_peer_timed_by_graph_replay_runs_each_copy_and_stays_correct(problem, peer):
    # the graph holds one run per input copy (resets inside: kmeans_update's peers accumulate); after the
    # timed replays the outputs still match the oracle, so each run started from zeroed accumulators
    from cake_core.runtime.peers import time_peer
    from cake_core.runtime.timing import graph_launches
    p = get_problem(problem)
    shape = {"tinygemm": {"M": 8, "N": 4096, "K": 4096},
             "kmeans_update": {"B": 2, "N": 4096, "K": 64, "D": 128}}[problem]
    inputs = p.make_inputs(shape, np.random.default_rng(3))
    n = graph_launches(sum(int(v.nbytes) for v in inputs.values()))
    run = make_peer(problem, peer, inputs, copies=n)
    try:
        assert run.copies == n == 8
        t = time_peer(run, reps=20, timer="graph")
        assert t["timer"] == "cuda_graph (torch)" and t["runs"] == 20
        assert 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
        ok, err, msg = p.compare(run.fetch(), p.oracle(inputs))
        assert ok, msg
    finally:
        run.release()
