"""The final stage of a run made of several jobs (``tasks/final.py``), on stand-in workers in this process.

Each job of the run ends with the final stage. Its CPU workers verify and lower for real; the compile answers a
cubin without nvcc and the GPU runners answer every job correct with a median of M microseconds (or, for
``WrongOnConfirm``, wrong on the confirmation's jobs it names), logging each job they ran. The search rows a job's
generations landed are written straight into the warehouse.
"""
from __future__ import annotations

import shutil
from collections import Counter
from datetime import datetime
from types import SimpleNamespace

import pytest

from cake_core.harness.version import HarnessSpec
from cake_core.model.analytic import AnalyticModel
from cake_core.outcome import Outcome, StageResult
from cake_core.pipeline.attempt import attempt_id_for
from cake_core.pipeline.plan import RunPlan
from cake_core.pipeline.policy import CONFIRM_ROUNDS, CONFIRM_SEED, HELD_OUT_SEED, SWEEP_SEED
from cake_core.pipeline.stages import Binary
from cake_core.pipeline.verdicts import ShapeVerdict, Timing
from cake_core.problems import get_problem, shape_key
from tasks.final import final
from tasks.record import Recorder
from tasks.run import Run
from tasks.workers import PoolExhausted, _cpu_stage
from warehouse import Warehouse
from warehouse.queries import confirm_failures, shape_best

SEED_TEXT = get_problem("gemm_bf16").seed_text()
UNGUARDED = SEED_TEXT.replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)    # another kernel that verifies
S1, S2 = {"M": 128, "N": 128, "K": 64}, {"M": 64, "N": 64, "K": 160}
HELD = {"M": 130, "N": 70, "K": 50}
RUN_SEED = 3


class StandInCpu:
    """CPU workers in this process: every stage for real but the compile, which answers a cubin without nvcc."""

    size = 1

    def __init__(self):
        self.elapsed: list[float] = []

    def map(self, method, jobs, timeout_s):
        assert method == "stage"
        self.elapsed = [0.0] * len(jobs)
        return [self._stage(*job) for job in jobs]

    @staticmethod
    def _stage(name, *args):
        if name == "compile":
            lowered = args[0]
            return StageResult("compile", Outcome.OK, value=Binary(SimpleNamespace(kernel_name=lowered.kernel_name),
                                                                   lowered.source.encode())), 0.0
        return _cpu_stage(name)(*args), 0.0


class StandInGpu:
    """GPU runners in this process: every job correct, its median M µs; ``ran`` holds (seed, kernel or peer,
    shape) per job."""

    size = 1

    def __init__(self):
        self.lost: list = []
        self.ran: list[tuple[int, str, str]] = []

    def run_units(self, method, units, *, batch, skip=lambda key: False, on_answer=lambda key, answer: None):
        answers = {}
        for u in units:
            if skip(u.key):
                continue
            self.ran.append((u.args.seed, u.args.kernel_name, shape_key(u.args.shape)))
            answers[u.key] = self.answer(u.args)
            on_answer(u.key, answers[u.key])
        return answers

    def map(self, method, jobs, timeout_s):       # the peers of the baselines: (problem, peer, shape, seed, reps)
        assert method == "peer"
        for job in jobs:
            self.ran.append((job[3], job[1], shape_key(job[2])))
        return [{"verdict": _timed(job[2])} for job in jobs]

    def answer(self, job) -> ShapeVerdict:
        return _timed(job.shape)


class WrongOnConfirm(StandInGpu):
    """The stand-in runners, answering wrong on the confirmation's jobs (input seed run seed + CONFIRM_SEED) whose
    lowered source and shape ``wrong`` names: a racy kernel that passed the search's gate."""

    def __init__(self, source: str, shapes: list[str]):
        super().__init__()
        self.source, self.shapes = source, shapes

    def answer(self, job) -> ShapeVerdict:
        if (job.seed == RUN_SEED + CONFIRM_SEED and job.lowered.source == self.source
                and shape_key(job.shape) in self.shapes):
            return ShapeVerdict(shape_key(job.shape), "gpu", Outcome.WRONG, 0.5, "max error 0.5 above 0.01",
                                seconds=0.1)
        return super().answer(job)


class LostAtHeldOut(StandInGpu):
    """The stand-in runners, lost for good (``PoolExhausted``) when the held-out report's jobs come."""

    def run_units(self, method, units, **kw):
        if any(u.args.seed == RUN_SEED + HELD_OUT_SEED for u in units):
            raise PoolExhausted("every GPU runner was lost")
        return super().run_units(method, units, **kw)


def _timed(shape):
    ms = shape["M"] / 1000
    return ShapeVerdict(shape_key(shape), "gpu", Outcome.MEASURED, 1e-6, "correct",
                        Timing(ms, ms * 0.9, ms * 1.1, 20, "cuda_event", "cold-clean", "H200"), seconds=0.1)


def _job(root, session: int, gpu: StandInGpu | None = None) -> Run:
    """Job ``session`` of run ``r`` (0: the first; each resume one more) on the stand-in workers."""
    plan = RunPlan(run_id="r", problem="gemm_bf16", shape_set="set", seed=RUN_SEED, session=session)
    roles = {shape_key(S1): "headline", shape_key(S2): "headline", shape_key(HELD): "held_out"}
    return Run(plan=plan, warehouse_root=str(root), cache_dir=str(root / "cache"), harness=HarnessSpec(),
               gpus=["NVIDIA H200"], search_shapes=[S1, S2], check_shapes=[S1, S2], held_out=[HELD], roles=roles,
               model=AnalyticModel("H200"), agent=None, timeout_s=30.0, reps=20, flow_run_id=None,
               recorder=Recorder(str(root)), state=None, cpu=StandInCpu(), gpu=gpu or StandInGpu())


def _source(text: str) -> str:
    """The CUDA source ``text`` lowers to (what a GPU runner receives)."""
    verified = _cpu_stage("verify")(text, HarnessSpec(), "gemm_bf16", [S1, S2])
    return _cpu_stage("lower")(verified.value).value.source


def _searched(root, generation: int, text: str, medians: dict[str, float]) -> str:
    """What a generation's search landed for one kernel: its attempt and its search medians."""
    aid = attempt_id_for("r", generation, 0)
    wh = Warehouse(root)
    wh.append("attempts", [{"attempt_id": aid, "run_id": "r", "generation": generation, "slot": 0,
                            "problem": "gemm_bf16", "ir_hash": f"h{generation}", "ir_text": text, "agent": "tactic",
                            "harness_version": 0, "stage": "time", "outcome": "measured"}])
    wh.append("measurements", [{"attempt_id": aid, "run_id": "r", "shape": s, "gpu_model": "H200",
                                "timer": "cuda_event", "l2": "cold-clean", "median_ms": ms, "p10_ms": ms * 0.9,
                                "p90_ms": ms * 1.1, "runs": 20, "correct": True, "max_error": 1e-6,
                                "kind": "search", "measured_at": datetime(2026, 12, 1, 10, generation)}
                               for s, ms in medians.items()])
    return aid


def _ended(run: Run) -> Run:
    final.fn(run)
    run.recorder.close()
    return run


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """Job 0 finds kernel A, best on both shapes; job 1 finds B: slower on S1, faster on S2 and overall."""
    root = tmp_path_factory.mktemp("final") / "warehouse"
    a = _searched(root, 0, SEED_TEXT, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    first = _ended(_job(root, 0))
    baselines = Warehouse(root).query("select count(*) as n from baselines").to_pylist()[0]["n"]
    b = _searched(root, 1, UNGUARDED, {shape_key(S1): 1.5, shape_key(S2): 0.5})
    later = _ended(_job(root, 1))
    return SimpleNamespace(wh=Warehouse(root), a=a, b=b, first=first, later=later, baselines=baselines)


def _jobs_at(run: Run, offset: int) -> list[str]:
    """The shapes the run's kernels (A and B lower to the same kernel name) ran on with this input seed."""
    return sorted(shape for seed, kernel, shape in run.gpu.ran if seed == RUN_SEED + offset and kernel == "gemm_bf16")


def test_a_later_job_confirms_its_new_winner_and_no_pair_confirmed_before(two_jobs):
    wh, a, b = two_jobs.wh, two_jobs.a, two_jobs.b
    assert _jobs_at(two_jobs.first, CONFIRM_SEED) == sorted([shape_key(S1), shape_key(S2)])
    assert _jobs_at(two_jobs.later, CONFIRM_SEED) == [shape_key(S2)]       # B's shape; A's S1 stays confirmed
    confirmed = Counter((r["attempt_id"], r["shape"]) for r in wh.query(
        "select attempt_id, shape from measurements where kind = 'confirm'").to_pylist())
    assert confirmed == {(a, shape_key(S1)): 1, (a, shape_key(S2)): 1, (b, shape_key(S2)): 1}
    # the later job's dispatch table: each shape's winner with its confirmed median, none from the search
    latest = wh.query("select shape, attempt_id, median_ms from dispatch "
                      "qualify created_at = max(created_at) over () order by shape").to_pylist()
    assert [(r["shape"], r["attempt_id"], r["median_ms"]) for r in latest] == \
        [(shape_key(S1), a, pytest.approx(0.128)), (shape_key(S2), b, pytest.approx(0.064))]


def test_a_later_job_reports_its_new_best_on_the_held_out_rows_and_measures_the_baselines_once(two_jobs):
    wh, a, b = two_jobs.wh, two_jobs.a, two_jobs.b
    assert wh.query("select attempt_id from run_best").to_pylist() == [{"attempt_id": b}]
    held = Counter(r["attempt_id"] for r in wh.query(
        "select attempt_id from measurements where kind = 'held_out'").to_pylist())
    assert held == {a: 1, b: 1}
    checked = Counter(r["attempt_id"] for r in wh.query(
        "select attempt_id from checks where kind = 'held_out'").to_pylist())
    assert checked == {a: 1, b: 1}
    assert _jobs_at(two_jobs.later, HELD_OUT_SEED) == [shape_key(HELD)]
    # the baselines: once per run (the same inputs and shapes whatever the search found), by the first job
    assert two_jobs.baselines > 0 and {k for _, k, _ in two_jobs.first.gpu.ran} > {"gemm_bf16"}
    assert {k for _, k, _ in two_jobs.later.gpu.ran} == {"gemm_bf16"}        # no hand-written kernel, no peer
    assert wh.query("select count(*) as n from baselines").to_pylist()[0]["n"] == two_jobs.baselines


def test_a_job_whose_final_stage_is_redone_measures_nothing_again(two_jobs, tmp_path):
    root = tmp_path / "warehouse"
    shutil.copytree(two_jobs.wh.root, root)
    again = _ended(_job(root, 2))
    assert again.gpu.ran == []
    n = {r["kind"]: r["n"] for r in Warehouse(root).query(
        "select kind, count(*) as n from measurements group by kind").to_pylist()}
    assert n == {"search": 4, "confirm": 3, "held_out": 2}


def test_a_final_stage_cut_short_is_redone_from_the_part_that_landed_nothing(tmp_path):
    root = tmp_path / "warehouse"
    a = _searched(root, 0, SEED_TEXT, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    cut = _job(root, 0, LostAtHeldOut())
    with pytest.raises(PoolExhausted):
        final.fn(cut)
    cut.recorder.close()
    baselines = Warehouse(root).query("select count(*) as n from baselines").to_pylist()[0]["n"]
    assert baselines > 0
    resumed = _ended(_job(root, 1))
    assert resumed.gpu.ran == [(RUN_SEED + HELD_OUT_SEED, "gemm_bf16", shape_key(HELD))]
    n = Counter((r["kind"], r["attempt_id"]) for r in Warehouse(root).query(
        "select kind, attempt_id from measurements").to_pylist())
    assert n == {("search", a): 2, ("confirm", a): 2, ("held_out", a): 1}
    assert Warehouse(root).query("select count(*) as n from baselines").to_pylist()[0]["n"] == baselines


def _confirm_checks(wh: Warehouse) -> set[tuple[str, str, bool]]:
    return {(r["attempt_id"], r["shape"], r["correct"]) for r in wh.query(
        "select attempt_id, shape, correct from checks where kind = 'confirm'").to_pylist()}


@pytest.fixture(scope="module")
def racy(tmp_path_factory):
    """Kernel A best on both shapes, B the runner-up on both; A comes out wrong on S2 at its confirmation. A later
    job follows on runners that answer every job correct."""
    root = tmp_path_factory.mktemp("racy") / "warehouse"
    a = _searched(root, 0, SEED_TEXT, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    b = _searched(root, 1, UNGUARDED, {shape_key(S1): 1.5, shape_key(S2): 1.2})
    first = _job(root, 0, WrongOnConfirm(_source(SEED_TEXT), [shape_key(S2)]))
    landed = final.fn(first)
    first.recorder.close()
    later = _ended(_job(root, 1))
    return SimpleNamespace(wh=Warehouse(root), a=a, b=b, first=first, landed=landed, later=later)


def test_a_winner_wrong_on_fresh_inputs_is_dropped_and_its_runner_up_confirmed_in_the_same_job(racy):
    wh, a, b = racy.wh, racy.a, racy.b
    # A on both shapes, then B (the new winner of both: A wins nowhere once wrong anywhere) on both
    assert _jobs_at(racy.first, CONFIRM_SEED) == sorted([shape_key(S1), shape_key(S2)] * 2)
    assert _confirm_checks(wh) == {(a, shape_key(S1), True), (a, shape_key(S2), False),
                                   (b, shape_key(S1), True), (b, shape_key(S2), True)}
    assert [(f["attempt_id"], f["shape"]) for f in racy.landed["confirm_failed"]] == [(a, shape_key(S2))]
    assert "max error 0.5" in racy.landed["confirm_failed"][0]["message"]
    assert confirm_failures(str(wh.root), "r") == racy.landed["confirm_failed"]     # what the run's summary lists
    assert [(p["shape"], p["attempt_id"]) for p in shape_best(str(wh.root), "r")] == \
        [(shape_key(S1), b), (shape_key(S2), b)]
    assert wh.query("select attempt_id from run_best").to_pylist() == [{"attempt_id": b}]
    # neither job's dispatch table holds A; each shape's is B with its confirmed median
    dispatched = wh.query("select distinct shape, attempt_id, median_ms from dispatch order by shape").to_pylist()
    assert [(r["shape"], r["attempt_id"], r["median_ms"]) for r in dispatched] == \
        [(shape_key(S1), b, pytest.approx(0.128)), (shape_key(S2), b, pytest.approx(0.064))]
    # the held-out report is the confirmed best's
    assert {r["attempt_id"] for r in wh.query("select attempt_id from checks where kind = 'held_out'").to_pylist()} \
        == {b}


def test_a_later_job_confirms_no_pair_whose_confirmation_failed_or_passed(racy):
    assert _jobs_at(racy.later, CONFIRM_SEED) == []
    assert len(racy.wh.query("select * from checks where kind = 'confirm'").to_pylist()) == 4
    assert racy.later.gpu.ran == []


def test_the_confirmation_stops_after_its_rounds_and_leaves_the_next_winner_to_a_later_job(tmp_path):
    root = tmp_path / "warehouse"
    ids = [_searched(root, g, SEED_TEXT, {shape_key(S1): 1.0 + g, shape_key(S2): 1.0 + g})
           for g in range(CONFIRM_ROUNDS + 1)]
    first = _job(root, 0, WrongOnConfirm(_source(SEED_TEXT), [shape_key(S1), shape_key(S2)]))
    landed = final.fn(first)
    first.recorder.close()
    assert Counter(f["attempt_id"] for f in landed["confirm_failed"]) == {i: 2 for i in ids[:CONFIRM_ROUNDS]}
    assert _jobs_at(first, CONFIRM_SEED) == sorted([shape_key(S1), shape_key(S2)] * CONFIRM_ROUNDS)
    # the last one is the winner, on its search medians, unconfirmed
    picks = shape_best(str(root), "r")
    assert [(p["attempt_id"], p["confirm_ms"]) for p in picks] == [(ids[-1], None)] * 2
    later = _ended(_job(root, 1))
    assert _jobs_at(later, CONFIRM_SEED) == sorted([shape_key(S1), shape_key(S2)])
    assert [p["confirm_ms"] for p in shape_best(str(root), "r")] == [pytest.approx(0.128), pytest.approx(0.064)]


SWEPT = [{"M": 96, "N": 64, "K": 96}, {"M": 200, "N": 136, "K": 72}]


def test_the_finalists_are_swept_over_the_sweep_rows_once(tmp_path):
    """Each searched shape's winner and the run's best, once each, on every sweep row (a portfolio's other rows),
    kind `sweep`, from their own input seed; a later job sweeps only a finalist not swept before."""
    root = tmp_path / "warehouse"
    a = _searched(root, 0, SEED_TEXT, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    first = _job(root, 0)
    first.sweep = SWEPT
    _ended(first)
    swept = sorted(shape for seed, _, shape in first.gpu.ran if seed == RUN_SEED + SWEEP_SEED)
    assert swept == sorted(shape_key(s) for s in SWEPT)
    rows = Warehouse(root).query("select attempt_id, shape, median_ms from measurements where kind = 'sweep' "
                                 "order by shape").to_pylist()
    assert [(r["attempt_id"], r["shape"]) for r in rows] == [(a, shape_key(s)) for s in
                                                            sorted(SWEPT, key=shape_key)]
    b = _searched(root, 1, UNGUARDED, {shape_key(S1): 1.5, shape_key(S2): 0.5})
    later = _job(root, 1)
    later.sweep = SWEPT
    _ended(later)
    assert sorted(s for seed, _, s in later.gpu.ran if seed == RUN_SEED + SWEEP_SEED) == sorted(
        shape_key(s) for s in SWEPT)                                        # B, the new finalist, alone
    n = Counter(r["attempt_id"] for r in Warehouse(root).query(
        "select attempt_id from measurements where kind = 'sweep'").to_pylist())
    assert n == {a: 2, b: 2}
    checks = Counter((r["attempt_id"], r["kind"]) for r in Warehouse(root).query(
        "select attempt_id, kind from checks where kind = 'sweep' and correct").to_pylist())
    assert checks == {(a, "sweep"): 2, (b, "sweep"): 2}


def test_a_sweep_row_no_finalist_holds_gets_the_runs_best_scored_kernel_that_holds_it(tmp_path):
    """B (unguarded: M a multiple of 64, K of 32) wins both searched shapes, so it is the one finalist; A (guarded,
    slower) is measured on the sweep rows B's domain leaves out, and only there."""
    root = tmp_path / "warehouse"
    inside = {"M": 64, "N": 64, "K": 64}
    a = _searched(root, 0, SEED_TEXT, {shape_key(S1): 2.0, shape_key(S2): 2.0})
    b = _searched(root, 1, UNGUARDED, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    job = _job(root, 0)
    job.sweep = [*SWEPT, inside]
    _ended(job)
    swept = Counter((r["attempt_id"], r["shape"]) for r in Warehouse(root).query(
        "select attempt_id, shape from measurements where kind = 'sweep' and correct").to_pylist())
    assert {k for k in swept if k[0] == a} == {(a, shape_key(s)) for s in SWEPT}
    assert (a, shape_key(inside)) not in swept and (b, shape_key(inside)) in swept
    # a later job finds both swept: nothing is measured again
    later = _job(root, 1)
    later.sweep = job.sweep
    _ended(later)
    assert [x for x in later.gpu.ran if x[0] == RUN_SEED + SWEEP_SEED] == []


def test_the_peers_are_timed_on_each_sweep_row_once_across_the_runs_of_the_problem(tmp_path):
    """A portfolio region's run times the problem's peers on its sweep rows (role `sweep`) so every row has the peer
    figure its report compares with; a later job, or another region's run of the same problem sweeping the same
    rows, times none of them again; a row no run has a peer figure for yet is timed."""
    root = tmp_path / "warehouse"
    _searched(root, 0, SEED_TEXT, {shape_key(S1): 1.0, shape_key(S2): 1.0})
    first = _job(root, 0)
    first.sweep = SWEPT
    _ended(first)
    peers = ("torch.matmul", "torch.mm_f32")
    timed = sorted((p, s) for seed, p, s in first.gpu.ran if p in peers and s in {shape_key(x) for x in SWEPT})
    assert timed == sorted((p, shape_key(s)) for p in peers for s in SWEPT)
    rows = Warehouse(root).query("select name, shape, role, median_ms from baselines where role = 'sweep' "
                                 "order by name, shape").to_pylist()
    assert [(r["name"], r["shape"]) for r in rows] == sorted((p, shape_key(s)) for p in peers for s in SWEPT)
    assert all(r["median_ms"] for r in rows)
    later = _job(root, 1)
    later.sweep = SWEPT
    _ended(later)
    assert not [x for x in later.gpu.ran if x[1] in peers and x[2] in {shape_key(s) for s in SWEPT}]
    # another region's run of the same problem: only its new row gets the peers
    other = _job(root, 0)
    other.plan = RunPlan(run_id="r2", problem="gemm_bf16", shape_set="set2", seed=RUN_SEED, session=0)
    Warehouse(root).append("runs", [{"run_id": rid, "problem": "gemm_bf16", "shape_set": "set", "harness_version": 0,
                                     "agent": "tactic", "seed": RUN_SEED, "generations": 1, "population": 1,
                                     "host": "h", "status": "running", "started_at": datetime(2026, 12, 1),
                                     "session": 0, "recorded_at": datetime(2026, 12, 1)} for rid in ("r", "r2")])
    new = {"M": 64, "N": 32, "K": 48}
    other.sweep = SWEPT + [new]
    _ended(other)
    swept_peers = sorted((p, s) for _, p, s in other.gpu.ran if p in peers and s in
                         {shape_key(x) for x in other.sweep})
    assert swept_peers == [(p, shape_key(new)) for p in peers]
