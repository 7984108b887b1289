"""compact: stable stream compaction over the CTA, the count bound as a name (text, verifier, interpreter, bounds,
cost model, protocol checker); the positions of positive elements appended across tiles at a running offset that
fetch_add keeps in smem. tests/lower/test_lower_fetch_add.py lowers and compiles them;
tests/runtime/test_token_permute_gpu.py runs them on the GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sibling
from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.interp import InterpFault
from cake_core.ir.intervals import Interval, loop_bounds
from cake_core.ir.ops import Op
from cake_core.ir.printer import print_program
from cake_core.ir.program import walk
from cake_core.ir.text import parse_program
from cake_core.model.features import extract

_fetch_add = sibling.load(Path(__file__).parent / "test_fetch_add.py")

# the set flags of a 2-D tile, row-major, at positions 100 + j; only j < 2 * BC + 3 take part
WHERE = """@kernel(target="sm_90a", grid=(1,), threads=32, consts={"BC": 8, "BR": 4})
def where(f: gmem[i32, (R, C)], pos: gmem[i32, (BR * BC,)], count: gmem[i32, (1,)]):
    f_s = smem(i32, (BR, BC))
    p_s = smem(i32, (BR * BC,))
    v = smem(i32, (1,))
    load(f_s, f[tile(0, BR), tile(0, BC)])
    sync()
    compact(n, p_s, f_s, base=100, limit=100 + 2 * BC + 3, max=BR * BC)
    iota(v, base=n)
    sync()
    store(pos[tile(0, BR * BC)], p_s)
    store(count[tile(0, 1)], v)
"""

# keep[0 .. kept) = the positions of x's positive elements, in order: each tile's compacted at the running offset
KEEP = """@kernel(target="sm_90a", grid=(1,), threads=64, consts={"BN": 64})
def keep_positive(x: gmem[f32, (N,)], keep: gmem[i32, (N,)], kept: gmem[i32, (1,)]):
    x_s = smem(f32, (BN,))
    zero = smem(f32, (1,))
    hit = smem(i32, (BN,))
    pos = smem(i32, (BN,))
    at = smem(i32, (BN,))
    cur = smem(i32, (1,))
    v = smem(i32, (1,))
    fill(zero)
    fill(cur)
    sync()
    for t in range(cdiv(N, BN)):
        load(x_s, x[tile(t, BN)])
        sync()
        ewise(hit, x_s, zero, fn="gt")
        sync()
        compact(n, pos, hit, base=t * BN, limit=N, max=BN)
        fetch_add(off, cur[0], n, max=N)
        iota(at, base=off)
        sync()
        scatter_add(keep[:], at, pos, base=0, limit=n)
        sync()
    scalar(total, cur[0], max=N)
    iota(v, base=total)
    sync()
    store(kept[tile(0, 1)], v)
"""


def _errors(text: str) -> list[str]:
    return [d.rule for d in check_text(text) if d.severity.name == "ERROR"]


def keep_positive(x: np.ndarray, text: str = KEEP) -> tuple[np.ndarray, int]:
    N = x.size
    got = interp.run(parse_program(text), {"N": N}, {"x": x},
                     {"keep": np.zeros(N, np.int32), "kept": np.full(1, -7, np.int32)})
    return got["keep"], int(got["kept"][0])


def test_the_set_flags_are_listed_row_major_past_the_base_up_to_the_limit_then_minus_one():
    assert _errors(WHERE) == []
    f = np.zeros((3, 5), np.int32)            # R=3 rows of C=5 columns, padded to the (4, 8) tile with zeros
    f[0, [1, 4]] = 1
    f[1, 0] = 7
    f[2, [2, 3]] = -2                           # tile position 2 * 8 + 3 = 19 is past the limit
    got = interp.run(parse_program(WHERE), {"R": 3, "C": 5}, {"f": f},
                     {"pos": np.full(32, -7, np.int32), "count": np.full(1, -7, np.int32)})
    assert got["count"][0] == 4
    np.testing.assert_array_equal(got["pos"], [101, 104, 108, 118] + [-1] * 28)


@pytest.mark.parametrize("case", ["mixed", "none", "all"])
def test_positions_compacted_tile_by_tile_at_a_running_offset_match_numpy(case):
    assert _errors(KEEP) == []
    rng = np.random.default_rng({"mixed": 0, "none": 1, "all": 2}[case])
    x = rng.normal(size=150).astype(np.float32)
    x = -np.abs(x) if case == "none" else np.abs(x) + 0.5 if case == "all" else x
    keep, kept = keep_positive(x)
    want = np.flatnonzero(x > 0)
    assert kept == want.size
    np.testing.assert_array_equal(keep[:kept], want)
    assert (keep[kept:] == 0).all()


def test_a_count_past_the_declared_maximum_is_a_fault_at_its_line():
    with pytest.raises(InterpFault) as e:
        keep_positive(np.ones(70, np.float32), KEEP.replace("max=BN)", "max=BN - 1)"))
    assert "compact `n` counted 64 set flags of `hit`, outside its declared range [0, 63]" in str(e.value)
    assert e.value.node.line == 18


def test_the_text_round_trips_in_canonical_form():
    for text in (WHERE, KEEP):
        assert print_program(parse_program(text)) == text


def test_its_count_is_bounded_by_the_declared_range_and_costed_per_flag():
    p = parse_program(KEEP)
    loop = next(n for n, _, _ in walk(p.body) if n.op is Op.FOR)
    assert loop_bounds(p, {"N"})[id(loop.body[5])]["n"] == Interval(0, 64)       # after the compact: 0..BN
    one, two = (extract(p, {"N": n}) for n in (64, 128))
    assert two.simt_ops - one.simt_ops == 3 * 64           # a tile more: its ewise, compact and iota, BN each


_RACY_READ = WHERE.replace("    iota(v, base=n)\n    sync()\n", "    iota(v, base=n)\n")
_RACY_FLAGS = WHERE.replace("    sync()\n    compact(", "    compact(")


@pytest.mark.parametrize("text, rule, words, line", [
    (WHERE.replace("f_s = smem(i32, (BR, BC))", "f_s = smem(i32, (BR, BC), stages=2)"), "compact.operands",
     "compact reads a 1-D or 2-D single-stage unswizzled smem tile", 8),
    (WHERE.replace("p_s = smem(i32, (BR * BC,))", "p_s = smem(f32, (BR * BC,))"), "compact.operands",
     "writes positions into a 1-D single-stage unswizzled i32 smem tile", 8),
    (WHERE.replace("p_s = smem(i32, (BR * BC,))", "p_s = smem(i32, (BR, BC))").replace(
        "pos[tile(0, BR * BC)]", "pos[tile(0, BR)]"), "compact.operands", "1-D single-stage unswizzled i32", 8),
    (WHERE.replace("p_s = smem(i32, (BR * BC,))", "p_s = smem(i32, (BC,))").replace(
        "pos[tile(0, BR * BC)]", "pos[tile(0, BC)]"), "compact.operands", "`p_s` holds 8 positions and `f_s` 32", 8),
    (WHERE.replace("compact(n, p_s, f_s,", "compact(n, p_s, p_s,"), "compact.operands",
     "`p_s` is both the flags and the positions", 8),
    (WHERE.replace("max=BR * BC)", "max=R * C - 0.5)"), "compact.max", "compact `n`'s max holds a float", 8),
    (KEEP.replace("max=BN)", "max=t)"), "compact.max", "compact `n`'s max uses `t`", 18),
    (_RACY_READ, "races.smem", "read-after-write race on smem tile `p_s`: no sync() between the write at line 8", 10),
    (_RACY_FLAGS, "races.smem", "read-after-write race on smem tile `f_s`", 7),
])
def test_misuse_is_refused_for_its_reason_at_its_line(text, rule, words, line):
    diags = [d for d in check_text(text) if d.rule == rule]
    assert diags, [d.rule + ": " + d.message for d in check_text(text)]
    assert words in diags[0].message and diags[0].line == line, (diags[0].message, diags[0].line)
    assert diags[0].hint


_FLAGS = "hit = smem(i32, (8,))\n    pos = smem(i32, (8,))\n    fill(hit)\n    sync()\n    "


def test_the_protocol_checker_also_takes_the_count_at_zero():
    text = _fetch_add._ws_with_claimed_trips(_FLAGS + "compact(n, pos, hit, base=0, limit=8, max=cdiv(K, BK))")
    diags = [d for d in check_text(text) if d.rule.startswith("protocol.")]
    assert diags and diags[0].rule == "protocol.deadlock", [d.rule + ": " + d.message for d in check_text(text)]
    assert any("compact's count too" in w for w in diags[0].witness), diags[0].witness


def test_inside_a_role_it_is_refused():
    text = _fetch_add.WS.replace(
        '    with role("producer", warps=(0, 4), regs=40):\n',
        '    hit = smem(i32, (8,))\n    pos = smem(i32, (8,))\n    fill(hit)\n    sync()\n'
        '    with role("producer", warps=(0, 4), regs=40):\n        compact(n, pos, hit, base=0, limit=8, max=8)\n')
    d = [d for d in check_text(text) if d.rule == "let.cta_wide"]
    assert d and d[0].line == 12 and "compact `n` inside role `producer`" in d[0].message, \
        [x.rule for x in check_text(text)]
