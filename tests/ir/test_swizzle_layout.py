"""layout.swizzle: a swizzled smem tile is addressed one way by every op that touches it. TMA, cp_async_bar,
wgmma, sqnorm_rows and the elementwise ops follow the swizzle (``OpDef.swizzle``); a plain load or store, a
reduction or an fma mma address the tile row-major. Mixing the two on one tile reads or writes other elements
than the ones named, silently (the interpreter keeps tiles logical), so it is refused at the row-major op; a tile
that only row-major ops touch keeps working, its swizzle attribute changing nothing."""
from __future__ import annotations

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.opdef import Family
from cake_core.ir.ops import REGISTRY, Op
from cake_core.problems import corpus_files

KERNEL = """@kernel(target="sm_90a", grid=(1,), threads=128)
def swz(x: gmem[bf16, (M, N)], y: gmem[f32, (M, N)]):
    x_s = smem(bf16, (64, 64), swizzle=128)
    t_s = smem(f32, (64, 64))
    full = mbarrier(1)
    with role("copy", warps=(0, 4)):
        expect_tx(full[0], 64 * 64 * 2)
        tma_load(x_s[0], x[tile(0, 64), tile(0, 64)], bar=full[0])
        wait(full[0], phase=0)
        cast(t_s, x_s)
    sync()
    store(y[tile(0, 64), tile(0, 64)], t_s)
"""


def _rule_hits(text: str) -> list:
    return [d for d in check_text(text, "k.cake") if d.rule == "layout.swizzle"]


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_a_tma_filled_tile_read_by_an_elementwise_op_passes():
    assert check_text(KERNEL, "k.cake") == []


def test_the_ops_that_follow_the_swizzle_are_the_declared_ones():
    aware = {op for op, d in REGISTRY.items() if d.swizzle}
    assert {Op.TMA_LOAD, Op.TMA_STORE, Op.CP_ASYNC_BAR, Op.WGMMA, Op.SQNORM_ROWS} <= aware
    assert {Op.FILL, Op.CAST, Op.UNARY, Op.EWISE, Op.SELECT, Op.IOTA} <= aware
    assert not {Op.LOAD, Op.STORE, Op.MMA, Op.REDUCE, Op.TRANSPOSE, Op.CP_ASYNC} & aware
    assert all(REGISTRY[op].family in (Family.COPY, Family.MMA, Family.EPILOGUE, Family.ELEMENTWISE) for op in aware)


@pytest.mark.parametrize("old,new,needle,words", [
    # a plain load into the tile that an elementwise op reads swizzled
    ("        expect_tx(full[0], 64 * 64 * 2)\n        tma_load(x_s[0], x[tile(0, 64), tile(0, 64)], bar=full[0])\n"
     "        wait(full[0], phase=0)\n", "", None, None),
    # a reduction reading the TMA-filled tile row-major
    ("        cast(t_s, x_s)\n", "        reduce(r_s, x_s, axis=1)\n", "reduce(", ("row-major", "`tma_load` at line")),
    # a broadcast read of the swizzled tile
    ("        cast(t_s, x_s)\n", "        ewise(w_s, x_s, x_s)\n", "ewise(", ("broadcast",)),
    # swizzle=64: elementwise ops address swizzle-128 tiles only
    ("    x_s = smem(bf16, (64, 64), swizzle=128)\n", "    x_s = smem(bf16, (64, 64), swizzle=64)\n", "cast(",
     ("swizzle=64", "swizzle-128")),
], ids=["plain_load", "reduce", "broadcast", "swizzle64"])
def test_a_row_major_access_of_a_swizzled_tile_is_refused_at_its_line(old, new, needle, words):
    assert old in KERNEL
    text = KERNEL.replace(old, new, 1).replace("    t_s = smem(f32, (64, 64))\n", "    t_s = smem(f32, (64, 64))\n"
                                               "    r_s = smem(f32, (64, 1))\n    w_s = smem(f32, (2, 64, 64))\n")
    if needle is None:      # the plain load goes in front: it fills the tile row-major, the cast reads it swizzled
        text = text.replace("    full = mbarrier(1)\n", "    full = mbarrier(1)\n    load(x_s, x[tile(0, 64), tile(0, 64)])\n"
                            "    sync()\n")
        needle, words = "load(x_s", ("row-major", "`cast` at line")
    hits = _rule_hits(text)
    assert hits, [d.format("k.cake", text) for d in check_text(text, "k.cake")]
    assert hits[0].line == _line(text, needle) and all(w in hits[0].message for w in words), hits[0].message


def test_a_tile_only_row_major_ops_touch_keeps_working():
    text = """@kernel(target="sm_90a", grid=(1,), threads=128)
def plain(x: gmem[bf16, (M, N)], y: gmem[f32, (M, N)]):
    x_s = smem(bf16, (64, 64), swizzle=128)
    r_s = smem(f32, (64, 1))
    load(x_s, x[tile(0, 64), tile(0, 64)])
    sync()
    reduce(r_s, x_s, axis=1)
    sync()
    store(y[tile(0, 64), tile(0, 1)], r_s)
"""
    assert _rule_hits(text) == []


def test_no_kernel_of_the_corpus_mixes_the_two():
    for f in corpus_files():
        assert _rule_hits(f.read_text()) == [], f.name


def test_the_elementwise_read_is_lowered_in_the_swizzle_and_compiles(tmp_path):
    from cake_core.ir.text import parse_program
    from cake_core.lower import compile as compile_mod
    from cake_core.lower import compile_kernel, lower
    r = lower(parse_program(KERNEL, "k.cake"), "k.cake")
    assert r.ok, r.diagnostics
    assert "x_s[cake::swizzle128_elem<64, 64, __nv_bfloat16>(cake_r, cake_c)]" in r.value.source
    if compile_mod.nvcc_path() is not None:
        c = compile_kernel(r.value, cache_dir=tmp_path)
        assert c.ok, [d.message for d in c.diagnostics]
