"""gemm_bf16: C[M, N] = A[M, K] @ B[K, N], bf16 operands, fp32 accumulate and output."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cake_core.problems.base import BenchTarget, Problem, Shape, as_sampler, bf16_round, data, output
from cake_core.problems.common import matmul


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    a = bf16_round(r.normal((s["M"], s["K"])))
    b = bf16_round(r.normal((s["K"], s["N"])))
    return {"a": a, "b": b}


PROBLEM = Problem(
    name="gemm_bf16",
    description="C = A @ B, bf16 inputs (row-major A[M,K], B[K,N]), accumulated in fp32 (or wider), fp32 output",
    dims=("M", "N", "K"),
    tensors=(data("a", "bf16"), data("b", "bf16"), output("c", "f32")),
    make_inputs=_inputs,
    oracle=matmul.oracle,
    rtol=2e-3,   # fp32 accumulation of exact bf16 products: far under this; a wrong index is far over
    flops=matmul.flops,
    bytes=matmul.nbytes,
    seed_file="gemm_bf16.cake",
    shape_sets=("gemm_small", "gemm_square", "gemm_aligned"),
    # warp-specialized TMA + wgmma, fastest first on the H200: 128x256 tiles, the same persistent
    # (grid = min(tiles, num_sms)), 128x64 tiles (fastest at 1024^3)
    best_files=("gemm_bf16_ws_n256.cake", "gemm_bf16_persistent.cake", "gemm_bf16_ws.cake"),
    rows=matmul.ROWS,
    # a split-K kernel adds its CTAs' partial sums into C with atomics: the harness zeroes C before each
    # launch of such a program (and times the zeroing with it); every other program gets C poisoned
    zeroed_outputs=("c",),
    peers=matmul.PEERS,
    # cuBLAS computing what the problem asks (fp32 C); torch.matmul's bf16 C writes half the output
    # bytes and is still shown in the full table
    bench=BenchTarget("gemm_aligned", ("torch.mm_f32",), 0.9, ("M=4096,N=4096,K=4096", "M=8192,N=8192,K=8192")),
    root=Path(__file__).resolve().parent,
)
