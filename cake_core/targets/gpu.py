"""GPU products: one JSON file per product under ``gpus/`` (``h200.json``), read into :class:`Gpu`.

The cost model reads the SM count, bandwidths, latencies and peak rates; the timing protocol sizes its L2 flush from
the largest ``l2_bytes``; a device name as CUDA reports it (``NVIDIA H200``) maps to a product with
:func:`gpu_for_name`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cake_core.targets.arch import Arch, UnknownTarget, get_arch
from cake_core.targets.records import load_record

_DIR = Path(__file__).resolve().parent / "gpus"
DEFAULT_GPU = "H200"        # the GPU a model is built for when the device is unknown or absent


@dataclass(frozen=True)
class ClusterSlots:
    """How many CTAs of thread-block clusters run at once at ``ctas_per_sm`` CTAs per SM: ``ctas[c - 1]`` for
    clusters of ``c`` (``cudaOccupancyMaxActiveClusters`` times ``c``). A cluster's CTAs share one GPC, and a GPC's
    SM count need not be a multiple of ``c``, so fewer than ``sms * ctas_per_sm`` may fit."""

    ctas_per_sm: int
    ctas: tuple[int, ...]


@dataclass(frozen=True)
class SmemRmw:
    """How fast one SM adds into a shared-memory accumulator with ``lowering`` (``atomic``: shared-memory
    atomics; ``owned``: plain adds by the warp owning each row), against the warps ``n`` it holds:
    ``per_clk * n / (n + half_warps)`` elements per clock. Each warp's adds are chains of dependent
    shared-memory reads and writes, so few warps leave the SM waiting on their latency (Little's law);
    ``half_warps`` is where half the peak is reached. Fitted by ``bench/smem_rmw.py``."""

    lowering: str
    per_clk: float
    half_warps: float


@dataclass(frozen=True)
class Gpu:
    """One GPU product: its architecture, SMs, L2, HBM bandwidth and peak rates (where each comes from in
    ``source``)."""

    name: str
    arch: str
    sms: int
    l2_bytes: int
    hbm_bytes_per_s: float
    bf16_tensor_flops: float
    fp32_simt_flops: float
    l2_bytes_per_s: float          # L2 -> SM bandwidth the cost model charges re-read operands at
    smem_bytes_per_s: float        # shared-memory bandwidth of the whole GPU
    l2_atomic_ops_per_s: float     # gmem (L2) atomics
    smem_rmw: tuple[SmemRmw, ...]  # shared-memory read-modify-writes per SM, by lowering and resident warps
    launch_s: float                # an empty kernel launch, as the timing protocol measures it
    dram_latency_s: float          # what Little's law puts between bytes in flight and bandwidth
    sm_clock_hz: float
    max_ctas_per_sm: int
    cluster_slots: tuple[ClusterSlots, ...] | None   # measured on a device of this product; None: not measured
    source: str

    @property
    def arch_data(self) -> Arch:
        return get_arch(self.arch)

    def smem_rmw_ops_per_s(self, lowering: str, warps_per_sm: float) -> float:
        """Elements one SM adds into shared memory per second with ``lowering`` when it holds ``warps_per_sm``
        warps (see :class:`SmemRmw`)."""
        by = {r.lowering: r for r in self.smem_rmw}
        if lowering not in by:
            raise KeyError(f"{self.name} has no smem_rmw row for `{lowering}`; it has {', '.join(sorted(by))}")
        r, n = by[lowering], max(float(warps_per_sm), 1.0)
        return r.per_clk * n / (n + r.half_warps) * self.sm_clock_hz

    def ctas_at_once(self, cluster: int, ctas_per_sm: int) -> int:
        """CTAs resident at once when each SM holds ``ctas_per_sm`` and CTAs come in clusters of ``cluster``.

        From ``cluster_slots``: the measured row of the largest ``ctas_per_sm`` not above the one asked
        (scaled by their ratio, whole clusters only); without a row or for a size it lacks, every SM's slots
        in whole clusters, as if one GPC held them all.
        """
        per_sm = max(1, ctas_per_sm)
        whole = self.sms * per_sm
        cluster = max(1, cluster)
        if cluster == 1:
            return whole
        rows = sorted((r for r in self.cluster_slots or () if len(r.ctas) >= cluster), key=lambda r: r.ctas_per_sm)
        below = [r for r in rows if r.ctas_per_sm <= per_sm] or rows[:1]
        if not below:
            return whole // cluster * cluster
        row = below[-1]
        fit = row.ctas[cluster - 1] * per_sm / row.ctas_per_sm
        return max(cluster, min(whole, int(fit)) // cluster * cluster)


def known_gpus() -> list[str]:
    return sorted(p.stem.upper() for p in _DIR.glob("*.json"))


def get_gpu(name: str) -> Gpu:
    """The :class:`Gpu` named ``name`` (any case); :class:`UnknownTarget` listing the known GPUs otherwise."""
    path = _DIR / f"{name.lower()}.json"
    if not name or "/" in name or not path.is_file():
        raise UnknownTarget(f"no data for GPU `{name}`; known: {', '.join(known_gpus())}")
    return _load(path)


@lru_cache(maxsize=None)
def _load(path: Path) -> Gpu:
    return load_record(Gpu, path)


def gpu_for_name(device_name: str | None) -> str:
    """The product a device name (``NVIDIA H200``) names; :data:`DEFAULT_GPU` when unknown or absent."""
    if device_name:
        for name in sorted(known_gpus(), key=lambda n: -len(n)):
            if name in device_name.upper():
                return name
    return DEFAULT_GPU


def largest_l2_bytes() -> int:
    """The largest L2 of the GPUs described here: what a flush must exceed on every one of them."""
    return max(get_gpu(n).l2_bytes for n in known_gpus())
