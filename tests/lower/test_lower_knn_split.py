"""Lowering knn_topk_split: __cluster_dims__(1, 4, 1), the quad-merged lists published to smem, the
cross-CTA merge through distributed shared memory between two cluster barriers; compiled for sm_90a with
nvcc (no GPU): no spills, no stack, no local memory, within the smem of one CTA per SM. knn_topk_split_pp
(two consumer roles taking turns, two m64n64 accumulators each) lowers to one list pair per role, each
published to its own tiles and merged by its own 64-row cluster merge."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file

SEED = corpus_file("knn_topk_split.cake").read_text()
PP = corpus_file("knn_topk_split_pp.cake").read_text()


def _lower(text: str = SEED):
    return lower(parse_program(text, "knn_topk_split.cake"), "knn_topk_split.cake")


def test_knn_split_lowers_with_the_cluster_merge_between_two_cluster_barriers():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert "__cluster_dims__(1, 4, 1)" in src
    assert "cake::store_smem_topk<16>(pub_v, pub_i, top_v, top_i, (int)threadIdx.x - 128);" in src
    merge = src.index("cake::topk_cluster_merge_gmem<128, 16, 4, 1>(idx + ")
    assert src.rindex("cake::cluster_sync();", 0, merge) > src.index("store_smem_topk")
    assert src.index("cake::cluster_sync();", merge) > merge
    assert "(int)(((k) - (0 * KMAX)))" in src[merge:]                      # the first k columns
    assert src.count("cake::topk_bias_rmem_wgmma_acc<128, 16>(") == 1
    assert r.value.smem_bytes == 215680      # knn_topk_ws's 199296 B + pub_v and pub_i, 8 KiB each


def test_roles_go_back_to_the_entry_cap_before_the_merge_every_thread_runs():
    # the merge after the roles runs on all 384 threads and is compiled for the 168-register entry cap: the
    # producer (40) and the consumers (232) return to it at the end of their branches, before the barrier
    src = _lower().value.source
    producer, consumer = src.index("// role producer"), src.index("// role consumer")
    merge = src.index("cake::topk_cluster_merge_gmem<")
    assert producer < src.index("cake::setmaxnreg_inc<168>();", producer) < consumer
    assert consumer < src.index("cake::setmaxnreg_dec<168>();", consumer) < src.index("cake::cluster_sync();") < merge


def test_roles_with_nothing_after_them_keep_their_registers_to_the_end():
    src = _lower(corpus_file("knn_topk_ws.cake").read_text()).value.source
    assert "setmaxnreg_dec<40>" in src and "setmaxnreg_inc<232>" in src and "<168>" not in src


def test_a_merge_inside_the_role_is_refused():
    text = SEED.replace("        topk_publish(pub_v, pub_i, top_v, top_i)\n",
                        "        topk_publish(pub_v, pub_i, top_v, top_i)\n"
                        "        topk_cluster_merge(idx[tile(bid.x, BM), tile(0, KMAX)], pub_v, pub_i)\n")
    r = _lower(text)
    assert any(d.rule == "lower.unsupported_in_role" for d in r.diagnostics), r.diagnostics


def test_knn_split_pp_lowers_one_list_pair_per_role_and_two_cluster_merges():
    r = _lower(PP)
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert "__cluster_dims__(1, 4, 1)" in src and src.count("cake::setmaxnreg_inc<232>();") == 2
    assert src.count("cake::topk_bias_rmem_wgmma_acc<64, 16>(") == 4     # 2 roles x 2 accumulators
    assert "store_smem_topk<16>(pub_v0, pub_i0, top_v0, top_i0, (int)threadIdx.x - 128);" in src
    assert "store_smem_topk<16>(pub_v1, pub_i1, top_v1, top_i1, (int)threadIdx.x - 256);" in src
    first = src.index("cake::topk_cluster_merge_gmem<64, 16, 4, 1>(")
    second = src.index("cake::topk_cluster_merge_gmem<64, 16, 4, 1>(", first + 1)
    assert src.rindex("cake::cluster_sync();", 0, first) > src.rindex("store_smem_topk", 0, first)
    assert src.index("cake::cluster_sync();", second) > second
    assert src.count("cake::wgmma_wait<2>();") == 2 and src.count("cake::wgmma_wait<0>();") == 2
    # q 32 KiB + 16 (64, 64) db halves (4 pair slots) 128 KiB + 8 norm slots + 4 published tiles 16 KiB + barriers
    assert r.value.smem_bytes == 182400


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("seed", ["knn_topk_split", "knn_topk_split_pp"])
def test_knn_split_compiles_for_sm_90a_without_local_memory(seed, tmp_path):
    r = compile_kernel(_lower(corpus_file(f"{seed}.cake").read_text()).value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log
    assert not re.search(r"C75\d\d", log), log
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0, log
    assert not re.search(r"[1-9]\d* bytes lmem", log), log
    assert res.smem_bytes <= 232448        # the H200's opt-in smem per block: one CTA per SM


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_cluster_merge_maps_every_element_it_reads(tmp_path):
    # after a list's first pop, a read offset from the row's mapa result returned the next element of the
    # index list on the H200; each ld.shared::cluster of the merge takes an address straight from a mapa
    from ptx import ptx_of
    ptx = ptx_of(_lower().value.source, tmp_path)
    merge = ptx[ptx.index("barrier.cluster.wait"):ptx.rindex("barrier.cluster.arrive")]
    loads = re.findall(r"ld\.shared::cluster\.\w+\s+%\w+, \[(%r\d+)\];", merge)
    mapped = set(re.findall(r"mapa\.shared::cluster\.u32\s+(%r\d+),", merge))
    assert len(loads) >= 8 and set(loads) <= mapped, (loads, mapped)


def test_the_ablation_variants_lower_and_each_removes_what_it_names():
    # bench/knn_ablation.py times the pp3 seed with parts dropped: a needle that stops matching would time
    # the unchanged kernel under another name
    import importlib.util
    spec = importlib.util.spec_from_file_location("knn_ablation", Path(__file__).resolve().parents[2] / "bench" / "knn_ablation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vs = mod.variants(corpus_file("knn_topk_split_pp3.cake").read_text())
    counts = {n: (t.count("topk_bias("), t.count("sqnorm_rows(")) for n, t in vs.items()}
    assert counts == {"as_is": (4, 4), "regs56": (4, 4), "no_sqnorm": (4, 0), "half_topk": (2, 4),
                      "half_both": (2, 0), "S5": (4, 4)}
    assert len(set(vs.values())) == len(vs)
    for n, t in vs.items():
        assert _lower(t).outcome is Outcome.OK, n


@pytest.mark.parametrize("split", [2, 3])
def test_the_pp_split_variants_are_the_pp_program_with_another_cluster_size(split):
    # the GPU tests build SPLIT = 3 from knn_topk_split_pp.cake: the registered file must stay that program
    pp = PP.replace('"SPLIT": 4}', f'"SPLIT": {split}}}').replace("def knn_topk_split_pp(", f"def knn_topk_split_pp{split}(")
    assert corpus_file(f"knn_topk_split_pp{split}.cake").read_text() == pp
