"""Peers: flash-linear-attention's ``chunk_kda`` and ``fused_recurrent_kda`` on the packed inputs as their varlen
path takes them (a batch of one, ``cu_seqlens`` as int64 offsets, one initial state per sequence; q carries its
scale: ``scale=1``)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.kda_peers import device_sets, fla_op
from cake_core.problems.peer import PeerRun, library, to_device, to_numpy, torch_cuda

BF16_O_RTOL = 5e-5 + 2.0 ** -8        # fla returns o in v's dtype (bf16): its rounding on top of the problem's


def _peer(fn_name: str):
    def make(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
        torch = torch_cuda()
        fn, lib = fla_op(fn_name)
        sets = device_sets(torch, inputs, copies)
        cu = to_device(torch, inputs["cu_seqlens"], torch.int64)
        box: dict[str, Any] = {}

        def run(i: int) -> None:
            x = sets[i % len(sets)]
            box["o"], box["s"] = fn(x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"][None],
                                    scale=1.0, initial_state=x["s"], output_final_state=True, cu_seqlens=cu)

        return PeerRun(problem, f"fla.ops.kda.{fn_name} (cu_seqlens)", f"{lib}, {library(torch)}", run,
                       lambda: {"o": to_numpy(box["o"][0].float()), "s": to_numpy(box["s"].float())}, len(sets),
                       note="bf16 o: checked at the bf16 output rounding", rtol=BF16_O_RTOL, _keep=[sets, box, cu])
    return make


PEERS = {"fla.chunk_kda": _peer("chunk_kda"), "fla.fused_recurrent_kda": _peer("fused_recurrent_kda")}
