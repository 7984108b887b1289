"""tinygemm: decode-style C[M, N] = A[M, K] @ B[K, N] with few rows (M ≤ 64), bf16 operands.

A[M, K] holds the activations of a few tokens, B[K, N] the weights (row-major, K-major rows as
in the general GEMM problem); C is fp32 (accumulate and output), as there, so the two problems take
the same kernels and the same oracle (``common.matmul``). An fp32 C costs 4·M·N bytes, under 1 % of the weight read at
every headline cell (M ≤ 64, N = K ≥ 4096), so the choice does not move the floor.

The weight read dominates: K·N·2 bytes (32 MiB at N = K = 4096, 128 MiB at 8192) against
2·M·N·K flops (≤ 8.6 GFLOP), about 4 flop per byte at M = 1 and 64 at M = 64, far under the
H200's ~190 flop/byte ridge (790 TFLOP/s / 4.22 TB/s): the floor is bytes / 4.22 TB/s, 7.9 µs
at 4096 and 31.8 µs at 8192.

C is zeroed by the harness before every launch (``zeroed_outputs``, the zeroing timed with the
kernel), so a kernel may split K over CTAs and add its partial products with atomics. The gate
stays strict: inputs are random, so an all-zero C (a kernel that writes nothing) is far outside
the tolerance, as is any tile left unwritten.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cake_core.problems.base import BenchTarget, Problem, Shape, as_sampler, bf16_round, data, output
from cake_core.problems.common import matmul


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    a = bf16_round(r.normal((s["M"], s["K"])))
    # weights at a typical init scale (std 1/sqrt(K)); bf16 keeps the relative precision
    b = bf16_round(r.normal((s["K"], s["N"])) / np.float32(np.sqrt(s["K"])))
    return {"a": a, "b": b}


PROBLEM = Problem(
    name="tinygemm",
    description="C = A @ B for decode (M ≤ 64 rows of activations, B[K,N] weights), bf16 inputs "
                "(row-major A[M,K], B[K,N]), accumulated in fp32 (or wider), fp32 output; bound by the weight read",
    dims=("M", "N", "K"),
    tensors=(data("a", "bf16"), data("b", "bf16"), output("c", "f32")),
    make_inputs=_inputs,
    oracle=matmul.oracle,
    rtol=2e-3,   # fp32 accumulation of exact bf16 products: ~1e-6; a dropped K-tile or wrong index is ≥ 1e-2
    flops=matmul.flops,
    bytes=matmul.nbytes,
    seed_file="tinygemm.cake",
    # tinygemm_aligned: small shapes with N and K multiples of 8 (TMA's 16-byte row strides)
    shape_sets=("tinygemm_small", "tinygemm_aligned", "tinygemm_decode", "gemm_decode_portfolio"),
    zeroed_outputs=("c",),
    # split-K TMA + wgmma: 64 x 128 tiles (A's rows past M zero-filled by TMA), an 8-stage ring (one
    # CTA per SM), K split so that about 132 CTAs stream the weights, partials added with red.v4.f32; and
    # split-K over clusters of 2 reduced through distributed smem (no zeroing launch), 128-column tiles:
    # 128 CTAs in one wave at N = 8192; no split at all, 64-column tiles over the whole of K, stored
    # (no zeroing launch), with only the first 8 or 16 rows of A loaded at small M (tma_load rows=):
    # fastest at N = K = 8192; and clusters of 2 with 64-column tiles and the same rows= branches: one wave
    # of 128 CTAs at N = 4096, fastest there at every M
    best_files=("tinygemm_splitk.cake", "tinygemm_cluster2.cake", "tinygemm_rows.cake", "tinygemm_cluster2_rows.cake"),
    rows=matmul.ROWS,
    peers=matmul.PEERS,
    bench=BenchTarget("tinygemm_decode", ("torch.mm_f32",), 1.3, floor_slack=1.15, floor_bytes=matmul.weight_bytes),
    root=Path(__file__).resolve().parent,
)
