"""Bindings (`name = expr`, Op.LET): text form and round trip, the `let` verifier rules (each passing and
failing at its planted line), the interpreter (CTA-wide and in roles), the protocol checker, the cost
model, inline_lets, the tactics, and the rewritten kmeans_update_smem seed (the measured kernel: same
hash once inlined, same outputs in the interpreter)."""
from pathlib import Path

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import TACTICS, apply
from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.expr import Bin, Sym
from cake_core.ir.ops import Op, Tile, View
from cake_core.ir.passes import inline_lets
from cake_core.ir.program import Builder, walk
from cake_core.ir.text import parse, parse_program
from cake_core.ir.types import DType
from cake_core.model.features import extract
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file


LET = """@kernel(target="sm_90a", grid=(cdiv(N, BN), cdiv(M, BM)), threads=128, consts={"BK": 32, "BM": 64, "BN": 64})
def g(a: gmem[f32, (M, K)], b: gmem[f32, (K, N)], c: gmem[f32, (M, N)]):
    acc = rmem(f32, (BM, BN))
    a_s = smem(f32, (BM, BK))
    b_s = smem(f32, (BK, BN))
    row = bid.y
    col = bid.x * 1
    for kt in range(cdiv(K, BK)):
        k0 = kt
        load(a_s, a[tile(row, BM), tile(k0, BK)])
        load(b_s, b[tile(k0, BK), tile(col, BN)])
        sync()
        mma(acc, a_s, b_s)
        sync()
    store(c[tile(row, BM), tile(col, BN)], acc)
"""

# rule id -> (old, new, line of the diagnostic)
PLANTED = {
    "let.shadow": ("    col = bid.x * 1\n", "    BN = bid.x * 1\n", 7),
    "let.redefined": ("        k0 = kt\n", "        row = kt\n", 9),
    "let.scope": ("    store(c[tile(row, BM)", "    store(c[tile(k0, BM)", 15),
    "let.value": ("    col = bid.x * 1\n", "    col = bid.x * 1.0\n", 7),
}


def _rules(text: str) -> list:
    return check_text(text, "let.cake")


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


# ------------------------------------------------------------------ text


def test_a_binding_round_trips_and_is_canonical_text():
    p = parse_program(LET)
    assert p.text() == LET and parse_program(p.text()) == p
    lets = [(n, path) for n, path, _ in walk(p.body) if n.op is Op.LET]
    assert [n.args for n, _ in lets] == [("row", Sym("bid.y")), ("col", Bin("*", Sym("bid.x"), 1)),
                                         ("k0", Sym("kt"))]
    assert [path for _, path in lets] == ["let[row]", "let[col]", "for[kt].let[k0]"]
    assert lets[0][0].line == 6


def test_an_op_call_is_not_a_binding_and_let_is_not_a_call():
    assert parse(LET.replace("    row = bid.y\n", "    row = cdiv(M, BM)\n")).ok       # an index function: binding
    r = parse(LET.replace("    row = bid.y\n", "    row = smme(f32, (BM,))\n"))
    assert [d.rule for d in r.diagnostics] == ["parse.unknown_op"] and "let" not in r.diagnostics[0].hint
    r = parse(LET.replace("    row = bid.y\n", "    let(row, bid.y)\n"))
    assert [d.rule for d in r.diagnostics] == ["parse.statement"] and "row = bid.y" not in r.diagnostics[0].hint
    r = parse(LET.replace("    row = bid.y\n", '    row = "y"\n'))
    assert [d.rule for d in r.diagnostics] == ["parse.expr"]


def test_the_builder_makes_the_parsed_binding():
    b = Builder("k", target="sm_90a", grid=(1,), threads=128)
    b.param("y", DType.F32, (Sym("N"),))
    b.emit(Op.RMEM, DType.F32, (128,), result="r")
    with b.loop("t", 4):
        i = b.let("i", Bin("+", Sym("t"), 1))
        b.emit(Op.STORE, View("y", (Tile(Sym(i), 128),)), "r")
    p = b.build()
    assert parse_program(p.text()) == p and "        i = t + 1\n" in p.text()


# ------------------------------------------------------------------ verifier rules


def test_the_binding_program_passes_every_rule():
    assert _rules(LET) == []


@pytest.mark.parametrize("rule_id", sorted(PLANTED))
def test_a_planted_binding_mistake_fails_at_its_line(rule_id):
    old, new, line = PLANTED[rule_id]
    assert old in LET
    text = LET.replace(old, new, 1)
    hits = [d for d in _rules(text) if d.rule == rule_id]
    assert hits, [d.rule for d in _rules(text)]
    assert hits[0].line == line and hits[0].hint and hits[0].path, hits[0].format("let.cake", text)


def test_shadowing_each_kind_of_name_is_refused():
    for name, what in (("N", "problem dimension"), ("a", "parameter"), ("a_s", "buffer"), ("num_sms", "launch")):
        text = LET.replace("    col = bid.x * 1\n", f"    {name} = bid.x * 1\n    col = bid.x * 1\n")
        (d,) = [d for d in _rules(text) if d.rule == "let.shadow"]
        assert what in d.message and d.line == 7
    text = LET.replace("        k0 = kt\n", "        kt = 0\n        k0 = kt\n")
    (d,) = [d for d in _rules(text) if d.rule == "let.shadow"]
    assert "loop variable (line 8)" in d.message and d.line == 9


def test_use_before_the_binding_and_self_reference_are_scope_errors():
    text = LET.replace("    row = bid.y\n", "    row = col\n")
    (d,) = [d for d in _rules(text) if d.rule == "let.scope"]
    assert d.line == 6 and "before its binding at line 7" in d.message
    assert "shapes.symbols" not in [x.rule for x in _rules(text)]       # one diagnostic, the precise one
    text = LET.replace("        k0 = kt\n", "        k0 = k0 + 1\n")
    assert [(d.rule, d.line) for d in _rules(text) if d.rule.startswith("let")] == [("let.scope", 9)]


def test_a_loop_or_buffer_named_like_a_binding_in_scope_is_redefined():
    text = LET.replace("for kt in range", "for row in range").replace("        k0 = kt\n", "        k0 = row\n")
    assert ("types.redefined", 8) in [(d.rule, d.line) for d in _rules(text)]


def test_sibling_blocks_may_reuse_a_name():
    text = LET.replace("    store(c[", "    for j in range(1):\n        k0 = j\n    store(c[")
    assert _rules(text) == []


PINGPONG = corpus_file("kmeans_assign_pingpong.cake").read_text()
RUN = "(t - bid.x) // ncta.x * cdiv(K, 2 * BN) + kp"


def _pingpong_with_bindings() -> str:
    """The pingpong seed with its running k-pair count bound once per trip in each role."""
    out = []
    for ln in PINGPONG.splitlines(keepends=True):
        out.append(ln.replace(f"({RUN})", "it").replace(RUN, "it"))
        if ln.strip().startswith("for kp in range("):
            out.append(" " * (len(ln) - len(ln.lstrip()) + 4) + f"it = {RUN}\n")
    return "".join(out)


def test_bindings_in_roles_pass_the_verifier_and_the_protocol_checker():
    text = _pingpong_with_bindings()
    assert RUN not in text.replace(f"it = {RUN}", "") and text.count(f"it = {RUN}") == 3
    assert check_text(text) == []
    assert inline_lets(parse_program(text)).hash == parse_program(PINGPONG).hash


def test_a_phase_bound_to_a_name_is_read_through_the_binding():
    text = _pingpong_with_bindings().replace("wait(turn0[0], phase=(it + 1) % 2)",
                                             "ph = (it + 1) % 2\n                wait(turn0[0], phase=ph)")
    assert "phase=ph" in text and check_text(text) == []
    bad = text.replace("ph = (it + 1) % 2", "ph = it + 1")
    assert ("mbarrier.phase", _line(bad, "phase=ph")) in [(d.rule, d.line) for d in check_text(bad)]


def test_a_broken_phase_through_a_binding_is_still_a_deadlock():
    text = _pingpong_with_bindings().replace("wait(turn0[0], phase=(it + 1) % 2)", "wait(turn0[0], phase=it % 2)")
    assert "protocol.deadlock" in [d.rule for d in check_text(text)]


def test_a_binding_between_sibling_roles_is_misplaced():
    text = PINGPONG.replace('    with role("consumer0"', '    it0 = bid.x\n    with role("consumer0"')
    (d,) = [d for d in check_text(text) if d.rule == "let.placement"]
    assert d.line == _line(text, "it0 = bid.x") and "producer" in d.message
    before = PINGPONG.replace('    with role("producer"', '    it0 = bid.x\n    with role("producer"')
    assert "let.placement" not in [d.rule for d in check_text(before)]


# ------------------------------------------------------------------ interpreter, cost model


def test_the_interpreter_binds_values_per_trip():
    p = parse_program(LET)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((70, 50)).astype(np.float32), rng.standard_normal((50, 90)).astype(np.float32)
    out = {"c": np.full((70, 90), np.nan, np.float32)}
    interp.run(p, {"M": 70, "N": 90, "K": 50}, {"a": a, "b": b}, out)
    assert np.allclose(out["c"], a @ b, atol=1e-4)


def test_bindings_in_roles_match_the_oracle_in_the_interpreter():
    shapes = [{"B": 1, "N": 129, "K": 60, "D": 32}, {"B": 2, "N": 300, "K": 300, "D": 64}]
    checks = check_on_cpu(parse_program(_pingpong_with_bindings()), get_problem("kmeans_assign"), shapes, seed=3)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_the_cost_model_sees_bound_loop_extents():
    text = LET.replace("    for kt in range(cdiv(K, BK)):", "    nk = cdiv(K, BK)\n    for kt in range(nk):")
    shape = {"M": 512, "N": 512, "K": 512}
    assert extract(parse_program(text), shape) == extract(parse_program(LET), shape)


def test_the_llm_reference_and_replies_carry_bindings():
    from cake_core.agents.llm_agent import extract_program
    from cake_core.ir.reference import render_reference
    assert "### `let`" in render_reference() and "name = expr" in render_reference()
    assert parse_program(extract_program(f"Here:\n```python\n{LET}```\n")) == parse_program(LET)


# ------------------------------------------------------------------ inline_lets, tactics


def test_inline_lets_substitutes_through_nested_bindings():
    p = inline_lets(parse_program(LET))
    assert not [n for n, _, _ in walk(p.body) if n.op is Op.LET]
    assert "tile(bid.y, BM), tile(kt, BK)" in p.text() and "tile(bid.x * 1, BN)" in p.text()


@pytest.mark.parametrize("which", ["kmeans_update_smem", "pingpong"])
@pytest.mark.parametrize("name", sorted(TACTICS))
def test_every_tactic_keeps_a_program_with_bindings_valid_or_skips_it(name, which):
    seed = parse_program(corpus_file("kmeans_update_smem.cake").read_text() if which == "kmeans_update_smem"
                         else _pingpong_with_bindings())
    for s in range(8):
        out = apply(name, seed, np.random.default_rng(s))
        if isinstance(out, Refused):
            continue
        again = parse_program(out.text())
        assert again == out
        assert [n.args for n, _, _ in walk(out.body) if n.op is Op.LET] == \
            [n.args for n, _, _ in walk(seed.body) if n.op is Op.LET]
        assert not [d for d in check_text(out.text()) if d.rule.startswith(("let.", "parse.", "shapes.symbols"))]


def test_the_tactic_agent_mutates_the_best_known_program_with_its_bindings():
    from cake_core.agents.base import Context
    from cake_core.agents.tactic_agent import TacticAgent
    upd = get_problem("kmeans_update")
    gen0 = TacticAgent(seed=5).propose(upd, Context(harness_version=1, generation=0, population=6,
                                                     known=upd.best_texts()))
    best = parse_program(corpus_file("kmeans_update_smem.cake").read_text())    # a best-known program with bindings
    assert any(c.tactic == "best-known" and parse_program(c.text) == best for c in gen0)
    later = TacticAgent(seed=5).propose(upd, Context(1, 1, 6, best=[(best.text(), 1.0)]))
    assert later and all(parse_program(c.text).text() == c.text and "chunk = cdiv(N, BN * splits)" in c.text
                         for c in later)


# ------------------------------------------------------------------ the kmeans_update_smem rewrite

UPD = get_problem("kmeans_update")
MEASURED_HASH = "a80ac3e5b3ea2eed"     # kmeans_update_smem as measured on the GPU, before the bindings


def test_the_rewritten_seed_is_the_measured_kernel():
    text = corpus_file("kmeans_update_smem.cake").read_text()
    p = parse_program(text)
    assert sum(n.op is Op.LET for n, _, _ in walk(p.body)) == 5
    assert "max(1, SMS // (B * cdiv(D, BD)))" not in text.split("\n", 2)[2].replace(
        "splits = max(1, SMS // (B * cdiv(D, BD)))", "")
    assert inline_lets(p).hash == MEASURED_HASH
    assert check_text(text) == []


def _run(p, shape):
    inputs = UPD.make_inputs(shape, np.random.default_rng(1))
    out = {"sums": np.full((shape["B"], shape["K"], shape["D"]), 0, np.float32),
           "counts": np.zeros((shape["B"], shape["K"]), np.int32)}
    interp.run(p, dict(shape), {k: v for k, v in inputs.items() if k[0] != "_"}, out)
    return out


def test_the_rewritten_seed_gives_identical_outputs_on_the_small_set():
    p = parse_program(corpus_file("kmeans_update_smem.cake").read_text())
    before = inline_lets(p)
    for shape in UPD.shape_set("kmeans_update_small").shapes:
        a, b = _run(p, shape), _run(before, shape)
        assert all(np.array_equal(a[k], b[k]) for k in a), shape
