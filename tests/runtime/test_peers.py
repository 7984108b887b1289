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
from cake_core.problems import list_problems, get_problem
from cake_core.ir.numeric import bf16_round
from cake_core.runtime.gate import pick_rows
from cake_core.problems.common.matmul import BF16_C_RTOL
from cake_core.runtime.peers import PeerUnavailable, make_peer
from cake_core.problems import corpus_file

PROBLEMS = {p.name: p for p in list_problems()}
PEERS = {p.name: tuple(p.peers) for p in list_problems()}

SMALL = {"gemm_bf16": {"M": 40, "N": 33, "K": 50}, "tinygemm": {"M": 9, "N": 70, "K": 40},
         "kmeans_assign": {"B": 3, "N": 77, "K": 20, "D": 9}, "kmeans_update": {"B": 3, "N": 200, "K": 13, "D": 7},
         "knn_topk": {"Q": 30, "N": 90, "D": 8, "k": 5}, "knn_search": {"B": 2, "Q": 30, "M": 90, "D": 8, "k": 5, "S": 2},
         "kda_decode": {"B": 2, "H": 3, "DK": 16, "DV": 12},
         "kda_prefill": {"B": 2, "T": 3, "H": 2, "DK": 16, "DV": 12}, "moe": {"M": 3, "H": 16, "I": 8, "E": 6, "k": 2},
         "kda_varlen": {"N": 2, "T": 5, "H": 2, "DK": 16, "DV": 12}, "mha": {"H": 2, "T": 9, "DH": 8},
         "grouped_gemm": {"T": 5, "topk": 2, "E": 6, "K": 16, "N": 8}}


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
    with pytest.raises(CakeError, match="unknown problem `nope`"):
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
    cut = p.take_rows(got, rows, shape)
    for n in p.outputs:   # the same values the full oracle gives for those rows, up to the order of the sums
        # (a BLAS product of 7 rows and one of all rows may block, and so round, differently: last-place ulps)
        np.testing.assert_allclose(np.asarray(cut[n], np.float64), np.asarray(sub[n], np.float64), rtol=1e-12, atol=0)
    ok, err, msg = p.compare(cut, sub)
    assert ok and err <= p.rtol, msg
    # all rows at once: the whole output
    every = np.arange(p.rows.count(shape))
    assert p.compare(p.take_rows(got, every, shape), p.oracle_rows(x, every))[0]


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
    wf = mod.weight_floor_ms("tinygemm", s)
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


def test_a_peer_needs_its_library_before_any_input_is_drawn(no_torch):
    from cake_core.runtime.peers import require
    with pytest.raises(PeerUnavailable, match="PyTorch"):
        require("kmeans_assign", "torch")
    with pytest.raises(PeerUnavailable, match="PyTorch"):        # flash-kmeans runs on torch: that is named first
        require("kmeans_assign", "flash-kmeans")
    with pytest.raises(CakeError, match="its peers: torch"):
        require("knn_topk", "faiss")


def test_measuring_a_peer_that_cannot_run_here_draws_nothing(no_torch, monkeypatch):
    from cake_core.runtime import peers

    def draw(*a, **k):
        raise AssertionError("inputs drawn for a peer that cannot run")
    monkeypatch.setattr(peers, "device_reference", draw)
    with pytest.raises(PeerUnavailable, match="PyTorch"):
        peers.measure_peer(get_problem("kmeans_assign"), "flash-kmeans", SMALL["kmeans_assign"], 0, reps=20)


# ---------------------------------------------------------------- on the GPU: device inputs, the gate's reference

GPU_SHAPES = {"gemm_bf16": {"M": 256, "N": 192, "K": 128}, "tinygemm": {"M": 8, "N": 512, "K": 256},
              "kmeans_assign": {"B": 2, "N": 1024, "K": 64, "D": 128},
              "kmeans_update": {"B": 2, "N": 4096, "K": 64, "D": 128},
              "knn_topk": {"Q": 64, "N": 1024, "D": 64, "k": 8},
              "knn_search": {"B": 2, "Q": 64, "M": 1024, "D": 64, "k": 8, "S": 2},
              "grouped_gemm": {"T": 16, "topk": 8, "E": 128, "K": 2048, "N": 768}}


def _cupy_and_torch():
    from cake_core.runtime.gpu import gpu_model
    if gpu_model() is None:
        pytest.skip("no usable NVIDIA GPU here")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    import cupy
    return cupy


@pytest.mark.gpu
@pytest.mark.parametrize("problem,peer", [(p, n) for p, names in sorted(PEERS.items()) for n in names])
def test_a_peer_reads_the_gates_device_inputs_and_gets_their_values(problem, peer):
    # CuPy inputs (the gate's draw) go to torch on the device; the peer's output is right against the oracle of
    # a host copy of those very values, so every factory read the values, not a host-only view of them
    import dataclasses

    from cake_core.problems.base import input_sampler, to_host
    cp = _cupy_and_torch()
    p = get_problem(problem)
    shape = GPU_SHAPES[problem]
    dev = p.make_inputs(shape, input_sampler(11, shape, cp))
    host = {k: v if k.startswith("_") else to_host(v) for k, v in dev.items()}
    try:
        run = make_peer(problem, peer, dev)
    except PeerUnavailable as e:
        pytest.skip(str(e))
    try:
        if run.reset:
            run.reset()
        run.run(0)
        got = run.fetch()
        judged = p if run.rtol is None else dataclasses.replace(p, rtol=run.rtol)
        ok, err, msg = judged.compare(got, p.oracle(host))
        assert ok, (peer, msg)
        for n in p.inputs:      # the peer copied them: the gate's arrays are as they were drawn
            np.testing.assert_array_equal(to_host(dev[n]), host[n])
    finally:
        run.release()


def _hand_written_job(problem, shape, seed, tmp_path):
    from cake_core.ir.text import parse_program
    from cake_core.lower import compile_kernel, lower
    from cake_core.pipeline.execute import GpuJob
    name = get_problem(problem).best_files[0]
    lr = lower(parse_program(corpus_file(name).read_text(), name), name)
    assert lr.ok, lr.diagnostics
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return GpuJob((0, 0), lr.value, Path(cr.value.cubin_path).read_bytes(), cr.value.kernel_name, problem, shape,
                  seed, 20, False)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,check", [({"M": 256, "N": 256, "K": 256}, "full (256 rows)"),
                                         ({"M": 4096, "N": 4096, "K": 2048}, "rows (256 rows)")])
def test_a_peer_is_measured_against_the_reference_the_hand_written_kernel_cached(tmp_path, shape, check):
    # as the final stage measures the baselines: the hand-written kernel first, then each peer at the same seed;
    # the peer's check reuses the kernel's reference (on a row subset of the large shape, the same rows)
    from cake_core.outcome import Outcome
    from cake_core.pipeline.execute import GpuSession, gate_rows
    _cupy_and_torch()
    assert (gate_rows("gemm_bf16", shape) is None) == check.startswith("full")
    session = GpuSession(refs_dir=tmp_path / "refs")
    kernel = session.run(_hand_written_job("gemm_bf16", shape, 7926, tmp_path))
    assert kernel.correct, kernel.message
    assert session.refs.stored == 1 and session.refs.hits == 0
    for n, peer in enumerate(("torch.mm_f32", "torch.matmul"), start=1):     # fp32 C, and bf16 C at its rtol
        v = session.peer("gemm_bf16", peer, shape, 7926, 20)
        assert v.outcome is Outcome.MEASURED, v.message
        assert v.message == f"correct; {check}; reference cached" and v.timing.runs == 20
        assert 0 < v.timing.p10_ms <= v.timing.median_ms <= v.timing.p90_ms
        assert session.refs.hits == n and session.refs.stored == 1
    # another seed draws other inputs: its reference is computed, not the cached one
    other = session.peer("gemm_bf16", "torch.mm_f32", shape, 7927, 20)
    assert other.outcome is Outcome.MEASURED and other.message.endswith("reference computed"), other.message
    assert session.poisoned is None


def test_a_shape_outside_a_programs_domain_is_a_refused_row_not_a_wrong_one():
    """The GPU gate refuses a shape outside the program's domain before launch (``ShapeRun.refused``, outcome
    wrong); the bench's row says refused, and only a program that ran and was wrong makes the exit code 2."""
    from dataclasses import dataclass

    mod = _bench_module()

    @dataclass
    class Run:
        correct: bool
        outcome: str
        message: str
        median_ms: float | None
        max_error: float | None
        refused: bool

    class Gpu:
        GPURefused = RuntimeError

        def __init__(self, run):
            self.run = run

        def check_and_time(self, *a, **kw):
            return [self.run]

    class Args:
        seed, reps, warmup, timeout_s, timer = 0, 1, 0, 1.0, "event"

    prog = {"compiled": None, "lowered": None}
    out = mod.run_ours(Gpu(Run(False, "wrong", "refused: k = 32 > 16", None, None, True)), prog, None, None, {},
                       Args())
    assert (out["correct"], out["outcome"]) == (None, "refused")
    wrong = mod.run_ours(Gpu(Run(False, "wrong", "max error 0.5", None, 0.5, False)), prog, None, None, {}, Args())
    assert (wrong["correct"], wrong["outcome"]) == (False, "wrong")
    row = {"problem": "knn_search", "shape_key": "k=32", "check": "full oracle", "floor_ms": 0.01,
           "ours": [dict(out, program="k16")], "peers": [{"peer": "torch", "median_ms": 0.2, "correct": True}]}
    assert "k16 (refused)" in mod.table([row])[2]
