"""scalar: an integer read from memory bound as a name, usable in window offsets, loop bounds and conditions
(text, verifier, interpreter, bounds, cost model); tests/lower/test_lower_scalar.py lowers and compiles it."""
from __future__ import annotations

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.intervals import Interval, loop_bounds
from cake_core.ir.interp import InterpFault
from cake_core.ir.ops import Op
from cake_core.ir.printer import print_program
from cake_core.ir.program import walk
from cake_core.ir.text import parse_program
from cake_core.model.features import extract
from cake_core.problems import corpus_file

# row gather: y[m] = x[ids[m]], each CTA's source row an offset read from memory
GATHER = """@kernel(target="sm_90a", grid=(M,), threads=64, consts={"BC": 32})
def gather_rows(ids: gmem[i32, (M,)], x: gmem[f32, (N, C)], y: gmem[f32, (M, C)]):
    r = smem(f32, (1, BC))
    scalar(e, ids[bid.x], max=N - 1)
    for c in range(cdiv(C, BC)):
        load(r, x[tile(e, 1), tile(c, BC)])
        sync()
        store(y[tile(bid.x, 1), tile(c, BC)], r)
        sync()
"""

# ragged rows: out[s] = sum of the first cnt[s] rows of x[s] (a count read from memory bounds a loop; a
# condition on it skips the empty segments' copy)
RAGGED = """@kernel(target="sm_90a", grid=(S,), threads=32, consts={"BC": 32})
def ragged_sum(cnt: gmem[i32, (S,)], x: gmem[f32, (S, R, C)], out: gmem[f32, (S, C)]):
    acc = smem(f32, (1, BC))
    row = smem(f32, (1, BC))
    scalar(n, cnt[bid.x], max=R)
    fill(acc, value=0.0)
    sync()
    for i in range(n):
        load(row, x[bid.x, tile(i, 1), tile(0, BC)])
        sync()
        ewise(acc, acc, row)
        sync()
    if n > 0:
        store(out[tile(bid.x, 1), tile(0, BC)], acc)
    if n == 0:
        store(out[tile(bid.x, 1), tile(0, BC)], acc)
"""


# the index read from an smem tile the CTA loaded (and synchronised): y[m] = x[ids[m, 1]]
SMEM = """@kernel(target="sm_90a", grid=(M,), threads=64, consts={"BC": 32})
def gather_rows_smem(ids: gmem[i32, (M, 2)], x: gmem[f32, (N, C)], y: gmem[f32, (M, C)]):
    ix = smem(i32, (1, 2))
    r = smem(f32, (1, BC))
    load(ix, ids[tile(bid.x, 1), tile(0, 2)])
    sync()
    scalar(e, ix[0, 1], max=N - 1)
    for c in range(cdiv(C, BC)):
        load(r, x[tile(e, 1), tile(c, BC)])
        sync()
        store(y[tile(bid.x, 1), tile(c, BC)], r)
        sync()
"""


def _rules(text: str) -> list[str]:
    return [d.rule for d in check_text(text) if d.severity.name == "ERROR"]


def _run(text: str, shape: dict, inputs: dict, outputs: dict) -> dict:
    return interp.run(parse_program(text), shape, inputs, outputs)


def test_a_gathered_row_is_the_row_its_index_names():
    assert _rules(GATHER) == []
    rng = np.random.default_rng(0)
    M, N, C = 5, 7, 45
    x = rng.normal(size=(N, C)).astype(np.float32)
    ids = rng.integers(0, N, M).astype(np.int32)
    got = _run(GATHER, {"M": M, "N": N, "C": C}, {"ids": ids, "x": x}, {"y": np.full((M, C), np.nan, np.float32)})
    np.testing.assert_array_equal(got["y"], x[ids])


def test_a_loop_bounded_by_a_count_read_from_memory_runs_that_many_trips():
    assert _rules(RAGGED) == []
    rng = np.random.default_rng(1)
    S, R, C = 4, 6, 32
    x = rng.normal(size=(S, R, C)).astype(np.float32)
    cnt = np.array([0, 6, 3, 1], np.int32)
    got = _run(RAGGED, {"S": S, "R": R, "C": C}, {"cnt": cnt, "x": x}, {"out": np.full((S, C), np.nan, np.float32)})
    want = np.stack([x[s, :cnt[s]].sum(axis=0) for s in range(S)])
    np.testing.assert_allclose(got["out"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad", [7, -1])
def test_a_value_outside_its_declared_range_is_a_fault_at_its_line(bad):
    M, N, C = 3, 7, 32
    ids = np.array([0, bad, 2], np.int32)
    with pytest.raises(InterpFault) as e:
        _run(GATHER, {"M": M, "N": N, "C": C}, {"ids": ids, "x": np.ones((N, C), np.float32)},
             {"y": np.full((M, C), np.nan, np.float32)})
    assert f"read {bad} from `ids`[1], outside its declared range [0, 6]" in str(e.value)
    assert e.value.node.line == 4


def test_the_text_round_trips():
    for text in (GATHER, RAGGED):
        p = parse_program(text)
        again = parse_program(print_program(p))
        assert print_program(again) == print_program(p)
        assert "scalar(e, ids[bid.x], max=N - 1)" in print_program(parse_program(GATHER))


def test_its_name_is_bounded_by_the_declared_range():
    p = parse_program(RAGGED)
    loop = next(n for n, _, _ in walk(p.body) if n.op is Op.FOR)
    inner = loop.body[0]
    env = loop_bounds(p, {"S", "R", "C"})
    assert env[id(loop)]["n"] == Interval(0, None)         # max=R: R is any dimension
    assert env[id(inner)]["i"] == Interval(0, None)
    capped = parse_program(RAGGED.replace("max=R", "max=BC"))
    inner = next(n for n, _, _ in walk(capped.body) if n.op is Op.FOR).body[0]
    assert loop_bounds(capped, {"S", "R", "C"})[id(inner)]["i"] == Interval(0, 31)


def test_the_cost_model_counts_its_loop_at_the_declared_maximum():
    shape = {"S": 4, "R": 64, "C": 32}
    few, many = (extract(parse_program(RAGGED.replace("max=R", f"max={hi}")), shape) for hi in (2, 16))
    assert few.read_bytes_load == 2 * 32 * 4           # two rows of 32 f32 (per CTA)
    assert many.read_bytes_load == 8 * few.read_bytes_load


@pytest.mark.parametrize("edit, rule, words", [
    ("ids: gmem[i32, (M,)]", "scalar.source", "of f32; it reads i32 or i64"),
    ("ids[bid.x], max", "scalar.source", "a window of `ids`, not one element"),
    ("max=N - 1", "scalar.max", "uses `c`"),
    ("max=N - 1)", "scalar.max", "holds a float"),
    ("scalar(e,", "let.shadow", "binding `N` shadows the problem dimension"),
])
def test_misuse_is_refused_for_its_reason(edit, rule, words):
    text = {
        "ids: gmem[i32, (M,)]": GATHER.replace("ids: gmem[i32, (M,)]", "ids: gmem[f32, (M,)]"),
        "ids[bid.x], max": GATHER.replace("ids: gmem[i32, (M,)]", "ids: gmem[i32, (M, 2)]")
                                 .replace("ids[bid.x], max", "ids[bid.x, tile(0, 2)], max"),
        "max=N - 1": GATHER.replace("    scalar(e, ids[bid.x], max=N - 1)\n", "").replace(
            "        load(r, x[tile(e, 1)", "        scalar(e, ids[bid.x], max=c)\n        load(r, x[tile(e, 1)"),
        "max=N - 1)": GATHER.replace("max=N - 1)", "max=N - 1.5)"),
        "scalar(e,": GATHER.replace("scalar(e,", "scalar(N,").replace("tile(e, 1)", "tile(N, 1)"),
    }[edit]
    diags = [d for d in check_text(text) if d.rule == rule]
    assert diags, [d.rule + ": " + d.message for d in check_text(text)]
    assert words in diags[0].message
    assert diags[0].line == next(i for i, ln in enumerate(text.splitlines(), 1) if "scalar(" in ln)


def test_an_smem_source_is_read_after_a_sync_and_a_missing_sync_is_a_race():
    assert _rules(SMEM) == []
    rng = np.random.default_rng(7)
    M, N, C = 4, 9, 40
    ids = rng.integers(0, N, (M, 2)).astype(np.int32)
    x = rng.normal(size=(N, C)).astype(np.float32)
    got = _run(SMEM, {"M": M, "N": N, "C": C}, {"ids": ids, "x": x}, {"y": np.full((M, C), np.nan, np.float32)})
    np.testing.assert_array_equal(got["y"], x[ids[:, 1]])
    racy = SMEM.replace("    sync()\n    scalar(", "    scalar(", 1)
    assert "races.smem" in _rules(racy)


@pytest.mark.parametrize("alloc, words", [
    ("ix = smem(i32, (1, 2), stages=2)", "a ring smem tile"),
    ("ix = rmem(i32, (64, 2))", "a rmem tile"),
])
def test_an_smem_source_that_is_not_a_plain_tile_is_refused_with_the_way_out(alloc, words):
    text = SMEM.replace("ix = smem(i32, (1, 2))", alloc)
    if "rmem" in alloc:
        text = text.replace("load(ix, ids[tile(bid.x, 1), tile(0, 2)])", "fill(ix)")
    d = [d for d in check_text(text) if d.rule == "scalar.source"]
    assert d and words in d[0].message, [x.rule + ": " + x.message for x in check_text(text)]


WS = corpus_file("gemm_bf16_ws.cake").read_text()


def _ws_with_producer_trips(trips: str) -> str:
    """The warp-specialized GEMM whose producer's loop runs ``trips`` times, read with scalar from a count
    tensor, while its consumer's runs cdiv(K, BK) times."""
    text = WS.replace("c: gmem[f32, (M, N)]):", "c: gmem[f32, (M, N)], cnt: gmem[i32, (1,)]):")
    text = text.replace('    with role("producer", warps=(0, 4), regs=40):\n        for kt in range(cdiv(K, BK)):',
                        '    with role("producer", warps=(0, 4), regs=40):\n'
                        f'        scalar(n, cnt[0], max={trips})\n        for kt in range(n):')
    assert text.count("scalar(n,") == 1
    return text


def test_the_protocol_checker_also_runs_a_scalar_at_zero():
    # at its maximum the producer fills every tile the consumer waits for: no finding there
    ok = _ws_with_producer_trips("cdiv(K, BK)")
    # the same bound, read as 0: the consumer waits for a tile no producer fills
    diags = [d for d in check_text(ok) if d.rule.startswith("protocol.")]
    assert diags and diags[0].rule == "protocol.deadlock", [d.rule + ": " + d.message for d in check_text(ok)]
    assert any("every scalar read as 0" in w for w in diags[0].witness), diags[0].witness


def test_a_role_that_guards_its_scalar_bounded_loop_passes_at_zero():
    # the consumer's loop bounded by the same count: at 0 neither role moves, at the maximum both walk K
    text = _ws_with_producer_trips("cdiv(K, BK)").replace(
        '    with role("consumer", warps=(4, 12), regs=232):\n        acc = rmem(f32, (BM, BN))\n'
        '        for kt in range(cdiv(K, BK)):',
        '    with role("consumer", warps=(4, 12), regs=232):\n        acc = rmem(f32, (BM, BN))\n'
        '        scalar(m, cnt[0], max=cdiv(K, BK))\n        for kt in range(m):')
    assert text.count("scalar(") == 2
    assert [d.rule for d in check_text(text) if d.rule.startswith("protocol.")] == []
