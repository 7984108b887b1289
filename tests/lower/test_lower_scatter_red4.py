"""scatter_add(..., vector=4) of an rmem tile into a gmem window adds its rows 16 bytes at a time
(red.global.add.v4.f32) behind a run-time alignment check with the scalar atomics as the fallback; without
the attribute the element atomics stay; the kmeans_update_red4 seed is correct in the CPU interpreter and
compiles for sm_90a without spills."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.problems import get_problem, load_shape_set
from cake_core.runtime.cpu import check_on_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx import ptx_of  # noqa: E402
from cake_core.problems import corpus_file

NAIVE = corpus_file("kmeans_update.cake").read_text()      # rmem x_r (128, 32), 128 threads
VEC = NAIVE.replace("scatter_add(sums[bid.y, :, tile(dt, BD)], a_r, x_r, base=bid.x * BN, limit=N)",
                    "scatter_add(sums[bid.y, :, tile(dt, BD)], a_r, x_r, base=bid.x * BN, limit=N, vector=4)")
RED4 = corpus_file("kmeans_update_red4.cake").read_text()


def _source(text: str) -> str:
    r = lower(parse_program(text, "k.cake"), "k.cake")
    assert r.ok, [d.format("k.cake") for d in r.diagnostics]
    return r.value.source


def test_an_rmem_scatter_into_contiguous_f32_rows_takes_the_vector_path_with_a_scalar_fallback():
    assert VEC != NAIVE
    assert "red_v4_rows_ok" not in _source(NAIVE)        # without vector=4: the element atomics, as measured
    src = _source(VEC)
    assert "if (cake::red_v4_rows_ok(cake_dst, cake_ldi, cake_ldc)) {" in src
    assert "cake::scatter_add_gmem_f32x4<128, 32, THREADS, true>(cake_dst, cake_ldi, (int)cake_rows, cake_cin, " \
           "cake_st_a_r, x_r, cake_valid);" in src
    # unaligned views (D % 4 != 0, an odd base) keep one atomic per element; the i32 counts always do
    assert src.count("cake::atomic_add_gmem(") == 2
    assert src.count("scatter_add_gmem_f32x4") == 1


@pytest.mark.parametrize("change", [
    ('"BD": 32', '"BD": 30'),                                   # rows not a multiple of 4
    ('"BD": 32', '"BD": 256'),                                  # a thread would change column (128 threads)
    ("x_r = rmem(bf16, (BN, BD))", "x_r = smem(bf16, (BN, BD))"),          # smem source: scalar loop
])
def test_vector_4_where_it_cannot_apply_is_refused_at_the_line(change):
    text = VEC.replace(*change)
    if "smem(bf16" in text:
        text = text.replace("        scatter_add(sums", "        sync()\n        scatter_add(sums")
    assert text != VEC
    r = lower(parse_program(text, "k.cake"), "k.cake")
    assert not r.ok
    d = r.diagnostics[0]
    assert d.rule == "lower.unsupported_layout" and "vector=4" in d.message and "vector=4" in d.hint
    assert "scatter_add(sums" in text.splitlines()[d.line - 1]


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_vector_path_emits_red_v4_and_keeps_the_scalar_fallback_in_ptx(tmp_path):
    ptx = ptx_of(_source(VEC), tmp_path)
    assert "red.global.add.v4.f32" in ptx
    assert "shfl.sync.bfly" in ptx                      # the quad transpose
    assert "red.global.add.f32" in ptx                  # the unaligned fallback (and ragged right edges)
    assert ".local" not in ptx                          # the transpose's selects stay in registers


@pytest.mark.parametrize("name", ["kmeans_update_red4", "kmeans_update_red4_d3"])
def test_the_red4_seeds_check_and_match_the_oracle_in_the_cpu_interpreter(name):
    p = get_problem("kmeans_update")
    text = corpus_file(f"{name}.cake").read_text()
    assert check_text(text, f"{name}.cake") == []
    shapes = load_shape_set(p, "kmeans_update_small").cpu_shapes(p.cpu_limit) + [{"B": 2, "N": 1200, "K": 40, "D": 72}]
    checks = check_on_cpu(parse_program(text, f"{name}.cake"), p, shapes, seed=11)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_a_three_buffer_rotation_that_scatters_a_buffer_twice_fails():
    # kmeans_update_red4_d3 keeps two x tiles in flight: x2 scattered where x0 should be double-counts one tile
    p = get_problem("kmeans_update")
    d3 = corpus_file("kmeans_update_red4_d3.cake").read_text()
    wrong = d3.replace("scatter_add(sums[bid.y, :, tile(dt, BD)], a0, x0, base=c * BN",
                       "scatter_add(sums[bid.y, :, tile(dt, BD)], a1, x1, base=c * BN", 1)
    assert wrong != d3
    (c,) = check_on_cpu(parse_program(wrong, "w.cake"), p, [{"B": 2, "N": 1200, "K": 40, "D": 72}], seed=11)
    assert not c.correct and "sums" in c.message, c.message


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_red4_seed_compiles_for_sm_90a_without_spills(tmp_path):
    src = _source(RED4)
    assert src.count("scatter_add_gmem_f32x4<16, 128, THREADS, true>") == 2
    r = lower(parse_program(RED4, "kmeans_update_red4.cake"), "kmeans_update_red4.cake")
    c = compile_kernel(r.value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    res = c.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0, res
    assert res.registers <= 80, res                     # 3 CTAs of 256 threads per SM
