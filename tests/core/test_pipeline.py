"""The pipeline in the core: the stage list, typed results end to end, attempt -> rows, the debug switch."""
from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from cake_core.agents.base import Candidate
from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse_program
from cake_core.model.analytic import AnalyticModel
from cake_core.outcome import Outcome, StageResult
from cake_core.pipeline import STAGE_NAMES, Attempt, attempt_id_for, cost_filter_stage, stages_for, verify_stage
from cake_core.pipeline.debug import Debug
from cake_core.pipeline.rows import attempt_rows, check_row, measurement_rows
from cake_core.pipeline.stages import check_stage
from cake_core.pipeline.verdicts import ShapeVerdict, Timing, fault, from_cpu_check, judge
from cake_core.problems import get_problem
from cake_core.runtime.cpu import ShapeCheck

GEMM = get_problem("gemm_bf16")
SEED = GEMM.seed_text()
SHAPES = [{"M": 96, "N": 80, "K": 72}, {"M": 33, "N": 17, "K": 9}]


def test_the_seed_passes_and_an_extra_parameter_fails_verify():
    p = get_problem("tinygemm")
    harness = HarnessSpec()
    assert verify_stage(p.seed_text(), harness, p).outcome is Outcome.OK
    # an extra gmem parameter the problem does not supply: the interpreter and the GPU have no array for it
    head, rest = p.seed_text().split("):", 1)
    extra = head + ", scratch: gmem[f32, (M, N)]):" + rest
    r = verify_stage(extra, harness, p)
    assert r.outcome is Outcome.VERIFY_FAILED
    assert [d.message for d in r.diagnostics if d.rule == "problem.params"] == \
        ["parameters scratch are not inputs or outputs of `tinygemm`"]


def test_one_flat_list_of_named_stages():
    assert STAGE_NAMES == ("generate", "verify", "lower", "compile", "cost_filter", "check", "time", "select")
    assert [s.name for s in stages_for(timed=True)] == ["generate", "verify", "lower", "compile", "cost_filter",
                                                       "time", "select"]
    assert "time" not in [s.name for s in stages_for(timed=False)]


def test_cake_core_pipeline_imports_no_prefect_ray_or_duckdb():
    code = ("import sys, cake_core.pipeline, cake_core.pipeline.state, cake_core.pipeline.rows, "
            "cake_core.pipeline.debug, cake_core.pipeline.execute, cake_core.pipeline.generate, "
            "cake_core.pipeline.plan; print(sorted(m for m in ('prefect', 'ray', 'duckdb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- verdicts: right or wrong, decided once

def _v(shape, outcome, timing=None, **kw):
    return ShapeVerdict(shape, kw.pop("backend", "gpu"), outcome, 1e-4, kw.pop("message", ""), timing, **kw)


T = Timing(1.0, 0.9, 1.1, 20, "cuda_event", "cold-clean", "NVIDIA H200")


def test_judge_measured_checked_wrong_and_faults():
    assert judge("time", [_v("S1", Outcome.MEASURED, T), _v("S2", Outcome.MEASURED, T)]).outcome is Outcome.MEASURED
    assert judge("check", [_v("S1", Outcome.CHECKED, backend="interpreter")]).outcome is Outcome.CHECKED
    wrong = judge("time", [_v("S1", Outcome.MEASURED, T), _v("S2", Outcome.WRONG, message="wrong: x")])
    assert wrong.outcome is Outcome.WRONG and wrong.diagnostics[0].rule == "check.mismatch"
    assert wrong.diagnostics[0].message == "S2: wrong: x"
    # a fault anywhere beats a wrong shape before it: the context (or the run) ended there
    hang = judge("time", [_v("S1", Outcome.WRONG), _v("S2", Outcome.TIMEOUT, message="did not finish")])
    assert hang.outcome is Outcome.TIMEOUT and hang.diagnostics[0].rule == "runtime.timeout"
    died = judge("time", [fault("S1", "gpu", Outcome.RUNTIME_FAULT, "worker died: killed")])
    assert died.outcome is Outcome.RUNTIME_FAULT and died.diagnostics[0].message == "worker died: killed"
    assert died.diagnostics[0].witness == ("shape S1",)
    with pytest.raises(ValueError, match="at least one shape"):
        judge("time", [])
    with pytest.raises(ValueError, match="runtime_fault or timeout"):
        fault("S1", "gpu", Outcome.WRONG, "not a fault")


def test_interpreter_faults_point_at_the_ir_line_and_nothing_is_inf():
    v = from_cpu_check(ShapeCheck("M=33,N=17,K=9", False, None, "load out of bounds", fault=True, fault_line=12))
    r = judge("check", [v])
    assert r.outcome is Outcome.RUNTIME_FAULT and (r.diagnostics[0].line, r.diagnostics[0].rule) == (12, "runtime.fault")
    wrong = from_cpu_check(ShapeCheck("S", False, math.inf, "NaN at (0, 0)"))
    assert wrong.outcome is Outcome.WRONG and wrong.max_error is None


def test_check_stage_on_the_interpreter():
    good = check_stage(parse_program(SEED), "gemm_bf16", SHAPES, seed=1)
    assert good.outcome is Outcome.CHECKED and [(v.shape, v.kind) for v in good.value] == [
        ("M=96,N=80,K=72", "search"), ("M=33,N=17,K=9", "search"), ("M=129,N=129,K=65", "strict")]
    bad = SEED.replace("tile(kt, BK), tile(bid.x, BN)", "tile(kt, BK), tile(bid.y, BN)")
    r = check_stage(parse_program(bad), "gemm_bf16", SHAPES, seed=1)
    assert r.outcome is Outcome.WRONG and r.diagnostics[0].rule == "check.mismatch"


KM = get_problem("kmeans_assign")
KM_SHAPES = [{"B": 1, "N": 96, "K": 129, "D": 64}, {"B": 1, "N": 33, "K": 7, "D": 9}]
# the arg-min scores the first 256 centroids only: right on every shape with K <= 256 (every CPU-sized row)
FIRST_256 = KM.seed_text().replace("limit=K)", "limit=min(K, 256))")


def test_the_check_stage_checks_a_candidate_right_on_the_run_shapes_on_its_strict_shapes():
    a = Attempt("r", 0, 0, "kmeans_assign", 0, Candidate(KM.seed_text()))
    a.record(verify_stage(KM.seed_text(), HarnessSpec(), KM, KM_SHAPES))
    a.record(check_stage(a.program, "kmeans_assign", KM_SHAPES, seed=1))
    assert a.outcome is Outcome.CHECKED
    rows = attempt_rows(a)["checks"]
    assert [r["kind"] for r in rows] == ["search", "search", "strict"] and all(r["correct"] for r in rows)
    assert rows[2]["shape"] == "B=2,N=257,K=129,D=65" and "several tiles and a tail" in rows[2]["message"]
    # skipping the centroids past 256: right on the run's shapes, wrong on the strict shape past the threshold
    bad = Attempt("r", 0, 1, "kmeans_assign", 0, Candidate(FIRST_256))
    bad.record(verify_stage(FIRST_256, HarnessSpec(), KM, KM_SHAPES))
    assert bad.going_on
    bad.record(check_stage(bad.program, "kmeans_assign", KM_SHAPES, seed=1))
    assert bad.outcome is Outcome.WRONG and bad.diagnostics[0].rule == "check.mismatch"
    assert bad.diagnostics[0].message.startswith("B=2,N=257,K=321,D=65: strict shape (K past the `min` threshold")
    rows = attempt_rows(bad)["checks"]
    assert [(r["kind"], r["correct"]) for r in rows] == [("search", True)] * 2 + [("strict", True), ("strict", False)]
    assert "farther (relative) than the nearest" in rows[-1]["message"]
    # without the strict gate the same kernel passes
    assert check_stage(bad.program, "kmeans_assign", KM_SHAPES, seed=1, strict=False).outcome is Outcome.CHECKED


def test_a_candidate_wrong_on_the_run_shapes_pays_no_strict_shape():
    bad = SEED.replace("tile(kt, BK), tile(bid.x, BN)", "tile(kt, BK), tile(bid.y, BN)")
    r = check_stage(parse_program(bad), "gemm_bf16", SHAPES, seed=1)
    assert r.outcome is Outcome.WRONG and {v.kind for v in r.value} == {"search"}
    assert r.diagnostics[0].message.startswith("M=96,N=80,K=72: ")


def test_strict_verdicts_are_checked_never_timed():
    strict = replace(_v("S9", Outcome.CHECKED), kind="strict")
    a = judge("time", [_v("S1", Outcome.MEASURED, T), strict])
    assert a.outcome is Outcome.MEASURED       # the strict shape is not timed, and the search shapes are
    assert judge("time", [_v("S1", Outcome.CHECKED), strict]).outcome is Outcome.CHECKED
    wrong = judge("time", [_v("S1", Outcome.MEASURED, T), replace(strict, outcome=Outcome.WRONG, message="x")])
    assert wrong.outcome is Outcome.WRONG and wrong.diagnostics[0].message == "S9: x"
    assert [m["shape"] for m in measurement_rows("a", "r", a.value)] == ["S1"]
    assert [(c["shape"], c["kind"]) for c in map(lambda v: check_row("a", v), a.value)] == [("S1", "search"),
                                                                                          ("S9", "strict")]


# ---------------------------------------------------------------- the attempt and its rows

def test_attempt_ids_come_from_run_generation_and_slot():
    assert attempt_id_for("r", 2, 5) == attempt_id_for("r", 2, 5) != attempt_id_for("r", 2, 6)
    assert Attempt("r", 2, 5, "gemm_bf16", 0, Candidate(SEED)).attempt_id == attempt_id_for("r", 2, 5)


def test_a_stopped_attempt_takes_no_further_stage():
    a = Attempt("r", 0, 0, "gemm_bf16", 0, Candidate("def ("))
    a.record(verify_stage("def (", HarnessSpec(), GEMM))
    assert a.outcome is Outcome.VERIFY_FAILED and not a.going_on
    with pytest.raises(ValueError, match="already stopped at verify"):
        a.record(StageResult("lower", Outcome.OK))


def test_rows_carry_the_outcome_value_and_every_stage_result():
    a = Attempt("r", 1, 3, "gemm_bf16", 0, Candidate(SEED, tactic="retile"))
    a.record(verify_stage(SEED, HarnessSpec(), GEMM, SHAPES), 0.5)
    (f,) = cost_filter_stage([a.program], SHAPES, AnalyticModel("H200"), 1, 0, 0, seed=0)
    a.record(f)
    a.record(judge("time", [_v(k, Outcome.MEASURED, T, seconds=2.0) for k in a.predictions]))
    rows = attempt_rows(a)
    (row,) = rows["attempts"]
    assert (row["outcome"], row["stage"], row["slot"], row["generation"]) == ("measured", "time", 3, 1)
    assert row["gpu_seconds"] == 4.0 and row["predicted_ms"] == pytest.approx(a.predicted_ms)
    assert [m["kind"] for m in rows["measurements"]] == ["search", "search"]
    assert {c["shape"] for c in rows["checks"]} == set(a.predictions) and all(c["correct"] for c in rows["checks"])
    assert len(rows["predictions"]) == 2 and rows["compiles"] == []
    a2 = Attempt("r", 1, 4, "gemm_bf16", 0, Candidate(SEED))
    a2.record(verify_stage(SEED, HarnessSpec(), GEMM, SHAPES))
    a2.record(f)
    a2.record(judge("time", [_v("S1", Outcome.WRONG, message="wrong: y")]))
    r2 = attempt_rows(a2)
    assert r2["measurements"] == [] and r2["attempts"][0]["signature"].startswith("time:wrong:check.mismatch")


def test_the_cost_filter_keeps_the_top_k_and_explores_deterministically():
    progs = [parse_program(SEED).with_consts(BM=bm, BN=bn) for bm in (16, 32, 64) for bn in (16, 32)]
    model = AnalyticModel("H200")
    a = cost_filter_stage(progs, SHAPES, model, 2, 1, 0, seed=42)
    b = cost_filter_stage(progs, SHAPES, model, 2, 1, 0, seed=42)
    assert [r.outcome for r in a] == [r.outcome for r in b]
    kept = [i for i, r in enumerate(a) if r.outcome is Outcome.OK]
    assert len(kept) == 3 and sum(r.outcome is Outcome.FILTERED for r in a) == 3
    ranks = {i: a[i].metrics["rank"] for i in range(len(progs))}
    assert {i for i in kept if ranks[i] < 2} == {i for i in ranks if ranks[i] < 2}      # the top 2 always go on
    assert all(set(r.metrics["predictions"]) == {"M=96,N=80,K=72", "M=33,N=17,K=9"} for r in a)
    assert {a[i].metrics["decision"] for i in kept} <= {"kept", "explored"}


def test_the_cost_filter_times_a_sample_of_what_it_drops_and_records_every_decision():
    progs = [parse_program(SEED).with_consts(BM=bm, BN=bn) for bm in (16, 32, 64) for bn in (16, 32)]
    res = cost_filter_stage(progs, SHAPES, AnalyticModel("H200"), 2, 1, 1, seed=7)
    decisions = [r.metrics["decision"] for r in res]
    assert sorted(decisions) == ["explored", "filtered", "filtered", "kept", "kept", "sampled"]
    # a sampled candidate goes on to be timed though it ranked below the cut
    (s,) = [r for r in res if r.metrics["decision"] == "sampled"]
    assert s.outcome is Outcome.OK and s.metrics["rank"] >= 2
    assert all(r.outcome is Outcome.FILTERED for r in res if r.metrics["decision"] == "filtered")
    a = Attempt("r", 0, 0, "gemm_bf16", 0, Candidate(SEED))
    a.record(verify_stage(SEED, HarnessSpec(), GEMM, SHAPES))
    a.record(s)
    rows = attempt_rows(a)["predictions"]
    assert {r["decision"] for r in rows} == {"sampled"} and {r["model_kind"] for r in rows} == {"analytic"}
    assert all(r["score"] is not None for r in rows)
    # without the filter (keep everything) nothing is dropped and nothing needs sampling
    everyone = cost_filter_stage(progs, SHAPES, AnalyticModel("H200"), len(progs), 0, 0, seed=7)
    assert all(r.outcome is Outcome.OK and r.metrics["decision"] == "kept" for r in everyone)


# ---------------------------------------------------------------- the debug switch

def test_debug_dumps_numbered_ir_and_passes_a_sound_journey(tmp_path):
    dbg = Debug(tmp_path, HarnessSpec(), "gemm_bf16", SHAPES)
    a = Attempt("r", 0, 2, "gemm_bf16", 0, Candidate(SEED))
    a.record(verify_stage(SEED, HarnessSpec(), GEMM, SHAPES))
    assert dbg.after("verify", [a]) == 0
    from cake_core.pipeline.stages import lower_stage
    a.record(lower_stage(a.program))
    assert dbg.after("lower", [a]) == 0 and a.going_on
    files = sorted(p.name for p in (tmp_path / "r" / "g000").iterdir())
    assert files == ["002-01-verify.cake", "002-02-lower.cake", "002-02-lower.cu"]


def test_debug_stops_an_attempt_whose_program_a_stage_changed(tmp_path):
    dbg = Debug(tmp_path, HarnessSpec(), "gemm_bf16", SHAPES)
    a = Attempt("r", 0, 0, "gemm_bf16", 0, Candidate(SEED))
    a.record(verify_stage(SEED, HarnessSpec(), GEMM, SHAPES))
    # a stage that (wrongly) rewrote the program: a racy one, with another identity
    racy = parse_program(SEED.replace("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n"))
    a.program = racy
    assert dbg.after("lower", [a]) == 1
    assert a.outcome is Outcome.VERIFY_FAILED and a.stage == "lower"
    assert a.diagnostics[-1].rule == "debug.reverify" and "not the one verified" in a.diagnostics[-1].message
    # same identity but no longer verifying under this run's shapes (a harness rule added mid-run, say)
    b = Attempt("r", 0, 1, "gemm_bf16", 0, Candidate(racy.text()))
    b.record(StageResult("verify", Outcome.OK, value=racy))
    assert dbg.after("compile", [b]) == 1 and "no longer verifies: races.smem" in b.diagnostics[-1].message


def test_a_gpu_session_keeps_references_under_the_home_and_checks_very_large_shapes_on_rows(tmp_path):
    from cake_core.pipeline.execute import GpuSession, gate_rows
    from cake_core.problems import get_problem
    session = GpuSession(refs_dir=tmp_path / "refs")
    assert session.refs is not None and session.refs.root == tmp_path / "refs"
    assert GpuSession().refs is None                        # no home: references are computed every time
    assert gate_rows("gemm_bf16", {"M": 64, "N": 48, "K": 32}) is None                       # every row
    assert gate_rows("gemm_bf16", {"M": 8192, "N": 8192, "K": 8192}) == 256
    assert gate_rows("kmeans_assign", {"B": 32, "N": 65536, "K": 1024, "D": 128}) == get_problem("kmeans_assign").subset_rows == 4096


def test_a_peer_that_cannot_run_here_is_a_fault_that_says_what_is_missing():
    pytest.importorskip("cake_core.runtime.peers")
    try:
        import torch  # noqa: F401
        if torch.cuda.is_available():
            pytest.skip("torch with CUDA here: tests/flows/test_evolve_gpu.py measures the peers")
    except ImportError:
        pass
    from cake_core.pipeline.execute import GpuSession
    v = GpuSession().peer("gemm_bf16", "torch.matmul", {"M": 64, "N": 48, "K": 32}, 0, 20)
    assert v.outcome is Outcome.RUNTIME_FAULT and v.by_worker and "PyTorch" in v.message and v.timing is None
