"""Persistent kernels: `for t in range(start, stop, step)`, the grid's CTA counts `ncta.x/y/z`, the launch
symbol `num_sms` in the grid; the interpreter, the protocol checker (ring phases carried across tiles) and the
verifier rules on the persistent GEMM seed and planted mistakes."""
from pathlib import Path

import pytest

from cake_core.ir import interp
from cake_core.ir.check import check_text
from cake_core.ir.expr import Bin, Call, Sym
from cake_core.ir.ops import Op, loop_range
from cake_core.ir.program import Builder
from cake_core.ir.protocol import check_protocol
from cake_core.targets import get_arch
from cake_core.ir.text import parse_program
from cake_core.ir.types import DType
from cake_core.ir.verify import build_ctx
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SEED = corpus_file("gemm_bf16_persistent.cake").read_text()
GEMM = get_problem("gemm_bf16")
IT = "(t - bid.x) // ncta.x * cdiv(K, BK) + kt"          # the running k-tile count of the seed's ring
LAST_RELEASE = "            arrive(empty[((t - bid.x) // ncta.x * cdiv(K, BK) + cdiv(K, BK) + S - 1) % S])\n"

TOY = """@kernel(target="sm_90a", grid=(min(cdiv(N, 64), num_sms),), threads=128, consts={"BN": 64})
def toy(x: gmem[f32, (N,)], y: gmem[f32, (N,)]):
    r = rmem(f32, (BN,))
    for t in range(bid.x, cdiv(N, BN), ncta.x):
        load(r, x[tile(t, BN)])
        store(y[tile(t, BN)], r)
"""


def _protocol(text: str):
    return check_protocol(build_ctx(parse_program(text), get_arch("sm_90a")))


def _rules(text: str) -> list[str]:
    return [d.rule for d in check_text(text)]


# ------------------------------------------------------------------ text, builder


def test_ranged_loops_round_trip_and_range_0_n_is_canonical():
    p = parse_program(TOY)
    assert p.text() == TOY
    (loop,) = [n for n in p.body if n.op is Op.FOR]
    assert loop_range(loop) == (Sym("bid.x"), Call("cdiv", (Sym("N"), Sym("BN"))), Sym("ncta.x"))
    plain = TOY.replace("range(bid.x, cdiv(N, BN), ncta.x)", "range(0, cdiv(N, BN))")
    assert "range(cdiv(N, BN))" in parse_program(plain).text()                       # (var, stop) again
    two = TOY.replace("range(bid.x, cdiv(N, BN), ncta.x)", "range(bid.x, cdiv(N, BN))")
    assert "range(bid.x, cdiv(N, BN)):" in parse_program(two).text()                 # step 1 is not printed
    assert parse_program(SEED).text() == SEED


def test_builder_makes_the_parsed_loop():
    b = Builder("toy", target="sm_90a", grid=(Call("min", (Call("cdiv", (Sym("N"), 64)), Sym("num_sms"))),),
                threads=128, consts={"BN": 64})
    b.param("x", DType.F32, (Sym("N"),))
    b.param("y", DType.F32, (Sym("N"),))
    b.emit(Op.RMEM, DType.F32, (Sym("BN"),), result="r")
    from cake_core.ir.ops import Tile, View
    with b.loop("t", Call("cdiv", (Sym("N"), Sym("BN"))), start=Sym("bid.x"), step=Sym("ncta.x")):
        b.emit(Op.LOAD, "r", View("x", (Tile(Sym("t"), Sym("BN")),)))
        b.emit(Op.STORE, View("y", (Tile(Sym("t"), Sym("BN")),)), "r")
    assert b.build().text() == TOY


def test_a_bad_range_is_a_parse_error():
    bad = TOY.replace("range(bid.x, cdiv(N, BN), ncta.x)", "range(bid.x, cdiv(N, BN), ncta.x, 2)")
    assert "parse.for" in _rules(bad)


# ------------------------------------------------------------------ interpreter


@pytest.mark.parametrize("num_sms", [1, 2, 3, 132])
def test_every_tile_is_visited_once_whatever_the_sm_count(num_sms):
    import numpy as np
    p = parse_program(TOY)
    x = np.arange(1000, dtype=np.float32)
    y = np.full(1000, np.nan, dtype=np.float32)
    interp.run(p, {"N": 1000}, {"x": x}, {"y": y}, num_sms=num_sms)
    assert np.array_equal(x, y)
    assert interp.grid_size(p, {"N": 1000}, num_sms) == (min(16, num_sms),)


def test_persistent_seed_matches_the_oracle_in_the_interpreter():
    # small aligned shapes (N, K multiples of 8), ragged against 128 x 256 x 64; on 3 SMs every CTA walks
    # several tiles and the ring phases cross tile boundaries with K / BK odd and even
    shapes = [{"M": 96, "N": 80, "K": 72}, {"M": 128, "N": 256, "K": 64}, {"M": 200, "N": 72, "K": 136},
              {"M": 129, "N": 264, "K": 520}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72},
              {"M": 300, "N": 1000, "K": 24}]
    checks = check_on_cpu(parse_program(SEED), GEMM, shapes, seed=13)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


# ------------------------------------------------------------------ protocol checker


def test_the_persistent_seed_passes_every_rule():
    assert check_text(SEED) == []


def test_a_ring_phase_restarting_with_each_tile_is_a_deadlock():
    text = SEED.replace(f"phase=({IT}) // S % 2", "phase=kt // S % 2")
    assert text != SEED
    found = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert found, "the checker must follow the ring across tiles"
    assert any("trip t=" in w for w in found[0].witness)


def test_a_tile_that_never_releases_its_last_slot_is_a_deadlock():
    text = SEED.replace(LAST_RELEASE, "")
    assert text != SEED
    (d,) = [d for d in _protocol(text) if d.rule == "protocol.deadlock"]
    assert "empty[" in d.message and d.path == "role[producer].for[t].for[kt].wait"


def test_releasing_the_last_slot_before_the_wgmma_drained_is_a_race():
    text = SEED.replace("            wgmma_wait(0)\n" + LAST_RELEASE, LAST_RELEASE + "            wgmma_wait(0)\n")
    assert text != SEED
    assert "protocol.slot_reuse" in [d.rule for d in _protocol(text)]


# ------------------------------------------------------------------ verifier rules


def test_loop_step_must_be_positive():
    assert "control.loop_step" not in _rules(TOY)
    bad = TOY.replace("range(bid.x, cdiv(N, BN), ncta.x)", "range(bid.x, cdiv(N, BN), 0)")
    assert "control.loop_step" in _rules(bad)


def test_num_sms_is_for_the_grid_and_ncta_for_the_body():
    assert "shapes.launch_symbols" not in _rules(TOY)
    in_body = TOY.replace("range(bid.x, cdiv(N, BN), ncta.x)", "range(bid.x, cdiv(N, BN), num_sms)")
    assert "shapes.launch_symbols" in _rules(in_body)
    in_grid = TOY.replace("grid=(min(cdiv(N, 64), num_sms),)", "grid=(min(cdiv(N, 64), ncta.x),)")
    assert "shapes.launch_symbols" in _rules(in_grid)
    assert "shapes.symbols" not in _rules(in_body) + _rules(in_grid)


def test_arrive_sites_in_different_blocks_of_a_role_are_alternatives():
    # the seed releases in its k-loop and after it: 2 arrivals a phase, not 4
    assert "mbarrier.arrivals" not in _rules(SEED)
    # two releases in the same block both happen every phase: 4 arrivals against 2
    twice = SEED.replace(LAST_RELEASE, LAST_RELEASE + LAST_RELEASE)
    assert "mbarrier.arrivals" in _rules(twice)


def test_cost_model_walks_the_largest_tile_share():
    from cake_core.model.features import extract
    f = extract(parse_program(SEED), {"M": 4096, "N": 4096, "K": 4096})
    assert f.ctas == 132
    # 512 tiles on 132 CTAs: CTA 0 walks 4, so the work counted per CTA is 4 tiles (wave quantization)
    assert f.tensor_flops == pytest.approx(4 * 2 * 128 * 256 * 4096)


def test_expression_helpers_know_the_new_symbols():
    from cake_core.ir.expr import c_expr
    assert c_expr(Bin("+", Sym("bid.x"), Sym("ncta.x"))) == "(blockIdx.x + gridDim.x)"
