"""``hoist_loads``: a role-free kernel's top-level loads issued as early as their operands allow, the largest tile
first. The evolved KDA decode kernels' state load moves above the vectors' loads, their barrier and transforms;
the kernels pass the strict CPU gate and compile. The varlen seed's state load moves above the two reads of
cu_seqlens. It keeps a load below the scalar its window reads, below a store into the tensor it reads and below
a statement that touches its tile, and it refuses kernels with warp roles and kernels whose loads all sit in
loops."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cake_core.agents.rewrite import Refused
from cake_core.agents.tactics import STRUCTURAL, apply
from cake_core.ir.text import parse_program
from cake_core.ir.verify import verify
from cake_core.lower.cuda import lower
from cake_core.outcome import Outcome
from cake_core.problems import get_problem
from cake_core.runtime.cpu import check_on_cpu

ROOT = Path(__file__).parents[2]
DECODE_KERNELS = ["bench/kda_decode_rmem_bv32_ordered.cake",
                  "bench/results/programs/kda-decode-h100-2026-12-06-evolved.cake"]
DECODE_SHAPES = [{"B": 2, "H": 3, "DK": 128, "DV": 64}, {"B": 1, "H": 2, "DK": 128, "DV": 96}]

TOY = '''@kernel(target="sm_90a", grid=(B,), threads=128, consts={"TN": 64})
def toy(x: gmem[f32, (B, N)], idx: gmem[i32, (B,)], y: gmem[f32, (B, N)]):
    a = smem(f32, (1, TN))
    b = smem(f32, (1, TN))
    scalar(i, idx[bid.x], max=B - 1)
    load(a, x[tile(i, 1), tile(0, TN)])
    sync()
    store(y[tile(bid.x, 1), tile(0, TN)], a)
    sync()
    load(b, y[tile(bid.x, 1), tile(0, TN)])
    sync()
    store(y[tile(bid.x, 1), tile(0, TN)], b)
'''


def _hoist(p):
    return apply("hoist_loads", p, np.random.default_rng(0))


def test_hoist_loads_is_a_structural_tactic():
    assert "hoist_loads" in STRUCTURAL


@pytest.mark.parametrize("file", DECODE_KERNELS)
def test_the_decode_state_load_is_issued_first_and_the_kernel_stays_correct(file, tmp_path):
    p = parse_program((ROOT / file).read_text(), file)
    out = _hoist(p)
    assert not isinstance(out, Refused), out.reason
    first = [n for n in out.body if n.op.value == "load"][0]
    assert first.arg("dst") == "s_t" and first.arg("src").buf == "s"
    assert parse_program(out.text()) == out
    assert not [d for d in verify(out, shapes=DECODE_SHAPES) if d.is_error]
    checks = check_on_cpu(out, get_problem("kda_decode"), DECODE_SHAPES, seed=8, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]
    low = lower(out, "hoisted.cake")
    assert low.outcome is Outcome.OK, [d.message for d in low.diagnostics]
    if shutil.which("nvcc"):
        from cake_core.lower.compile import compile_kernel
        comp = compile_kernel(low.value, arch="sm_90a", cache_dir=tmp_path)
        assert comp.outcome is Outcome.OK, [d.message for d in comp.diagnostics]


def test_the_varlen_seed_s_state_load_moves_above_the_sequence_bounds():
    problem = get_problem("kda_varlen")
    p = parse_program(problem.seed_text())
    out = _hoist(p)
    assert not isinstance(out, Refused), out.reason
    ops = [n.op.value for n in out.body if n.op.value in ("load", "scalar", "for")]
    assert ops == ["load", "scalar", "scalar", "for"]
    shapes = [{"N": 3, "T": 40, "H": 2, "DK": 128, "DV": 128}]
    checks = check_on_cpu(out, problem, shapes, seed=2, strict=True)
    assert all(c.correct for c in checks), [c.message for c in checks]


def _lines(p) -> list[str]:
    return [ln.strip() for ln in p.text().splitlines()[4:]]


def test_it_keeps_a_load_below_what_it_depends_on():
    out = _hoist(parse_program(TOY))
    assert isinstance(out, Refused)
    # a's load reads i; b's load reads y, which other threads stored before the barrier above it
    assert "binds i, which the load's window reads" in out.reason
    assert "the barrier at line 9 orders the write of `y` at line 8 before the load" in out.reason
    nosync = _hoist(parse_program(TOY.replace("    sync()\n    load(b", "    load(b")))
    assert isinstance(nosync, Refused) and "line 8 (store) writes `y`, which the load reads" in nosync.reason


def test_a_load_moves_only_as_far_as_its_tile_is_untouched():
    text = TOY.replace("    scalar(i, idx[bid.x], max=B - 1)\n", "").replace("tile(i, 1)", "tile(bid.x, 1)") \
        .replace("load(b, y[", "load(b, x[")
    out = _hoist(parse_program(text))
    assert not isinstance(out, Refused), out.reason
    assert _lines(out)[:2] == ["load(a, x[tile(bid.x, 1), tile(0, TN)])", "load(b, x[tile(bid.x, 1), tile(0, TN)])"]
    touched = _hoist(_hoist(parse_program(text.replace("store(y[tile(bid.x, 1), tile(0, TN)], a)",
                                                       "ewise(b, a, a)"))))
    assert isinstance(touched, Refused) and "(ewise) declares or touches `b`" in touched.reason


def test_it_refuses_warp_roles_and_loads_that_sit_in_loops():
    ws = _hoist(parse_program(get_problem("kmeans_assign").kernel_text("kmeans_assign_ws.cake")))
    assert isinstance(ws, Refused) and "warp roles" in ws.reason
    gemm = _hoist(parse_program(get_problem("gemm_bf16").seed_text()))
    assert isinstance(gemm, Refused) and "no top-level load can be issued earlier" in gemm.reason
