"""Peers: flash-linear-attention's ``fused_recurrent_kda`` (its decode path, T = 1) and the same step written as
plain torch tensor ops in fp32, each on the problem's inputs (q carries its scale: ``scale=1``)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.kda_peers import device_sets, fla_op
from cake_core.problems.peer import PeerRun, library, to_numpy, torch_cuda


def fla_kda(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """``fla.ops.kda.fused_recurrent_kda`` on [B, 1, H, *] views, the state passed as its initial state and the
    final state returned (a new tensor: every timed run starts from the same state)."""
    torch = torch_cuda()
    fused_recurrent_kda, lib = fla_op("fused_recurrent_kda")
    sets = device_sets(torch, inputs, copies)
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        o, st = fused_recurrent_kda(s["q"][:, None], s["k"][:, None], s["v"][:, None], s["g"][:, None],
                                    s["beta"][:, None], scale=1.0, initial_state=s["s"], output_final_state=True)
        box["o"], box["s"] = o, st

    return PeerRun(problem, "fla.ops.kda.fused_recurrent_kda", f"{lib}, {library(torch)}", run,
                   lambda: {"o": to_numpy(box["o"][:, 0].float()), "s": to_numpy(box["s"].float())}, len(sets),
                   note="bf16 o (its output dtype follows v): checked at the bf16 output rounding",
                   rtol=2e-5 + 2.0 ** -8, _keep=[sets, box])


def torch_step(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    """The step as torch ops in fp32 (a decay, two batched matrix-vector products and an outer product)."""
    torch = torch_cuda()
    sets = device_sets(torch, inputs, copies)
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        x = sets[i % len(sets)]
        k, q, v = x["k"].float(), x["q"].float(), x["v"].float()
        s1 = x["s"] * torch.exp(x["g"])[..., None]
        u = torch.einsum("bhkv,bhk->bhv", s1, k)
        s2 = s1 + k[..., None] * ((v - u) * x["beta"][..., None])[..., None, :]
        box["s"], box["o"] = s2, torch.einsum("bhkv,bhk->bhv", s2, q)

    return PeerRun(problem, "torch (fp32 ops)", library(torch), run,
                   lambda: {"o": to_numpy(box["o"]), "s": to_numpy(box["s"])}, len(sets), _keep=[sets, box])


PEERS = {"fla.fused_recurrent_kda": fla_kda, "torch.kda_step": torch_step}
