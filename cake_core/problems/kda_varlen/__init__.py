"""kda_varlen: Kimi Delta Attention prefill over N sequences of different lengths packed into T tokens.

The tokens of sequence n are t = cu_seqlens[n] .. cu_seqlens[n+1] - 1 of the packed inputs (cu_seqlens: (N + 1,)
i32, 0 first and T last), laid out as flash-linear-attention's varlen path takes them: q, k, g (T, H, DK), v
(T, H, DV), beta (T, H). Per sequence n and head h, the decode step (``cake_core.problems.common.kda``) runs over
the sequence's tokens in order from the state s[n, h] (f32, DK x DV); o[t, h] is the output after token t and the
final state is written over s. q carries the attention scale; products are accumulated in fp32 (or wider).

The lengths are drawn with the inputs: N - 1 distinct cut points of 1 .. T - 1, uniformly (every sequence at
least one token; a draw of a large T mixes short and long sequences, as a serving batch does).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems import BenchTarget, Problem, data, index, output, state
from cake_core.problems.base import RowOracle, Shape, array_module, as_sampler, bf16_round, to_host
from cake_core.problems.common.kda import betas, gates, step, unit_rows

from .peers import PEERS


def seqlens_offsets(r: Any, N: int, T: int) -> Any:
    """cu_seqlens (N + 1,) i32 of N sequences of at least one token each, T in all."""
    xp = r.xp
    cuts = xp.sort(xp.argsort(r.uniform((T - 1,)))[:N - 1] + 1) if N > 1 else xp.zeros((0,), xp.int64)
    return xp.concatenate([xp.zeros(1, xp.int64), cuts, xp.full(1, T, xp.int64)]).astype(xp.int32)


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    N, T, H, DK, DV = s["N"], s["T"], s["H"], s["DK"], s["DV"]
    return {"q": unit_rows(r, (T, H, DK)), "k": unit_rows(r, (T, H, DK)), "v": bf16_round(r.normal((T, H, DV))),
            "g": gates(r, (T, H, DK)), "beta": betas(r, (T, H)), "cu_seqlens": seqlens_offsets(r, N, T),
            "s": r.normal((N, H, DK, DV))}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    """The steps of every sequence, token position by token position: step t advances the sequences longer than
    t together (one batched fp64 step per position, not per token)."""
    xp = array_module(x["q"], x["s"])
    cu = to_host(x["cu_seqlens"]).astype(np.int64)
    starts, lengths = cu[:-1], np.diff(cu)
    st = x["s"].astype(xp.float64)
    o = xp.zeros(x["v"].shape, xp.float64)
    for t in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > t)
        tok, seq = xp.asarray(starts[live] + t), xp.asarray(live)
        new, o[tok] = step(x["q"][tok], x["k"][tok], x["v"][tok], x["g"][tok], x["beta"][tok], st[seq])
        st[seq] = new
    return {"s": st, "o": o}


_HEAD_FIRST = {"o": lambda a, s: a.transpose(1, 0, 2), "s": lambda a, s: a.transpose(1, 0, 2, 3)}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The oracle of the heads ``rows`` alone (a row is a head: every token and sequence of it), head first."""
    xp = array_module(x["q"])
    h = xp.asarray(rows)
    got = _oracle({**{n: x[n][:, h] for n in ("q", "k", "v", "g", "beta", "s")}, "cu_seqlens": x["cu_seqlens"]})
    return {n: f(got[n], None) for n, f in _HEAD_FIRST.items()}


PROBLEM = Problem(
    name="kda_varlen",
    description="Kimi Delta Attention prefill over N sequences packed into T tokens (sequence n: tokens "
                "cu_seqlens[n] .. cu_seqlens[n+1]-1, cu_seqlens (N+1,) i32), per (sequence, head) in token order: "
                "S = diag(exp(g_t)) S; S = S + beta_t k_t (v_t - S^T k_t)^T; o[t,h] = S^T q_t (f32); the final "
                "state written over the f32 initial state s[N,H,DK,DV]; q, k (unit rows), v bf16 [T,H,*], g and "
                "beta f32; products accumulated in fp32 (or wider)",
    dims=("N", "T", "H", "DK", "DV"),
    tensors=(data("q", "bf16"), data("k", "bf16"), data("v", "bf16"), data("g", "f32"), data("beta", "f32"),
             index("cu_seqlens", "i32"), state("s", "f32"), output("o", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # the fixed-length prefill's tolerance: each step's fp32 error is the decode step's, the state a contraction
    rtol=5e-5,
    flops=lambda s: 7.0 * s["T"] * s["H"] * s["DK"] * s["DV"],
    bytes=lambda s: s["N"] * s["H"] * 8.0 * s["DK"] * s["DV"] + s["T"] * s["H"] * (
        2 * 2.0 * s["DK"] + 2.0 * s["DV"] + 4.0 * s["DK"] + 4.0 + 4.0 * s["DV"]) + 4.0 * (s["N"] + 1),
    seed_file="kda_varlen.cake",
    shape_sets=("kda_varlen_small", "kda_varlen_llm"),
    shape_rule=lambda s: "" if s["N"] <= s["T"] else f"N = {s['N']} sequences > T = {s['T']} tokens: a sequence "
                                                     "has at least one token",
    # a row is a head (its sequences are independent of the other heads'): a large shape is checked on a few
    rows=RowOracle(count=lambda s: s["H"], oracle=_oracle_rows, views=_HEAD_FIRST,
                   rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["q"].shape[2] % x["q"].shape[1])),
    peers=PEERS,
    bench=BenchTarget("kda_varlen_llm", ("fla.chunk_kda",), 1.5),
)
