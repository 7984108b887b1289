"""What the KDA problems' peers share: the inputs as torch tensors (bf16 q, k, v; f32 g, beta and state) and
flash-linear-attention's KDA ops, imported when a peer is made."""
from __future__ import annotations

from typing import Any, Callable

from cake_core.problems.peer import PeerRun, PeerUnavailable, device_copies, library, to_device, to_numpy, torch_cuda

BF16_O_RTOL = 5e-5 + 2.0 ** -8        # fla returns o in v's dtype (bf16): its rounding on top of the prefill's


def device_sets(torch, inputs: dict[str, Any], copies: int | None) -> list[dict[str, Any]]:
    """The inputs on the GPU (see ``peer.device_copies``): q, k, v bf16; g, beta and the state s f32."""
    t = {n: to_device(torch, inputs[n], torch.bfloat16) for n in ("q", "k", "v")}
    t.update({n: to_device(torch, inputs[n], torch.float32) for n in ("g", "beta", "s")})
    return device_copies(torch, t, copies)


def fla_op(name: str) -> tuple[Callable[..., Any], str]:
    """``fla.ops.kda.<name>`` and the library's version text, or PeerUnavailable saying what to install."""
    try:
        import fla  # noqa: PLC0415
        from fla.ops import kda  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"flash-linear-attention does not import here ({type(e).__name__}: {e}); install the "
                              "flash-linear-attention wheel on the GPU machine") from None
    return getattr(kda, name), f"flash-linear-attention {getattr(fla, '__version__', '?')}"


def fla_prefill_peer(fn_name: str, packed: bool = False) -> Callable[[str, dict[str, Any], int | None], PeerRun]:
    """The peer factory of ``fla.ops.kda.<fn_name>`` over a prefill's inputs, the state as its initial state and the
    final state returned (q carries its scale: ``scale=1``); ``packed``: the varlen layout, the tokens of every
    sequence on one axis (a batch of one) with ``cu_seqlens`` as int64 offsets."""
    def make(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
        torch = torch_cuda()
        fn, lib = fla_op(fn_name)
        sets = device_sets(torch, inputs, copies)
        extra = {"cu_seqlens": to_device(torch, inputs["cu_seqlens"], torch.int64)} if packed else {}
        box: dict[str, Any] = {}
        lead = (lambda t: t[None]) if packed else (lambda t: t)      # noqa: E731

        def run(i: int) -> None:
            x = sets[i % len(sets)]
            box["o"], box["s"] = fn(*(lead(x[n]) for n in ("q", "k", "v", "g", "beta")), scale=1.0,
                                    initial_state=x["s"], output_final_state=True, **extra)

        o = (lambda: box["o"][0]) if packed else (lambda: box["o"])   # noqa: E731
        return PeerRun(problem, f"fla.ops.kda.{fn_name}" + (" (cu_seqlens)" if packed else ""),
                       f"{lib}, {library(torch)}", run,
                       lambda: {"o": to_numpy(o().float()), "s": to_numpy(box["s"].float())}, len(sets),
                       note="bf16 o: checked at the bf16 output rounding", rtol=BF16_O_RTOL,
                       _keep=[sets, box, extra])
    return make
