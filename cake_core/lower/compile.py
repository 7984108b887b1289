"""Compile a lowered kernel to a cubin with nvcc, parse ptxas resources, cache by content.

One nvcc call per distinct (source, header, flags, arch): the cubin and its
resource report are stored under ``cache_dir`` as ``<key>.cubin`` and
``<key>.json`` (written to a temporary name, then renamed, so concurrent
workers never see half a file). CPU workers compile; GPU workers only load.

Architectures come from the target data (``cake_core.targets``): a target that is
not there is refused (``compile.unknown_arch``), never swapped for another.
``sm_90a`` is compiled as ``-gencode=arch=compute_90a,code=sm_90a`` (the
``-arch=sm_90a`` shorthand of nvcc 13.0 also runs a plain sm_90 pass that
rejects wgmma/setmaxnreg); the same for ``sm_100a``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cake_core.lower.context import LoweredKernel
from cake_core.outcome import Diagnostic, Outcome, Severity, StageResult
from cake_core.targets import find_arch, known_archs

HEADER_DIR = Path(__file__).resolve().parent / "header"
DEFAULT_CACHE = Path(os.environ.get("CAKE_CUBIN_CACHE", Path.home() / ".cache" / "cake" / "cubin"))
STAGE = "compile"


@dataclass(frozen=True)
class Resources:
    """ptxas' report for the kernel. ``smem_bytes`` is static shared memory plus the
    lowering's dynamic shared memory, i.e. what one CTA holds."""

    registers: int
    spill_bytes: int          # spill stores + spill loads
    smem_bytes: int
    barriers: int
    stack_bytes: int


@dataclass(frozen=True)
class Compiled:
    cubin_path: Path
    kernel_name: str
    resources: Resources
    source_hash: str          # the cache key (sha256 of source, header, flags, arch)
    seconds: float            # nvcc wall time (0.0 on a cache hit)
    cached: bool
    arch: str = "sm_90a"


def nvcc_path() -> str | None:
    return os.environ.get("CAKE_NVCC") or shutil.which("nvcc") or \
        next((p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.path.exists(p)), None)


def arch_flags(arch: str) -> list[str]:
    num = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{num},code={arch}"]


def _flags(arch: str) -> list[str]:
    return ["-cubin", *arch_flags(arch), "-O3", "-std=c++17", "-Xptxas", "-v", "-I", str(HEADER_DIR)]


def _header_text() -> str:
    return "".join(p.read_text() for p in sorted(HEADER_DIR.glob("*.cuh")))


def cache_key(source: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (source, _header_text(), " ".join(_flags(arch)).replace(str(HEADER_DIR), "<header>"), arch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------- ptxas report

_RE_REGS = re.compile(r"Used (\d+) registers")
_RE_BARS = re.compile(r"used (\d+) barriers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str, kernel_name: str, dynamic_smem: int = 0) -> Resources | None:
    """Resources of ``kernel_name`` from ``-Xptxas -v`` output (None if absent)."""
    m = re.search(rf"Function properties for {re.escape(kernel_name)}\b(.*?)(?=ptxas info\s*: (?:Compiling|Function)|\Z)",
                  log, re.S)
    block = m.group(1) if m else log
    regs = _RE_REGS.search(block)
    if not regs:
        return None
    st = _RE_STACK.search(block)
    bars = _RE_BARS.search(block)
    smem = _RE_SMEM.search(block)
    return Resources(registers=int(regs.group(1)),
                     spill_bytes=int(st.group(2)) + int(st.group(3)) if st else 0,
                     smem_bytes=(int(smem.group(1)) if smem else 0) + dynamic_smem,
                     barriers=int(bars.group(1)) if bars else 0,
                     stack_bytes=int(st.group(1)) if st else 0)


# ---------------------------------------------------------------- nvcc errors

_RE_LOC = re.compile(r'(?P<file>[^\s():"]+)\((?P<line>\d+)\): (?P<sev>error|warning|catastrophic error)\s*:?\s*(?P<msg>.*)')
_RE_INST = re.compile(r'at line (\d+) of "?([^"\s]+)"?')


def parse_nvcc_errors(log: str, ir_filename: str) -> list[Diagnostic]:
    """Diagnostics for nvcc's errors (and warnings). A message located in the IR file
    keeps its line; one in the header is placed at the IR line that instantiated it
    (``detected during ... at line N of "kernel.cake"``) when nvcc names one."""
    out: list[Diagnostic] = []
    lines = log.splitlines()
    base = os.path.basename(ir_filename)
    for i, ln in enumerate(lines):
        m = _RE_LOC.search(ln)
        if m:
            sev = Severity.WARNING if m.group("sev") == "warning" else Severity.ERROR
            line, where = int(m.group("line")), m.group("file")
            if os.path.basename(where) != base:
                line = 0
                for nxt in lines[i + 1:i + 12]:
                    if _RE_LOC.search(nxt):
                        break
                    inst = _RE_INST.search(nxt)
                    if inst and os.path.basename(inst.group(2)) == base:
                        line = int(inst.group(1))
                msg = f"{m.group('msg').strip()} (in {os.path.basename(where)}:{m.group('line')})"
            else:
                msg = m.group("msg").strip()
            if sev is Severity.ERROR or line:
                out.append(Diagnostic("nvcc.error" if sev is Severity.ERROR else "nvcc.warning", sev, msg, line,
                                      hint="the generated CUDA for this IR statement does not compile; "
                                           "see artifact nvcc.log and kernel.cu"))
        elif re.match(r"\s*ptxas (fatal|error)", ln):
            out.append(Diagnostic("ptxas.error", Severity.ERROR, ln.strip(), 0))
    if not any(d.is_error for d in out):
        tail = "\n".join(l for l in lines if l.strip())[-400:]
        out.append(Diagnostic("nvcc.error", Severity.ERROR, f"nvcc failed: {tail or '(no output)'}", 0))
    return out


# ---------------------------------------------------------------- compile

def _fail(rule: str, msg: str, hint: str = "", artifacts: dict | None = None, line: int = 0) -> StageResult:
    return StageResult(STAGE, Outcome.COMPILE_FAILED, [Diagnostic(rule, Severity.ERROR, msg, line, hint=hint)],
                       artifacts=artifacts or {})


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _run_group(cmd: list[str], timeout_s: float, cwd: str) -> subprocess.CompletedProcess:
    """Run nvcc in a process group of its own and, on a time-out or an interrupt, kill the whole group:
    nvcc runs cicc and ptxas as children, and killing nvcc alone would leave them running."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException as e:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            if isinstance(e, subprocess.TimeoutExpired):
                raise subprocess.TimeoutExpired(cmd, timeout_s, output=(out or "") + (err or "")) from None
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def compile_kernel(lowered: LoweredKernel, arch: str = "sm_90a", cache_dir: Path | None = None,
                   timeout_s: float = 120) -> StageResult:
    """Compile ``lowered`` for ``arch`` to a cubin (stage ``compile``).

    Returns ``OK`` with a :class:`Compiled` value (``cached=True`` when the cubin
    came from ``cache_dir``), or ``COMPILE_FAILED`` with diagnostics: ``nvcc.error``
    at the IR line nvcc names, ``nvcc.timeout``, ``compile.unknown_arch``,
    ``compile.no_nvcc``. Artifacts: ``kernel.cu`` and ``nvcc.log``.
    """
    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    arts = {"kernel.cu": lowered.source}
    if find_arch(arch) is None:
        return _fail("compile.unknown_arch", f"no target data for `{arch}` (cake_core/targets/archs/{arch}.json)",
                     f"known targets: {', '.join(known_archs())}; Cake never falls back to another architecture",
                     arts)
    key = cache_key(lowered.source, arch)
    cubin = cache_dir / f"{key}.cubin"
    meta = cache_dir / f"{key}.json"
    if cubin.exists() and meta.exists():
        try:
            info = json.loads(meta.read_text())
            res = Resources(**info["resources"])
            return StageResult(STAGE, Outcome.OK, [], {"registers": res.registers, "spill_bytes": res.spill_bytes,
                                                       "nvcc_s": 0.0, "cached": True},
                               {**arts, "nvcc.log": info.get("log", "")},
                               Compiled(cubin, lowered.kernel_name, res, key, 0.0, True, arch))
        except (ValueError, KeyError, TypeError):
            pass   # a damaged entry: rebuild it
    nvcc = nvcc_path()
    if nvcc is None:
        return _fail("compile.no_nvcc", "nvcc was not found on PATH (nor /usr/local/cuda/bin, /usr/local/bin)",
                     "install the CUDA toolkit or set CAKE_NVCC=/path/to/nvcc", arts)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cake-nvcc-", dir=cache_dir) as tmp:
        cu, out = Path(tmp) / f"{lowered.kernel_name}.cu", Path(tmp) / f"{lowered.kernel_name}.cubin"
        cu.write_text(lowered.source)
        cmd = [nvcc, *_flags(arch), "-o", str(out), str(cu)]
        t0 = time.perf_counter()
        try:
            p = _run_group(cmd, timeout_s, tmp)
        except subprocess.TimeoutExpired as e:
            log = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return _fail("nvcc.timeout", f"nvcc ran past {timeout_s:g} s and was stopped",
                         "a smaller unroll or tile keeps the generated code compilable", {**arts, "nvcc.log": log})
        except OSError as e:
            return _fail("compile.no_nvcc", f"nvcc at {nvcc} could not be run: {e}",
                         "check the CUDA toolkit install or set CAKE_NVCC", arts)
        seconds = time.perf_counter() - t0
        log = (p.stdout or "") + (p.stderr or "")
        arts["nvcc.log"] = log
        if p.returncode != 0 or not out.exists():
            return StageResult(STAGE, Outcome.COMPILE_FAILED, parse_nvcc_errors(log, lowered.ir_filename),
                               {"nvcc_s": seconds}, arts)
        res = parse_ptxas(log, lowered.kernel_name, lowered.smem_bytes)
        if res is None:
            return _fail("ptxas.no_report", f"ptxas printed no resource report for `{lowered.kernel_name}`",
                         "see artifact nvcc.log", arts)
        _atomic_write(cubin, out.read_bytes())
        _atomic_write(meta, json.dumps({"resources": asdict(res), "kernel": lowered.kernel_name, "arch": arch,
                                        "log": log}).encode())
    warns = [d for d in parse_nvcc_errors(log, lowered.ir_filename) if not d.is_error] if "warning" in log else []
    return StageResult(STAGE, Outcome.OK, warns,
                       {"registers": res.registers, "spill_bytes": res.spill_bytes, "nvcc_s": seconds,
                        "cached": False}, arts, Compiled(cubin, lowered.kernel_name, res, key, seconds, False, arch))
