"""Lowering of persistent kernels: ranged `for` loops, `ncta` as gridDim, a grid sized by `num_sms` at launch;
the persistent GEMM seed compiles for sm_90a without spills (compile-only: nvcc, no GPU)."""
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile as compile_mod
from cake_core.lower import compile_kernel, lower
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
SEED = corpus_file("gemm_bf16_persistent.cake").read_text()


def _lowered(text: str = SEED):
    r = lower(parse_program(text, "gemm_bf16_persistent.cake"), "gemm_bf16_persistent.cake")
    assert r.ok, r.diagnostics
    return r.value


def test_tile_loop_starts_at_the_cta_and_steps_by_the_grid():
    src = _lowered().source
    assert "for (int t = ((int)blockIdx.x); t < (cake_cdiv(M, BM) * cake_cdiv(N, BN)); t += ((int)gridDim.x)) {" in src
    assert src.count("t += ((int)gridDim.x)") == 2                     # producer and consumers walk the same tiles
    assert "for (int kt = 0; kt < cake_cdiv(K, BK); ++kt) {" in src     # plain loops are unchanged


def test_grid_is_sized_by_the_sm_count_at_launch():
    lk = _lowered()
    assert lk.persistent
    shape = {"M": 4096, "N": 4096, "K": 4096}
    assert lk.grid_for(shape, num_sms=132) == (132,)                    # 512 tiles: one CTA per SM
    assert lk.grid_for({"M": 1024, "N": 1024, "K": 1024}, num_sms=132) == (32,)
    with pytest.raises(ValueError, match="num_sms"):
        lk.grid_for(shape)
    n256 = corpus_file("gemm_bf16_ws_n256.cake").read_text()
    assert not _lowered(n256).persistent


def test_num_sms_in_the_body_is_not_lowered():
    bad = SEED.replace("for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), ncta.x):\n            acc",
                       "for t in range(bid.x, cdiv(M, BM) * cdiv(N, BN), num_sms):\n            acc")
    assert bad != SEED
    r = lower(parse_program(bad), "x.cake")
    assert not r.ok and r.first_error().rule == "lower.unknown_name" and "num_sms" in r.first_error().message


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_persistent_seed_compiles_without_spills(tmp_path):
    r = compile_kernel(_lowered(), arch="sm_90a", cache_dir=tmp_path)
    assert r.ok, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert r.metrics["spill_bytes"] == 0, log
    assert "C75" not in log, log            # no wgmma serialisation remark
    assert r.metrics["registers"] <= 168    # 384 threads, one CTA per SM


MC = corpus_file("gemm_bf16_persistent_mc.cake").read_text()


def test_multicast_seed_lowers_cluster_dims_multicast_copies_and_remote_arrivals():
    lk = _lowered(MC)
    src = lk.source
    assert "__cluster_dims__(2, 1, 1)" in src and lk.cluster == (2, 1, 1)
    assert src.count("cake::tma_load_2d_multicast(") == 4 and ", (uint16_t)3, " in src   # B: 4 column boxes
    assert src.count("cake::mbarrier_arrive_cluster(") == 4          # 2 release sites x 2 CTAs
    assert src.count("cake::cluster_sync();") == 2
    assert lk.grid_for({"M": 4096, "N": 4096, "K": 4096}, num_sms=132) == (132,)
    assert lk.grid_for({"M": 128, "N": 256, "K": 64}, num_sms=132) == (2,)   # one tile: a whole cluster


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_multicast_seed_compiles_without_spills(tmp_path):
    r = compile_kernel(_lowered(MC), arch="sm_90a", cache_dir=tmp_path)
    assert r.ok, [d.message for d in r.diagnostics]
    assert r.metrics["spill_bytes"] == 0 and "C75" not in r.artifacts["nvcc.log"], r.artifacts["nvcc.log"]
