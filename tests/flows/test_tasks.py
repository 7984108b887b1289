"""Task bodies without a Prefect server: each diagnostic is recorded once, failed programs keep their identity."""
from cake_core.agents.base import Candidate
from cake_core.harness.version import HarnessSpec
from cake_core.problems import get_problem
from tasks.record import Attempt
from tasks.stages import verify

SEED = get_problem("gemm_bf16").seed_text()
SHAPES = [{"M": 96, "N": 80, "K": 72}]


def _attempt(text):
    return Attempt("r", 0, "gemm_bf16", 0, Candidate(text))


def test_verify_records_each_diagnostic_once_and_keeps_the_hash_of_a_failed_program():
    racy = SEED.replace("        mma(acc, a_s, b_s)\n        sync()\n", "        mma(acc, a_s, b_s)\n")
    unguarded = SEED.replace("tile(kt, BK)])", "tile(kt, BK)], guard=False)", 1)
    passed, stopped = verify.fn([_attempt(SEED), _attempt(racy), _attempt(unguarded), _attempt("def (")],
                                HarnessSpec(), SHAPES)
    assert [a.candidate.text for a in passed] == [SEED, unguarded]
    for a in passed + stopped:
        assert len(a.diagnostics) == len(set(a.diagnostics)), a.diagnostics
    assert [d.rule for d in passed[1].diagnostics] == ["shapes.tail_guard"]    # a warning travels along
    race = stopped[0]
    assert race.outcome.value == "verify_failed" and race.ir_hash and race.features["n_sync"] == 1
    assert {d.rule for d in race.diagnostics} == {"races.smem"}
    assert stopped[1].ir_hash == "" and stopped[1].diagnostics[0].rule == "parse.syntax"
    rows = race.rows()
    assert rows["attempts"][0]["signature"] == "verify:verify_failed:races.smem"
    assert len(rows["diagnostics"]) == len(race.diagnostics)
