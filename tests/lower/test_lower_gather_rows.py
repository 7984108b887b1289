"""gather lowered onto cake::gather_smem_gmem (header/cake.cuh) and compiled with nvcc, alone and in the grouped
GEMM over gathered rows; refused inside a warp role."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import sibling
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.outcome import Outcome

_ir = sibling.load(Path(__file__).parents[1] / "ir" / "test_gather.py")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def test_it_lowers_to_the_header_gather_with_the_gathered_dimension_as_the_row_stride():
    src = lower(parse_program(_ir.PICK)).value.source
    assert ("cake::gather_smem_gmem<8, 32, THREADS>(a_s, x + ((cake::index_t)(c * BC) * (cake::index_t)1), "
            "(cake::index_t)C, (cake::index_t)1, ((N) - 0), ((C) - (c * BC)), perm, (3 + (((int)blockIdx.x) * BR)), "
            "(3 + R));") in src
    grouped = lower(parse_program(_ir.GROUPED)).value.source
    assert "cake::gather_smem_gmem<16, 32, THREADS>(a_s, x + " in grouped and "perm, (start + " in grouped


@needs_nvcc
@pytest.mark.parametrize("name", ["PICK", "GROUPED"])
def test_it_compiles_for_sm_90a(tmp_path, name):
    cr = compile_kernel(lower(parse_program(getattr(_ir, name))).value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.spill_bytes == 0


def test_a_gather_inside_a_warp_role_is_refused_at_its_line():
    text = _ir.PICK.replace('threads=64', 'threads=128').replace(
        "    for c in range(cdiv(C, BC)):\n        gather(",
        "    with role(\"producer\", warps=(0, 4)):\n        gather(").replace(
        "        sync()\n        store(y[tile(bid.x, BR), tile(c, BC)], a_s)\n        sync()\n", "").replace(
        "tile(c, BC)], perm", "tile(0, BC)], perm")
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.line == 5 and "role" in d.message for d in r.diagnostics), [d.message for d in r.diagnostics]
