"""Text form: canonical printing, round trips, identity, and diagnostics for malformed text."""
import pytest

from cake_core.ir.expr import Call, Sym
from cake_core.ir.ops import Op
from cake_core.ir.program import Builder
from cake_core.ir.text import parse, parse_program
from cake_core.ir.types import DType
from cake_core.problems import list_problems


@pytest.mark.parametrize("problem", list_problems(), ids=lambda p: p.name)
def test_seed_round_trips(problem):
    text = problem.seed_text()
    prog = parse_program(text)
    assert prog.text() == text, "seed files are kept in canonical form"
    assert parse_program(prog.text()) == prog


def test_hash_is_canonical_text_identity():
    p = list_problems()[0]
    a = parse_program(p.seed_text())
    spaced = p.seed_text().replace("(BM, BK)", "(BM,   BK)")
    b = parse_program(spaced)
    assert a.hash == b.hash
    assert a.with_consts(BK=16).hash != a.hash


def test_builder_makes_the_parsed_program():
    M, N, K, BM, BN, BK = (Sym(s) for s in ("M", "N", "K", "BM", "BN", "BK"))
    from cake_core.ir.ops import Tile, View
    b = Builder("gemm_bf16", target="sm_90a", grid=(Call("cdiv", (N, BN)), Call("cdiv", (M, BM))), threads=256,
                consts={"BM": 64, "BN": 64, "BK": 32})
    b.param("a", DType.BF16, (M, K)); b.param("b", DType.BF16, (K, N)); b.param("c", DType.F32, (M, N))
    b.emit(Op.SMEM, DType.BF16, (BM, BK), result="a_s")
    b.emit(Op.SMEM, DType.BF16, (BK, BN), result="b_s")
    b.emit(Op.RMEM, DType.F32, (BM, BN), result="acc")
    with b.loop("kt", Call("cdiv", (K, BK))):
        b.emit(Op.LOAD, "a_s", View("a", (Tile(Sym("bid.y"), BM), Tile(Sym("kt"), BK))))
        b.emit(Op.LOAD, "b_s", View("b", (Tile(Sym("kt"), BK), Tile(Sym("bid.x"), BN))))
        b.emit(Op.SYNC)
        b.emit(Op.MMA, "acc", "a_s", "b_s")
        b.emit(Op.SYNC)
    b.emit(Op.STORE, View("c", (Tile(Sym("bid.y"), BM), Tile(Sym("bid.x"), BN))), "acc")
    gemm = next(p for p in list_problems() if p.name == "gemm_bf16")
    assert b.build() == parse_program(gemm.seed_text())


BAD = [
    ("syntax", "def k(:\n", "parse.syntax", 1),
    ("unknown op", "    lod(a_s, a[tile(bid.y, BM), tile(kt, BK)])\n", "parse.unknown_op", 9),
    ("arity", "    sync(a_s)\n", "parse.arity", 9),
    ("type", "    x = smem(bf17, (BM, BK))\n", "parse.type", 9),
    ("attr type", "    x = smem(bf16, (BM, BK), swizzle=\"yes\")\n", "parse.type", 9),
    ("unknown attr", "    sync(fast=True)\n", "parse.attr", 9),
    ("negated name", "    r = rmem(f32, (BM,), fill=-big)\n", "parse.attr", 9),
    ("negated string", "    r = rmem(f32, (BM,), fill=-\"inf\")\n", "parse.attr", 9),
    ("inf on an int attr", "    x = smem(bf16, (BM, BK), stages=-inf)\n", "parse.attr", 9),
    ("statement", "    while True:\n        pass\n", "parse.statement", 9),
]
HEAD = ('@kernel(target="sm_90a", grid=(1,), threads=128, consts={"BK": 32, "BM": 64})\n'
        "def k(a: gmem[bf16, (M, K)]):\n" + "    pass\n" * 5)


@pytest.mark.parametrize("name,line,rule,lineno", BAD, ids=[b[0] for b in BAD])
def test_malformed_text_gets_a_located_diagnostic(name, line, rule, lineno):
    text = line if rule == "parse.syntax" else HEAD + "    pass\n" + line
    r = parse(text, "bad.cake")
    assert not r.ok
    d = next(d for d in r.diagnostics if d.rule == rule)
    assert d.line == lineno
    assert d.hint or rule == "parse.statement"
    assert "bad.cake:" in d.format("bad.cake", text)


def test_all_errors_are_collected():
    text = HEAD + "    lod(x)\n    sync(1)\n"
    rules = [d.rule for d in parse(text).diagnostics]
    assert rules == ["parse.unknown_op", "parse.arity"]


INF_FILLS = ('@kernel(target="sm_90a", grid=(1,), threads=128)\n'
             "def k(out: gmem[f32, (128,)]):\n"
             "    lo = rmem(f32, (128,), fill=-inf)\n"
             "    hi = rmem(f32, (128,), fill=inf)\n"
             "    fill(lo, value=-inf)\n"
             "    fill(hi, value=inf)\n"
             "    ewise(lo, lo, hi, fn=\"max\")\n"
             "    store(out[tile(0, 128)], lo)\n")


def test_infinite_attributes_print_back_to_the_same_text():
    prog = parse_program(INF_FILLS)
    assert prog.text() == INF_FILLS
    assert parse_program(prog.text()) == prog
    assert [dict(n.attrs).get("value", dict(n.attrs).get("fill")) for n in prog.body[:4]] == \
        [float("-inf"), float("inf"), float("-inf"), float("inf")]


def test_ninf_still_reads_as_minus_inf():
    prog = parse_program(INF_FILLS.replace("value=-inf", "value=ninf"))
    assert prog.text() == INF_FILLS
