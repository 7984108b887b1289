"""Lowering bindings (`name = expr` → `const int name = expr;` in its C block), compiled for sm_90a; the
kmeans_update_smem seed rewritten with bindings compiles to the resources of the measured kernel."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cake_core.ir.passes import inline_lets
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
from test_let import LET, _pingpong_with_bindings  # noqa: E402
from cake_core.problems import corpus_file

nvcc = pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")


def _lowered(text: str):
    r = lower(parse_program(text, "let.cake"), "let.cake")
    assert r.ok, [d.format("let.cake", text) for d in r.diagnostics]
    return r.value


def test_a_binding_is_a_const_int_in_its_block():
    src = _lowered(LET).source
    assert "    const int row = ((int)blockIdx.y);" in src and "    const int col = (((int)blockIdx.x) * 1);" in src
    assert "        const int k0 = kt;" in src                     # inside the loop's C block
    assert "(row * BM)" in src and "(k0 * BK)" in src
    lines = src.splitlines()
    assert lines[lines.index("    const int row = ((int)blockIdx.y);") - 1] == '#line 6 "let.cake"'


def test_a_binding_out_of_scope_is_a_lowering_error_too():
    text = LET.replace("    store(c[tile(row, BM)", "    store(c[tile(k0, BM)")
    r = lower(parse_program(text, "let.cake"), "let.cake")
    assert not r.ok and any(d.rule == "lower.unknown_name" and "`k0`" in d.message and d.line == 15
                            for d in r.diagnostics)


def test_a_binding_named_like_a_cpp_keyword_is_reserved():
    text = LET.replace("row", "auto")
    r = lower(parse_program(text, "let.cake"), "let.cake")
    assert any(d.rule == "lower.reserved_name" and d.line == 6 for d in r.diagnostics)


@nvcc
def test_programs_with_bindings_compile_for_sm_90a(tmp_path):
    for text in (LET, _pingpong_with_bindings()):
        c = compile_kernel(_lowered(text), cache_dir=tmp_path)
        assert c.ok, [d.message for d in c.diagnostics]
        assert c.value.resources.spill_bytes == 0


@nvcc
def test_the_rewritten_kmeans_update_smem_has_the_measured_kernels_resources(tmp_path):
    p = parse_program(corpus_file("kmeans_update_smem.cake").read_text())
    new, old = lower(p), lower(inline_lets(p))      # inline_lets(p) is the measured program (test_let)
    assert new.ok and old.ok and "const int chunk = " in new.value.source
    assert new.value.smem_bytes == old.value.smem_bytes
    a, b = (compile_kernel(r.value, cache_dir=tmp_path) for r in (new, old))
    assert a.ok and b.ok
    assert a.value.resources == b.value.resources, (a.value.resources, b.value.resources)
