"""kda_prefill: Kimi Delta Attention over a sequence of T tokens, from an initial state to the final state.

Per sequence b and head h, the decode step (``cake_core.problems.common.kda``) applied to tokens t = 0 .. T-1 in
order, starting from the state s[b, h] (f32, DK x DV): o[b, t, h] is the output after token t, and the final
state is written over s. Inputs are laid out as flash-linear-attention takes them: q, k, g (B, T, H, DK), v
(B, T, H, DV), beta (B, T, H); q carries the attention scale. Products are accumulated in fp32 (or wider).
Fixed-length sequences (sequences of different lengths packed into one token axis are a problem of their own).

The naive seed (kernels/kda_prefill.cake) is the decode step in a loop over tokens. kernels/kda_prefill_chunked.cake
is the same recurrence in the chunked form fast kernels use (chunks of 64 tokens: the decayed intra-chunk products
under iota masks, the UT transform (I + L)^-1 as a product of log2(64) Neumann factors in f32 mma, the chunk's output,
the state carried chunk to chunk): a kernel file beside the seed (``Problem.kernel_files``), not the seed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems import BenchTarget, Problem, data, output, state
from cake_core.problems.base import RowOracle, Shape, array_module, as_sampler, bf16_round
from cake_core.problems.common.kda import betas, gates, step, unit_rows

from .peers import PEERS


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    B, T, H, DK, DV = s["B"], s["T"], s["H"], s["DK"], s["DV"]
    return {"q": unit_rows(r, (B, T, H, DK)), "k": unit_rows(r, (B, T, H, DK)),
            "v": bf16_round(r.normal((B, T, H, DV))), "g": gates(r, (B, T, H, DK)), "beta": betas(r, (B, T, H)),
            "s": r.normal((B, H, DK, DV))}


def _scan(q, k, v, g, beta, s) -> dict[str, Any]:
    """The steps in token order over (B', T, H, *) inputs and a (B', H, DK, DV) state (B' sequences)."""
    xp = array_module(q, s)
    outs, st = [], s
    for t in range(q.shape[1]):
        st, o = step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], st)
        outs.append(o)
    return {"s": st.astype(xp.float64), "o": xp.stack(outs, axis=1)}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return _scan(x["q"], x["k"], x["v"], x["g"], x["beta"], x["s"])


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    xp = array_module(x["q"])
    got = _scan(*(x[n][xp.asarray(rows)] for n in ("q", "k", "v", "g", "beta", "s")))
    return {n: a.reshape(len(rows), -1) for n, a in got.items()}


def _take(out: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {n: a[array_module(a).asarray(rows)].reshape(len(rows), -1) for n, a in out.items()}


def _rows_of_q(x: dict[str, Any], flat: np.ndarray) -> np.ndarray:
    # a row is a sequence: element b * (T * H * DK) + ... of q feeds sequence b's outputs only
    return np.unique(np.asarray(flat) // (x["q"].shape[1] * x["q"].shape[2] * x["q"].shape[3]))


PROBLEM = Problem(
    name="kda_prefill",
    description="Kimi Delta Attention over T tokens per (sequence, head), in token order: S = diag(exp(g_t)) S; "
                "S = S + beta_t k_t (v_t - S^T k_t)^T; o[b,t,h] = S^T q_t (f32); the final state written over "
                "the f32 initial state s[B,H,DK,DV]; q, k (unit rows), v bf16 [B,T,H,*], g and beta f32; products "
                "accumulated in fp32 (or wider)",
    dims=("B", "T", "H", "DK", "DV"),
    tensors=(data("q", "bf16"), data("k", "bf16"), data("v", "bf16"), data("g", "f32"), data("beta", "f32"),
             state("s", "f32"), output("o", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # each step's fp32 error is the decode step's (~1e-6 of the scale, 7.6e-6 worst order); the state is a
    # contraction, so earlier steps' errors decay rather than add up. Every mistake worth catching is far over
    # 5e-5: a dropped decay or beta (~0.1 and more), a skipped last token, the initial state ignored
    rtol=5e-5,
    flops=lambda s: 7.0 * s["B"] * s["T"] * s["H"] * s["DK"] * s["DV"],
    bytes=lambda s: s["B"] * s["H"] * (8.0 * s["DK"] * s["DV"] + s["T"] * (
        2 * 2.0 * s["DK"] + 2.0 * s["DV"] + 4.0 * s["DK"] + 4.0 + 4.0 * s["DV"])),
    seed_file="kda_prefill.cake",
    shape_sets=("kda_prefill_small", "kda_prefill_llm"),
    rows=RowOracle(count=lambda s: s["B"], oracle=_oracle_rows, take=_take, rows_of_perturbed=_rows_of_q),
    peers=PEERS,
    bench=BenchTarget("kda_prefill_llm", ("fla.chunk_kda",), 1.0),
)
