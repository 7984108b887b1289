"""The PTX nvcc makes of a lowered kernel, for tests that look for instructions in it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from cake_core.lower import compile as compile_mod


def ptx_of(source: str, tmp_path: Path, arch: str = "sm_90a") -> str:
    cu, out = tmp_path / "k.cu", tmp_path / "k.ptx"
    cu.write_text(source)
    subprocess.run([compile_mod.nvcc_path(), "-ptx", *compile_mod.arch_flags(arch), "-std=c++17", "-I",
                    str(compile_mod.HEADER_DIR), "-o", str(out), str(cu)], check=True, capture_output=True)
    return out.read_text()
