"""rmsnorm: y[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + eps) * w, eps = 1e-6.

x[M, N] bf16 activations and w[N] bf16 weights give y[M, N] f32; the sum of squares of a row is
accumulated in fp32 (or wider). An example of a problem that lives outside Cake: pass its parent folder
with ``--problem-path examples/problems`` (docs/new-problem.md walks through it).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems import BenchTarget, Problem, data, output
from cake_core.problems.base import RowOracle, Shape, array_module, as_sampler, bf16_round

from .peers import PEERS

EPS = 1e-6


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    M, N = s["M"], s["N"]
    # rows of activations whose RMS spans 2^-6 .. 2^4 (one draw per row): a kernel that skips the
    # normalisation, or drops eps (worth ~2e-3 of the output on the quietest rows), is far off
    scale = r.xp.exp2(r.uniform((M, 1)) * 10.0 - 6.0).astype(r.xp.float32)
    x = bf16_round(r.normal((M, N)) * scale)
    # trained RMSNorm gains sit near 1; 0.1 of spread makes a kernel that forgets w wrong by ~1e-1
    w = bf16_round(1.0 + 0.1 * r.normal((N,)))
    return {"x": x, "w": w}


def _rmsnorm_f64(x: Any, w: Any) -> Any:
    xp = array_module(x, w)
    x64 = x.astype(xp.float64)
    inv = 1.0 / xp.sqrt(xp.mean(x64 * x64, axis=1, keepdims=True) + EPS)
    return x64 * inv * w.astype(xp.float64)[None, :]


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return {"y": _rmsnorm_f64(x["x"], x["w"])}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"y": _rmsnorm_f64(x["x"][array_module(x["x"]).asarray(rows)], x["w"])}


def _take(out: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"y": out["y"][array_module(out["y"]).asarray(rows)]}


def _rows_of_x(x: dict[str, Any], flat: np.ndarray) -> np.ndarray:
    # element m * N + n of x feeds row m of y alone
    return np.unique(np.asarray(flat) // x["x"].shape[1])


PROBLEM = Problem(
    name="rmsnorm",
    description="y[m, :] = x[m, :] * rsqrt(mean(x[m, :]^2) + 1e-6) * w; x[M,N] and w[N] bf16, the sum of squares "
                "accumulated in fp32 (or wider), y[M,N] f32",
    dims=("M", "N"),
    tensors=(data("x", "bf16"), data("w", "bf16"), output("y", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # the squares of bf16 values are exact in fp32, so the error is the fp32 sum's: 1.3e-7 of the sum pairwise,
    # 9e-6 for one running sum over N = 8192 (measured, 64 rows), (N - 1) * 2^-24 = 4.9e-4 in the worst order
    # bound, and rsqrt halves it; rsqrt.approx and the two products add a few ulp. A kernel that drops w is off
    # by ~1e-1, one that skips a tail tile's squares by ~1e-2, one that drops eps by ~1e-3 (the quietest rows)
    rtol=1e-4,
    flops=lambda s: 4.0 * s["M"] * s["N"],        # square, add, and two products per element
    bytes=lambda s: 2.0 * s["M"] * s["N"] + 2.0 * s["N"] + 4.0 * s["M"] * s["N"],
    seed_file="rmsnorm.cake",
    shape_sets=("rmsnorm_small", "rmsnorm_llm"),
    rows=RowOracle(
        count=lambda s: s["M"],
        oracle=_oracle_rows,
        take=_take,
        rows_of_perturbed=_rows_of_x,
    ),
    peers=PEERS,
    bench=BenchTarget("rmsnorm_llm", ("torch.rms_norm",), 1.0, ("M=2048,N=4096", "M=8192,N=8192")),
)
