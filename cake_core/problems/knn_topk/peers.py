"""Peer: torch mm (fp32 output) + ``topk``."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, device_copies, library, mm_f32, to_device, to_numpy, torch_cuda


def mm_topk(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    k = int(inputs["_k"])
    sets = device_copies(torch, {"q": to_device(torch, inputs["q"], torch.bfloat16),
                                 "db": to_device(torch, inputs["db"], torch.bfloat16)}, copies)
    out = torch.empty((inputs["q"].shape[0], k), device="cuda", dtype=torch.int32)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        db_sq = (s["db"].float() ** 2).sum(-1)
        scores = mm_f32(torch, s["q"], s["db"].T)                    # (Q, N) fp32
        scores.mul_(-2.0).add_(db_sq[None, :])
        out.copy_(torch.topk(scores, k, dim=1, largest=False, sorted=True).indices)

    return PeerRun(problem, "torch mm f32 + topk", library(torch), run, lambda: {"idx": to_numpy(out)}, len(sets),
                   note="materialises the (Q, N) fp32 score matrix; ||db||^2 computed in the timed run",
                   _keep=[sets, out])


PEERS = {"torch": mm_topk}
