"""scalar lowered onto cake::read_index (header/cake.cuh) and compiled with nvcc; the GPU test
(tests/runtime/test_scalar_gpu.py, marked `gpu`) launches the kernels against the interpreter."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import sibling
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.outcome import Outcome

_ir = sibling.load(Path(__file__).parents[1] / "ir" / "test_scalar.py")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def test_every_thread_reads_the_element_clamped_into_its_range():
    src = lower(parse_program(_ir.GATHER)).value.source
    assert "const int e = cake::read_index(ids + ((cake::index_t)(((int)blockIdx.x)) * (cake::index_t)1), " in src
    assert ", (N - 1));" in src
    ragged = lower(parse_program(_ir.RAGGED)).value.source
    assert "const int n = cake::read_index(cnt + " in ragged and "for (int i = 0; i < n; ++i) {" in ragged
    assert "if (n > 0) {" in ragged


def test_a_float_source_is_refused_at_its_line_when_the_verifier_is_skipped():
    text = _ir.GATHER.replace("ids: gmem[i32, (M,)]", "ids: gmem[f32, (M,)]")
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED
    d = r.diagnostics[0]
    assert d.rule == "lower.unsupported_operand" and "reads `ids` of f32" in d.message and d.line == 4


def test_a_name_already_in_scope_is_refused():
    text = _ir.GATHER.replace("scalar(e,", "scalar(BC,").replace("tile(e, 1)", "tile(BC, 1)")
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED and r.diagnostics[0].rule == "lower.shadowed_name"


def test_an_smem_source_is_read_at_its_flat_offset_and_checked_inside_the_tile():
    src = lower(parse_program(_ir.SMEM)).value.source
    assert "const int e = cake::read_index(ix + ((0) * 2 + (1) * 1), (0) >= 0 && (0) < 1 && (1) >= 0 && (1) < 2, " \
           "(N - 1));" in src


@needs_nvcc
@pytest.mark.parametrize("name", ["GATHER", "RAGGED", "SMEM"])
def test_it_compiles_for_sm_90a(tmp_path, name):
    lk = lower(parse_program(getattr(_ir, name)))
    cr = compile_kernel(lk.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
