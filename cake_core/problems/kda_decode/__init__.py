"""kda_decode: one decode step of Kimi Delta Attention, the state updated in place.

Per sequence b and head h, with the state S = s[b, h] (DK x DV, f32), the key k, query q (DK, bf16), the value
v (DV, bf16), the channel-wise log-decay g (DK, f32, g <= 0) and the write strength beta (in (0, 1)):

    S' = diag(exp(g)) S                      the decay, per key channel
    S  = S' + beta * k (v - S'^T k)^T        the delta rule: S = (I - beta k k^T) S' + beta k v^T
    o  = S^T q                               (q carries the attention scale)

``s`` is a state tensor: the kernel reads it and writes the new state over it. Products are accumulated in fp32
(or wider). The keys and queries are unit vectors per head, as the model's L2 normalisation leaves them, so the
update is a contraction and the state stays bounded over steps.
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
    B, H, DK, DV = s["B"], s["H"], s["DK"], s["DV"]
    return {"q": unit_rows(r, (B, H, DK)), "k": unit_rows(r, (B, H, DK)), "v": bf16_round(r.normal((B, H, DV))),
            "g": gates(r, (B, H, DK)), "beta": betas(r, (B, H)), "s": r.normal((B, H, DK, DV))}


def _step(q, k, v, g, beta, s) -> dict[str, Any]:
    s2, o = step(q, k, v, g, beta, s)
    return {"s": s2, "o": o}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return _step(x["q"], x["k"], x["v"], x["g"], x["beta"], x["s"])


def _flat(a: Any, rows: np.ndarray) -> Any:
    """Rows (b * H + h) of an array whose first two axes are (B, H)."""
    xp = array_module(a)
    return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])[xp.asarray(rows)]


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    got = _step(*(_flat(x[n], rows) for n in ("q", "k", "v", "g", "beta", "s")))
    return {"s": got["s"].reshape(len(rows), -1), "o": got["o"]}


def _take(out: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    return {"s": _flat(out["s"], rows).reshape(len(rows), -1), "o": _flat(out["o"], rows)}


def _rows_of_q(x: dict[str, Any], flat: np.ndarray) -> np.ndarray:
    # element (b * H + h) * DK + i of q feeds row b * H + h of o (and not the state)
    return np.unique(np.asarray(flat) // x["q"].shape[2])


PROBLEM = Problem(
    name="kda_decode",
    description="one Kimi Delta Attention decode step per (sequence, head): S' = diag(exp(g)) S; S = S' + "
                "beta k (v - S'^T k)^T written over the f32 state s[B,H,DK,DV]; o[B,H,DV] = S^T q (f32); q, k "
                "(unit rows), v bf16, g (log-decay) and beta f32; products accumulated in fp32 (or wider)",
    dims=("B", "H", "DK", "DV"),
    tensors=(data("q", "bf16"), data("k", "bf16"), data("v", "bf16"), data("g", "f32"), data("beta", "f32"),
             state("s", "f32"), output("o", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # fp32 sums of DK = 128 products of unit-scale values: ~1e-6 of the output's scale in the worst order
    # (128 * 2^-24 = 7.6e-6 bound, ~1e-7 typical); exp in fp32 adds an ulp. Every mistake worth catching is far
    # over 2e-5: a dropped decay (up to 0.6), beta or the delta term (~0.1), a tail channel skipped (~1e-2)
    rtol=2e-5,
    flops=lambda s: 7.0 * s["B"] * s["H"] * s["DK"] * s["DV"],
    # the state read and written once, the vectors read once, o written once
    bytes=lambda s: s["B"] * s["H"] * (8.0 * s["DK"] * s["DV"] + 2 * 2.0 * s["DK"] + 2.0 * s["DV"]
                                       + 4.0 * s["DK"] + 4.0 + 4.0 * s["DV"]),
    seed_file="kda_decode.cake",
    shape_sets=("kda_decode_small", "kda_decode_llm"),
    rows=RowOracle(count=lambda s: s["B"] * s["H"], oracle=_oracle_rows, take=_take, rows_of_perturbed=_rows_of_q),
    peers=PEERS,
    bench=BenchTarget("kda_decode_llm", ("fla.fused_recurrent_kda",), 1.0),
)
