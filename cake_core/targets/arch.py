"""Architectures: one JSON file per arch under ``archs/`` (``sm_90a.json``, ``sm_100a.json``), read into :class:`Arch`.

What reads what:
- the verifier's resource, TMA, wgmma, setmaxnreg and cluster rules, and the protocol checker's cluster
  bound, read the limits (``smem_per_cta_bytes``, ``tma``, ``wgmma``, ``setmaxnreg``, ``max_cluster_size``);
- the lowering aligns shared memory by ``smem_alloc_align_bytes`` (``tma.swizzle_smem_align_bytes`` for
  swizzle-128 tiles) and sizes warp roles by ``warp_size`` and ``warpgroup_warps``;
- the cost model's occupancy reads ``max_threads_per_sm``, ``max_ctas_per_sm`` and ``smem_per_sm_bytes``;
- features bucket shared memory and registers up to ``smem_per_cta_bytes`` and ``max_regs_per_thread``;
- the compiler refuses an arch without a file here; the GPU runtime runs only ``runs_here`` archs, on a
  device of ``compute_capability``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cake_core.errors import CakeError
from cake_core.targets.records import load_record

_DIR = Path(__file__).resolve().parent / "archs"


@dataclass(frozen=True)
class SetMaxNReg:
    """``setmaxnreg``'s register budgets per thread: ``min``..``max`` in steps of ``step``."""

    min: int
    max: int
    step: int


@dataclass(frozen=True)
class Wgmma:
    """Warpgroup MMA shapes: M per warpgroup, N range and step, K per instruction by operand width."""

    m: int
    n_min: int
    n_max: int
    n_step: int
    k_16bit: int
    k_8bit: int


@dataclass(frozen=True)
class MmaSync:
    """The ``mma.sync`` atom's shape: K per atom for 16-bit operands, and for f32 ones (tf32 atoms, three per
    product: the 3xTF32 split that keeps fp32's accuracy)."""

    m: int
    n: int
    k_16bit: int
    k_32bit: int


@dataclass(frozen=True)
class Tma:
    """TMA limits: box dims and rank, gmem and smem alignment (1024 B for a swizzle-128 slot), unswizzled inner box
    bytes."""

    max_box_dim: int
    global_align_bytes: int
    smem_align_bytes: int
    max_rank: int
    swizzle_smem_align_bytes: int
    no_swizzle_inner_bytes_multiple: int


@dataclass(frozen=True)
class Arch:
    """One GPU architecture's limits, as the verifier, the lowering, the cost model and the runtime use them."""

    arch: str
    family: str
    runs_here: bool                         # this workplace can run (not only compile) it
    compute_capability: tuple[int, ...]     # (major, minor) of the devices it runs on
    max_threads_per_cta: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    warp_size: int
    max_regs_per_thread: int
    regs_per_sm: int
    smem_per_cta_bytes: int
    smem_per_sm_bytes: int
    smem_static_limit_bytes: int            # above it, a launch opts in to more dynamic shared memory
    smem_alloc_align_bytes: int
    max_cluster_size: int
    setmaxnreg: SetMaxNReg
    tmem_columns: int
    mma_atoms: tuple[str, ...]
    wgmma: Wgmma | None                     # None: no wgmma on this arch
    mma_sync: MmaSync
    tma: Tma
    warpgroup_warps: int
    mbarrier_bytes: int
    mbarrier_max_arrivals: int              # mbarrier.init's count: 1 to this

    @property
    def warpgroup_threads(self) -> int:
        return self.warpgroup_warps * self.warp_size

    def entry_regs(self, threads: int) -> int:
        """Registers per thread a CTA of ``threads`` starts with when it owns the SM (setmaxnreg's entry cap)."""
        step = self.setmaxnreg.step
        return min(self.max_regs_per_thread, self.regs_per_sm // threads) // step * step


class UnknownTarget(CakeError):
    """An architecture or GPU with no data file: the message lists the known ones."""


def known_archs() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


@lru_cache(maxsize=None)
def find_arch(name: str) -> Arch | None:
    """The :class:`Arch` of ``name`` (``sm_90a``), or None when there is no data for it."""
    path = _DIR / f"{name}.json"
    if not name or "/" in name or not path.is_file():
        return None
    a = load_record(Arch, path)
    if a.arch != name:
        raise UnknownTarget(f"{path} describes `{a.arch}`, not `{name}`: name the file after its arch")
    return a


def get_arch(name: str) -> Arch:
    """The :class:`Arch` of ``name``; :class:`UnknownTarget` (listing the known archs) when there is none."""
    a = find_arch(name)
    if a is None:
        raise UnknownTarget(f"unknown target `{name}`; known targets: {', '.join(known_archs())}")
    return a
