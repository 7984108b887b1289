"""gemm_bf16: C[M, N] = A[M, K] @ B[K, N], bf16 operands, fp32 accumulate and output."""
from __future__ import annotations

import numpy as np

from cake_core.ir.numeric import bf16_round
from cake_core.problems.base import Problem, RowOracle, Shape


def _inputs(s: Shape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    a = bf16_round(rng.standard_normal((s["M"], s["K"]), dtype=np.float32))
    b = bf16_round(rng.standard_normal((s["K"], s["N"]), dtype=np.float32))
    return {"a": a, "b": b}


def _oracle(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"c": x["a"].astype(np.float64) @ x["b"].astype(np.float64)}


def _oracle_rows(x: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {"c": x["a"][rows].astype(np.float64) @ x["b"].astype(np.float64)}


# a row is a row of C (of A); shared with tinygemm, which has the same operands
GEMM_ROWS = RowOracle(
    count=lambda s: s["M"],
    oracle=_oracle_rows,
    take=lambda out, rows: {"c": np.asarray(out["c"])[rows]},
    rows_of_input0=lambda x, flat: np.unique(np.asarray(flat) // x["a"].shape[1]),
)

GEMM_BF16 = Problem(
    name="gemm_bf16",
    description="C = A @ B, bf16 inputs (row-major A[M,K], B[K,N]), fp32 accumulate and output",
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
)
