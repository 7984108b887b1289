"""Peers: flash-kmeans ``triton_centroid_update_sorted_euclid`` (sort by cluster, then chunked sums;
``calculate_new=False`` leaves sums and counts, our outputs), flash-kmeans unsorted (its per-point atomic kernel
``_centroid_update_kernel``, launched as ``triton_centroid_update_euclid`` launches it, into our buffers: the
public wrapper returns means only), and torch ``index_add_`` + ``bincount``."""
from __future__ import annotations

from typing import Any

from cake_core.problems.common.flash_kmeans import flash_kmeans
from cake_core.problems.peer import PeerRun, PeerUnavailable, device_copies, library, to_device, to_numpy, torch_cuda


def _update_buffers(torch, inputs):
    B, N, D = inputs["x"].shape
    K = int(inputs["_K"])
    return (torch.zeros((B, K, D), device="cuda", dtype=torch.float32),
            torch.zeros((B, K), device="cuda", dtype=torch.int32), K)


def flash_sorted(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    _, fk_update, lib = flash_kmeans()
    sets = device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "assign": to_device(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    old = torch.zeros((inputs["x"].shape[0], K, inputs["x"].shape[2]), device="cuda", dtype=torch.bfloat16)

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        fk_update.triton_centroid_update_sorted_euclid(s["x"], s["assign"], old, centroid_sums=sums,
                                                       centroid_cnts=counts, calculate_new=False)

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "flash-kmeans sorted update", f"{lib}, {library(torch)}", run,
                   lambda: {"sums": to_numpy(sums), "counts": to_numpy(counts)}, len(sets), reset,
                   note="timed: its torch.sort of the assignments + the chunked-sum kernel; "
                        "calculate_new=False (sums and counts, no division)", _keep=[sets, sums, counts, old])


def flash_unsorted(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    _, fk_update, lib = flash_kmeans()
    kernel = getattr(fk_update, "_centroid_update_kernel", None)
    if kernel is None:
        raise PeerUnavailable(f"{lib} has no _centroid_update_kernel (the unsorted update's kernel)")
    sets = device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "assign": to_device(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    B, N, D = inputs["x"].shape

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        x = s["x"]
        # the launch triton_centroid_update_euclid makes (one program per point, 128 dims each),
        # into our sums/counts; the wrapper itself allocates its own and returns only the means
        kernel[(B * N,)](x, s["assign"], sums, counts,
                         x.stride(0), x.stride(1), x.stride(2),
                         sums.stride(0), sums.stride(1), sums.stride(2),
                         counts.stride(0), counts.stride(1),
                         B, N, D, K, BLOCK_D=128)

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "flash-kmeans unsorted update (atomics)", f"{lib}, {library(torch)}", run,
                   lambda: {"sums": to_numpy(sums), "counts": to_numpy(counts)}, len(sets), reset,
                   note="its _centroid_update_kernel launched as triton_centroid_update_euclid does",
                   _keep=[sets, sums, counts])


def index_add(problem: str, inputs: dict[str, Any], copies: int | None) -> PeerRun:
    torch = torch_cuda()
    sets = device_copies(torch, {"x": to_device(torch, inputs["x"], torch.bfloat16),
                                 "assign": to_device(torch, inputs["assign"], torch.int32)}, copies)
    sums, counts, K = _update_buffers(torch, inputs)
    B, N, D = inputs["x"].shape
    base = (torch.arange(B, device="cuda", dtype=torch.int64) * K)[:, None]

    def run(i: int) -> None:
        s = sets[i % len(sets)]
        flat = (s["assign"].long() + base).reshape(-1)
        sums.view(B * K, D).index_add_(0, flat, s["x"].reshape(B * N, D).float())
        counts.view(-1).add_(torch.bincount(flat, minlength=B * K).to(torch.int32))

    def reset() -> None:
        sums.zero_()
        counts.zero_()

    return PeerRun(problem, "torch index_add_ + bincount", library(torch), run,
                   lambda: {"sums": to_numpy(sums), "counts": to_numpy(counts)}, len(sets), reset,
                   note="timed: index arithmetic, the bf16→fp32 copy of x, index_add_ and bincount",
                   _keep=[sets, sums, counts, base])


PEERS = {"flash-kmeans-sorted": flash_sorted, "flash-kmeans-unsorted": flash_unsorted, "torch": index_add}
