"""Cake IR types: dtypes, memory spaces, swizzles, tile types.

What depends on what:
- ``DType.bytes`` drives every resource rule (smem budget, TMA box bytes) and the
  cost model's byte counts; ``DType.c_type`` is what the lowering emits.
- ``MemSpace`` decides which ops may read or write a buffer (the verifier's
  operand rules) and where the lowering places it (``__shared__``, registers,
  kernel arguments).
- ``Swizzle`` is the shared-memory layout that TMA and wgmma must agree on.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from cake_core.ir.expr import Expr, fmt_expr


class DType(str, enum.Enum):
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"

    @property
    def bytes(self) -> int:
        return _BYTES[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.BF16, DType.F16, DType.F32, DType.E4M3, DType.E5M2)

    @property
    def c_type(self) -> str:
        return _C_TYPE[self]


_BYTES = {DType.BF16: 2, DType.F16: 2, DType.F32: 4, DType.E4M3: 1, DType.E5M2: 1,
          DType.I32: 4, DType.I64: 8, DType.BOOL: 1}
_C_TYPE = {DType.BF16: "__nv_bfloat16", DType.F16: "__half", DType.F32: "float",
           DType.E4M3: "__nv_fp8_e4m3", DType.E5M2: "__nv_fp8_e5m2", DType.I32: "int",
           DType.I64: "long long", DType.BOOL: "bool"}


class MemSpace(str, enum.Enum):
    """Where a buffer lives. gmem: kernel arguments; smem: one CTA's shared
    memory; rmem: registers, distributed over the CTA's threads; tmem:
    Blackwell tensor memory (sm_100a targets only)."""

    GMEM = "gmem"
    SMEM = "smem"
    RMEM = "rmem"
    TMEM = "tmem"


class Swizzle(int, enum.Enum):
    """Shared-memory swizzle span in bytes (0 = none). TMA and wgmma must agree."""

    NONE = 0
    B32 = 32
    B64 = 64
    B128 = 128


@dataclass(frozen=True)
class TileType:
    """The type of a buffer: dtype, shape (static ints or symbols), memory space,
    swizzle and pipeline stages (a ring of ``stages`` copies of ``shape``)."""

    dtype: DType
    shape: tuple[Expr, ...]
    space: MemSpace
    swizzle: Swizzle = Swizzle.NONE
    stages: int = 1

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        dims = ", ".join(fmt_expr(d) for d in self.shape)
        extra = f", swizzle={self.swizzle.value}" if self.swizzle else ""
        extra += f", stages={self.stages}" if self.stages != 1 else ""
        return f"{self.space.value}[{self.dtype.value}, ({dims}{',' if len(self.shape) == 1 else ''}){extra}]"
