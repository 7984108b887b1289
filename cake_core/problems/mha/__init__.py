"""mha: multi-head softmax attention (each head on its own), two chained GEMMs with a row softmax between them.

Per head h, with queries q[h] (T, DH), keys k[h] and values v[h] (T, DH), all bf16:

    o[h] = softmax(q[h] k[h]^T) v[h]          (row softmax over the T keys; q carries the 1/sqrt(DH) scale)

o is f32. Products are accumulated in fp32 (or wider); the probabilities may be rounded to bf16 before the second
product, as fused attention kernels do. Non-causal, one sequence of T tokens per head.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems import BenchTarget, Problem, data, output
from cake_core.problems.base import RowOracle, Shape, array_module, as_sampler, bf16_round

from .peers import PEERS


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    H, T, DH = s["H"], s["T"], s["DH"]
    # q scaled by 1/sqrt(DH) (the attention scale it carries), times 2: a softmax that is peaked, not flat, so a
    # kernel that drops the running-max rescale or a key tile is far off
    return {"q": bf16_round(r.normal((H, T, DH)) * (2.0 / DH ** 0.5)), "k": bf16_round(r.normal((H, T, DH))),
            "v": bf16_round(r.normal((H, T, DH)))}


def attend(q: Any, k: Any, v: Any) -> Any:
    """softmax(q k^T) v in fp64 for queries q (R, DH) of one head against its keys and values (T, DH)."""
    xp = array_module(q)
    f = lambda a: a.astype(xp.float64)         # noqa: E731
    s = f(q) @ f(k).T
    p = xp.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ f(v)


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    xp = array_module(x["q"])
    return {"o": xp.stack([attend(x["q"][h], x["k"][h], x["v"][h]) for h in range(x["q"].shape[0])])}


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """Rows h * T + t: query t of head h, against every key of its head (one head's rows at a time)."""
    xp = array_module(x["q"])
    T, DH = x["q"].shape[1:]
    r = np.asarray(rows)
    out = xp.empty((len(r), DH), xp.float64)
    for h in np.unique(r // T):
        sel = np.flatnonzero(r // T == h)
        out[xp.asarray(sel)] = attend(x["q"][int(h)][xp.asarray(r[sel] % T)], x["k"][int(h)], x["v"][int(h)])
    return {"o": out}


PROBLEM = Problem(
    name="mha",
    description="softmax attention per head: o[h] (T, DH, f32) = softmax(q[h] k[h]^T) v[h], row softmax over the "
                "T keys, q, k, v bf16 (H, T, DH), q carrying the scale; products accumulated in fp32 (or wider), "
                "the probabilities may be rounded to bf16 before the second product",
    dims=("H", "T", "DH"),
    tensors=(data("q", "bf16"), data("k", "bf16"), data("v", "bf16"), output("o", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # the probabilities rounded to bf16 (2^-9 relative each) move o by ~1e-3 of its largest magnitude; a dropped
    # rescale, a key tile left out or an unnormalised row moves it by 5e-2 and more
    rtol=5e-3,
    flops=lambda s: 4.0 * s["H"] * s["T"] * s["T"] * s["DH"],
    bytes=lambda s: s["H"] * s["T"] * s["DH"] * (3 * 2.0 + 4.0),
    seed_file="mha.cake",
    # the warp-specialised reference: TMA producer, S = Q K^T and O += P V by wgmma with P as a register A
    # (GPU-checked on an H200, 2026-12-06: 0.48x / 0.45x torch sdpa at H=32,T=1024 / H=8,T=8192)
    best_files=("mha_ws.cake",),
    shape_sets=("mha_small", "mha_llm"),
    rows=RowOracle(count=lambda s: s["H"] * s["T"], oracle=_oracle_rows,
                   rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["q"].shape[2])),
    peers=PEERS,
    bench=BenchTarget("mha_llm", ("torch.sdpa",), 1.0),
)
