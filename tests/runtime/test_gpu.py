"""GPU runtime: the correctness gate and timing on an NVIDIA GPU (marked `gpu`: run on the H200 machine).

    PYTHONPATH=. python3 -m pytest -m gpu tests/runtime -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower.compile import Compiled, Resources
from cake_core.problems import get_problem

GEMM = get_problem("gemm_bf16")
SEED = GEMM.seed_text()
BIG = [{"M": 1000, "N": 1000, "K": 1000}, {"M": 2047, "N": 1025, "K": 513}]


def _build(text: str, tmp_path):
    lr = lower(parse_program(text, "kernel.cake"))
    assert lr.ok, lr.diagnostics
    cr = compile_kernel(lr.value, cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lr.value


def test_module_imports_without_a_gpu_and_refuses_compile_only_targets(tmp_path):
    from cake_core.runtime import gpu
    lr = lower(parse_program(SEED, "kernel.cake")).value
    fake = Compiled(tmp_path / "x.cubin", "gemm_bf16", Resources(1, 0, 0, 0, 0), "0", 0.0, False, "sm_100a")
    with pytest.raises(gpu.GPURefused, match="compile-only"):
        gpu.check_and_time(fake, lr, GEMM, [{"M": 8, "N": 8, "K": 8}], seed=0)


def test_a_timing_cutoff_is_refused_under_the_graph_timer_before_anything_runs(tmp_path):
    from cake_core.runtime import gpu
    lr = lower(parse_program(SEED, "kernel.cake")).value
    fake = Compiled(tmp_path / "x.cubin", "gemm_bf16", Resources(1, 0, 0, 0, 0), "0", 0.0, False, "sm_100a")
    with pytest.raises(gpu.GPURefused, match="cutoff applies to the event timer"):
        gpu.check_and_time(fake, lr, GEMM, [{"M": 8, "N": 8, "K": 8}], seed=0, timer="graph", cutoff_ms=1.0)
    with pytest.raises(gpu.GPURefused, match="compile-only"):     # the event timer takes one: on to the next check
        gpu.check_and_time(fake, lr, GEMM, [{"M": 8, "N": 8, "K": 8}], seed=0, timer="event", cutoff_ms=1.0)


@pytest.mark.gpu
def test_seed_passes_the_gate_on_small_and_odd_shapes(tmp_path):
    from cake_core.runtime.gpu import check_and_time, gpu_model
    assert gpu_model()
    compiled, lowered = _build(SEED, tmp_path)
    shapes = list(GEMM.shape_set("gemm_small").shapes) + BIG
    assert len(shapes) >= 6
    runs = check_and_time(compiled, lowered, GEMM, shapes, seed=7, time=False)
    bad = [(r.shape, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.outcome == "checked" and r.max_error < GEMM.rtol and r.median_ms is None for r in runs)


@pytest.mark.gpu
def test_timing_reports_cold_l2_cuda_event_statistics(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    compiled, lowered = _build(SEED, tmp_path)
    (r,) = check_and_time(compiled, lowered, GEMM, [{"M": 1024, "N": 1024, "K": 1024}], seed=1, reps=20)
    assert r.correct and r.outcome == "measured", r.message
    assert r.runs == 20 and r.timer == "cuda_event" and r.l2 == "cold-clean"
    assert 0 < r.p10_ms <= r.median_ms <= r.p90_ms


@pytest.mark.gpu
def test_a_kernel_timed_above_its_cutoff_stops_after_a_few_runs_and_says_so(tmp_path):
    # the time stage's path: a GpuJob through the worker's session. The naive seed at 1024^3 takes far longer
    # than a nanosecond: cut short after CUTOFF_MIN_REPS launches; far under a minute: every rep; no cutoff: every rep
    from cake_core.pipeline.execute import GpuJob, GpuSession
    from cake_core.runtime.timing import CUTOFF_MIN_REPS
    compiled, lowered = _build(SEED, tmp_path)
    shape = {"M": 1024, "N": 1024, "K": 1024}
    session = GpuSession(refs_dir=tmp_path / "refs")

    def timed(cutoff_ms):
        job = GpuJob((0, 0), lowered, Path(compiled.cubin_path).read_bytes(), compiled.kernel_name, "gemm_bf16",
                     shape, 1, 20, True, cutoff_ms)
        return session.run(job)

    cut, loose, full = timed(1e-6), timed(6e4), timed(None)
    assert cut.correct and cut.outcome.value == "measured" and cut.timing.runs == CUTOFF_MIN_REPS == 3, cut.message
    assert "timing cut short after 3 of 20 runs" in cut.message and "above the cutoff 1e-06 ms" in cut.message
    assert cut.timing.median_ms > 1e-6 and 0 < cut.timing.p10_ms <= cut.timing.median_ms <= cut.timing.p90_ms
    for v in (loose, full):
        assert v.correct and v.timing.runs == 20 and "cut short" not in v.message, v.message
    assert session.poisoned is None


@pytest.mark.gpu
def test_a_wrong_program_fails_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    wrong = SEED.replace("store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)",
                         "store(c[tile(bid.x, BM), tile(bid.y, BN)], acc)")     # the transposed tile
    assert wrong != SEED
    compiled, lowered = _build(wrong, tmp_path)
    runs = check_and_time(compiled, lowered, GEMM, [{"M": 128, "N": 192, "K": 64}, {"M": 96, "N": 80, "K": 72}],
                          seed=3, time=False)
    assert [r.correct for r in runs] == [False, False]
    assert all(r.outcome == "wrong" for r in runs)


@pytest.mark.gpu
def test_a_kernel_that_skips_the_k_tail_fails_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    wrong = SEED.replace("for kt in range(cdiv(K, BK)):", "for kt in range(K // BK):")
    compiled, lowered = _build(wrong, tmp_path)
    ok, tail = check_and_time(compiled, lowered, GEMM, [{"M": 128, "N": 128, "K": 64},
                                                        {"M": 96, "N": 80, "K": 72}], seed=3, time=False)
    assert ok.correct and not tail.correct and "max rel error" in tail.message


@pytest.mark.gpu
def test_an_accumulating_kernel_is_timed_and_still_correct_after_timing(tmp_path):
    # kmeans_update accumulates into zeroed outputs with atomics: every timed launch must start from
    # zero, or the re-check after timing sees the sums of all the launches and calls a correct kernel wrong
    from cake_core.runtime.gpu import check_and_time
    upd = get_problem("kmeans_update")
    compiled, lowered = _build(upd.seed_text(), tmp_path)
    (r,) = check_and_time(compiled, lowered, upd, [{"B": 2, "N": 150, "K": 20, "D": 40}], seed=2, reps=20)
    assert r.correct and r.outcome == "measured", r.message
    assert r.median_ms is not None and r.median_ms > 0


@pytest.mark.gpu
def test_the_smem_privatised_kmeans_update_is_correct_on_ragged_and_headline_shapes(tmp_path):
    # per-CTA shared-memory sums (smem scatter_add), cp.async ring, plain
    # stores when one CTA owns a (batch, D-slice) and atomic merges when points are split across CTAs
    from cake_core.runtime.gpu import check_and_time
    upd = get_problem("kmeans_update")
    text = upd.kernel_text("kmeans_update_smem.cake")
    compiled, lowered = _build(text, tmp_path)
    small = list(upd.shape_set("kmeans_update_small").shapes)
    odd = [{"B": 1, "N": 5000, "K": 1500, "D": 72},       # K > KMAX: the global-atomic branch
           {"B": 40, "N": 3001, "K": 1024, "D": 128}]     # one CTA per (batch, D-slice): plain stores
    runs = check_and_time(compiled, lowered, upd, small + odd, seed=5, time=False)
    bad = [(r.shape, r.message) for r in runs if not r.correct]
    assert not bad, bad
    head = list(upd.shape_set("kmeans_update_large").shapes)
    runs = check_and_time(compiled, lowered, upd, head, seed=6, reps=20)
    bad = [(r.shape, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.outcome == "measured" for r in runs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["kmeans_update_owned.cake", "kmeans_update_owned_w32.cake",
                                  "kmeans_update_owned_w8.cake"])
def test_the_warp_owned_kmeans_update_variants_are_correct(name, tmp_path):
    # scatter_add(owner="warp"): each warp adds the rows it owns with plain smem loads and stores; the
    # CPU interpreter cannot see a lost update between warps, this does
    # few clusters (K = 3): most owned pairs share a row
    _gate_kmeans_update_seed(name, tmp_path, [], seed=7)


def _gate_kmeans_update_seed(name: str, tmp_path, extra: list[dict], seed: int) -> None:
    """A kmeans_update seed passes the gate on the small set, ragged and few-cluster shapes, ``extra`` and
    the large set (correctness only)."""
    from cake_core.runtime.gpu import check_and_time
    upd = get_problem("kmeans_update")
    text = upd.kernel_text(name)
    compiled, lowered = _build(text, tmp_path)
    shapes = list(upd.shape_set("kmeans_update_small").shapes) + [
        {"B": 1, "N": 5000, "K": 1500, "D": 72}, {"B": 40, "N": 3001, "K": 1024, "D": 128},
        {"B": 2, "N": 20000, "K": 3, "D": 128}] + extra
    runs = check_and_time(compiled, lowered, upd, shapes + list(upd.shape_set("kmeans_update_large").shapes),
                          seed=seed, time=False)
    bad = [(r.shape, r.message) for r in runs if not r.correct]
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["kmeans_update_red4.cake", "kmeans_update_red4_d3.cake"])
def test_the_red4_kmeans_update_variants_are_correct(name, tmp_path):
    # scatter_add of an rmem tile into gmem rows with red.global.add.v4.f32 after a quad transpose; the
    # CPU interpreter runs neither the shuffles nor the alignment check. D % 4 != 0 takes the scalar
    # fallback, D = 200 two D-tiles (one of them ragged), and few clusters pile every red onto one row
    _gate_kmeans_update_seed(name, tmp_path, [{"B": 3, "N": 1000, "K": 50, "D": 200},
                                              {"B": 2, "N": 777, "K": 64, "D": 126}], seed=8)


@pytest.mark.gpu
def test_the_gathering_kmeans_update_is_correct(tmp_path):
    # gather_add: warps own target rows and read only the x rows of their clusters, queued across index
    # chunks and loaded 8 rows at a time; the CPU interpreter runs neither the ballots nor the queue. D = 200
    # takes two D-slices (one ragged), D = 126 the scalar path (rows not 8-byte aligned), K = 3 puts every
    # row of a warp on one target row, K = 1500 splits the clusters over 6 CTAs, B = 1 N = 5000 splits N
    _gate_kmeans_update_seed("kmeans_update_gather.cake", tmp_path, [{"B": 3, "N": 1000, "K": 50, "D": 200},
                                                                       {"B": 2, "N": 777, "K": 64, "D": 126}],
                             seed=9)

def _fake_events(log: list, reps: int, elapsed_ms: float):
    """A stand-in for CuPy's CUDA module whose events log their recording: the timers make the ``reps``
    start events first, then the ``reps`` end events."""
    import types

    class Event:
        def __init__(self, name):
            self.name = name

        def record(self, stream):
            log.append(self.name)

    events = iter([Event("start") for _ in range(reps)] + [Event("end") for _ in range(reps)])
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Event=lambda: next(events),
                                                            get_elapsed_time=lambda s, e: elapsed_ms))


def test_zeroing_of_accumulated_outputs_is_inside_the_timed_region():
    # split-K kernels add into a C the harness zeroes: that zeroing is part of their cost, so it must
    # fall between the start and end events of every timed launch (and after the L2 flush)
    import types

    from cake_core.runtime import gpu
    reps, log = 3, []
    cp = _fake_events(log, reps, 1.0)
    L = types.SimpleNamespace(zero_accumulators=lambda: log.append("zero"), launch=lambda args: log.append("launch"),
                              wait=lambda what: log.append("wait"))
    ms = gpu._timed_launches(cp, L, [()], reps, types.SimpleNamespace(ptr=0), lambda s: log.append("flush"))
    assert ms == [1.0] * reps
    assert log == ["flush", "start", "zero", "launch", "end"] * reps + ["wait"]


def test_the_graph_timer_replays_zeroing_and_launch_per_input_copy_between_one_event_pair():
    # timer="graph": the capture holds, per input copy, the zeroing then the launch; each timed replay
    # comes after a flush, between its own events, and its time is shared among its launches
    import types

    from cake_core.runtime import gpu
    reps, log = 3, []
    cp = _fake_events(log, reps, 8.0)
    graph = types.SimpleNamespace(launch=lambda stream: log.append("replay"))
    stream = types.SimpleNamespace(begin_capture=lambda: log.append("capture"),
                                   end_capture=lambda: (log.append("end capture"), graph)[1])
    L = types.SimpleNamespace(zero_accumulators=lambda: log.append("zero"),
                              launch=lambda args: log.append(f"launch {args}"), wait=lambda what: log.append("wait"))
    ms = gpu._graph_timed(cp, L, ["a", "b", "c", "d"], reps, 1, stream, lambda s: log.append("flush"))
    assert ms == [2.0] * reps
    assert log == (["capture"] + [x for a in "abcd" for x in ("zero", f"launch {a}")] + ["end capture"]
                   + ["replay", "wait"] + ["flush", "start", "replay", "end"] * reps + ["wait"])


def test_the_graph_timer_holds_up_to_8_copies_and_at_least_2():
    from cake_core.runtime.timing import GRAPH_COPY_BYTES, graph_launches
    assert graph_launches(32 << 20) == 8 and graph_launches(128 << 20) == 8
    assert graph_launches(GRAPH_COPY_BYTES // 4) == 4
    assert graph_launches(GRAPH_COPY_BYTES) == 2 and graph_launches(4 * GRAPH_COPY_BYTES) == 2


def test_an_unknown_timer_is_refused_before_any_gpu_work(tmp_path):
    from cake_core.runtime import gpu
    lr = lower(parse_program(SEED, "kernel.cake")).value
    fake = Compiled(tmp_path / "x.cubin", "gemm_bf16", Resources(1, 0, 0, 0, 0), "0", 0.0, False, "sm_90a")
    with pytest.raises(gpu.GPURefused, match="unknown timer 'wall'.*event, graph"):
        gpu.check_and_time(fake, lr, GEMM, [{"M": 8, "N": 8, "K": 8}], seed=0, timer="wall")


def test_every_timer_the_runtime_records_is_one_the_warehouse_accepts():
    from cake_core.runtime.timing import TIMERS
    from warehouse.expectations import TIMERS as ACCEPTED
    assert set(TIMERS.values()) <= set(ACCEPTED)


def test_the_recorded_l2_state_is_one_the_warehouse_accepts():
    # every measurement row carries ShapeRun.l2; a value the expectation suite does not know would
    # send whole batches of GPU measurements to quarantine
    from cake_core.runtime.gpu import ShapeRun
    from warehouse.expectations import L2_STATES
    assert ShapeRun({}, True, 0.0, "").l2 in L2_STATES


def test_a_kernel_that_writes_nothing_fails_the_gate_of_a_zeroed_output():
    # tinygemm's c is zeroed, not poisoned, before each launch (kernels may accumulate with atomics):
    # an untouched c is all zeros, which random inputs never produce, so the oracle check fails it
    import numpy as np
    tiny = get_problem("tinygemm")
    assert "c" in tiny.zeroed_outputs
    shape = {"M": 3, "N": 40, "K": 24}
    x = tiny.make_inputs(shape, np.random.default_rng(0))
    ok, err, msg = tiny.compare({"c": np.zeros((3, 40), np.float32)}, tiny.oracle(x))
    assert not ok and err >= 0.99 and "max rel error" in msg
