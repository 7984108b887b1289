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


LAYOUT_CHECK = r"""
#include "cake.cuh"
#include <cstdio>
template <int KMAX> __host__ int slot(int row, int p) { return PLAIN ? p : cake::list_slot<KMAX>(row, p); }
template <int KMAX> int conflicts() {
    int bad = 0;
    for (int row = 0; row < 16; ++row) {                        // each row's pairs: a bijection of [0, KMAX)
        int seen[128] = {0};
        for (int p = 0; p < KMAX; ++p) {
            int s = slot<KMAX>(row, p);
            if (s < 0 || s >= KMAX || seen[s]++) return -1;
        }
    }
    for (int i = 0; i <= KMAX / 4; ++i) {                       // the rank count's reads (4i + lane), the threshold
        int banks[32] = {0};
        for (int r = 0; r < 8; ++r)                             // the 8 rows of a warp's quads
            for (int l = 0; l < 4; ++l) {
                int p = i < KMAX / 4 ? 4 * i + l : KMAX - 1;
                if (i < KMAX / 4 || l == 0) ++banks[(r * KMAX + slot<KMAX>(r, p)) % 32];
            }
        for (int b = 0; b < 32; ++b) bad += banks[b] > 1;
    }
    return bad;
}
int main() { printf("%d %d\n", conflicts<64>(), conflicts<128>()); return 0; }
"""


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_the_smem_lists_are_laid_out_without_bank_conflicts_between_the_quads_of_a_warp(tmp_path):
    """cake::list_slot, compiled by nvcc and run on the host: a bijection of each row's KMAX pairs under which the
    8 quads of a warp (8 consecutive rows, 4 consecutive pairs a quad) read 32 distinct banks, and the 8 rows'
    thresholds 8; the plain row-major layout puts the 8 quads on the same 4 banks."""
    import subprocess
    out = {}
    for plain in (0, 1):
        src = tmp_path / f"layout{plain}.cu"
        src.write_text(LAYOUT_CHECK)
        exe = tmp_path / f"layout{plain}"
        subprocess.run([compile_mod.nvcc_path(), "-std=c++17", "-arch=sm_90a", "-I", str(compile_mod.HEADER_DIR),
                        f"-DPLAIN={plain}", str(src), "-o", str(exe)], check=True, capture_output=True, timeout=300)
        out[plain] = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout.split()
    assert out[0] == ["0", "0"], out
    assert all(int(x) > 0 for x in out[1]), out
