"""The pipeline's verify stage checks a candidate against its problem, not only against the rules."""
from __future__ import annotations

from cake_core.harness.version import HarnessSpec
from cake_core.outcome import Outcome
from cake_core.pipeline import verify_stage
from cake_core.problems import get_problem


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
