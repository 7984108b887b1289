"""Peers: flash-linear-attention's ``chunk_kda`` (the chunked prefill) and ``fused_recurrent_kda`` (token by
token), on the problem's inputs with the state as the initial state (q carries its scale: ``scale=1``)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.kda_peers import device_sets, fla_op
from cake_core.problems.peer import PeerRun, library, to_numpy, torch_cuda

BF16_O_RTOL = 5e-5 + 2.0 ** -8        # fla returns o in v's dtype (bf16): its rounding on top of the problem's


def _peer(fn_name: str):
    def make(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
        torch = torch_cuda()
        fn, lib = fla_op(fn_name)
        sets = device_sets(torch, inputs, copies)
        box: dict[str, Any] = {}

        def run(i: int) -> None:
            x = sets[i % len(sets)]
            box["o"], box["s"] = fn(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=1.0, initial_state=x["s"],
                                    output_final_state=True)

        return PeerRun(problem, f"fla.ops.kda.{fn_name}", f"{lib}, {library(torch)}", run,
                       lambda: {"o": to_numpy(box["o"].float()), "s": to_numpy(box["s"].float())}, len(sets),
                       note="bf16 o: checked at the bf16 output rounding", rtol=BF16_O_RTOL, _keep=[sets, box])
    return make


PEERS = {"fla.chunk_kda": _peer("chunk_kda"), "fla.fused_recurrent_kda": _peer("fused_recurrent_kda")}
