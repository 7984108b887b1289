"""features(): the schedule summary, read from the op declarations, right for every op family."""
from __future__ import annotations

from pathlib import Path

from cake_core.ir.features import features
from cake_core.ir.text import parse_program
from cake_core.problems import corpus_file



def _f(name: str, **replace: str) -> dict:
    text = corpus_file(f"{name}.cake").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return features(parse_program(text))


def test_a_warp_specialized_tma_wgmma_kernel():
    f = _f("gemm_bf16_ws")
    assert f["mma_atom"] == "wgmma" and f["copy_engine"] == "tma"
    assert f["n_roles"] == 2 and f["role_regs"] == "40/232" and f["mbarrier_slots"] == 4 and f["smem_stages"] == 4
    assert f["cluster_size"] == 1 and not f["multicast"] and not f["persistent"]
    assert f["epilogue"] == "store" and f["n_sync"] == 0
    assert f["smem_kib"] == "<=100" and f["regs_per_thread"] == "<=32"


def test_persistence_clusters_and_multicast():
    persistent = _f("gemm_bf16_persistent")
    assert persistent["persistent"] and persistent["mma_atom"] == "wgmma"
    mc = _f("gemm_bf16_persistent_mc")
    assert mc["cluster_size"] == 2 and mc["multicast"]
    assert _f("knn_topk_split")["cluster_size"] == 4


def test_the_epilogue_is_what_reads_the_accumulator():
    assert _f("kmeans_assign_ws")["epilogue"] == "argmin_bias"
    assert _f("knn_topk_ws")["epilogue"] == "topk_bias"
    assert _f("tinygemm_cluster")["epilogue"] == "acc_publish"
    assert _f("tinygemm_splitk")["epilogue"] == "atomic_add"
    assert _f("kmeans_update")["epilogue"] == "none" and _f("kmeans_update")["mma_atom"] == "none"


def test_the_copy_engine_and_atom_of_the_cta_wide_kernels():
    seed = _f("gemm_bf16")
    assert seed["mma_atom"] == "fma" and seed["copy_engine"] == "plain" and seed["n_roles"] == 0
    assert seed["role_regs"] == "none" and seed["n_sync"] == 2
    assert _f("gemm_bf16", **{"mma(acc, a_s, b_s)": 'mma(acc, a_s, b_s, atom="mma_sync")'})["mma_atom"] == "mma_sync"
    assert _f("kmeans_assign_unaligned")["copy_engine"] == "cp_async"
    assert _f("kmeans_update_red4")["copy_engine"] == "cp_async+plain"


def test_tcgen05_reports_its_atom():
    text = corpus_file("gemm_bf16_ws.cake").read_text().replace("wgmma(acc,", "tcgen05_mma(acc,")
    assert features(parse_program(text))["mma_atom"] == "tcgen05"


def test_unguarded_accesses_count_every_op_with_a_guard():
    assert not _f("gemm_bf16")["unguarded_load"]
    assert _f("gemm_bf16", **{"tile(kt, BK)])": "tile(kt, BK)], guard=False)"})["unguarded_load"]
    store = _f("gemm_bf16", **{"tile(bid.x, BN)], acc)": "tile(bid.x, BN)], acc, guard=False)"})
    assert store["unguarded_store"] and not store["unguarded_load"]
