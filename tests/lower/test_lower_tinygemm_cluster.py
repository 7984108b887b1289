"""The tinygemm_cluster program: the lowering of acc_publish / acc_cluster_reduce (header/cake_cluster.cuh) and an
nvcc compile for sm_90a (no GPU): no spills, no stack, wgmma not serialised, two CTAs per SM fit."""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from ptx import ptx_of
from cake_core.problems import corpus_file

NAME = "tinygemm_cluster.cake"
TEXT = corpus_file(NAME).read_text()
SM_SMEM = 233472        # bytes of shared memory per H200 SM (228 KiB), 1 KiB of it reserved per CTA


def _lower(text: str = TEXT):
    return lower(parse_program(text, NAME), NAME)


def test_grid_and_cluster_put_256_ctas_two_per_sm_at_4096():
    lk = _lower().value
    assert lk.cluster == (1, 8, 1)
    assert lk.grid_for({"M": 1, "N": 4096, "K": 4096}) == (32, 8, 1)          # 256 CTAs, 8 K tiles each
    assert lk.grid_for({"M": 64, "N": 8192, "K": 8192}) == (64, 8, 1)         # 512 CTAs, 16 K tiles each
    assert lk.smem_bytes == 3 * (8192 + 16384) + 32768 + 128
    assert 2 * (lk.smem_bytes + 1024) <= SM_SMEM


def test_publish_and_reduce_lower_to_the_cluster_helpers():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert "if (cake_acc_fresh) cake::fill_rmem(acc, 0.0f);" in src             # an empty K slice publishes 0
    assert "cake::store_smem_wgmma_acc_cluster<128>(part_s, acc, (int)threadIdx.x - 0);" in src
    assert "cake::cluster_reduce_gmem_f32<64, 128, 8>(c + " in src
    assert src.count("cake::cluster_sync();") == 2
    assert "red_gmem" not in src and "atomic" not in src
    assert "__cluster_dims__(1, 8, 1)" in src


def test_publish_outside_a_role_or_of_a_non_accumulator_is_refused():
    text = TEXT.replace("    cluster_sync()\n    acc_cluster_reduce", "    acc_publish(part_s, part_s)\n"
                                                                     "    cluster_sync()\n    acc_cluster_reduce", 1)
    r = _lower(text)
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.rule == "lower.unsupported_operand" for d in r.diagnostics), r.diagnostics


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_cluster_program_compiles_for_sm_90a_without_spills(tmp_path):
    r = compile_kernel(_lower().value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log and "C75" not in log                         # wgmma not serialised
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0 and res.registers <= 128
    assert 2 * 160 * res.registers <= 65536                                    # two CTAs per SM
    ptx = ptx_of(_lower().value.source, tmp_path)
    for needle in ("ld.shared::cluster.v4.f32", "mapa.shared::cluster", "st.global.v4.f32", "barrier.cluster",
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "cp.async.bulk.tensor.2d"):
        assert needle in ptx, needle
    assert "red.global" not in ptx
