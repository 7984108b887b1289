"""An rmem tile reduced by its owners first: each thread combines the elements it holds on one line into a
partial, and only the partials go through shared-memory scratch (``lower_axis._reduce_partials``), where the
thread map puts each thread's slots on a fixed set of lines; elsewhere the whole tile is staged as before.
Compiled with nvcc here; ``tests/runtime/test_reduce_rmem_gpu.py`` (marked `gpu`) launches each case against the
interpreter."""
from __future__ import annotations

import shutil

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# (rows, cols, axis, threads): the tile's shape, the reduced axis, the CTA's threads; "1-D" tiles have rows 0
CASES = {
    "columns, threads a multiple of the columns": (128, 32, 0, 128),
    "columns, columns a multiple of the threads": (8, 256, 0, 128),
    "rows, columns a multiple of the threads": (4, 256, 1, 128),
    "a vector": (0, 512, 0, 128),
    "rows, ragged: staged whole": (16, 24, 1, 128),
}
PARTIAL = {k for k in CASES if "staged" not in k}


def kernel(rows: int, cols: int, axis: int, threads: int, fn: str = "sum", dst_space: str = "smem") -> str:
    """Load an (R, C) f32 tile (or a C vector) into registers, reduce it along ``axis`` into a ``dst_space`` tile,
    store the result."""
    if rows == 0:
        src_shape, out_shape, window = "(C,)", "(1,)", "tile(0, C)"
        x_shape, y_shape, y_window = "(C,)", "(1,)", "tile(0, 1)"
    else:
        src_shape = "(R, C)"
        out_shape = "(1, C)" if axis == 0 else "(R, 1)"
        window, x_shape = "tile(0, R), tile(0, C)", "(R, C)"
        y_shape, y_window = ("(1, C)", "tile(0, 1), tile(0, C)") if axis == 0 else ("(R, 1)", "tile(0, R), tile(0, 1)")
    consts = f'{{"R": {max(rows, 1)}, "C": {cols}}}'
    return (f'@kernel(target="sm_90a", grid=(1,), threads={threads}, consts={consts})\n'
            f"def red(x: gmem[f32, {x_shape}], y: gmem[f32, {y_shape}]):\n"
            f"    t = rmem(f32, {src_shape})\n"
            f"    u = {dst_space}(f32, {out_shape})\n"
            f"    load(t, x[{window}])\n"
            f'    reduce(u, t, axis={axis}, fn="{fn}")\n'
            f"    sync()\n"
            f"    store(y[{y_window}], u)\n")


def _source(text: str) -> str:
    r = lower(parse_program(text))
    assert r.ok, [d.message for d in r.diagnostics]
    return r.value.source


@pytest.mark.parametrize("case", sorted(CASES))
def test_owners_reduce_first_where_the_thread_map_allows_it(case):
    src = _source(kernel(*CASES[case]))
    if case in PARTIAL:
        assert "cake_part" in src and "stage_smem_rmem" not in src, case
    else:
        assert "cake_part" not in src and "cake::stage_smem_rmem<384, THREADS>" in src, case


def test_the_partials_of_each_line_are_combined_in_one_reduction_over_them():
    # 128 threads over a (128, 32) tile: thread tid holds column tid % 32 in all 32 of its slots; the 4 partials of
    # each column are combined by reduce_smem over a (32, 4) tile of them
    src = _source(kernel(128, 32, 0, 128))
    assert "cake_part[(threadIdx.x % 32) * 4 + threadIdx.x / 32] = cake_p[cake_k];" in src
    assert "cake::reduce_smem<32, 4, 4, 1, 0, THREADS>(u, cake_part);" in src
    # a (8, 256) tile over 128 threads: each thread holds two whole columns, nothing left to combine
    src = _source(kernel(8, 256, 0, 128, fn="max"))
    assert "cake::reduce_smem<256, 1, 1, 1, 1, THREADS>" in src


def test_an_rmem_result_is_read_back_from_the_scratch_the_layout_gives_it():
    src = _source(kernel(128, 128, 0, 128, dst_space="rmem"))
    assert "cake_part" in src and "cake::unstage_rmem_smem<128, THREADS>(u, cake_st_u);" in src


def test_a_bf16_tile_whose_partials_would_not_fit_its_scratch_is_staged_whole():
    text = kernel(4, 128, 1, 128).replace("t = rmem(f32", "t = rmem(bf16")
    src = _source(text)
    assert "cake_part" not in src and "cake::stage_smem_rmem<512, THREADS>" in src


@needs_nvcc
@pytest.mark.parametrize("case", sorted(CASES))
def test_it_compiles_for_sm_90a(tmp_path, case):
    r = lower(parse_program(kernel(*CASES[case], fn="min")))
    assert r.ok
    cr = compile_kernel(r.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
