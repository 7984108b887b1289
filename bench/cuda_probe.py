"""Compile a one-file CUDA probe with nvcc, run it, and read the JSON it prints: the step the probes that ask
the GPU itself share (``bench/cluster_occupancy.py``, ``bench/smem_rmw.py``)."""
from __future__ import annotations

import json
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path


class ProbeFailed(Exception):
    """nvcc refused the probe, or it ran and printed no JSON; the message says which and what it printed."""


def run_probe(name: str, source: str, *, arch: str, flags: tuple[str, ...] = (), compile_only: bool = False,
              timeout_s: float = 60) -> dict | None:
    """The probe's JSON, stamped with when and by which command it was measured; None when ``compile_only``
    (it compiled). Raises :class:`ProbeFailed`."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cu", Path(tmp) / "probe"
        src.write_text(source)
        try:
            r = subprocess.run(["nvcc", *flags, f"-arch={arch}", "-o", str(exe), str(src)], capture_output=True,
                               text=True)
        except FileNotFoundError:
            raise ProbeFailed(f"{name}: no nvcc on PATH; the probe needs the CUDA toolkit") from None
        if r.returncode:
            raise ProbeFailed(f"{name}: nvcc failed: {r.stderr.strip()[:600]}")
        if compile_only:
            return None
        try:
            r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ProbeFailed(f"{name}: the probe ran past {timeout_s:.0f} s and was stopped") from None
        if r.returncode or not r.stdout.strip():
            raise ProbeFailed(f"{name}: the probe failed (is there a GPU?): {(r.stderr or r.stdout).strip()[:400]}")
    try:
        data = json.loads(r.stdout)
    except ValueError as e:
        raise ProbeFailed(f"{name}: the probe printed something other than JSON ({e}): {r.stdout[:200]}") from None
    data["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    data["command"] = f"python bench/{name}.py"
    return data
