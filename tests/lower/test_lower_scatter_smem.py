"""Lowering scatter_add into a shared-memory tile: the smem helper is called (no gmem atomics), an rmem
index is staged, and the smem-privatised kmeans_update program compiles for sm_90a without spills."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import get_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ir"))
from test_scatter_smem import PRIV  # noqa: E402  (a privatised kmeans_update)
from cake_core.problems import corpus_file


def test_scatter_into_smem_lowers_to_shared_memory_atomics():
    r = lower(parse_program(PRIV, "priv.cake"), "priv.cake")
    assert r.outcome is Outcome.OK, [d.format("priv.cake") for d in r.diagnostics]
    src = r.value.source
    assert "cake::scatter_add_smem<128, 32, THREADS, true>(acc_s, 64, a_s, x_r, " in src
    assert "cake::scatter_add_smem<128, 1, THREADS, true>(cnt_s, 64, a_s, ones, " in src
    assert src.count("atomic_add_gmem") == 2          # only the two merges into gmem


def test_an_rmem_index_is_staged_through_smem_scratch():
    text = PRIV.replace("    a_s = smem(i32, (BN,))\n", "    a_s = rmem(i32, (BN,))\n").replace(
        "    load(a_s, assign[bid.y, tile(bid.x, BN)])\n    sync()\n", "    load(a_s, assign[bid.y, tile(bid.x, BN)])\n")
    r = lower(parse_program(text, "priv.cake"), "priv.cake")
    assert r.ok, r.diagnostics
    assert "cake::stage_smem_rmem<128, THREADS>(cake_st_a_s, a_s);" in r.value.source
    assert "(acc_s, 64, cake_st_a_s, x_r, " in r.value.source


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("which", ["priv", "smem"])
def test_smem_scatter_programs_compile_for_sm_90a(which, tmp_path):
    text = PRIV if which == "priv" else corpus_file("kmeans_update_smem.cake").read_text()
    r = lower(parse_program(text, f"{which}.cake"), f"{which}.cake")
    assert r.ok, r.diagnostics
    c = compile_kernel(r.value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.arch == "sm_90a" and c.value.resources.smem_bytes <= 232448
    if which == "smem":
        assert r.value.smem_bytes > 128 * 1024     # the K x BD f32 accumulator plus the cp.async ring


OWNED = ("kmeans_update_owned.cake", "kmeans_update_owned_w32.cake", "kmeans_update_owned_w8.cake")
# PRIV with x staged in smem, so that a warp can read every row it owns
PRIV_S = PRIV.replace("    x_r = rmem(bf16, (BN, BD))\n", "    x_r = smem(bf16, (BN, BD))\n").replace(
    "        load(x_r, x[bid.y, tile(bid.x, BN), tile(dt, BD)])\n",
    "        load(x_r, x[bid.y, tile(bid.x, BN), tile(dt, BD)])\n        sync()\n")


def test_a_warp_owned_scatter_lowers_to_plain_adds_by_the_owning_warp():
    text = PRIV_S.replace("scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N)",
                          'scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N, owner="warp")')
    assert text != PRIV_S
    r = lower(parse_program(text, "priv.cake"), "priv.cake")
    assert r.ok, [d.format("priv.cake") for d in r.diagnostics]
    assert "cake::scatter_add_smem_owned<128, 32, THREADS, true>(acc_s, 64, a_s, x_r, " in r.value.source
    assert "cake::scatter_add_smem<128, 1, THREADS, true>(cnt_s, 64, a_s, ones, " in r.value.source


def test_a_warp_owned_scatter_of_an_rmem_source_is_refused_by_the_lowering():
    text = PRIV.replace("scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N)",
                        'scatter_add(acc_s[:, :], a_s, x_r, base=bid.x * BN, limit=N, owner="warp")')
    r = lower(parse_program(text, "priv.cake"), "priv.cake")
    assert not r.ok and any(d.rule == "lower.unsupported_operand" and "x_r" in d.message for d in r.diagnostics)


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", OWNED)
def test_the_warp_owned_variants_compile_for_sm_90a_without_spills(name, tmp_path):
    r = lower(parse_program(corpus_file(name).read_text(), name), name)
    assert r.ok, r.diagnostics
    assert "cake::scatter_add_smem_owned<384, 32, THREADS, true>(acc_s, 1024, " in r.value.source
    c = compile_kernel(r.value, cache_dir=tmp_path)
    assert c.ok, [d.message for d in c.diagnostics]
    assert c.value.resources.spill_bytes == 0 and c.value.resources.stack_bytes == 0, c.value.resources
