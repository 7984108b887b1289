"""Kimi Delta Attention, shared by the KDA problems (decode and prefill): the input draws and the fp64 step.

Per head, with the state S (DK x DV, f32), key k and query q (DK), value v (DV), channel-wise log-decay g (DK,
g <= 0) and write strength beta in (0, 1):

    S' = diag(exp(g)) S;   S = S' + beta k (v - S'^T k)^T;   o = S^T q      (q carries the attention scale)

The keys and queries are unit vectors, as the model's L2 normalisation leaves them, so (I - beta k k^T) is a
contraction and the state stays bounded over any number of steps.
"""
from __future__ import annotations

from typing import Any

from cake_core.problems.base import array_module, bf16_round


def unit_rows(r, shape: tuple[int, ...]) -> Any:
    """bf16 unit vectors along the last axis (normalised, then rounded: within bf16 rounding of unit length)."""
    x = r.normal(shape).astype(r.xp.float64)
    x = x / r.xp.sqrt((x * x).sum(axis=-1, keepdims=True))
    return bf16_round(x.astype(r.xp.float32))


def gates(r, shape: tuple[int, ...]) -> Any:
    """Log-decays g with exp(g) spread over (0.37, 1): a kernel that forgets the decay, or decays along the value
    axis, is off by up to 0.6 of the state."""
    return (-(r.uniform(shape) * 0.999 + 0.001)).astype(r.xp.float32)


def betas(r, shape: tuple[int, ...]) -> Any:
    """Write strengths: the sigmoid of a normal, spread over (0, 1)."""
    return (1.0 / (1.0 + r.xp.exp(-r.normal(shape)))).astype(r.xp.float32)


def step(q, k, v, g, beta, s) -> tuple[Any, Any]:
    """One fp64 step over leading batch axes (q, k, g: (..., DK); v: (..., DV); beta: (...); s: (..., DK, DV)):
    the new state and the output."""
    xp = array_module(q, s)
    f = lambda a: a.astype(xp.float64)          # noqa: E731
    s1 = f(s) * xp.exp(f(g))[..., :, None]
    u = (s1 * f(k)[..., :, None]).sum(axis=-2)                      # S'^T k: (..., DV)
    d = (f(v) - u) * f(beta)[..., None]
    s2 = s1 + f(k)[..., :, None] * d[..., None, :]
    return s2, (s2 * f(q)[..., :, None]).sum(axis=-2)
