"""Elementwise ops inside warp roles are lowered over the role's own threads: the index math the lowering emits,
evaluated for every thread of the CTA, touches each element of the destination exactly once, and only from the
role's threads; the ops it cannot lower that way are refused (``lower.unsupported_in_role``), never spread over
the CTA's threads."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod

WS = (Path(__file__).resolve().parents[2] / "cake_core" / "problems" / "gemm_bf16" / "kernels" /
      "gemm_bf16_ws.cake").read_text()
STORE = "        store(c["
TOP = "    full = mbarrier(S)\n"
CONSUMER = "        acc = rmem(f32, (BM, BN))\n"


def in_consumer(text: str, before_store: str = "", after_acc: str = "", top: str = "") -> str:
    """The warp-specialised gemm seed (384 threads, consumer warps 4..12) with statements planted."""
    out = text.replace(STORE, before_store + STORE) if before_store else text
    out = out.replace(CONSUMER, CONSUMER + after_acc) if after_acc else out
    return out.replace(TOP, TOP + top) if top else out


def _lowered(text: str):
    r = lower(parse_program(text, "kernel.cake"), "kernel.cake")
    assert r.ok, [d.format("kernel.cake", text) for d in r.diagnostics]
    return r.value


def _c_to_py(expr: str) -> str:
    """A C integer expression of the emitted loop as Python (operands are never negative: / is //)."""
    return expr.replace("(int)threadIdx.x", "tid").replace("/", "//")


def _block_of(src: str, line: int) -> list[str]:
    """The C lines emitted for IR line ``line``."""
    lines = src.splitlines()
    return [lines[i + 1].strip() for i in range(len(lines) - 1) if lines[i] == f'#line {line} "kernel.cake"']


def _role_range(src: str, line: int, threads: int) -> range:
    """The threads that run IR line ``line``: the role branch around it, or the whole CTA."""
    lines = src.splitlines()
    at = next(i for i in range(len(lines) - 1) if lines[i] == f'#line {line} "kernel.cake"')
    depth, branch = 0, None
    for ln in reversed(lines[:at]):
        depth += ln.count("}") - ln.count("{")
        if depth < 0 and "// role " in ln:
            branch = ln
            break
        depth = min(depth, 0)
    if branch is None:
        return range(threads)
    m = re.search(r"threadIdx\.x >= (\d+)u && threadIdx\.x < (\d+)u", branch) or \
        re.search(r"()threadIdx\.x < (\d+)u", branch)
    return range(int(m.group(1) or 0), int(m.group(2)))


def touched(src: str, line: int, threads: int) -> tuple[Counter, dict]:
    """Evaluate the loop emitted for IR line ``line`` for every thread of the CTA: how often each element of its
    destination is written ((row, col) for a fragment destination, the flat index for an smem or CTA-spread one),
    and the loop's facts (slots, destination access, first thread, the threads that ran it)."""
    code = _block_of(src, line)
    text = "\n".join(code)
    slots = int(re.search(r"for \(int cake_s = 0; cake_s < (\d+); \+\+cake_s\)", text).group(1))
    first = re.search(r"const int cake_t = \(int\)threadIdx\.x - (\d+);", text)
    elem = re.search(r"const int cake_e = ([^;]+);", text).group(1)
    rc = re.search(r"const int cake_r = ([^,]+), cake_c = ([^;]+);", text)
    half = re.search(r"const int cake_h = ([^;]+);", text)      # a fragment slot's row half
    guard = re.search(r"if \((cake_e < \d+)\) \{", text)
    dst = re.search(r"^(\w+)\[(cake_s|cake_e)\] = ", text, re.M)
    ran = _role_range(src, line, threads)
    hits: Counter = Counter()
    for tid in ran:
        env = {"tid": tid, "THREADS": threads}
        if first:
            env["cake_t"] = tid - int(first.group(1))
        for s in range(slots):
            env["cake_s"] = s
            if half:
                env["cake_h"] = eval(_c_to_py(half.group(1)), {}, env)
            if rc and "cake_t" in rc.group(1):            # fragment: (row, col) first, then e from them
                env["cake_r"], env["cake_c"] = (eval(_c_to_py(x), {}, env) for x in rc.groups())
                env["cake_e"] = eval(_c_to_py(elem), {}, env)
            else:
                env["cake_e"] = eval(_c_to_py(elem), {}, env)
                if rc:
                    env["cake_r"], env["cake_c"] = (eval(_c_to_py(x), {}, env) for x in rc.groups())
            if guard and not eval(_c_to_py(guard.group(1)), {}, env):
                continue
            key = (env["cake_r"], env["cake_c"]) if dst.group(2) == "cake_s" and "cake_r" in env else env["cake_e"]
            hits[key] += 1
    return hits, {"slots": slots, "dst": dst.group(1), "first": int(first.group(1)) if first else None,
                  "threads": ran, "rc": rc.groups() if rc else None}


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def _store_slot(tid: int, s: int) -> tuple[int, int]:
    """Where ``cake::store_gmem_wgmma_acc`` (cake_async.cuh) stores slot ``s`` of role thread ``tid``."""
    wg, warp, lane = tid // 128, (tid % 128) // 32, tid % 32
    return wg * 64 + warp * 16 + lane // 4 + ((s % 4) // 2) * 8, (s // 4) * 8 + (lane % 4) * 2 + s % 2


def test_unary_on_a_wgmma_accumulator_covers_every_fragment_slot():
    # the reported miscompile: a 128x64 accumulator, 384 threads, consumer warps 4..12; the CTA map visited
    # 22 of the 32 slots of each thread (8192 / 384 rounded up)
    text = in_consumer(WS, before_store='        unary(acc, acc, fn="neg")\n')
    src = _lowered(text).source
    hits, facts = touched(src, _line(text, "unary("), 384)
    assert facts["slots"] == 32 and facts["dst"] == "acc" and facts["first"] == 128
    assert facts["threads"] == range(128, 384)
    assert set(hits) == {(r, c) for r in range(128) for c in range(64)} and set(hits.values()) == {1}
    row, col = (_c_to_py(x) for x in facts["rc"])
    for tid in range(256):
        for s in range(32):
            env = {"cake_t": tid, "cake_s": s, "cake_h": s % 4 // 2}
            assert (eval(row, {}, env), eval(col, {}, env)) == _store_slot(tid, s)


def test_fill_of_a_shared_tile_inside_a_role_covers_the_elements_of_the_other_roles_threads():
    # the reported miscompile: the CTA map left out the elements mapped to the producer's threads 0..127
    text = in_consumer(WS, after_acc="        fill(t_s, value=1.0)\n", top="    t_s = smem(f32, (BM, BN))\n")
    src = _lowered(text).source
    hits, facts = touched(src, _line(text, "fill(t_s"), 384)
    assert facts["threads"] == range(128, 384) and facts["dst"] == "t_s"
    assert set(hits) == set(range(128 * 64)) and set(hits.values()) == {1}


@pytest.mark.parametrize("planted", [
    ("        fill(acc, value=2.0)\n", "fill(acc"),
    ('        ewise(acc, acc, v_s, fn="mul")\n', "ewise("),           # an smem row vector against the fragments
    ('        ewise(acc, col_s, acc, fn="sub")\n', "ewise("),         # an smem column vector
    ("        cast(o_s, acc)\n", "cast("),                            # fragments into an smem tile of their shape
    ('        unary(o_s, u_s, fn="exp")\n', "unary("),                # smem only, a tile the role threads split
    ('        ewise(w_s, w_s, w_s, fn="add")\n', "ewise("),           # 48 x 40: not a multiple of 256 threads
    ("        iota(acc, base=bid.x * BN, axis=1)\n", "iota("),          # coordinates of the fragment slots
    ("        select(acc, k_s, acc, v_s)\n", "select("),
    ('        ewise(acc, acc, u_s, fn="lt")\n', "ewise("),
    ("        iota(k_s, base=0, axis=0)\n", "iota("),
], ids=["fill acc", "ewise row vector", "ewise column vector", "cast to smem", "unary smem", "ragged smem",
        "iota acc", "select acc", "compare acc", "iota smem"])
def test_elementwise_ops_inside_a_role_cover_their_destination_once(planted):
    stmt, needle = planted
    top = ("    v_s = smem(f32, (BN,))\n    col_s = smem(f32, (BM, 1))\n    o_s = smem(bf16, (BM, BN))\n"
           "    u_s = smem(f32, (BM, BN))\n    w_s = smem(f32, (48, 40))\n    k_s = smem(i32, (BM, BN))\n")
    text = in_consumer(WS, before_store=stmt, top=top)
    src = _lowered(text).source
    hits, facts = touched(src, _line(text, needle), 384)
    assert facts["threads"] == range(128, 384)
    want = {"acc": {(r, c) for r in range(128) for c in range(64)}, "o_s": set(range(128 * 64)),
            "u_s": set(range(128 * 64)), "w_s": set(range(48 * 40)), "k_s": set(range(128 * 64))}[facts["dst"]]
    assert set(hits) == want and set(hits.values()) == {1}


def test_a_broadcast_operand_is_read_at_the_fragment_slots_row_or_column():
    top = "    v_s = smem(f32, (BN,))\n    col_s = smem(f32, (BM, 1))\n"
    text = in_consumer(WS, before_store='        ewise(acc, acc, v_s, fn="mul")\n        ewise(acc, col_s, acc)\n',
                       top=top)
    src = _lowered(text).source
    row = "\n".join(_block_of(src, _line(text, "v_s, fn=")))
    col = "\n".join(_block_of(src, _line(text, "col_s, acc")))
    assert "cake::to_f32(v_s[cake_c])" in row and "cake::to_f32(acc[cake_s])" in row
    assert "cake::to_f32(col_s[cake_r])" in col


def test_the_cta_map_outside_roles_is_unchanged():
    text = ('@kernel(target="sm_90a", grid=(1,), threads=384)\n'
            "def k(x: gmem[f32, (48, 40)]):\n"
            "    w_s = smem(f32, (48, 40))\n"
            "    fill(w_s, value=1.0)\n"
            "    sync()\n"
            "    store(x[:, :], w_s)\n")
    src = _lowered(text).source
    hits, facts = touched(src, 4, 384)
    assert facts["first"] is None and facts["threads"] == range(384)
    assert set(hits) == set(range(48 * 40)) and set(hits.values()) == {1}
    assert "cake_e = cake_s * THREADS + (int)threadIdx.x" in "\n".join(_block_of(src, 4))


def test_a_lazily_zeroed_accumulator_gets_its_zeros_before_an_op_touches_it():
    # acc = rmem(f32, ...) is zero until a wgmma writes it (lower_wgmma); an op before any wgmma must see zeros,
    # and a fill before the first wgmma must survive it (the wgmma then accumulates instead of overwriting)
    text = in_consumer(WS, after_acc="        fill(acc, value=1.0)\n")
    block = "\n".join(_block_of(_lowered(text).source, _line(text, "fill(acc")))
    assert "if (cake_acc_fresh) { cake::fill_rmem(acc, 0.0f); cake_acc_fresh = 0; }" in block


@pytest.mark.parametrize("case", [
    ("    t_s = smem(f32, (BM, BN))\n    r_s = smem(f32, (BM,))\n", "        reduce(r_s, t_s, axis=1)\n", "reduce("),
    ("    t = rmem(f32, (3, 128))\n", "        fill(t, value=1.0)\n", "fill(t"),      # 1 slot of each thread
    ("    t_s = smem(f32, (BM, BN))\n    u_s = smem(f32, (BN, BM))\n", "        transpose(u_s, t_s)\n", "transpose("),
], ids=["reduce", "CTA-spread rmem", "transpose"])
def test_what_a_role_cannot_run_over_its_own_threads_is_refused_by_the_lowering(case):
    top, stmt, needle = case
    text = in_consumer(WS, after_acc=stmt, top=top)
    r = lower(parse_program(text, "kernel.cake"), "kernel.cake")
    hits = [d for d in r.diagnostics if d.rule == "lower.unsupported_in_role"]
    assert hits and hits[0].line == _line(text, needle), [d.format("kernel.cake", text) for d in r.diagnostics]


ROLE_OPS = in_consumer(WS, top="    v_s = smem(f32, (BN,))\n    o_s = smem(bf16, (BM, BN))\n"
                               "    w_s = smem(f32, (48, 40))\n",
                       after_acc="        fill(w_s, value=-inf)\n",
                       before_store='        unary(acc, acc, fn="silu")\n        ewise(acc, acc, v_s, fn="max")\n'
                                    "        cast(o_s, acc)\n"
                                    '        unary(w_s, w_s, fn="softplus")\n'
                                    "        iota(acc, base=bid.y * BM, axis=0)\n"
                                    '        ewise(acc, acc, v_s, fn="ge")\n'
                                    "        select(acc, acc, acc, v_s)\n")


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_ops_inside_roles_compile_for_sm_90a(tmp_path):
    c = compile_kernel(_lowered(ROLE_OPS), cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0
