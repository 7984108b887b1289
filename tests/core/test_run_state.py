"""The select stage and run plans: state from rows, stop reasons, resume checks, cold starts."""
from __future__ import annotations

import re

import pytest

from cake_core.agents.base import Context
from cake_core.agents.tactic_agent import TacticAgent
from cake_core.errors import CakeError
from cake_core.ir.text import parse_program
from cake_core.pipeline.plan import ResumeRefused, RunPlan, plan_from_row, resume_plan
from cake_core.pipeline.rows import run_row
from cake_core.pipeline.stages import keep_count
from cake_core.pipeline.state import select_stage
from cake_core.problems import get_problem
from cake_core.problems import corpus_files

GEMM = get_problem("gemm_bf16")


def _att(g, slot, outcome="checked", tactic="retile", h=None, gpu=0.0):
    return {"generation": g, "slot": slot, "ir_hash": h or f"h{g}{slot}", "tactic": tactic, "outcome": outcome,
            "gpu_seconds": gpu, "prompt_tokens": 0, "completion_tokens": 0}


def _score(g, slot, ms, lineage=(), parents=()):
    return {"generation": g, "slot": slot, "ir_hash": f"h{g}{slot}", "score_ms": ms, "ir_text": f"text{g}{slot}",
            "lineage": list(lineage), "parents": list(parents)}


PLAN = RunPlan("r", "gemm_bf16", "gemm_small", generations=6, population=4)


def test_state_comes_from_finished_generations_only():
    attempts = [_att(0, 0), _att(0, 1, "wrong"), _att(1, 0, tactic="retile+unroll"), _att(2, 0)]
    scores = [_score(0, 0, 2.0), _score(1, 0, 1.0, ("retile+unroll",), ("h00",)),
              _score(2, 0, 0.5, ("retile+unroll", "tma"), ("h10",))]
    # an earlier run's slower child: its tactic was tried and did not win
    history = [{"run_id": "old", "ir_hash": "p", "score_ms": 1.0, "lineage": [], "parents": []},
               {"run_id": "old", "ir_hash": "c", "score_ms": 3.0, "lineage": ["retile"], "parents": ["p"]}]
    st = select_stage(PLAN, {0, 1}, attempts, scores, [], history)
    # generation 2 was cut short (no select row): it is redone, its rows do not count
    assert st.generation == 2 and st.attempts == 3 and st.seen == {"h00", "h01", "h10"}
    assert st.best == [("text10", 1.0), ("text00", 2.0)] and st.best_generation == 1
    # a tactic wins when its child scores better than the parent: retile won here and lost in the old run
    assert st.tactic_stats == {"retile": (2, 1), "unroll": (1, 1)}
    assert [(s.score, s.lineage, s.parent_score) for s in st.scored] == [(1.0, ("retile+unroll",), 2.0),
                                                                         (2.0, (), None)]
    assert st.stop is None and st.population == 4


def test_each_headline_shapes_fastest_scored_kernel_is_a_parent_of_its_own():
    """h00 has the best geometric mean; h10 is fastest on the large shape, h20 (a generation cut short) faster
    still but not counted; h11 is fastest on the small one but failed its confirmation (not scored)."""
    scores = [_score(0, 0, 1.0), _score(1, 0, 1.5), _score(2, 0, 0.5)]
    rows = [{"shape": s, "generation": g, "slot": 0, "ir_hash": f"h{g}0", "ms": ms}
            for s, g, ms in [("big", 0, 2.0), ("big", 1, 1.2), ("big", 2, 0.9), ("small", 0, 0.5), ("small", 1, 1.9)]]
    rows.append({"shape": "small", "generation": 1, "slot": 1, "ir_hash": "h11", "ms": 0.1})
    st = select_stage(PLAN, {0, 1}, [], scores, [], shape_scores=rows)
    assert [k.text for k in st.shape_winners] == ["text10", "text00"]          # big, then small
    assert [k.text for k in st.context(PLAN, 0).shape_winners] == ["text10", "text00"]
    assert select_stage(PLAN, {0, 1}, [], scores, []).shape_winners == []       # a CPU run measures nothing


def test_ties_go_to_the_earlier_generation_and_slot():
    scores = [_score(1, 2, 1.0), _score(1, 0, 1.0), _score(0, 3, 1.0)]
    st = select_stage(PLAN, {0, 1}, [], scores, [])
    assert [t for t, _ in st.best] == ["text03", "text10", "text12"] and st.best_generation == 0


def test_stop_reasons():
    done = set(range(6))
    assert select_stage(PLAN, done, [], [], []).stop == "generations"
    capped = replace_plan(budget_candidates=10)
    st = select_stage(capped, {0, 1}, [_att(g, s) for g in (0, 1) for s in range(4)], [_score(1, 0, 1.0)], [])
    assert st.stop is None and st.population == 2        # the last generation is cut to the budget
    st = select_stage(capped, {0, 1, 2}, [_att(g, s) for g in (0, 1) for s in range(4)] + [_att(2, 0), _att(2, 1)],
                      [_score(2, 0, 0.5)], [])
    assert st.stop == "budget_candidates"
    gpu = replace_plan(budget_gpu_minutes=1.0)
    assert select_stage(gpu, {0}, [_att(0, 0, gpu=30.0), _att(0, 1, gpu=30.0)], [], []).stop == "budget_gpu_minutes"
    assert select_stage(gpu, {0}, [_att(0, 0, gpu=30.0)], [], []).stop is None
    patient = replace_plan(patience=2)
    scores = [_score(0, 0, 1.0), _score(1, 0, 1.0), _score(2, 1, 1.5)]
    assert select_stage(patient, {0, 1}, [], scores, []).stop is None
    assert select_stage(patient, {0, 1, 2}, [], scores, []).stop == "no_improvement"
    assert select_stage(patient, {0, 1}, [], [], []).stop == "no_improvement"      # nothing correct in 2


def replace_plan(**kw) -> RunPlan:
    from dataclasses import replace
    return replace(PLAN, **kw)


def test_feedback_is_the_first_error_of_each_recent_failure_with_its_source_line():
    fails = [{"generation": 0, "slot": 1, "ir_text": "a\nb = 1\n", "rule": "races.smem", "severity": "error",
              "message": "race", "line": 2, "col": 1, "path": "", "hint": "sync", "witness": ["w1"]},
             {"generation": 0, "slot": 1, "ir_text": "a\nb = 1\n", "rule": "races.smem", "severity": "error",
              "message": "race", "line": 2, "col": 1, "path": "", "hint": "sync", "witness": ["w1"]}]
    st = select_stage(PLAN, {0}, [], [], fails)
    assert st.feedback == ["candidate.cake:2:1: error[races.smem]: race\n    b = 1\n    ^\n    witness: w1\n"
                           "    hint: sync"]


def test_plans_refuse_bad_values():
    with pytest.raises(CakeError, match="--generations must be at least 1"):
        RunPlan("r", "p", "s", generations=0)
    with pytest.raises(CakeError, match="--budget-gpu-minutes must be above 0"):
        RunPlan("r", "p", "s", budget_gpu_minutes=0.0)
    with pytest.raises(CakeError, match=r"--keep \(filter_keep\) must be at least 1"):
        RunPlan("r", "p", "s", filter_keep=0)
    with pytest.raises(CakeError, match=r"--no-filter \(cost_filter\) passes them all"):
        RunPlan("r", "p", "s", cost_filter=False, filter_keep=3)


def test_the_filter_keeps_half_the_population_unless_a_run_asks_for_another_count():
    assert [keep_count(p) for p in (1, 3, 8, 16)] == [2, 2, 4, 8]
    assert keep_count(24, 4) == 4 and keep_count(3, 1) == 1
    row = run_row(RunPlan("r", "gemm_bf16", "gemm_small", population=24, filter_keep=4), "running",
                  harness_version=0, gpu_model=None, flow_run_id=None)
    assert plan_from_row({**row, "session": 0}).filter_keep == 4
    assert plan_from_row({**ROW, "filter_keep": None}).filter_keep is None     # rows from before: half


# ---------------------------------------------------------------- resume

ROW = {"run_id": "r1", "problem": "gemm_bf16", "shape_set": "gemm_small", "seed": 3, "generations": 4,
       "population": 6, "agent": "tactic", "cold": True, "harness_version": 2, "budget_candidates": None,
       "budget_gpu_minutes": None, "patience": None, "check_shape_set": None, "session": 1, "gpu_model": None,
       "started_at": None, "status": "running"}


def _resume(rows=(ROW,), versions=frozenset({1, 2}), timed=False, **asked):
    return resume_plan("r1", list(rows), set(versions), where="the warehouse W", asked={"problem": "gemm_bf16",
                                                                                        **asked}, timed=timed)


def test_resume_continues_the_recorded_run():
    plan = _resume()
    assert (plan.seed, plan.population, plan.cold, plan.harness_version, plan.session) == (3, 6, True, 2, 2)
    assert _resume(generations=9, patience=2, seed=3).generations == 9       # how far it goes may change


def test_a_resume_may_move_the_run_to_a_newer_harness_version_only():
    assert _resume(versions=frozenset({1, 2, 3}), harness_version=3).harness_version == 3
    assert _resume(harness_version=2).harness_version == 2
    with pytest.raises(ResumeRefused, match="may move to a newer version, not back to 1"):
        _resume(harness_version=1)
    with pytest.raises(ResumeRefused, match="holds no harness version 5"):
        _resume(harness_version=5)


@pytest.mark.parametrize("kw, message", [
    ({"rows": ()}, "no run `r1` in the warehouse W"),
    ({"problem": "tinygemm"}, "run `r1` evolves gemm_bf16, not tinygemm; resume it with `cake evolve gemm_bf16"),
    ({"versions": frozenset({1})}, "harness version 2, which the warehouse W no longer holds"),
    ({"seed": 4}, "was started with --seed 3, and a resumed run keeps it"),
    ({"filter_keep": 2}, "was started with --keep (filter_keep) None, and a resumed run keeps it"),
    ({"shape_set": "gemm_square"}, "was started with --shapes (shape_set) 'gemm_small'"),
    ({"timed": True}, "was checked on the CPU and can only continue the same way"),
])
def test_resume_refusals_say_what_is_wrong(kw, message):
    with pytest.raises(ResumeRefused, match=re.escape(message)):
        _resume(**kw)


# ---------------------------------------------------------------- the agent: cold, and a generation's random state

def test_a_cold_start_never_asks_for_the_hand_written_kernels(monkeypatch):
    from dataclasses import replace
    from cake_core.problems import get_problem

    def refuse():
        raise AssertionError("a cold run read the hand-written kernels")

    prob = replace(GEMM, best_files=("gemm_bf16_ws.cake",))
    known = get_problem("gemm_bf16").best_texts()
    monkeypatch.setattr(type(prob), "best_texts", lambda self: refuse())
    cands = TacticAgent(0).propose(prob, Context(0, 0, 6, cold=True))
    assert cands[0].tactic == "seed" and all(c.tactic != "best-known" for c in cands) and len(cands) == 6
    hand = {parse_program(t.read_text()).hash for t in corpus_files("gemm_bf16_*.cake")}
    assert not hand & {parse_program(c.text).hash for c in cands}
    # the agent never reads them itself: a warm run's caller passes them in (the select stage does)
    warm = TacticAgent(0).propose(prob, Context(0, 0, 6, known=known))
    assert [c.tactic for c in warm[:2]] == ["seed", "best-known"]
    assert get_problem("gemm_bf16").best_files


def test_a_generation_proposes_the_same_whatever_ran_before():
    ctx = Context(0, 3, 6, best=[(GEMM.seed_text(), 1.0)])
    fresh = TacticAgent(7).propose(GEMM, ctx)
    used = TacticAgent(7)
    for g in range(3):
        used.propose(GEMM, Context(0, g, 6, best=[(GEMM.seed_text(), 1.0)]))
    assert [c.text for c in used.propose(GEMM, ctx)] == [c.text for c in fresh]
    assert [c.text for c in TacticAgent(8).propose(GEMM, ctx)] != [c.text for c in fresh]
