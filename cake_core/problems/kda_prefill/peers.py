"""Peers: flash-linear-attention's ``chunk_kda`` (the chunked prefill) and ``fused_recurrent_kda`` (token by
token), on the problem's inputs with the state as the initial state (q carries its scale: ``scale=1``)."""
from __future__ import annotations

from typing import Any

from cake_core.problems.peer import PeerRun, PeerUnavailable, device_copies, library, to_device, to_numpy, torch_cuda

BF16_O_RTOL = 5e-5 + 2.0 ** -8        # fla returns o in v's dtype (bf16): its rounding on top of the problem's


def _fla(name: str):
    try:
        import fla  # noqa: PLC0415
        from fla.ops import kda  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"flash-linear-attention does not import here ({type(e).__name__}: {e}); install the "
                              "flash-linear-attention wheel on the GPU machine") from None
    return getattr(kda, name), f"flash-linear-attention {getattr(fla, '__version__', '?')}"


def _peer(fn_name: str):
    def make(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
        torch = torch_cuda()
        fn, lib = _fla(fn_name)
        t = {n: to_device(torch, inputs[n], torch.bfloat16) for n in ("q", "k", "v")}
        t.update({n: to_device(torch, inputs[n], torch.float32) for n in ("g", "beta", "s")})
        sets = device_copies(torch, t, copies)
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
