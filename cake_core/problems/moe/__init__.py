"""moe: a routed mixture-of-experts layer at decode sizes, from router logits to the weighted sum of the experts.

Per token m, with the router logits l = logits[m] (E, f32):

    ids = the k experts of the largest logits, largest first (equal logits: the lower expert id first)
    w   = softmax over l[ids] (the renormalised top-k softmax probabilities: softmax(l)[ids] / their sum)
    out[m] = sum_j w_j * (silu(x[m] W_gate[ids_j]) * (x[m] W_up[ids_j])) W_down[ids_j]

x (M, H), the expert weights W_gate and W_up (E, H, I) and W_down (E, I, H) are bf16; out (M, H) is f32 and the
expert ids (M, k, i32) and weights (M, k, f32) are outputs too. Products are accumulated in fp32 (or wider); the
intermediate h = silu(g) * u may be rounded to bf16 between the two projections (as serving kernels do).

Inputs: unit-variance tokens, weights at the 1/sqrt(fan-in) scale of a trained layer, router logits at a spread
of 1.5. Each row of logits is spread so that any two differ by at least 1e-3 (ranking them, before or after exp,
is exact in fp32: no near-tied k-th and (k+1)-th expert), and whenever there are more than k experts one drawn
expert is hot (its logit a quarter above each row's largest other: every token routes to it first, with a weight
like its second's, so the other experts' terms still show in the output) and another cold (below each row's
smallest: no token routes to it), so every draw has an expert that receives all tokens and one that receives none.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from cake_core.problems.base import (BenchTarget, Problem, RowOracle, Shape, array_module, as_sampler, bf16_round,
                                     data, output)

from .peers import PEERS

HOT = 0.25      # the hot expert's logit: this far above the row's largest other one (first, but not dominant)
COLD = 1.0      # the cold expert's logit: this far below the row's smallest other one
SPREAD = 1e-3   # the least gap between two logits of a row


def _logits(r: Any, M: int, E: int, k: int) -> Any:
    xp = r.xp
    z = r.normal((M, E)) * 1.5
    if E > k:
        hot = int(r.integers(0, E, (1,))[0])
        cold = (hot + 1 + int(r.integers(0, E - 1, (1,))[0])) % E
        others = xp.ones(E, bool)
        others[[hot, cold]] = False
        z[:, hot] = z[:, others].max(axis=1) + HOT
        z[:, cold] = z[:, others].min(axis=1) - COLD
    rank = xp.argsort(xp.argsort(z, axis=1), axis=1)
    return (z + SPREAD * rank).astype(xp.float32)


def _inputs(s: Shape, rng: Any) -> dict[str, Any]:
    r = as_sampler(rng)
    M, H, I, E, k = s["M"], s["H"], s["I"], s["E"], s["k"]
    return {"x": bf16_round(r.normal((M, H))), "logits": _logits(r, M, E, k),
            "w_gate": bf16_round(r.normal((E, H, I)) * H ** -0.5),
            "w_up": bf16_round(r.normal((E, H, I)) * H ** -0.5),
            "w_down": bf16_round(r.normal((E, I, H)) * I ** -0.5),
            "_k": np.array(k)}        # `_k`: auxiliary, not a kernel argument


def route(logits: Any, k: int) -> tuple[Any, Any]:
    """(ids, weights) of the top-k experts of each row, largest logit first (ties: lower id), fp64 weights."""
    xp = array_module(logits)
    lg = logits.astype(xp.float64)
    ids = xp.argsort(-lg, axis=1, kind="stable")[:, :k]
    sel = xp.take_along_axis(lg, ids, axis=1)
    w = xp.exp(sel - sel[:, :1])
    return ids, w / w.sum(axis=1, keepdims=True)


def _silu(g: Any) -> Any:
    xp = array_module(g)
    return g / (1.0 + xp.exp(-g))


def experts(x: Any, w_gate: Any, w_up: Any, w_down: Any, ids: Any, w: Any) -> Any:
    """out (rows of x, H) in fp64: each row's weighted sum over its experts, one expert's rows at a time."""
    xp = array_module(x, ids)
    out = xp.zeros((x.shape[0], w_down.shape[2]), xp.float64)
    for e in [int(v) for v in xp.unique(ids)]:
        m, j = xp.nonzero(ids == e)          # a token takes an expert at most once: no repeated rows in m
        xe = x[m].astype(xp.float64)
        h = _silu(xe @ w_gate[e].astype(xp.float64)) * (xe @ w_up[e].astype(xp.float64))
        out[m] += w[m, j][:, None] * (h @ w_down[e].astype(xp.float64))
    return out


def _oracle_rows(x: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    xp = array_module(x["x"])
    r = xp.asarray(rows)
    ids, w = route(x["logits"][r], int(x["_k"]))
    return {"out": experts(x["x"][r], x["w_gate"], x["w_up"], x["w_down"], ids, w), "topk_ids": ids,
            "topk_weights": w}


def _oracle(x: dict[str, Any]) -> dict[str, Any]:
    return _oracle_rows(x, np.arange(x["x"].shape[0]))


WEIGHT_ATOL = 1e-5      # the top-k weights lie in (0, 1]: an fp32 softmax is within ~1e-7 of them


def _compare(got: dict[str, Any], want: dict[str, Any], rtol: float) -> tuple[bool, float, str]:
    """The expert ids exactly (the logits are spread: the order is not a matter of rounding), the weights to
    WEIGHT_ATOL, the output to ``rtol`` of its largest magnitude."""
    xp = array_module(got["topk_ids"], want["topk_ids"])
    g_ids, w_ids = got["topk_ids"].reshape(want["topk_ids"].shape), want["topk_ids"]
    bad = g_ids != w_ids
    if bool(bad.any()):
        m, j = (int(v) for v in np.unravel_index(int(xp.argmax(bad)), bad.shape))
        return False, float("inf"), (f"topk_ids: token {m} slot {j} is expert {int(g_ids[m, j])}; the {j}-th largest "
                                     f"logit is expert {int(w_ids[m, j])} (token {m}'s experts: "
                                     f"{w_ids[m].tolist()})")
    g_w = got["topk_weights"].reshape(want["topk_weights"].shape).astype(xp.float64)
    err_w = xp.abs(g_w - want["topk_weights"])
    if not bool(xp.isfinite(g_w).all()) or float(err_w.max()) > WEIGHT_ATOL:
        m, j = (int(v) for v in np.unravel_index(int(xp.argmax(xp.where(xp.isfinite(err_w), err_w, xp.inf))),
                                                 err_w.shape))
        return False, float("inf"), (f"topk_weights: token {m} slot {j} is {float(g_w[m, j]):.7g}, the renormalised "
                                     f"softmax weight is {float(want['topk_weights'][m, j]):.7g}")
    g_o = got["out"].reshape(want["out"].shape).astype(xp.float64)
    scale = float(xp.abs(want["out"]).max()) or 1.0
    err = xp.abs(g_o - want["out"]) / scale
    if not bool(xp.isfinite(g_o).all()):
        m, n = (int(v) for v in np.unravel_index(int(xp.argmax(~xp.isfinite(g_o))), g_o.shape))
        return False, float("inf"), f"out: token {m} column {n} is {float(g_o[m, n])}"
    worst = float(err.max()) if err.size else 0.0
    if worst <= rtol:
        return True, worst, ""
    m, n = (int(v) for v in np.unravel_index(int(xp.argmax(err)), err.shape))
    return False, worst, (f"out: token {m} column {n} is {float(g_o[m, n]):.6g}, the reference {float(want['out'][m, n]):.6g} "
                          f"({worst:.3g} of the largest |out|)")


def routed_experts(s: Shape) -> float:
    """The expected number of distinct experts the draw routes to: the hot one, and M tokens taking k - 1 of the
    other E - 2 each (uniformly, as the spread logits do on average); every expert when E <= k."""
    M, E, k = s["M"], s["E"], s["k"]
    if E <= k:
        return float(E)
    rest = E - 2
    return 1.0 + rest * (1.0 - (1.0 - (k - 1) / rest) ** M)


def _bytes(s: Shape) -> float:
    """The routed experts' weights read once (expected distinct experts), the tokens and logits read, the outputs
    written: the layer's floor at decode sizes, where the weights dominate."""
    M, H, I, k = s["M"], s["H"], s["I"], s["k"]
    return routed_experts(s) * 3 * 2.0 * H * I + 2.0 * M * H + 4.0 * M * s["E"] + 4.0 * M * H + 8.0 * M * k


PROBLEM = Problem(
    name="moe",
    description="routed mixture of experts per token m: ids = the k largest router logits of logits[m] (E, f32), "
                "largest first, ties to the lower id; w = softmax over those logits; out[m] (f32) = sum_j w_j * "
                "(silu(x[m] W_gate[e_j]) * (x[m] W_up[e_j])) W_down[e_j] with x (M, H), W_gate and W_up (E, H, I), "
                "W_down (E, I, H) bf16; topk_ids (M, k, i32) and topk_weights (M, k, f32) are outputs too; fp32 "
                "accumulation (the intermediate may be rounded to bf16)",
    dims=("M", "H", "I", "E", "k"),
    tensors=(data("x", "bf16"), data("logits", "f32"), data("w_gate", "bf16"), data("w_up", "bf16"),
             data("w_down", "bf16"), output("out", "f32"), output("topk_ids", "i32"), output("topk_weights", "f32")),
    make_inputs=_inputs,
    oracle=_oracle,
    # the bf16 rounding of the intermediate (2^-9 relative per element) gives ~2e-3 of the largest |out| at
    # worst over these shapes; a dropped expert (~1/k of a token's output), a missing silu, unnormalised
    # weights or a wrong expert move the output by 5e-2 and more
    rtol=1e-2,
    flops=lambda s: 6.0 * s["M"] * s["k"] * s["H"] * s["I"],
    bytes=_bytes,
    seed_file="moe.cake",
    shape_sets=("moe_small", "moe_decode"),
    zeroed_outputs=("out",),
    compare_fn=_compare,
    rows=RowOracle(count=lambda s: s["M"], oracle=_oracle_rows,
                   rows_of_perturbed=lambda x, flat: np.unique(np.asarray(flat) // x["x"].shape[1])),
    shape_rule=lambda s: "" if s["k"] <= s["E"] else f"k = {s['k']} > E = {s['E']}: fewer experts than k",
    peers=PEERS,
    bench=BenchTarget("moe_decode", ("torch.grouped_mm",), 4.0, floor_slack=2.0,
                      floor_bytes=lambda s: routed_experts(s) * 3 * 2.0 * s["H"] * s["I"]),
)
