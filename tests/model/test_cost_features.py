"""Cost-model features: a wgmma/TMA kernel's features are what it is, branch and loop counting, L2 reuse."""
from __future__ import annotations

import math

import pytest
from model_fixtures import seed

from cake_core.ir.ops import REGISTRY
from cake_core.model.features import FEATURE_NAMES, extract
from cake_core.model.walk import TRAFFIC

GEMM = {"M": 4096, "N": 4096, "K": 4096}


def test_every_op_has_a_traffic_class():
    assert set(TRAFFIC) == set(REGISTRY)


def test_wgmma_tma_kernel_features_are_what_it_is():
    f = extract(seed("gemm_bf16_ws"), GEMM)
    assert (f.atom, f.copy_engine, f.stages) == ("wgmma", "tma", 4)
    assert (f.n_roles, f.math_roles, f.role_regs_max, f.role_regs_min) == (2, 1, 232, 40)
    assert (f.tile_m, f.tile_n, f.tile_k) == (128, 64, 64)
    assert f.ctas == (4096 // 64) * (4096 // 128)
    assert f.tensor_flops == 2 * 128 * 64 * 4096            # one CTA's tile over all of K
    assert f.flops == 2 * 4096 ** 3
    assert f.read_bytes_tma == (128 * 64 + 64 * 64) * 2 * (4096 // 64)
    assert f.read_bytes_load == f.read_bytes_cp_async == 0
    assert f.write_bytes == 128 * 64 * 4
    # each warpgroup of the consumer reads its 64 rows of a and the whole b tile per k-step
    assert f.smem_operand_bytes == (128 * 64 * 2 + 2 * 64 * 64 * 2) * (4096 // 64)


def test_the_naive_seed_is_fma_with_plain_loads():
    f = extract(seed("gemm_bf16"), GEMM)
    assert (f.atom, f.copy_engine, f.stages, f.n_roles) == ("fma", "load", 1, 0)
    assert f.tensor_flops == 0 and f.fma_flops > 0


def test_an_if_on_a_dimension_counts_only_when_taken():
    """tinygemm_cluster2_rows loads 8 rows of A at M <= 8, 16 at M <= 16, all 64 above."""
    p = seed("tinygemm_cluster2_rows")
    shape = {"N": 4096, "K": 4096}
    trips = math.ceil(4096 // 64 / 2)
    for m, rows in ((1, 8), (16, 16), (64, 64)):
        f = extract(p, {"M": m, **shape})
        assert f.read_bytes_tma == (rows * 64 + 64 * 64) * 2 * trips, m
    f = extract(p, {"M": 1, **shape})
    assert f.cluster_size == 2 and f.split_k == 2      # two CTAs of a cluster write one output window


def test_an_if_on_the_loop_variable_counts_its_trips():
    """``if i > 0: arrive(...)`` and the ring's first trips: the walk takes loop-dependent ifs trip by trip."""
    from cake_core.ir.text import parse_program
    text = '''@kernel(target="sm_90a", grid=(1,), threads=128, consts={"T": 10})
def k(x: gmem[f32, (N,)], y: gmem[f32, (N,)]):
    a = rmem(f32, (128,))
    for i in range(T):
        if i > 0:
            load(a, x[tile(i, 128)])
    store(y[tile(0, 128)], a)
'''
    f = extract(parse_program(text), {"N": 4096})
    assert f.read_bytes_load == 9 * 128 * 4


VARLEN = '''@kernel(target="sm_90a", grid=(G,), threads=128)
def k(cu: gmem[i32, (G + 1,)], x: gmem[f32, (T, 128)], y: gmem[f32, (T, 128)]):
    a = rmem(f32, (1, 128))
    scalar(bos, cu[bid.x], max=T)
    scalar(eos, cu[bid.x + 1], max=T)
    if eos - bos > 0:
        for t in range(eos - bos):
            load(a, x[tile(bos + t, 1), tile(0, 128)])
            store(y[tile(bos + t, 1), tile(0, 128)], a)
'''


def test_values_read_from_memory_bound_a_loop_at_their_greatest_range_and_their_ifs_are_taken():
    """Both offsets at their declared maximum would make ``eos - bos`` 0 (nothing counted, every candidate the
    same); the loop runs to the greatest value the range takes over [0, max] of each (T trips), its if taken."""
    from cake_core.ir.text import parse_program
    p = parse_program(VARLEN)
    for t in (64, 1000):
        f = extract(p, {"G": 4, "T": t})
        assert f.read_bytes_load == t * 128 * 4, t
    unguarded = parse_program(VARLEN.replace("    if eos - bos > 0:\n", "    if 1 > 0:\n"))
    assert extract(unguarded, {"G": 4, "T": 64}).read_bytes_load == 64 * 128 * 4


def test_l2_reuse_between_the_unique_bytes_and_the_requested_bytes():
    small = {"M": 2048, "N": 2048, "K": 2048}
    f = extract(seed("gemm_bf16_ws"), small)
    assert f.unique_bytes == pytest.approx((2 * 2048 * 2048 * 2) + 2048 * 2048 * 4)
    assert f.unique_bytes <= f.dram_bytes < f.l2_bytes
    # at 2048 what one wave touches (~12 MB) fits in the usable L2: operands are read from DRAM once
    assert f.wave_bytes < 25e6 and f.dram_bytes == pytest.approx(f.unique_bytes)
    big = extract(seed("gemm_bf16_ws"), {"M": 16384, "N": 16384, "K": 16384})
    assert big.dram_bytes > 1.5 * big.unique_bytes        # a wave's panels no longer fit: re-read per wave


def test_occupancy_follows_ptxas_resources():
    p = seed("kmeans_update_red4")
    shape = {"B": 32, "N": 65536, "K": 1024, "D": 128}
    few = extract(p, shape, resources={"registers": 32, "spill_bytes": 0, "smem_bytes": 4096})
    many = extract(p, shape, resources={"registers": 255, "spill_bytes": 64, "smem_bytes": 4096})
    assert few.from_ptxas and few.ctas_per_sm == 8 and few.occupancy_limit == "threads"
    assert many.ctas_per_sm == 1 and many.occupancy_limit == "regs" and many.spill_bytes == 64
    assert many.waves > few.waves and many.tail_ctas != few.tail_ctas


def test_vector_atomics_are_a_quarter_of_the_element_atomics():
    p = seed("kmeans_update_red4")
    shape = {"B": 4, "N": 8192, "K": 1024, "D": 128}
    f = extract(p, shape)
    # per CTA: TPC tiles of BN rows x BD columns into sums (red.v4), BN counts (element atomics)
    assert f.atomic_ops == 32 * 16 * 128 / 4 + 32 * 16
    assert f.atomic_bytes == 32 * 16 * 128 * 4 + 32 * 16 * 4


def test_feature_vector_has_the_schema_length():
    f = extract(seed("knn_topk_split_pp3"), {"Q": 4096, "N": 1 << 20, "D": 128, "k": 10})
    v = f.vector()
    assert len(v) == len(FEATURE_NAMES) and all(math.isfinite(x) for x in v)
    assert v[FEATURE_NAMES.index("atom=wgmma")] == 1.0 and v[FEATURE_NAMES.index("atom=fma")] == 0.0


KNN = {"Q": 4096, "N": 1048576, "D": 128, "k": 10}


def test_clusters_that_the_gpcs_cannot_hold_at_once_make_a_second_wave():
    """32 clusters of 4 (128 CTAs, one per SM) on the H200: its GPCs hold 30 at once (bench/results/
    cluster-occupancy-h200-2026-12-02.json), so 8 CTAs run in a second wave; 32 clusters of 3 fit in one."""
    four, three = extract(seed("knn_topk_split_pp"), KNN), extract(seed("knn_topk_split_pp3"), KNN)
    assert (four.cluster_size, four.ctas, four.ctas_per_sm) == (4, 128, 1)
    assert (four.concurrent_ctas, four.full_waves, four.tail_ctas) == (120, 1, 8)
    assert (three.cluster_size, three.ctas, three.concurrent_ctas, three.tail_ctas) == (3, 96, 96, 0)


UPDATE = {"B": 32, "N": 65536, "K": 1024, "D": 128}


def test_warp_owned_adds_are_counted_apart_and_fewer_warps_add_more_slowly():
    """kmeans_update_owned (512 threads) and owned_w8 (256) do the same adds; the probe of the H200
    (bench/smem_rmw.py) says 8 warps add at 1.54 elements per clock and 16 at 2.13, so the model must rank
    owned_w8 slower: measured 0.86 against 0.64 ms at this shape (corpus-vs-peers-2026-11-29b.json)."""
    from cake_core.model.analytic import AnalyticModel
    owned, w8, smem = (extract(seed(n), UPDATE) for n in ("kmeans_update_owned", "kmeans_update_owned_w8",
                                                          "kmeans_update_smem"))
    assert owned.smem_owned_ops > 0 and owned.smem_owned_ops == w8.smem_owned_ops
    assert smem.smem_owned_ops == 0 and smem.smem_atomic_ops > 0
    assert owned.smem_atomic_ops < owned.smem_owned_ops / 10      # the counts' i32 adds only
    assert (owned.warps_per_sm, w8.warps_per_sm) == (16, 8)
    model = AnalyticModel()
    assert model.predict_features(w8) > 1.2 * model.predict_features(owned)


def test_cp_async_of_rows_that_are_not_16_byte_aligned_is_a_synchronous_copy():
    """At D=100 a bf16 row is 200 bytes: cp_async_smem_gmem copies it element by element (four in flight per
    thread); at D=128 the same kernel streams 16-byte cp.async chunks."""
    from cake_core.model.analytic import AnalyticModel
    prog = seed("kmeans_update_smem")
    aligned = extract(prog, {"B": 4, "N": 100000, "K": 1000, "D": 128})
    ragged = extract(prog, {"B": 4, "N": 100000, "K": 1000, "D": 100})
    assert aligned.read_bytes_load == 0 and aligned.copy_engine == "cp_async"
    assert ragged.copy_engine == "load" and ragged.read_bytes_load > 10 * ragged.read_bytes_cp_async
    # the i32 assignments stay 16-byte chunks; the element path keeps 512 threads x 4 x 2 bytes in flight
    assert ragged.read_bytes_cp_async > 0 and ragged.inflight_bytes < 512 * 4 * 2 * 1.1
    assert aligned.inflight_bytes > 4 * ragged.inflight_bytes
    model = AnalyticModel()
    per_byte = [model.predict_features(f) / f.dram_bytes for f in (aligned, ragged)]
    assert per_byte[1] > 1.5 * per_byte[0]
