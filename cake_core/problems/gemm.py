"""gemm_bf16: C[M, N] = A[M, K] @ B[K, N], bf16 operands, fp32 accumulate and output."""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems.base import Problem, RowOracle, Shape, array_module, as_sampler, bf16_round


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    a = bf16_round(r.normal((s["M"], s["K"])))
    b = bf16_round(r.normal((s["K"], s["N"])))
    return {"a": a, "b": b}


def matmul_f64(a: Any, b: Any) -> Any:
    """a @ b in fp64 (numpy's BLAS on a CPU, cuBLAS's DGEMM on a GPU)."""
    xp = array_module(a, b)
    return a.astype(xp.float64) @ b.astype(xp.float64)


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return {"c": matmul_f64(x["a"], x["b"])}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"c": matmul_f64(x["a"][array_module(x["a"]).asarray(rows)], x["b"])}


# a row is a row of C (of A); shared with tinygemm, which has the same operands
GEMM_ROWS = RowOracle(
    count=lambda s: s["M"],
    oracle=_oracle_rows,
    take=lambda out, rows: {"c": out["c"][array_module(out["c"]).asarray(rows)]},
    rows_of_input0=lambda x, flat: np.unique(np.asarray(flat) // x["a"].shape[1]),
)

GEMM_BF16 = Problem(
    name="gemm_bf16",
    description="C = A @ B, bf16 inputs (row-major A[M,K], B[K,N]), accumulated in fp32 (or wider), fp32 output",
    dims=("M", "N", "K"),
    inputs=("a", "b"),
    outputs=("c",),
    make_inputs=_inputs,
    oracle=_oracle,
    rtol=2e-3,   # fp32 accumulation of exact bf16 products: far under this; a wrong index is far over
    flops=lambda s: 2.0 * s["M"] * s["N"] * s["K"],
    bytes=lambda s: 2.0 * (s["M"] * s["K"] + s["K"] * s["N"]) + 4.0 * s["M"] * s["N"],
    seed_file="gemm_bf16.cake",
    shape_sets=("gemm_small", "gemm_square", "gemm_aligned"),
    # warp-specialized TMA + wgmma, fastest first on the H200 (bench/results/corpus-vs-peers-2026-11-29b.md):
    # 128x256 tiles (0.93x cuBLAS at 4096^3, 0.96x at 8192^3), the same persistent (grid = min(tiles,
    # num_sms); within 1-3 % of it), 128x64 tiles (fastest at 1024^3)
    best_files=("gemm_bf16_ws_n256.cake", "gemm_bf16_persistent.cake", "gemm_bf16_ws.cake"),
    rows=GEMM_ROWS,
    # a split-K kernel adds its CTAs' partial sums into C with atomics: the harness zeroes C before each
    # launch of such a program (and times the zeroing with it); every other program gets C poisoned
    zeroed_outputs=("c",),
)
