"""Hardware facts as typed, frozen data, and their one loader (standard library only).

- :class:`Arch` (``archs/<arch>.json``): an architecture's limits, read by the verifier, the protocol
  checker, the lowering, the compiler, features, the cost model and the GPU runtime.
- :class:`Gpu` (``gpus/<product>.json``): a product (H100, H200, B200, GB200) of an arch, read by the cost
  model and the timing protocol.

No other module repeats one of these numbers as a literal: it asks for the record.
"""
from cake_core.targets.arch import (Arch, MmaSync, SetMaxNReg, Tma, UnknownTarget, Wgmma, find_arch, get_arch,
                                    known_archs)
from cake_core.targets.gpu import DEFAULT_GPU, Gpu, get_gpu, gpu_for_name, known_gpus, largest_l2_bytes
from cake_core.targets.records import TargetDataError

__all__ = ["Arch", "MmaSync", "SetMaxNReg", "Tma", "Wgmma", "UnknownTarget", "find_arch", "get_arch", "known_archs",
           "DEFAULT_GPU", "Gpu", "get_gpu", "gpu_for_name", "known_gpus", "largest_l2_bytes", "TargetDataError"]
