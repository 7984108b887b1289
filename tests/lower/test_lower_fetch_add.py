"""fetch_add and compact lowered onto cake::fetch_add_gmem / fetch_add_smem (header/cake.cuh) and
cake::compact_smem_smem (header/cake_compute.cuh), each through its own scratch in the shared-memory layout, and
compiled with nvcc: the kernels of tests/ir/test_fetch_add.py and test_compact.py, and the token permutation by
expert of test_token_permute.py; refused inside a warp role. The GPU test (tests/runtime/test_token_permute_gpu.py,
marked `gpu`) launches them against the interpreter."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import sibling
from cake_core.ir.program import walk
from cake_core.ir.smem_layout import smem_layout
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.outcome import Outcome
from cake_core.targets import get_arch

_ir = Path(__file__).parents[1] / "ir"
_fetch_add = sibling.load(_ir / "test_fetch_add.py")
_compact = sibling.load(_ir / "test_compact.py")
_permute = sibling.load(_ir / "test_token_permute.py")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
KERNELS = {"DISPATCH": _fetch_add.DISPATCH, "RUNNING": _fetch_add.RUNNING, "WHERE": _compact.WHERE,
           "KEEP": _compact.KEEP, "PERMUTE": _permute.PERMUTE}


def _source(text: str) -> str:
    r = lower(parse_program(text))
    assert r.ok, [d.message for d in r.diagnostics]
    return r.value.source


def test_a_gmem_counter_is_claimed_by_one_thread_and_handed_to_the_cta_through_scratch():
    src = _source(_fetch_add.DISPATCH)
    assert ("const int slot = cake::fetch_add_gmem(counts + ((cake::index_t)(e) * (cake::index_t)1), (int)(1), "
            "reinterpret_cast<int*>(cake_smem + ") in src
    assert ", (M - 1));" in src


def test_an_smem_counter_is_added_at_its_flat_offset():
    src = _source(_fetch_add.RUNNING)
    assert "const int off = cake::fetch_add_smem(cur + ((0) * 1), (int)(n), reinterpret_cast<int*>(cake_smem + " \
           in src and "(0) >= 0 && (0) < 1, (S * R));" in src


def test_compact_takes_the_flags_count_and_its_scratch_from_the_layout():
    p = parse_program(_compact.WHERE)
    src = _source(_compact.WHERE)
    node = next(n for n, _, _ in walk(p.body) if n.op.value == "compact")
    region = smem_layout(p, get_arch("sm_90a")).region(node)
    assert region is not None and region.nbytes == 128          # 32 warps' counts at most
    assert (f"const int n = cake::compact_smem_smem<32, 32, THREADS>(p_s, f_s, reinterpret_cast<int*>(cake_smem + "
            f"{region.offset}), (int)(100), (int)(((100 + (2 * BC)) + 3)), (BR * BC));") in src


def test_a_float_counter_is_refused_at_its_line_when_the_verifier_is_skipped():
    text = _fetch_add.DISPATCH.replace("counts: gmem[i32, (E,)]", "counts: gmem[f32, (E,)]")
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED
    d = r.diagnostics[0]
    assert d.rule == "lower.unsupported_operand" and "adds into `counts` of f32" in d.message and d.line == 8


@pytest.mark.parametrize("op", ["fetch_add(n, cnt[0], 1, max=M)", "compact(n, pos, hit, base=0, limit=8, max=8)"])
def test_inside_a_warp_role_it_is_refused_at_its_line(op):
    text = _fetch_add.WS.replace("c: gmem[f32, (M, N)]):", "c: gmem[f32, (M, N)], cnt: gmem[i32, (1,)]):").replace(
        '    with role("producer", warps=(0, 4), regs=40):\n',
        '    hit = smem(i32, (8,))\n    pos = smem(i32, (8,))\n'
        f'    with role("producer", warps=(0, 4), regs=40):\n        {op}\n')
    r = lower(parse_program(text))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.rule == "lower.unsupported_in_role" and d.line == 10 for d in r.diagnostics), \
        [(d.rule, d.line) for d in r.diagnostics]


@needs_nvcc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_it_compiles_for_sm_90a(tmp_path, name):
    cr = compile_kernel(lower(parse_program(KERNELS[name])).value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    assert cr.value.resources.spill_bytes == 0
