"""Fragments and row vectors a warp role holds (``ir.fragments``), and wgmma with A in registers: the layouts the
verifier reads, the index math the lowering emits (evaluated for every thread of the role), the register A's
k-steps against the m64k16 A fragment, what is refused and why, and the warp-specialised attention kernel built
from them compiling for sm_90a.

The kernel is cake_core/problems/mha/kernels/mha_ws.cake: a TMA producer, two consumer warpgroups that compute
S = Q K^T with wgmma, an online softmax on S's fragments with row vectors for the running max and sum, P = S
cast to bf16 in registers, and O += P V with P as wgmma's register A.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest

from cake_core.ir.check import check_text
from cake_core.ir.fragments import role_layouts
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.problems import get_problem

WS = get_problem("mha").kernel_text("mha_ws.cake")
CONSUMER_FIRST = 128          # consumer warps 4..12: threads 128..383, two warpgroups, 128 rows


def _lowered(text: str):
    r = lower(parse_program(text, "kernel.cake"), "kernel.cake")
    assert r.ok, [d.format("kernel.cake", text) for d in r.diagnostics]
    return r.value


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def _block_of(src: str, line: int) -> str:
    lines = src.splitlines()
    out = []
    for i in range(len(lines) - 1):
        if lines[i] == f'#line {line} "kernel.cake"':
            out.append(lines[i + 1].strip())
    return "\n".join(out)


def _py(expr: str) -> str:
    return expr.replace("/", "//")


def _fragment_slot(t: int, s: int) -> tuple[int, int]:
    """Where cake::store_gmem_wgmma_acc stores slot ``s`` of role thread ``t`` (cake_async.cuh)."""
    wg, warp, lane = t // 128, (t % 128) // 32, t % 32
    return wg * 64 + warp * 16 + lane // 4 + ((s % 4) // 2) * 8, (s // 4) * 8 + (lane % 4) * 2 + s % 2


def _loop(block: str) -> dict:
    """The facts of one emitted elementwise loop: its trips, and the C of cake_h, cake_r and cake_c."""
    return {"slots": int(re.search(r"cake_s < (\d+);", block).group(1)),
            "h": re.search(r"const int cake_h = ([^;]+);", block).group(1),
            "r": re.search(r"const int cake_r = ([^,]+), cake_c = ([^;]+);", block).group(1),
            "c": re.search(r"const int cake_r = ([^,]+), cake_c = ([^;]+);", block).group(2)}


# ------------------------------------------------------------------ the layouts

def test_the_roles_tiles_are_classified_by_shape_and_use():
    p = parse_program(WS, "mha_ws.cake")
    lay = role_layouts(p, 64, 4)
    kinds = {k: v.kind for k, v in lay.items()}
    assert kinds == {"s": "acc", "acc": "acc", "kc": "frag", "p": "frag", "m_i": "rows", "m_new": "rows",
                     "l_i": "rows", "alpha": "rows", "rsum": "rows"}
    assert {v.rows for v in lay.values()} == {128} and lay["acc"].cols == 128 and lay["p"].cols == 64
    assert role_layouts(p, None, 4) == {}          # no wgmma on the target: no fragments


def test_an_epilogue_row_state_and_a_ragged_tile_have_no_fragment_layout():
    kmeans = get_problem("kmeans_assign").kernel_text("kmeans_assign_ws.cake")
    lay = role_layouts(parse_program(kmeans, "k.cake"), 64, 4)
    assert set(lay) == {"acc0", "acc1"}            # best / arg are argmin_bias row state
    ragged = WS.replace("        kc = rmem(f32, (BM, BN))\n", "        kc = rmem(f32, (BM, 12))\n")
    assert "kc" not in role_layouts(parse_program(ragged, "k.cake"), 64, 4)


# ------------------------------------------------------------------ the thread maps

def test_the_kernel_checks_and_lowers():
    assert check_text(WS, "mha_ws.cake") == []
    _lowered(WS)


def test_a_row_vector_op_gives_each_row_to_its_quad():
    src = _lowered(WS).source
    block = _block_of(src, _line(WS, 'ewise(m_new, m_new, m_i, fn="max")'))
    f = _loop(block)
    assert f["slots"] == 2 and "m_new[cake_h]" in block and "m_i[cake_h]" in block
    hits: Counter = Counter()
    for t in range(256):
        for s in range(2):
            env = {"cake_t": t, "cake_s": s}
            env["cake_h"] = eval(_py(f["h"]), {}, env)
            hits[eval(_py(f["r"]), {}, env)] += 1
    assert set(hits) == set(range(128)) and set(hits.values()) == {4}     # every row, by the 4 threads of a quad


def test_a_row_vector_broadcast_along_a_fragment_is_read_at_the_slots_row():
    src = _lowered(WS).source
    block = _block_of(src, _line(WS, 'ewise(s, s, m_new, fn="sub")'))
    f = _loop(block)
    assert f["slots"] == 32 and "m_new[cake_h]" in block and "s[cake_s]" in block
    rows = _loop(_block_of(src, _line(WS, 'ewise(m_new, m_new, m_i, fn="max")')))
    for t in range(256):
        for s in range(32):
            env = {"cake_t": t, "cake_s": s}
            env["cake_h"] = eval(_py(f["h"]), {}, env)
            row, col = eval(_py(f["r"]), {}, env), eval(_py(f["c"]), {}, env)
            assert (row, col) == _fragment_slot(t, s)
            # the row vector's element cake_h of this thread holds that row (the rows map's own row)
            assert eval(_py(rows["r"]), {}, {"cake_t": t, "cake_s": env["cake_h"], "cake_h": env["cake_h"]}) == row


def _reduce_slots(slots: int, h: int) -> list[int]:
    """The slots cake::reduce_rows_wgmma_frag combines for row half h (its loop, cake_async.cuh)."""
    return [2 * h, 2 * h + 1] + [x for s in range(2 * h + 4, slots, 4) for x in (s, s + 1)]


def test_a_row_reduction_covers_each_row_once_across_its_quad():
    src = _lowered(WS).source
    line = _block_of(src, _line(WS, 'reduce(m_new, s, axis=1, fn="max")'))
    assert "cake::reduce_rows_wgmma_frag<1>(m_new, s);" in line
    assert "cake::reduce_rows_wgmma_frag<0>(rsum, s);" in _block_of(src, _line(WS, "reduce(rsum, s, axis=1)"))
    for slots in (4, 32, 64):
        for t in range(0, 256, 4):                  # a quad: lanes t .. t + 3, combined by xor 1 and xor 2
            for h in range(2):
                cells = Counter(_fragment_slot(q, s) for q in range(t, t + 4) for s in _reduce_slots(slots, h))
                row = _fragment_slot(t, 2 * h)[0]
                assert set(cells) == {(row, c) for c in range(slots * 2)} and set(cells.values()) == {1}


def test_the_register_a_k_steps_are_the_m64k16_a_fragment():
    src = _lowered(WS).source
    block = _block_of(src, _line(WS, "wgmma(acc, p, v_s[j % S])"))
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in block
    assert re.search(r"cake_k < (\d+);", block).group(1) == "4"            # K = BN = 64: 4 k-steps of 16
    # register i of k-step k packs slots 8k + 2i and 8k + 2i + 1 (before the fence), and the asm takes them in order
    assert "cake_ra[cake_k][cake_i] = cake::pack2_rmem(p[cake_k * 8 + 2 * cake_i], p[cake_k * 8 + 2 * cake_i + 1]);" \
        in block
    assert '"r"(cake_ra[cake_k][0]), "r"(cake_ra[cake_k][1]), "r"(cake_ra[cake_k][2]), "r"(cake_ra[cake_k][3])' in block
    assert block.index("cake::pack2_rmem") < block.index("cake::wgmma_fence()")
    pairs = [(2 * i, 2 * i + 1) for i in range(4)]
    # PTX's m64k16 A fragment of thread t (warp w, group g = lane / 4, q = lane % 4): registers a0..a3 hold
    # (g, 2q..2q+1), (g + 8, 2q..), (g, 2q + 8..), (g + 8, 2q + 8..) of the warp's 16 rows
    for t in range(256):
        g, q, base = (t % 32) // 4, t % 4, (t // 128) * 64 + ((t % 128) // 32) * 16
        want = [(base + g, 2 * q), (base + g + 8, 2 * q), (base + g, 2 * q + 8), (base + g + 8, 2 * q + 8)]
        for k in range(4):
            for i, (lo, hi) in enumerate(pairs):
                r0, c0 = _fragment_slot(t, k * 8 + int(lo))
                r1, c1 = _fragment_slot(t, k * 8 + int(hi))
                assert (r0, c0 - 16 * k) == want[i] and (r1, c1) == (r0, c0 + 1)


# ------------------------------------------------------------------ what is refused, and why

def _planted(old: str, new: str) -> str:
    assert old in WS, old
    return WS.replace(old, new, 1)


@pytest.mark.parametrize("old,new,rule,needle,why", [
    # a row vector written into a shared tile: each row's 4 threads would write it
    ("        wait(q_full[0], phase=0)\n", "        wait(q_full[0], phase=0)\n        cast(r_s, m_i)\n",
     "role.compute", "cast(r_s, m_i)", "held by the 4 threads of each row's quad"),
    # a reduction into a shared tile, and one along the rows (across the quads)
    ("            reduce(rsum, s, axis=1)\n", "            reduce(r_s, s, axis=1)\n", "role.compute", "reduce(r_s",
     "not an rmem (128, 1) row vector"),
    ("            reduce(rsum, s, axis=1)\n", "            reduce(c_s, s, axis=0)\n", "role.compute", "reduce(c_s",
     "along axis 0"),
    # an rmem tile of the role in no layout it holds (4 columns: no m64nN fragment)
    ("        kc = rmem(f32, (BM, BN))\n", "        kc = rmem(f32, (BM, BN))\n        t4 = rmem(f32, (BM, 4))\n"
     "        fill(t4, value=1.0)\n", "role.compute", "fill(t4", "in no layout it holds"),
    # an f32 register A, and a CTA-wide rmem tile as A
    ("            wgmma(acc, p, v_s[j % S])\n", "            wgmma(acc, kc, v_s[j % S])\n", "wgmma.operands",
     "wgmma(acc, kc", "not a 16-bit fragment of the wgmma's role"),
    ("            wgmma(acc, p, v_s[j % S])\n", "            wgmma(acc, pc, v_s[j % S])\n", "wgmma.operands",
     "wgmma(acc, pc", "not a 16-bit fragment of the wgmma's role"),
    # the register A overwritten while the wgmma that reads it may still run
    ("            wgmma(acc, p, v_s[j % S])\n            wgmma_wait(0)\n",
     "            wgmma(acc, p, v_s[j % S])\n            cast(p, s)\n            wgmma_wait(0)\n",
     "protocol.acc_in_flight", "            cast(p, s)\n            wgmma_wait", "reads it as its register A"),
])
def test_a_planted_misuse_is_refused_with_its_rule_at_its_line(old, new, rule, needle, why):
    text = _planted(old, new).replace(
        "    ninf = smem(f32, (1, 1))\n", "    ninf = smem(f32, (1, 1))\n    r_s = smem(f32, (BM, 1))\n"
        "    c_s = smem(f32, (1, BN))\n    pc = rmem(bf16, (96, BN))\n")
    diags = check_text(text, "kernel.cake")
    assert [d.rule for d in diags if d.is_error] == [rule], [d.format("kernel.cake", text) for d in diags]
    lines = text.splitlines()
    first, *rest = needle.splitlines()
    want = next(i for i, ln in enumerate(lines, 1) if first.strip() in ln and all(
        r.strip() in lines[i + k] for k, r in enumerate(rest)))
    assert diags[0].line == want and why in diags[0].message, diags[0].message


def test_the_lowering_refuses_a_row_reduction_it_was_not_given_a_layout_for():
    # the verifier's refusal has a twin in the lowering: a reduce inside a role into a shared tile
    text = _planted('            reduce(rsum, s, axis=1)\n', '            reduce(r_s, s, axis=1)\n').replace(
        "    ninf = smem(f32, (1, 1))\n", "    ninf = smem(f32, (1, 1))\n    r_s = smem(f32, (BM, 1))\n")
    r = lower(parse_program(text, "kernel.cake"), "kernel.cake")
    hits = [d for d in r.diagnostics if d.rule == "lower.unsupported_in_role"]
    assert hits and hits[0].line == _line(text, "reduce(r_s")


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_warp_specialised_attention_compiles_for_sm_90a(tmp_path):
    c = compile_kernel(_lowered(WS), cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0 and c.value.resources.registers <= 232
    # the register A packed before wgmma.fence: registers defined after it made ptxas serialise the wgmmas
    assert not re.search(r"C75\d\d", c.artifacts["nvcc.log"]), c.artifacts["nvcc.log"]


# ------------------------------------------------------------------ the accumulator through shared memory

def _through_smem() -> str:
    """P cast into a swizzled smem tile the second wgmma reads as its A: fenced, then the role's barrier."""
    text = WS
    for old, new in (("    ninf = smem(f32, (1, 1))\n", "    ninf = smem(f32, (1, 1))\n    p_s = smem(bf16, (BM, BN), swizzle=128)\n"),
                     ("        p = rmem(bf16, (BM, BN))\n", ""),
                     ("            cast(p, s)\n", "            cast(p_s, s)\n            fence_async()\n            role_sync()\n"),
                     ("            wgmma(acc, p, v_s[j % S])\n", "            wgmma(acc, p_s, v_s[j % S])\n")):
        assert old in text
        text = text.replace(old, new, 1)
    return text


def _swizzle128_elem(rows: int, cols: int, nbytes: int, r: int, c: int) -> int:
    """cake::swizzle128_elem (cake.cuh), element (r, c) of a swizzle-128 tile."""
    span, chunk = 128 // nbytes, 16 // nbytes
    blk, cc = c // span, c % span
    return blk * rows * span + r * span + ((cc // chunk) ^ (r & 7)) * chunk + cc % chunk


def _tma_byte(r: int, c: int, nbytes: int) -> int:
    """cake::smem_offset_swizzled (cake_async.cuh, cp_async_bar's and TMA's layout of rows of one span)."""
    byte = c * nbytes
    return r * 128 + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15)


@pytest.mark.parametrize("rows,cols,nbytes", [(128, 64, 2), (64, 32, 4), (64, 128, 2), (8, 256, 2)])
def test_a_swizzled_elements_place_is_where_tma_and_wgmma_put_it(rows, cols, nbytes):
    span = 128 // nbytes
    seen = set()
    for r in range(rows):
        for c in range(cols):
            e = _swizzle128_elem(rows, cols, nbytes, r, c)
            seen.add(e)
            blk = c // span      # column blocks of one span side by side, each laid out like a one-span tile
            assert e * nbytes == blk * rows * 128 + _tma_byte(r, c % span, nbytes)
    assert seen == set(range(rows * cols))


def test_an_accumulator_cast_into_a_swizzled_tile_is_written_in_its_swizzle_then_the_role_meets():
    text = _through_smem()
    assert check_text(text, "kernel.cake") == []
    src = _lowered(text).source
    cast = _block_of(src, _line(text, "cast(p_s, s)"))
    assert "p_s[cake::swizzle128_elem<128, 64, __nv_bfloat16>(cake_r, cake_c)] = " in cast
    f = _loop(cast)
    cells = set()
    for t in range(256):
        for s in range(32):
            env = {"cake_t": t, "cake_s": s}
            env["cake_h"] = eval(_py(f["h"]), {}, env)
            cells.add(_swizzle128_elem(128, 64, 2, eval(_py(f["r"]), {}, env), eval(_py(f["c"]), {}, env)))
    assert cells == set(range(128 * 64))
    # consumer warps 4..12: threads 128..383, the named barrier 1 + 128 / 128 over 256 threads
    assert 'asm volatile("bar.sync %0, %1;" :: "n"(2), "n"(256) : "memory");' in \
        _block_of(src, _line(text, "role_sync()"))


def test_role_sync_at_the_top_level_is_refused_by_the_lowering_too():
    text = _through_smem().replace("    fill(ninf, value=-inf)\n    sync()\n", "    fill(ninf, value=-inf)\n    role_sync()\n")
    r = lower(parse_program(text, "kernel.cake"), "kernel.cake")
    hits = [d for d in r.diagnostics if d.rule == "lower.role_placement"]
    assert hits and hits[0].line == _line(text, "    role_sync()")


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_attention_through_shared_memory_compiles_for_sm_90a(tmp_path):
    c = compile_kernel(_lowered(_through_smem()), cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0


def test_the_gpu_cases_of_fragments_and_row_vectors_verify_and_lower():
    # tests/runtime/test_role_compute_gpu.py launches these on the GPU against the interpreter
    from pathlib import Path

    import sibling
    gpu = sibling.load(Path(__file__).parents[1] / "runtime" / "test_role_compute_gpu.py")
    for name, stmts in gpu.FRAGMENT_CASES.items():
        text = gpu.acc_program(stmts, after_acc=gpu.FRAGMENTS)
        assert check_text(text, "kernel.cake") == [], name
        assert lower(parse_program(text, "kernel.cake"), "kernel.cake").ok, name


def test_a_row_vector_is_stored_once_a_row_and_a_bf16_fragment_like_the_accumulator(tmp_path):
    from pathlib import Path

    import sibling
    gpu = sibling.load(Path(__file__).parents[1] / "runtime" / "test_role_compute_gpu.py")
    text = gpu.stores_program()
    assert check_text(text, "kernel.cake") == []
    src = _lowered(text).source
    row = _block_of(src, _line(text, "store(rv["))
    assert "cake::store_gmem_rowvec(" in row and ", mx, " in row
    assert "cake::store_gmem_wgmma_acc<64, true>(" in _block_of(src, _line(text, "store(hb["))
    # cake::store_gmem_rowvec: lane % 4 == 0 of each quad writes rows row0 and row0 + 8: each of the 128 rows once
    written = [(t // 128) * 64 + ((t % 128) // 32) * 16 + (t % 32) // 4 + 8 * h for t in range(256) if t % 4 == 0
               for h in range(2)]
    assert sorted(written) == list(range(128))
    if compile_mod.nvcc_path() is not None:
        c = compile_kernel(_lowered(text), cache_dir=tmp_path)
        assert c.ok, [d.message for d in c.diagnostics]
