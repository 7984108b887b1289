"""Write an exported package: a folder a user imports with nothing of Cake installed.

::

    <pkg>/__init__.py              dispatcher_template.py, with the manifest's sha256 pinned
    <pkg>/cuda_driver.py           cuda_driver.py (ctypes on libcuda)
    <pkg>/manifest.json            manifest.manifest_bytes
    <pkg>/cubins/<arch>/<id>.cubin one per kernel
    <pkg>/cuda/<id>.cu             its CUDA source, beside the device header it includes (cake.cuh ...)

The folder is written under a temporary name beside ``out/<pkg>`` and renamed into place, so a package is
either whole or absent; an existing package of the same name is replaced.
"""
from __future__ import annotations

import keyword
import shutil
import tempfile
from pathlib import Path

from cake_core.export.manifest import KernelBuild, manifest_bytes, sha256
from cake_core.export.routes import ExportError
from cake_core.lower.compile import HEADER_DIR

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "dispatcher_template.py"
DRIVER = HERE / "cuda_driver.py"
PIN = "MANIFEST_SHA256: str | None = None"      # the template's line that render_init pins


def check_name(name: str) -> str:
    """``name`` if it can be imported as a package; an ExportError saying why not otherwise."""
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("cake_core", "cake_cli", "warehouse",
                                                                        "flows", "tasks"):
        raise ExportError(f"--name {name!r}: a package name is a Python identifier that is not a keyword nor the "
                          "name of a Cake package")
    return name


def render_init(digest: str) -> str:
    """The package's ``__init__.py``: the template with ``digest`` pinned."""
    text = TEMPLATE.read_text()
    if text.count(PIN) != 1:
        raise ExportError(f"{TEMPLATE}: the line `{PIN}` must appear once (it is where the digest is pinned)")
    return text.replace(PIN, f'MANIFEST_SHA256: str | None = "{digest}"')


def write_package(out: Path, name: str, manifest: dict, kernels: list[KernelBuild], arch: str) -> Path:
    """Write the package ``out/name`` (see the module doc); returns its folder."""
    check_name(name)
    out.mkdir(parents=True, exist_ok=True)
    data = manifest_bytes(manifest)
    final = out / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    try:
        (tmp / "manifest.json").write_bytes(data)
        (tmp / "__init__.py").write_text(render_init(sha256(data)))
        shutil.copyfile(DRIVER, tmp / "cuda_driver.py")
        (tmp / "cubins" / arch).mkdir(parents=True)
        (tmp / "cuda").mkdir()
        for header in sorted(HEADER_DIR.glob("*.cuh")):
            shutil.copyfile(header, tmp / "cuda" / header.name)
        for k in kernels:
            (tmp / "cubins" / arch / f"{k.id}.cubin").write_bytes(k.cubin)
            (tmp / "cuda" / f"{k.id}.cu").write_text(k.lowered.source)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
