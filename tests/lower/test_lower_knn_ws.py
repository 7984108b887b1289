"""Lowering knn_topk_ws: topk_bias on the accumulator fragment with its quad-merged store of the first k
columns, sqnorm_rows in the producer; compiled for sm_90a with nvcc (no GPU): no serialised wgmma, and the
register lists stay in registers (no spills, no stack, no local memory)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.lower import compile as compile_mod
from cake_core.outcome import Outcome
from cake_core.problems import corpus_file

SEED = corpus_file("knn_topk_ws.cake").read_text()


def _lower(text: str = SEED):
    return lower(parse_program(text, "knn_topk_ws.cake"), "knn_topk_ws.cake")


def test_knn_ws_lowers_with_the_fused_topk_and_in_kernel_norms():
    r = _lower()
    assert r.outcome is Outcome.OK, r.diagnostics
    lk = r.value
    assert [(m.gmem, m.box, m.swizzle) for m in lk.tensor_maps] == [("q", (128, 64), 128), ("db", (128, 64), 128)]
    src = lk.source
    assert src.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 2
    assert src.count("p, 1, 1, 0, 0;") == 2 and "p, 1, 1, 0, 1;" not in src
    assert "float top_v[2][16];" in src and "int top_i[2][16];" in src
    assert src.count("cake::topk_bias_rmem_wgmma_acc<128, 16>(top_v, top_i, acc") == 1
    assert "cake::store_gmem_topk<1, 16>(" in src and "(int)(((k) - (0 * KMAX)))" in src      # the first k columns
    assert src.count("cake::sqnorm_rows_smem<128, 64, 128, false, 1>(") == 1
    assert src.count("cake::sqnorm_rows_smem<128, 64, 128, true, 1>(") == 1
    assert lk.smem_bytes == 199296        # q 2 x 16 KiB, db 10 x 16 KiB, norms 5 x 512 B, mbarriers


def test_lists_of_the_wrong_shape_are_refused():
    r = _lower(SEED.replace("top_v = rmem(f32, (BM, KMAX), fill=inf)", "top_v = rmem(f32, (BM // 2, KMAX), fill=inf)"))
    assert any(d.rule == "lower.shape_mismatch" and d.line == 27 for d in r.diagnostics), r.diagnostics


def test_sqnorm_rows_of_a_two_span_row_is_refused_at_its_line():
    r = _lower(SEED.replace("db_s = smem(bf16, (BN, BK), stages=10", "db_s = smem(bf16, (BN, 2 * BK), stages=10"))
    assert r.outcome is Outcome.COMPILE_FAILED
    assert any(d.rule == "lower.unsupported_layout" and d.line == 17 for d in r.diagnostics), r.diagnostics


@pytest.mark.skipif(compile_mod.nvcc_path() is None, reason="nvcc not installed")
def test_knn_ws_compiles_for_sm_90a_with_registers_only_lists(tmp_path):
    r = compile_kernel(_lower().value, arch="sm_90a", cache_dir=tmp_path)
    assert r.outcome is Outcome.OK, [d.message for d in r.diagnostics]
    log = r.artifacts["nvcc.log"]
    assert "for 'sm_90a'" in log
    # setmaxnreg honoured; wgmma not serialised (C7514: the epilogue reads an accumulator in flight)
    for code in ("C7508", "C7510", "C7514", "C7515"):
        assert code not in log, log
    res = r.value.resources
    assert res.spill_bytes == 0 and res.stack_bytes == 0, log
    assert not re.search(r"[1-9]\d* bytes lmem", log), log
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(r.value.cubin_path)], capture_output=True, text=True).stdout
        assert "HGMMA" in sass and "UTMALDG" in sass and "SHFL.BFLY" in sass
        assert "LDL" not in sass and "STL" not in sass          # the sorted lists never touch local memory
