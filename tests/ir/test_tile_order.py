"""tile_order: the grouped tile order of a persistent grid, bound by one op (text, verifier, interpreter,
protocol checker, cost model); tests/lower/test_lower_tile_order.py lowers and compiles it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.expr import evaluate
from cake_core.ir.interp import InterpFault
from cake_core.ir.ops import Op
from cake_core.ir.program import walk
from cake_core.ir.protocol import check_protocol
from cake_core.ir.rule_ctx import build_ctx
from cake_core.ir.text import parse_program
from cake_core.model.features import extract
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.targets import get_arch
from cake_core.problems import corpus_file

SEED = corpus_file("gemm_bf16_persistent.cake").read_text()
TM = "t // (G * cdiv(N, BN)) * G + t % (G * cdiv(N, BN)) % min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G)"
TN = "t % (G * cdiv(N, BN)) // min(cdiv(M, BM) - t // (G * cdiv(N, BN)) * G, G)"
LOOP = "        for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):\n"
ORDER = "            tile_order(tm, tn, t, cdiv(M, BM), cdiv(N, BN), group=G)\n"

# one CTA per tile of an (MT, NT / 32) grid of 1 x 32 tiles: each copies its tile, so y == x exactly when the
# CTAs' (tm, tn) cover every tile once
TOY = """@kernel(target="sm_90a", grid=(MT * cdiv(NT, 32),), threads=32, consts={"G": 3})
def toy(x: gmem[i32, (MT, NT)], y: gmem[i32, (MT, NT)]):
    r = rmem(i32, (32,))
    tile_order(tm, tn, bid.x, MT, cdiv(NT, 32), group=G)
    load(r, x[tm, tile(tn, 32)])
    store(y[tm, tile(tn, 32)], r)
"""


def with_tile_order(text: str = SEED) -> str:
    """The persistent GEMM seed with its spelt-out tile coordinates bound by tile_order in each role."""
    assert TM in text and TN in text and text.count(LOOP) == 2
    return text.replace(TM, "tm").replace(TN, "tn").replace(LOOP, LOOP + ORDER)


def order_lines(text: str) -> list[int]:
    """The IR lines of the tile_order calls."""
    return [i for i, ln in enumerate(text.splitlines(), 1) if "tile_order(" in ln]


def _coords(t: int, mt: int, nt: int, g: int) -> tuple[int, int]:
    """The seed's expressions for tile t, evaluated in Python."""
    first = t // (g * nt) * g
    rows = min(mt - first, g)
    return first + t % (g * nt) % rows, t % (g * nt) // rows


def _toy(g: int = 3, extra_ctas: int = 0):
    text = TOY.replace('"G": 3', f'"G": {g}')
    return parse_program(text.replace("grid=(MT * cdiv(NT, 32),)", f"grid=(MT * cdiv(NT, 32) + {extra_ctas},)"))


def test_the_op_round_trips_and_is_canonical_text():
    p = parse_program(with_tile_order())
    assert parse_program(p.text()) == p
    orders = [m for m, _, _ in walk(p.body) if m.op is Op.TILE_ORDER]
    assert len(orders) == 2 and all(m.args[:2] == ("tm", "tn") for m in orders)
    assert ORDER.strip() in p.text()


def test_a_malformed_call_is_a_parse_diagnostic():
    text = with_tile_order().replace("tile_order(tm, tn,", "tile_order(tm + 1, tn,")
    r = [d for d in check_text(text) if d.rule.startswith("parse.")]
    assert [(d.rule, d.line) for d in r] == [("parse.type", x) for x in order_lines(text)]
    assert "a new name it binds" in r[0].message
    r = [d for d in check_text(with_tile_order().replace(", group=G)", ")")) if d.rule.startswith("parse.")]
    assert [d.rule for d in r] == ["parse.arity", "parse.arity"] and "group=..." in r[0].message


def test_the_rewritten_seed_verifies_and_its_protocol_is_the_seeds():
    text = with_tile_order()
    assert check_text(text) == []
    assert check_protocol(build_ctx(parse_program(text), get_arch("sm_90a"))) == []


def test_its_names_follow_the_binding_rules():
    # a coordinate named like a const, bound twice, or used outside its block fails with the let rules
    shadow = with_tile_order().replace("tile_order(tm, tn,", "tile_order(G, tn,")
    assert "let.shadow" in {d.rule for d in check_text(shadow)}
    twice = with_tile_order().replace("tile_order(tm, tn,", "tile_order(tm, tm,")
    assert "let.redefined" in {d.rule for d in check_text(twice)}
    outside = with_tile_order().replace("    empty = mbarrier(S, arrivals=2)\n",
                                        "    empty = mbarrier(S, arrivals=2)\n    tile_order(um, un, bid.x, 4, 4, group=G)\n")
    outside = outside.replace("            wgmma_wait(0)\n", "            wgmma_wait(um)\n")
    assert "let.scope" not in {d.rule for d in check_text(outside)}      # bound before the roles: in scope
    late = with_tile_order().replace("            wgmma_wait(0)\n", "            wgmma_wait(tk)\n")
    late = late.replace("        store(", "        tile_order(tk, tl, t, 4, 4, group=G)\n        store(", 1)
    assert "let.scope" in {d.rule for d in check_text(late)}


def test_the_interpreter_binds_the_grouped_order():
    mt, nt = 7, 5 * 32
    x = {"x": (np.arange(mt * nt).reshape(mt, nt) % 9973).astype(np.int32)}
    for g in (1, 2, 3, 8):
        y = {"y": np.full((mt, nt), -1, np.int32)}
        interp.run(_toy(g), {"MT": mt, "NT": nt}, x, y)
        np.testing.assert_array_equal(y["y"], x["x"])       # every (tm, tn) once: a permutation of the tiles
    node = next(n for n in _toy().body if n.op is Op.TILE_ORDER)
    seen = []
    for t in range(7 * 5):
        got = node.decl.bind(node, lambda e: int(evaluate(e, {"MT": 7, "NT": nt, "G": 3, "bid.x": t})))
        assert (got["tm"], got["tn"]) == _coords(t, 7, 5, 3)
        seen.append((got["tm"], got["tn"]))
    assert sorted(seen) == [(i, j) for i in range(7) for j in range(5)]
    assert seen[:4] == [(0, 0), (1, 0), (2, 0), (0, 1)] and seen[-2:] == [(6, 3), (6, 4)]  # runs of 3 rows


def test_a_tile_outside_the_grid_or_a_group_below_one_faults_at_its_line():
    x = {"x": np.zeros((4, 64), np.int32)}
    with pytest.raises(InterpFault, match="tile 8 of a 4 x 2 grid of tiles") as e:
        interp.run(_toy(extra_ctas=1), {"MT": 4, "NT": 64}, x, {"y": np.zeros((4, 64), np.int32)})
    assert e.value.node.line == 4
    with pytest.raises(InterpFault, match="group=0: a group is at least one tile row"):
        interp.run(_toy(0), {"MT": 4, "NT": 64}, x, {"y": np.zeros((4, 64), np.int32)})


def test_the_rewritten_seed_matches_the_oracle_in_the_interpreter():
    shapes = [{"M": 96, "N": 80, "K": 72}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72}]
    checks = check_on_cpu(parse_program(with_tile_order()), get_problem("gemm_bf16"), shapes, seed=13)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_the_cost_model_charges_the_same_work():
    shape = {"M": 4096, "N": 4096, "K": 4096}
    a, b = (extract(parse_program(t), shape) for t in (SEED, with_tile_order()))
    def work(f):
        return f.tensor_flops, f.read_bytes_load + f.read_bytes_cp_async + f.read_bytes_tma, f.write_bytes, f.ctas
    assert work(a) == work(b) and work(a)[1] > 0
