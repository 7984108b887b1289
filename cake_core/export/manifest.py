"""The manifest of an exported package: everything its dispatcher needs, as JSON, and the digest that pins it.

One JSON document (``manifest.json``), written canonically (sorted keys) so that its sha256 is the package's
identity; ``dispatcher_template.MANIFEST_SHA256`` is set to it in the package's ``__init__.py``. It holds:

- the problem: its name, dims in order, tensors (name, dtype, role, shape as expression text over the dims and
  ``consts``);
- the kernels: an id (the IR program's name and its IR hash), the kernel's function name, threads, dynamic shared
  memory (and the arch's static limit past which the launcher opts in), grid expressions as text (``num_sms``
  for a persistent kernel), cluster, consts, the order of its pointer parameters and int dims, tensor-map specs,
  the zeroed outputs it accumulates into, its domain (``routes.domain_data``), and the sha256 of its CUDA source
  and of its cubin with their paths in the package;
- the routes (``routes.Route``: kind, kernel, per shape its median, kind of measurement, run, peer, held_out) and
  the exact-key table (shape key -> route index): the measured shapes the dispatcher routes a shape with no
  exact route by (the nearest one whose kernel's domain holds it, among the kernels with a ``domain`` route);
- the GPU model, the arch, the toolkit's nvcc version, the driver version where known, when it was made and the
  runs its measurements came from.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass

from cake_core.ir.expr import LAUNCH_SYMBOLS, fmt_expr, symbols
from cake_core.ir.program import Program
from cake_core.lower.context import LoweredKernel
from cake_core.problems.base import Problem
from cake_core.runtime.tma import DATA_TYPE, SWIZZLE, TensorMapSpec
from cake_core.export.routes import Route, domain_data

FORMAT = 1


@dataclass(frozen=True)
class KernelBuild:
    """One exported kernel: its IR, its lowering, its CUDA source and cubin (bytes)."""

    id: str
    ir_hash: str                   # the warehouse's identity of the kernel (its canonical IR text's hash)
    program: Program
    lowered: LoweredKernel
    cubin: bytes
    registers: int | None = None
    spill_bytes: int | None = None


def kernel_id(program: Program, ir_hash: str) -> str:
    """The kernel's name in the package: its program name and the head of its IR hash."""
    return f"{program.name}_{ir_hash[:10]}"


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _tensor_maps(lowered: LoweredKernel) -> list[dict]:
    defaults = TensorMapSpec("", "", "", 0, 0, (), (), (), (), "")
    return [{"name": m.name, "gmem": m.gmem, "data_type": DATA_TYPE[m.dtype], "box": list(m.box),
             "swizzle": SWIZZLE[m.swizzle], "elem_bytes": m.dtype.bytes, "interleave": defaults.interleave,
             "l2_promotion": defaults.l2_promotion, "oob_fill": defaults.oob_fill} for m in lowered.tensor_maps]


def kernel_entry(k: KernelBuild, problem: Problem, arch: str, static_limit: int) -> dict:
    """A kernel's manifest entry (see the module doc)."""
    lw = k.lowered
    return {
        "id": k.id, "ir_hash": k.ir_hash, "kernel_name": lw.kernel_name, "threads": lw.threads,
        "smem_bytes": lw.smem_bytes, "smem_static_limit": static_limit, "grid": [fmt_expr(g) for g in lw.grid],
        "persistent": any(s in LAUNCH_SYMBOLS for g in lw.grid for s in symbols(g)), "cluster": list(lw.cluster),
        "consts": dict(lw.consts), "dims": list(lw.dims), "params": [a.name for a in lw.params],
        "param_dtypes": [a.dtype.value for a in lw.params],
        "param_shapes": [[fmt_expr(e) for e in a.shape] for a in lw.params], "tensor_maps": _tensor_maps(lw),
        "zeroed": list(problem.zeroed_for(lw.accumulates)), "domain": domain_data(k.program, problem.dims),
        "cuda": f"cuda/{k.id}.cu", "cuda_sha256": sha256(lw.source),
        "cubin": f"cubins/{arch}/{k.id}.cubin", "cubin_sha256": sha256(k.cubin),
        "registers": k.registers, "spill_bytes": k.spill_bytes,
    }


def tensors_entry(problem: Problem, first: LoweredKernel) -> tuple[list[dict], dict[str, int]]:
    """The problem's tensors with their shapes as text (from the first kernel's parameters) and the consts
    those shapes name."""
    shapes = {a.name: a.shape for a in first.params}
    consts = dict(first.consts)
    named = {s for shp in shapes.values() for e in shp for s in symbols(e)}
    return ([{"name": t.name, "dtype": t.dtype, "role": t.role.value,
              "shape": [fmt_expr(e) for e in shapes[t.name]]} for t in problem.tensors],
            {c: v for c, v in consts.items() if c in named})


def build_manifest(problem: Problem, routes: list[Route], kernels: dict[str, KernelBuild], *, package: str,
                   gpu_model: str, arch: str, static_limit: int, toolkit: str | None, driver: str | None,
                   run_ids: list[str], created_at: str) -> dict:
    """The manifest (a JSON-ready dict): ``kernels`` maps each route's IR hash to its build."""
    first = kernels[routes[0].ir_hash]
    tensors, consts = tensors_entry(problem, first.lowered)
    table, out_routes = {}, []
    for i, r in enumerate(routes):
        out_routes.append({"kind": r.kind, "kernel": kernels[r.ir_hash].id,
                           "shapes": {w.shape: w.as_dict() for w in r.wins}})
        for w in r.wins:
            table.setdefault(w.shape, i)
    used = list(dict.fromkeys(r.ir_hash for r in routes))
    return {
        "format": FORMAT, "package": package, "problem": problem.name, "description": problem.description,
        "dims": list(problem.dims), "consts": consts, "tensors": tensors, "gpu_model": gpu_model, "arch": arch,
        "toolkit": {"nvcc": toolkit}, "driver": driver,
        "kernels": [kernel_entry(kernels[h], problem, arch, static_limit) for h in used],
        "routes": out_routes, "exact": table, "created_at": created_at, "run_ids": sorted(run_ids),
    }


def manifest_bytes(manifest: dict) -> bytes:
    """The manifest as written: canonical JSON (sorted keys), so that its digest names its content."""
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def nvcc_version(nvcc: str | None) -> str | None:
    """The release of ``nvcc`` (``13.0.88``), or None when it cannot be told."""
    if nvcc is None:
        return None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None
