"""The analytic cost model: time from the features, the GPU's data and a few efficiency factors.

Per CTA (``features``): tensor-core time at the SM's share of the GPU's peak (times the atom's
efficiency), FMA and SIMT time at the SM's SIMT rate, the smem bandwidth the MMA operands need (a
small-N wgmma tile is bound by reading its operands), shared-memory read-modify-writes (smem atomics and
owned-row adds) at the rate the SM reaches with the warps it holds (``Gpu.smem_rmw_ops_per_s``: their
chains of dependent reads and writes need many warps to hide latency), barriers at a fixed cost each. Math of one math
role is the sum of tensor and SIMT time; with ``r`` math roles (ping-pong consumers) they overlap:
``combine(a, b, r) = max(a, b) + min(a, b) / r``.

Per wave of ``n`` CTAs (``ceil(n / sms)`` of them share an SM): math is the SM's CTAs' math; memory is
the longest of DRAM (the wave's share of the L2-aware DRAM estimate at a bandwidth bounded by Little's
law: ``n * bytes in flight per CTA / latency``, so a kernel with a shallow pipeline is latency-bound),
L2 (every requested byte) and L2 atomics. Copy and math overlap as deep as the pipeline:
``combine(math, memory, stages * CTAs per SM)`` (a single-stage synchronous loop pays both).

The kernel: launch cost + one memory latency (the pipeline fill) + the full waves + the tail wave (fewer
CTAs: per-SM work shrinks only when SMs hold fewer CTAs; memory time with the bytes). ``scale`` is the
calibration: a time factor per MMA atom fitted by ``update`` (median log ratio of measured to predicted),
so a refit changes every prediction of that atom and nothing else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cake_core.model.base import CostModelBase, NotEnoughData, Sample
from cake_core.model.charges import load_gpu
from cake_core.model.features import Features
from cake_core.targets import get_gpu

VERSION = "analytic-2"
# Fraction of each unit's peak a kernel reaches (of the GPU data's measured or datasheet figure).
DEFAULT_EFF = {"fma": 0.5, "mma_sync": 0.6, "wgmma": 0.95, "tcgen05_mma": 0.9, "simt": 0.5, "bytes": 0.95,
               "l2": 1.0, "smem": 0.8, "atomic": 1.0}
SYNC_CYCLES = 40              # a CTA barrier with all warps arriving together
MIN_FIT_SAMPLES = 3           # per atom, for update()


def combine(a: float, b: float, depth: float) -> float:
    """Two works that overlap ``depth`` deep: ``max + min / depth`` (depth 1: one after the other)."""
    return max(a, b) + min(a, b) / max(depth, 1.0)


@dataclass(frozen=True)
class Estimate:
    ms: float
    bound: str          # "memory" | "compute": the wave term that dominates


class AnalyticModel(CostModelBase):
    kind = "analytic"

    def __init__(self, gpu: str = "H200", version: str = VERSION, eff: dict[str, float] | None = None,
                 scale: dict[str, float] | None = None, fitted_on: int = 0):
        super().__init__(gpu, version)
        self.eff = {**DEFAULT_EFF, **(eff or {})}
        self.scale = dict(scale or {})
        self.fitted_on = fitted_on

    # ------------------------------------------------------------ the model

    def terms(self, f: Features) -> dict[str, float]:
        """The time terms (seconds) of a feature set; ``total`` is the prediction before ``scale``."""
        g, e, gpu = load_gpu(self.gpu), self.eff, get_gpu(self.gpu)
        sms = g["sms"]
        tensor = f.tensor_flops / (g["bf16_tensor_flops"] / sms * e.get(f.atom, e["wgmma"])) if f.tensor_flops else 0.0
        fma = f.fma_flops / (g["fp32_simt_flops"] / sms * e["fma"])
        simt = f.simt_ops / (g["fp32_simt_flops"] / sms * e["simt"]) + \
            f.smem_atomic_ops / gpu.smem_rmw_ops_per_s("atomic", f.warps_per_sm) + \
            f.smem_owned_ops / gpu.smem_rmw_ops_per_s("owned", f.warps_per_sm)
        smem = f.smem_operand_bytes / (g["smem_bytes_per_s"] / sms * e["smem"])
        sync = f.syncs * SYNC_CYCLES / g["sm_clock_hz"]
        math_cta = combine(max(tensor, smem), fma + simt, max(f.math_roles, 1))
        ctas = max(f.ctas, 1)
        peak_bw = g["hbm_bytes_per_s"] * e["bytes"]

        def wave(n: int) -> dict[str, float]:
            share = math.ceil(n / sms)
            bw = min(peak_bw, n * f.inflight_bytes / g["dram_latency_s"]) if f.inflight_bytes else peak_bw
            dram = n * f.dram_bytes / ctas / bw
            l2 = n * f.l2_bytes / ctas / (g["l2_bytes_per_s"] * e["l2"])
            atomic = n * f.atomic_ops / (g["l2_atomic_ops_per_s"] * e["atomic"])
            memory = max(dram, l2, atomic)
            math_w = share * math_cta
            depth = max(f.stages, 1) * share
            return {"math": math_w, "dram": dram, "l2": l2, "atomic": atomic, "memory": memory,
                    "total": combine(math_w, memory, depth) + sync}

        full = wave(f.concurrent_ctas) if f.full_waves else {"total": 0.0, "math": 0.0, "memory": 0.0}
        tail = wave(f.tail_ctas) if f.tail_ctas else {"total": 0.0, "math": 0.0, "memory": 0.0}
        body = f.full_waves * full["total"] + tail["total"]
        fill = g["dram_latency_s"] if f.l2_bytes else 0.0
        total = g["launch_s"] + fill + body
        return {"tensor": tensor, "fma": fma, "simt": simt, "smem": smem, "sync": sync, "math_cta": math_cta,
                "wave_math": full["math"], "wave_memory": full["memory"], "wave_dram": full.get("dram", 0.0),
                "tail": tail["total"],
                "launch": g["launch_s"], "fill": fill, "total": total}

    def predict_features(self, f: Features) -> float:
        return self.terms(f)["total"] * self.scale.get(f.atom, 1.0) * 1e3

    def estimate(self, program, shape: dict[str, int]) -> Estimate:
        """One program at one shape: milliseconds and what bound them (``memory`` or ``compute``)."""
        f = Sample.of(program, shape, self.gpu).features
        t = self.terms(f)
        return Estimate(self.predict_features(f), "memory" if t["wave_memory"] > t["wave_math"] else "compute")

    def with_eff(self, eff: dict[str, float], version: str | None = None) -> "AnalyticModel":
        """The same model with efficiency factors ``eff`` (a refit is another model: another version)."""
        return AnalyticModel(self.gpu, version or self.version, {**self.eff, **eff}, self.scale, self.fitted_on)

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        return np.array([self.predict_features(s.features) for s in samples], dtype=float)

    # ------------------------------------------------------------ calibration

    def update(self, samples: Sequence[Sample]) -> "AnalyticModel":
        """Refit ``scale`` per MMA atom: the median of log(measured / predicted) over the measured samples
        of that atom (atoms with fewer than MIN_FIT_SAMPLES keep their factor)."""
        measured = [s for s in samples if s.measured_ms and s.measured_ms > 0]
        by_atom: dict[str, list[float]] = {}
        base = AnalyticModel(self.gpu, self.version, self.eff)
        for s, p in zip(measured, base.predict(measured)):
            by_atom.setdefault(s.features.atom, []).append(math.log(s.measured_ms / p))
        fit = {a: math.exp(float(np.median(v))) for a, v in by_atom.items() if len(v) >= MIN_FIT_SAMPLES}
        if not fit:
            raise NotEnoughData(f"an analytic refit needs {MIN_FIT_SAMPLES} measured samples of one MMA atom; "
                                f"got {len(measured)} measured samples ({', '.join(f'{a}: {len(v)}' for a, v in sorted(by_atom.items())) or 'none'})")
        scale = {**self.scale, **fit}
        return AnalyticModel(self.gpu, f"{VERSION}+fit{len(measured)}", self.eff, scale, len(measured))

    # ------------------------------------------------------------ artefact

    def payload(self) -> dict[str, Any]:
        return {"eff": self.eff, "scale": self.scale, "fitted_on": self.fitted_on}

    @classmethod
    def from_payload(cls, gpu: str, version: str, payload: dict[str, Any], header: dict[str, Any]) -> "AnalyticModel":
        from cake_core.model.base import ModelFileError
        try:
            eff = {str(k): float(v) for k, v in payload["eff"].items()}
            scale = {str(k): float(v) for k, v in payload.get("scale", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ModelFileError(f"analytic model payload is malformed ({e})") from None
        if any(not (v > 0 and math.isfinite(v)) for v in (*eff.values(), *scale.values())):
            raise ModelFileError("analytic model payload has a factor that is not a positive number")
        return cls(gpu, version, eff, scale, int(payload.get("fitted_on", 0)))
