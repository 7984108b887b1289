"""Composite ops as data: definitions, expansion before the pipeline (line for line), contraction."""
import pytest

from cake_core.harness.composite import Composite, abstract, composite_name, contract, expand, windows
from cake_core.harness.errors import HarnessDataError
from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse_program
from cake_core.lower.cuda import lower
from cake_core.model.analytic import AnalyticModel
from cake_core.outcome import Outcome
from cake_core.pipeline import check_stage, verify_stage
from cake_core.problems import get_problem

GEMM = parse_program(get_problem("gemm_bf16").seed_text())
TINY = parse_program(get_problem("tinygemm").seed_text())
KLOOP = next(w for w in windows(GEMM, range(5, 6)))         # the k loop's body: load, load, sync, mma, sync
STEP = Composite(composite_name(KLOOP.nodes), KLOOP.operands, KLOOP.body, "the k step of a tiled GEMM")
SPEC = HarnessSpec(1, 0, composites=(STEP,))
RAGGED = [{"M": 96, "N": 80, "K": 72}, {"M": 33, "N": 17, "K": 9}]


def test_a_pattern_abstracts_buffers_views_and_expressions_into_operands():
    assert STEP.name == "load2_sync_mma_sync"
    assert STEP.body == ("load(dst, src)", "load(dst2, src2)", "sync()", "mma(acc, dst, dst2)", "sync()")
    assert [k for _, k in STEP.operands] == ["buf", "view", "buf", "view", "buf"]
    assert abstract(next(w for w in windows(TINY, range(5, 6))).nodes).key() == STEP.key()  # the same pattern
    renamed = Composite("kstep", tuple((f"x{i}", k) for i, (_, k) in enumerate(STEP.operands)),
                        tuple(s.replace("dst2", "x2").replace("dst", "x0").replace("src2", "x3")
                              .replace("src", "x1").replace("acc", "x4") for s in STEP.body))
    assert Composite.from_data(renamed.to_data()).key() == STEP.key()       # names do not make it another op


def test_the_composite_call_is_the_kernel_it_expands_to():
    text = contract(GEMM, [STEP])
    assert "load2_sync_mma_sync(a_s, a[tile(bid.y, BM), tile(kt, BK)], b_s, b[tile(kt, BK), tile(bid.x, BN)], " \
           "acc)" in text and len(text.splitlines()) == len(GEMM.text().splitlines()) - 4
    exp = expand(text, [STEP])
    assert exp.used == ("load2_sync_mma_sync",) and not exp.diagnostics
    assert len(exp.text.splitlines()) == len(text.splitlines())              # line for line
    prog = parse_program(exp.text)
    assert prog == GEMM and prog.hash == GEMM.hash
    # its semantics, lowering and cost are the expansion's
    r = verify_stage(text, SPEC, get_problem("gemm_bf16"), RAGGED)
    assert r.outcome is Outcome.OK and r.artifacts["expanded_ir"] == exp.text
    assert check_stage(r.value, "gemm_bf16", RAGGED, 0).outcome is Outcome.CHECKED
    assert lower(r.value, "k.cake").outcome is Outcome.OK
    m = AnalyticModel()
    assert m.predict_ms(r.value, RAGGED) == m.predict_ms(GEMM, RAGGED)
    assert SPEC.write(GEMM) == text and SPEC.read(text) == GEMM
    knn = parse_program(get_problem("knn_topk").seed_text())
    assert contract(knn, [STEP]) == knn.text()                              # no occurrence: the plain text


def test_diagnostics_of_a_composite_call_point_at_the_call():
    text = contract(GEMM, [STEP]).replace("tile(kt, BK)], b_s", "tile(kt, BK)], a_s")   # a_s twice: a race
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "load2_sync_mma_sync(" in s)
    r = verify_stage(text, SPEC, get_problem("gemm_bf16"), RAGGED)
    assert r.outcome is Outcome.VERIFY_FAILED and {d.line for d in r.errors} == {line}


@pytest.mark.parametrize("edit, rule", [
    (lambda t: t.replace(", acc)", ")"), "composite.arity"),
    (lambda t: t.replace("load2_sync_mma_sync(a_s", "load2_sync_mma_sync(a_s[0]"), "composite.operand"),
    (lambda t: t.replace("        load2_sync_mma_sync", "        sync(); load2_sync_mma_sync"), "composite.placement"),
])
def test_a_malformed_call_is_refused_with_its_rule(edit, rule):
    r = verify_stage(edit(contract(GEMM, [STEP])), SPEC, get_problem("gemm_bf16"), RAGGED)
    assert r.outcome is Outcome.VERIFY_FAILED and rule in {d.rule for d in r.errors}


def test_without_the_composite_in_the_harness_the_call_is_an_unknown_op():
    r = verify_stage(contract(GEMM, [STEP]), HarnessSpec(), get_problem("gemm_bf16"), RAGGED)
    assert r.outcome is Outcome.VERIFY_FAILED and "parse.unknown_op" in {d.rule for d in r.errors}


@pytest.mark.parametrize("data, said", [
    ({"name": "load", "operands": [["x", "buf"]], "body": ["sync()"]}, "not an op"),
    ({"name": "k", "operands": [["x", "tile"]], "body": ["sync()"]}, "kinds are"),
    ({"name": "k", "operands": [["x", "buf"]], "body": ["fill(x)", "load(x, a[tile(0, BM), :])"]}, "not an operand"),
    ({"name": "k", "operands": [["x", "buf"]], "body": ["x = smem(bf16, (4,))"]}, "one op call"),
    ({"name": "k", "operands": [["x", "buf"]], "body": ["for_(x)"]}, "not an op a composite may"),
    ({"name": "k", "operands": [["x", "buf"], ["y", "buf"]], "body": ["fill(x)"]}, "never used"),
    ({"name": "k", "operands": [["x", "buf"]], "body": ["fill(x"]}, "not an IR statement"),
])
def test_malformed_definitions_are_refused(data, said):
    with pytest.raises(HarnessDataError, match=said):
        Composite.from_data(data)
