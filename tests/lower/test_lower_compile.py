"""nvcc compile stage: cubins for sm_90a and sm_100a, ptxas resources, the cache, errors mapped to IR lines."""
from __future__ import annotations

import time

import pytest

from cake_core.ir.ops import Op
from cake_core.ir.text import parse_program
from cake_core.lower import LOWERINGS, compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.lower.compile import parse_ptxas
from cake_core.outcome import Outcome
from cake_core.problems import get_problem

pytestmark = pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")

SEED = get_problem("gemm_bf16").seed_text()


def _line_of(needle: str) -> int:
    return next(i for i, ln in enumerate(SEED.splitlines(), 1) if needle in ln)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cubins")


def _lowered(text: str = SEED):
    r = lower(parse_program(text, "kernel.cake"))
    assert r.ok, r.diagnostics
    return r.value


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_seed_compiles_with_resources(arch, cache):
    r = compile_kernel(_lowered(), arch=arch, cache_dir=cache)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    c = r.value
    assert c.cubin_path.exists() and c.cubin_path.stat().st_size > 0 and c.arch == arch
    assert c.resources.registers > 0
    if arch == "sm_90a":
        assert c.resources.spill_bytes == 0 and c.resources.stack_bytes == 0
    assert c.resources.smem_bytes == 8192 and c.resources.barriers == 1
    assert f"for '{arch}'" in r.artifacts["nvcc.log"]


def test_second_compile_is_a_cache_hit(cache):
    lk = _lowered(SEED.replace('"BK": 32', '"BK": 16'))
    t0 = time.perf_counter()
    first = compile_kernel(lk, cache_dir=cache)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = compile_kernel(lk, cache_dir=cache)
    warm = time.perf_counter() - t0
    assert first.ok and not first.value.cached and first.value.seconds > 0
    assert again.ok and again.value.cached and again.value.seconds == 0.0
    assert again.value.cubin_path == first.value.cubin_path and again.value.resources == first.value.resources
    assert warm < cold / 5
    assert not list(cache.glob("*.tmp")) and not list(cache.glob("cake-nvcc-*"))


def test_nvcc_error_in_a_lowering_lands_on_the_ir_line(cache, monkeypatch):
    monkeypatch.setitem(LOWERINGS, Op.SYNC, lambda n, ctx: ["this_is_not_cpp;"])
    r = compile_kernel(_lowered(), cache_dir=cache)
    assert r.outcome is Outcome.COMPILE_FAILED
    d = r.first_error()
    assert d.rule == "nvcc.error" and d.line == _line_of("sync()")
    assert "this_is_not_cpp" in d.message and "nvcc.log" in r.artifacts


def test_header_error_lands_on_the_instantiating_ir_line(cache, monkeypatch):
    monkeypatch.setitem(LOWERINGS, Op.MMA,
                        lambda n, ctx: ["cake::mma_fma_rmem_smem<64, 64, 32, 100>(acc, a_s, b_s);"])
    r = compile_kernel(_lowered(), cache_dir=cache)
    assert r.outcome is Outcome.COMPILE_FAILED
    d = r.first_error()
    assert d.line == _line_of("mma(") and "split evenly" in d.message and "cake.cuh" in d.message


def test_unknown_arch_is_refused_without_fallback(cache):
    r = compile_kernel(_lowered(), arch="sm_89", cache_dir=cache)
    assert r.outcome is Outcome.COMPILE_FAILED and r.first_error().rule == "compile.unknown_arch"


def test_missing_nvcc_is_a_clear_diagnostic(cache, monkeypatch):
    monkeypatch.setattr(compile_mod, "nvcc_path", lambda: None)
    r = compile_kernel(_lowered(SEED.replace('"BN": 64', '"BN": 32')), cache_dir=cache)
    assert r.first_error().rule == "compile.no_nvcc" and "CAKE_NVCC" in r.first_error().hint


def test_nvcc_timeout(cache):
    r = compile_kernel(_lowered(SEED.replace('"BN": 64', '"BN": 128')), cache_dir=cache, timeout_s=0.01)
    assert r.outcome is Outcome.COMPILE_FAILED and r.first_error().rule == "nvcc.timeout"


def test_a_timed_out_nvcc_leaves_none_of_its_children_running(tmp_path, monkeypatch):
    """nvcc runs cicc and ptxas as children; a time-out kills them with it, not nvcc alone."""
    import os
    import signal

    from tasks.processes import alive

    child = tmp_path / "child.pid"
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {child}\nsleep 300\n")   # a child, then the wait
    fake.chmod(0o755)
    monkeypatch.setattr(compile_mod, "nvcc_path", lambda: str(fake))
    r = compile_kernel(_lowered(SEED.replace('"BN": 64', '"BN": 16')), cache_dir=tmp_path / "c", timeout_s=1.0)
    assert r.first_error().rule == "nvcc.timeout"
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    alive = alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)   # not left to the next test either
    assert not alive, "the timed-out nvcc's child is still running"


def test_rows_program_compiles(cache):
    from test_lower_cuda import ROWS  # tests/lower is on sys.path (rootdir-less test dirs)
    r = lower(parse_program(ROWS, "rows.cake"), "rows.cake")
    c = compile_kernel(r.value, cache_dir=cache)
    assert c.ok, [d.message for d in c.diagnostics]


def test_parse_ptxas_report():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 1024 bytes smem, 384 bytes cmem[0]
"""
    r = parse_ptxas(log, "k", dynamic_smem=4096)
    assert (r.registers, r.spill_bytes, r.smem_bytes, r.barriers, r.stack_bytes) == (255, 20, 5120, 2, 24)
    assert parse_ptxas("nothing here", "k") is None
