"""Task bodies without a Prefect server: each diagnostic is recorded once, failed programs keep their identity."""
from cake_core.agents.base import Candidate
from cake_core.harness.version import HarnessSpec
from cake_core.pipeline import Attempt, verify_stage
from cake_core.pipeline.rows import attempt_rows
from cake_core.problems import get_problem

SEED = get_problem("gemm_bf16").seed_text()
SHAPES = [{"M": 96, "N": 80, "K": 72}]


def _verified(slot, text):
    a = Attempt("r", 0, slot, "gemm_bf16", 0, Candidate(text))
    a.record(verify_stage(text, HarnessSpec(), get_problem("gemm_bf16"), SHAPES))
    return a


def test_verify_records_each_diagnostic_once_and_keeps_the_hash_of_a_failed_program():
    racy = SEED.replace("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n")
    unguarded = SEED.replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)
    attempts = [_verified(i, t) for i, t in enumerate([SEED, racy, unguarded, "def ("])]
    passed = [a for a in attempts if a.going_on]
    stopped = [a for a in attempts if not a.going_on]
    assert [a.candidate.text for a in passed] == [SEED, unguarded]
    for a in passed + stopped:
        assert len(a.diagnostics) == len(set(a.diagnostics)), a.diagnostics
    assert [d.rule for d in passed[1].diagnostics] == ["shapes.tail_guard"]    # a warning travels along
    race = stopped[0]
    assert race.outcome.value == "verify_failed" and race.ir_hash and race.features["n_sync"] == 1
    assert {d.rule for d in race.diagnostics} == {"races.smem"}
    assert stopped[1].ir_hash == "" and stopped[1].diagnostics[0].rule == "parse.syntax"
    rows = attempt_rows(race)
    assert rows["attempts"][0]["signature"] == "verify:verify_failed:races.smem"
    assert len(rows["diagnostics"]) == len(race.diagnostics)


def test_two_approvals_at_once_get_consecutive_versions(tmp_path, monkeypatch):
    # both approvals read the current version while the other is between its read and its write
    # (a slowed apply): without the decision lock both would become version 1
    import threading
    import time

    from cake_core.harness.proposal import Proposal
    from cake_core.harness.version import HarnessSpec
    from tasks.harness import apply_decision, load_harness, record_proposal

    root = str(tmp_path / "warehouse")
    pids = [record_proposal(root, Proposal("rule", f"runtime:runtime_fault:x{i}", f"rule {i}",
                                           {"id": f"learned_x{i}", "predicate": {"all": [
                                               {"feature": "op.load.guard=False", "op": ">=", "value": i + 1}]},
                                            "message": "unguarded loads fault on ragged shapes"}, {"n": 3}),
                            {"passed": True}, None)
            for i in range(2)]
    real_apply = HarnessSpec.apply

    def slow_apply(self, *a, **k):
        time.sleep(0.3)
        return real_apply(self, *a, **k)

    monkeypatch.setattr(HarnessSpec, "apply", slow_apply)
    got: list = []
    threads = [threading.Thread(target=lambda pid=pid: got.append(apply_decision(root, pid, True, "ok", "t")))
               for pid in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [1, 2]
    spec = load_harness(root)
    assert spec.version == 2 and spec.parent == 1


def test_compact_merges_tables_with_many_batches_and_keeps_every_row(tmp_path):
    from datetime import datetime

    from tasks.record import compact
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse")
    t = datetime(2026, 11, 29, 10)
    for i in range(9):      # one record() call each, as a run lands them
        wh.append("measurements", [{"attempt_id": f"a{i}", "run_id": "r", "shape": "M=64,N=64,K=64",
                                    "gpu_model": "NVIDIA H200", "timer": "cuda_event", "l2": "cold-clean",
                                    "median_ms": 0.04, "p10_ms": 0.039, "p90_ms": 0.041, "runs": 20, "correct": True,
                                    "max_error": 1e-7, "kind": "search", "measured_at": t}])
    assert len(wh._snapshot("measurements")) == 9
    assert compact.fn(str(tmp_path / "warehouse"), min_files=8) == {"measurements": 9}
    assert len(wh._snapshot("measurements")) == 1
    assert wh.query("select count(*) n from measurements").to_pylist() == [{"n": 9}]
    assert compact.fn(str(tmp_path / "warehouse"), min_files=8) == {}      # nothing left to merge


def test_dispatch_prefers_confirmed_figures(tmp_path):
    from datetime import datetime

    from tasks.final import record_dispatch
    from warehouse import Warehouse

    wh = Warehouse(tmp_path / "warehouse")
    t = datetime(2026, 11, 29, 10)

    def m(aid, shape, ms, kind):
        return {"attempt_id": aid, "run_id": "r", "shape": shape, "gpu_model": "NVIDIA H200", "timer": "cuda_event",
                "l2": "cold", "median_ms": ms, "p10_ms": ms * 0.99, "p90_ms": ms * 1.01, "runs": 20,
                "correct": True, "max_error": 0.0, "kind": kind, "measured_at": t}
    wh.append("measurements", [m("lucky", "S1", 1.0, "search"), m("lucky", "S1", 1.3, "confirm"),
                               m("other", "S1", 1.1, "search"), m("other", "S2", 2.0, "search")])
    record_dispatch(str(wh.root), "r", "gemm_bf16", "set")
    got = {r["shape"]: (r["attempt_id"], r["median_ms"]) for r in wh.query("select * from dispatch").to_pylist()}
    assert got == {"S1": ("lucky", 1.3), "S2": ("other", 2.0)}


# ---------------------------------------------------------------- the time stage's jobs on (stand-in) GPU runners

import os  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class FakeGpu:
    """A GPU runner's answers without a GPU: `job.lowered` says how the kernel behaves on every shape."""

    def ident(self):
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def run_batch(self, jobs):
        from cake_core.outcome import Outcome
        from cake_core.pipeline.verdicts import ShapeVerdict, Timing
        out = []
        for job in jobs:
            key = ",".join(f"{k}={v}" for k, v in job.shape.items())
            past = {"wrong": 64, "wrong_past_128": 128}.get(job.lowered)
            if past is not None and job.shape["M"] > past:
                out.append(ShapeVerdict(key, "gpu", Outcome.WRONG, 0.5, "wrong: off by one", seconds=0.1))
            elif not job.time:
                out.append(ShapeVerdict(key, "gpu", Outcome.CHECKED, 1e-6, "correct (not timed)", seconds=0.05))
            else:
                ms = job.shape["M"] / 1000
                out.append(ShapeVerdict(key, "gpu", Outcome.MEASURED, 1e-6, f"correct in {os.getpid()}",
                                        Timing(ms, ms * 0.9, ms * 1.1, 20, "cuda_event", "cold-clean", "H200"),
                                        seconds=0.1))
        return {"verdicts": out, "restart": False, "pid": os.getpid()}


def _gpu_run(pool):
    return SimpleNamespace(plan=SimpleNamespace(problem="gemm_bf16"), problem=get_problem("gemm_bf16"), reps=20,
                           timeout_s=30.0, gpu=pool)


def test_the_time_stage_spreads_shapes_over_runners_and_drops_a_wrong_candidate_early(local_ray):
    from cake_core.pipeline.stages import Binary
    from cake_core.pipeline.verdicts import judge
    from tasks.stages import on_gpu
    from tasks.workers import ActorPool

    shapes = [{"M": 256, "N": 64, "K": 64}, {"M": 32, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 64}]
    binary = Binary(SimpleNamespace(kernel_name="k"), b"cubin")
    attempts = [SimpleNamespace(lowered=how, binary=binary, runs_on=lambda key: True) for how in ("ok", "wrong", "ok")]
    one = ActorPool(lambda: FakeGpu.remote(), 1)
    try:
        got = on_gpu(_gpu_run(one), attempts, shapes, seed=1, drop_failed=True)
    finally:
        one.shutdown()
    # verdicts in the shape set's order; the smallest shape runs first, the wrong kernel stops at M=128,
    # and its M=256 job is never run
    assert [v.shape for v in got[0]] == ["M=256,N=64,K=64", "M=32,N=64,K=64", "M=128,N=64,K=64"]
    assert [v.shape for v in got[1]] == ["M=32,N=64,K=64", "M=128,N=64,K=64"]
    assert judge("time", got[1]).outcome.value == "wrong"
    assert judge("time", got[2]).outcome.value == "measured"
    assert [v.timing.median_ms for v in got[2]] == [0.256, 0.032, 0.128]
    two = ActorPool(lambda: FakeGpu.remote(), 2)
    try:
        got = on_gpu(_gpu_run(two), [attempts[0]] * 4, shapes, seed=1, drop_failed=False)
    finally:
        two.shutdown()
    pids = {v.message for vs in got.values() for v in vs}
    assert len(pids) == 2 and all(len(vs) == 3 for vs in got.values())      # the shapes spread over both


def test_the_time_stage_checks_a_candidate_right_on_every_shape_on_its_strict_shapes_untimed(local_ray):
    from cake_core.ir.text import parse_program
    from cake_core.pipeline.stages import Binary
    from cake_core.pipeline.verdicts import judge
    from tasks.stages import gate_and_time
    from tasks.workers import ActorPool

    shapes = [{"M": 128, "N": 64, "K": 64}, {"M": 64, "N": 128, "K": 64}]
    binary = Binary(SimpleNamespace(kernel_name="k"), b"cubin")
    seed_program = parse_program(SEED)          # 64 x 64 tiles: its strict shape is M = N = 129, K = 65
    attempts = [SimpleNamespace(lowered=how, binary=binary, program=seed_program, runs_on=lambda key: True)
                for how in ("ok", "wrong_past_128", "wrong")]
    run = _gpu_run(ActorPool(lambda: FakeGpu.remote(), 1))
    run.search_shapes = shapes
    try:
        got = gate_and_time(run, attempts, seed=1)
    finally:
        run.gpu.shutdown()
    ok, past, wrong = (judge("time", got[i]) for i in range(3))
    assert ok.outcome.value == "measured"          # timed on the search shapes, checked untimed on the strict one
    assert [(v.shape, v.kind, v.timing is None) for v in got[0]] == [("M=128,N=64,K=64", "search", False),
                                                                    ("M=64,N=128,K=64", "search", False),
                                                                    ("M=129,N=129,K=65", "strict", True)]
    assert got[0][2].message == "strict shape (several tiles and a tail in every dimension): correct (not timed)"
    # right on every search shape (M <= 128), wrong on the strict one: wrong, and the message names the shape
    assert past.outcome.value == "wrong"
    assert past.diagnostics[0].message.startswith("M=129,N=129,K=65: strict shape (several tiles")
    # wrong on a search shape: no strict shape is run
    assert wrong.outcome.value == "wrong" and {v.kind for v in got[2]} == {"search"}


@ray.remote(num_cpus=0)
class FakeCpu:
    """A CPU worker whose stage answers, raises or dies as the candidate's text says."""

    def ident(self):
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def stage(self, name, text):
        from cake_core.outcome import Outcome, StageResult
        if text == "raise":
            raise ValueError("a bug in the stage")
        if text == "die":
            os._exit(3)
        return StageResult(name, Outcome.OK), 0.25


def test_a_cpu_stage_that_raises_or_kills_its_worker_stops_only_its_candidate(local_ray):
    from tasks.stages import on_cpu
    from tasks.workers import ActorPool

    pool = ActorPool(lambda: FakeCpu.remote(), 1)
    attempts = [Attempt("r", 0, i, "gemm_bf16", 0, Candidate(t)) for i, t in enumerate(["ok", "raise", "die", "ok"])]
    try:
        on_cpu(SimpleNamespace(cpu=pool), "lower", attempts, lambda a: (a.candidate.text,), 60.0)
    finally:
        pool.shutdown()
    assert [a.outcome.value for a in attempts] == ["ok", "runtime_fault", "runtime_fault", "ok"]
    assert [d.rule for d in attempts[1].diagnostics] == ["stage.raised"]
    assert "ValueError: a bug in the stage" in attempts[1].diagnostics[0].message
    assert [d.rule for d in attempts[2].diagnostics] == ["worker.died"] and pool.replaced == 1
    assert attempts[0].seconds == {"lower": 0.25} and attempts[1].stage == "lower"


def test_a_redone_generation_runs_the_candidates_its_slots_recorded(tmp_path):
    """A crash cut a generation short: its slot 0 recorded its kernel, slot 1 did not. Redone (the agent now
    writes other texts), slot 0 runs the recorded kernel, so what it lands belongs to that kernel; slot 1 runs
    the new text."""
    from tasks.stages import _as_recorded
    from warehouse import Warehouse
    from warehouse.queries import recorded_candidates

    racy = SEED.replace("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n")
    first = Attempt("r", 2, 0, "gemm_bf16", 0, Candidate(racy, ("p1",), "tactic", "mma_sync", 3, 4,
                                                         ("mma_sync",)))
    first.record(verify_stage(racy, HarnessSpec(), get_problem("gemm_bf16"), SHAPES))
    Warehouse(tmp_path / "wh").append("attempts", attempt_rows(first)["attempts"])
    other = SEED.replace("BK", "BKK")
    redone = [Attempt("r", 2, i, "gemm_bf16", 0, Candidate(other, ("p2",), "tactic", "prefetch")) for i in (0, 1)]
    landed = recorded_candidates(str(tmp_path / "wh"), [a.attempt_id for a in redone])
    assert set(landed) == {first.attempt_id}
    out = [_as_recorded(a, landed) for a in redone]
    assert out[0].candidate == first.candidate
    assert out[1].candidate == Candidate(other, ("p2",), "tactic", "prefetch")
    assert recorded_candidates(str(tmp_path / "wh"), []) == {}
