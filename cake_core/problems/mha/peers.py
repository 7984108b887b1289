"""Peer: torch's ``scaled_dot_product_attention`` (flash or memory-efficient backend, bf16 in and out) with
``scale=1`` (q carries the scale)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, device_copies, library, to_device, to_numpy, torch_cuda

BF16_O_RTOL = 5e-3 + 2.0 ** -8        # sdpa returns o in bf16: its rounding on top of the problem's


def sdpa(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    sets = device_copies(torch, {n: to_device(torch, inputs[n], torch.bfloat16) for n in ("q", "k", "v")}, copies)
    box: dict[str, Any] = {}

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        box["o"] = torch.nn.functional.scaled_dot_product_attention(s["q"][None], s["k"][None], s["v"][None],
                                                                    scale=1.0)[0]

    return PeerRun(problem, "torch.nn.functional.scaled_dot_product_attention", library(torch), run,
                   lambda: {"o": to_numpy(box["o"].float())}, len(sets),
                   note="bf16 o: checked at the bf16 output rounding", rtol=BF16_O_RTOL, _keep=[sets, box])


PEERS = {"torch.sdpa": sdpa}
