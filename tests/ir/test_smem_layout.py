"""One shared-memory layout: the offsets the lowering emits and the total the verifier checks are
``ir.smem_layout``'s, alignment gaps before swizzled tiles, mbarriers and scratch included."""
import re
from pathlib import Path

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.rule_ctx import build_ctx, smem_bytes
from cake_core.ir.smem_layout import MBARRIER, SCRATCH, TILE, smem_layout
from cake_core.ir.text import parse_program
from cake_core.lower.cuda import lower
from cake_core.targets import get_arch
from cake_core.problems import corpus_file, corpus_files

ARCH = get_arch("sm_90a")
WS = corpus_file("gemm_bf16_ws.cake").read_text()


def _nine_stages(pad: int, flag_first: bool) -> str:
    """The ws GEMM with 9-stage rings (221184 B of swizzle-128 tiles), an f32 pad tile and a 128 B tile `flag`
    before the rings (an 896 B gap to the next 1024 B boundary) or after them (no gap)."""
    t = WS.replace("stages=4", "stages=9").replace('"S": 4', '"S": 9')
    flag, padl = "    flag = smem(f32, (32,))\n", f"    pad = smem(f32, ({pad},))\n"
    if flag_first:
        return t.replace("    a_s = smem", flag + "    a_s = smem", 1).replace("    full = mbarrier", padl + "    full = mbarrier")
    return t.replace("    full = mbarrier", padl + flag + "    full = mbarrier")


@pytest.mark.parametrize("path", corpus_files("*.cake"), ids=lambda p: p.stem)
def test_the_lowering_places_smem_where_the_layout_says(path):
    prog = parse_program(path.read_text(), path.name)
    lay = smem_layout(prog, ARCH)
    r = lower(prog, path.name)
    assert r.ok, [d.message for d in r.diagnostics]
    assert r.value.smem_bytes == lay.total == smem_bytes(build_ctx(prog, ARCH))
    placed = dict(re.findall(r"(\w+) = reinterpret_cast<[^>]*>\(cake_smem \+ (\d+)\)", r.value.source))
    for reg in lay.regions:
        if reg.kind in (TILE, MBARRIER):
            assert int(placed[reg.name]) == reg.offset, reg
    assert all(reg.end <= lay.total for reg in lay.regions)


def test_swizzle_128_tiles_start_on_a_whole_pattern_and_the_gap_is_counted():
    lay = smem_layout(parse_program(_nine_stages(2700, True)), ARCH)
    flag, a_s = lay.regions[0], lay.regions[1]
    assert (flag.name, flag.offset, flag.nbytes) == ("flag", 0, 128)
    assert (a_s.name, a_s.offset, a_s.gap) == ("a_s", 1024, 896)
    assert lay.gaps >= 896 and "alignment" in lay.breakdown()


def test_the_alignment_gap_before_a_swizzled_tile_is_what_overflows():
    # the tiles alone (aligned to 128 B each) fit in 232448 B; the 896 B gap before a_s does not
    tiles = 128 + 9 * (128 * 64 * 2 + 64 * 64 * 2) + 2700 * 4
    assert tiles <= ARCH.smem_per_cta_bytes
    planted = _nine_stages(2700, True)
    hits = [d for d in check_text(planted, "planted.cake") if d.rule == "resources.smem"]
    assert len(hits) == 1 and "233216 B" in hits[0].message
    assert hits[0].line == planted.splitlines().index("    pad = smem(f32, (2700,))") + 1   # it ends past the limit
    assert hits[0].witness == ("tiles 232112 B + mbarriers 144 B + scratch 0 B + alignment 896 B",)
    twin = _nine_stages(2700, False)             # the same tiles, the small one after the rings: no gap
    assert smem_layout(parse_program(twin), ARCH).total == ARCH.smem_per_cta_bytes
    assert check_text(twin) == []


def test_mbarriers_count_against_the_limit():
    # the tiles fit with 128 B to spare; the 18 mbarriers (144 B) do not
    planted = _nine_stages(2724, False)
    lay = smem_layout(parse_program(planted), ARCH)
    assert lay.bytes_of(MBARRIER) == 18 * ARCH.mbarrier_bytes
    assert lay.bytes_of(TILE) + lay.gaps <= ARCH.smem_per_cta_bytes < lay.total
    (d,) = [d for d in check_text(planted) if d.rule == "resources.smem"]
    assert "`empty`" in d.message and d.line == planted.splitlines().index("    empty = mbarrier(S, arrivals=2)") + 1
    assert check_text(_nine_stages(2692, False)) == []


def test_consecutive_scratch_users_share_one_region_and_a_tile_between_starts_a_new_one():
    text = """@kernel(target="sm_90a", grid=(1,), threads=128, consts={})
def k(x: gmem[f32, (128, 64)], y: gmem[f32, (128,)]):
    a = rmem(f32, (128, 64))
    load(a, x[:, :])
    r = rmem(f32, (128,))
    reduce(r, a, fn="sum")
    reduce(r, a, fn="max")
    s = smem(f32, (64,))
    reduce(r, a, fn="min")
    store(y[:], r)
"""
    prog = parse_program(text)
    lay = smem_layout(prog, ARCH)
    scratch = [reg for reg in lay.regions if reg.kind == SCRATCH]
    assert len(scratch) == 3 and scratch[0].offset == scratch[1].offset == 0
    tile = next(reg for reg in lay.regions if reg.kind == TILE)
    assert tile.offset == scratch[0].offset + scratch[0].nbytes          # after the shared region
    assert scratch[2].offset >= tile.end                                 # a new region past the tile
    r = lower(prog)
    assert r.ok and r.value.smem_bytes == lay.total
    staged = re.findall(r"cake_st_r = reinterpret_cast<float\*>\(cake_smem \+ (\d+)\)", r.value.source)
    assert [int(x) for x in staged] == [reg.offset for reg in scratch]
