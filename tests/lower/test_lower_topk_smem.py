"""Lowering topk_bias over smem lists (KMAX up to 128) onto cake::topk_bias_smem_wgmma_acc / topk_shift_smem /
copy_smem_topk, and nvcc for sm_90a (no spills, no stack). The rules and the interpreter are
tests/ir/test_topk_smem.py; the GPU gate of the four kernels is tests/runtime/test_knn_smem_lists.py."""
from __future__ import annotations

import re

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file

K64 = corpus_file("knn_search_split_k64.cake").read_text()


def test_smem_lists_lower_onto_the_smem_helpers():
    r = lower(parse_program(K64, "k64.cake"), "k64.cake")
    assert r.outcome is Outcome.OK, r.diagnostics
    src = r.value.source
    assert src.count("cake::topk_bias_smem_wgmma_acc<128, 64>(top_v, top_i, acc, ") == 1
    assert "cake::topk_shift_smem<64>(top_v, qn_s, (int)threadIdx.x - 128);" in src
    assert "cake::copy_smem_topk<64>(pub_v, pub_i, top_v, top_i, (int)threadIdx.x - 128);" in src
    assert "topk_bias_rmem_wgmma_acc" not in src and "store_smem_topk" not in src
    # the fills are behind the role's barrier before the loop that runs topk_bias
    bar = src.index('"bar.sync %0, %1;" :: "n"(2), "n"(128)')
    assert src.index("top_i[cake_e] = ") < bar < src.index("cake::topk_bias_smem_wgmma_acc")
    assert src.index("cake::topk_cluster_merge_gmem<64, 64, 8, 1>(idx + ") > src.index("copy_smem_topk")


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
@pytest.mark.parametrize("file", ["knn_search_split_k64.cake", "knn_topk_split_k128.cake"])
def test_the_smem_list_kernels_compile_for_sm_90a_without_local_memory(file, tmp_path):
    lk = lower(parse_program(corpus_file(file).read_text(), file), file).value
    r = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0, log
    assert not re.search(r"[1-9]\d* bytes lmem", log), log
    assert res.smem_bytes <= 232448        # the H100's and H200's opt-in smem per block
