"""An exported package, imported where Cake is not: a fresh ``python -I`` whose sys.path holds the output folder
and the standard library only. Routes answer there; a tampered manifest, a wrong dtype and a shape no route
covers are refused in one line before any CUDA call (so on a CPU machine); the fallback serves the last. The
GPU test runs an exported kernel from torch against the problem's oracle."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cake_core.export.build import ExportRequest, export_problem
from cake_core.export.package import render_init
from cake_core.lower.compile import nvcc_path
from cake_core.problems import get_problem
from export_rows import FILES, PROBLEM, expected, land, shapes

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="export compiles each kernel with nvcc, absent here")

# run in the subprocess (python -I -S: no site module, so no site-packages and no editable install of Cake): the
# package's folder first, then the standard library alone
PRELUDE = """
import sys
sys.path[:] = [{out!r}] + [p for p in sys.path if p]
try:
    import cake_core
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("cake_core is importable here")

class Fake:
    # what run() reads of a torch tensor: shape, dtype, data_ptr, is_cuda, is_contiguous, get_device
    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.is_cuda = tuple(shape), dtype, True
    def data_ptr(self):
        raise SystemExit("a pointer was read: run() went past its checks")
    def is_contiguous(self):
        return True
    def get_device(self):
        return 0
    @property
    def nbytes(self):
        return 0

def tensors(B, N, K, D, x="torch.bfloat16"):
    return dict(x=Fake((B, N, D), x), c=Fake((B, K, D), "torch.bfloat16"), c_sq=Fake((B, K), "torch.float32"),
                out=Fake((B, N), "torch.int32"))
"""


def run_isolated(out: Path, body: str) -> subprocess.CompletedProcess:
    code = PRELUDE.format(out=str(out)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=out)


def one_line_error(p: subprocess.CompletedProcess, name: str) -> str:
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode != 0 and last.startswith(name), p.stderr
    return last


@pytest.fixture(scope="module")
def exported(tmp_path_factory, compile_cache):
    from warehouse.queries import export_rows
    if nvcc_path() is None:
        pytest.skip("export compiles each kernel with nvcc, absent here")
    tmp = tmp_path_factory.mktemp("export")
    land(tmp / "warehouse")
    rows = export_rows(tmp / "warehouse", PROBLEM)
    res = export_problem(get_problem(PROBLEM), rows, ExportRequest(out=tmp / "dist", name="kmeans_pkg",
                                                                   gpu_model="H200", cache_dir=compile_cache))
    return res


@needs_nvcc
def test_the_package_holds_the_manifest_cubins_and_sources(exported):
    pkg, m = exported.path, exported.manifest
    assert json.loads((pkg / "manifest.json").read_text()) == m
    assert m["gpu_model"] == "H200" and m["arch"] == "sm_90a" and m["run_ids"] == ["exp-1"]
    assert m["toolkit"]["nvcc"] and m["dims"] == ["B", "N", "K", "D"]
    assert [t["name"] for t in m["tensors"]] == ["x", "c", "c_sq", "out"]
    import hashlib
    for k in m["kernels"]:
        assert hashlib.sha256((pkg / k["cubin"]).read_bytes()).hexdigest() == k["cubin_sha256"]
        assert hashlib.sha256((pkg / k["cuda"]).read_bytes()).hexdigest() == k["cuda_sha256"]
    ws = next(k for k in m["kernels"] if k["kernel_name"] == "kmeans_assign_ws")
    assert len(ws["tensor_maps"]) == 3 and ws["smem_bytes"] > ws["smem_static_limit"]
    assert any(e["dim"] == "D" for e in ws["domain"]["extents"])
    assert next(k for k in m["kernels"] if k["kernel_name"] == "kmeans_assign_unaligned")["persistent"]
    digest = hashlib.sha256((pkg / "manifest.json").read_bytes()).hexdigest()
    assert (pkg / "__init__.py").read_text() == render_init(digest)
    assert (pkg / "cuda" / "cake.cuh").is_file()


@needs_nvcc
def test_routes_answer_in_a_fresh_interpreter_without_cake(exported):
    s = shapes()
    want = {k: FILES[v].removesuffix(".cake") for k, v in expected().items()}
    p = run_isolated(exported.path.parent, f"""
        import json, kmeans_pkg
        want = {want!r}
        for key, kernel in want.items():
            shape = {{k: int(v) for k, v in (kv.split("=") for kv in key.split(","))}}
            assert kmeans_pkg.covered(**shape), key
            r = kmeans_pkg.route_of(**shape)
            assert r["kernel_name"] == kernel and r["route"] == "exact", (key, r)
        print(json.dumps(kmeans_pkg.route_of(B=1, N=128, K=64, D=32)))
        assert not kmeans_pkg.covered(B=1, N=128, K=64, D=40)
        assert kmeans_pkg.route_of(B=1, N=128, K=64, D=40) is None
        assert not [m for m in sys.modules if m.split(".")[0] in
                    ("cake_core", "cake_cli", "warehouse", "flows", "tasks", "numpy", "duckdb", "prefect", "ray")]
    """)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r == {"kernel": r["kernel"], "kernel_name": "kmeans_assign_ws", "route": "exact", "median_ms": 0.2,
                 "peer_ms": 0.4, "held_out": False}
    assert s[5] in exported.manifest["exact"]
    assert exported.manifest["routes"][exported.manifest["exact"][s[5]]]["shapes"][s[5]]["held_out"] is True


@needs_nvcc
def test_a_tampered_manifest_is_refused_on_import_in_one_line(exported, tmp_path):
    import shutil
    copy = tmp_path / "kmeans_pkg"
    shutil.copytree(exported.path, copy)
    data = bytearray((copy / "manifest.json").read_bytes())
    i = data.index(b'"median_ms": 0.2') + len(b'"median_ms": 0.')
    data[i] = ord("1")                                              # one byte: 0.2 ms becomes 0.1 ms
    (copy / "manifest.json").write_bytes(bytes(data))
    p = run_isolated(tmp_path, "import kmeans_pkg")
    line = one_line_error(p, "kmeans_pkg.ManifestTampered")
    import re
    pinned = re.search(r'MANIFEST_SHA256: str \| None = "([0-9a-f]{64})"', (copy / "__init__.py").read_text())[1]
    assert str(copy / "manifest.json") in line and pinned in line and line.count("sha256") == 1


@needs_nvcc
def test_run_refuses_before_any_cuda_call_and_falls_back(exported):
    p = run_isolated(exported.path.parent, """
        import kmeans_pkg
        seen = []
        got = kmeans_pkg.run(fallback=lambda **t: seen.append(sorted(t)) or "served", **tensors(1, 128, 64, 40))
        assert got == "served" and seen == [["c", "c_sq", "out", "x"]]
        for bad, cls in ((dict(tensors(1, 128, 64, 32, x="torch.float32")), kmeans_pkg.BadArgument),
                         ({**tensors(1, 128, 64, 32), "extra": Fake((1,), "torch.int32")}, kmeans_pkg.BadArgument),
                         ({k: v for k, v in tensors(1, 128, 64, 32).items() if k != "out"}, kmeans_pkg.BadArgument),
                         (dict(tensors(1, 128, 64, 32), out=Fake((2, 128), "torch.int32")), kmeans_pkg.BadArgument)):
            try:
                kmeans_pkg.run(**bad)
            except cls as e:
                assert "\\n" not in str(e), e
            else:
                raise SystemExit(f"not refused: {bad}")
        assert "cuda_driver" not in sys.modules or kmeans_pkg._dispatcher._driver is None
        kmeans_pkg.run(**tensors(1, 128, 64, 40))
    """)
    line = one_line_error(p, "kmeans_pkg.ShapeNotCovered")
    assert "B=1,N=128,K=64,D=40" in line and "fallback" in line


@needs_nvcc
def test_an_out_of_domain_shape_is_refused_by_the_domain_routes(tmp_path, compile_cache):
    """Exported with --unmeasured routes and only the TMA kernel: D past its 128 (or not a multiple of 8) is
    refused by run() before any CUDA call; a shape inside its domain is served by its domain route."""
    from warehouse.queries import export_rows
    land(tmp_path / "warehouse")
    s = shapes()
    res = export_problem(get_problem(PROBLEM), export_rows(tmp_path / "warehouse", PROBLEM),
                         ExportRequest(out=tmp_path / "dist", name="ws_only", gpu_model="H200", shapes=(s[0], s[1]),
                                       domain_routes=True, cache_dir=compile_cache))
    assert [r["kind"] for r in res.manifest["routes"]] == ["exact", "domain"]
    p = run_isolated(tmp_path / "dist", """
        import ws_only
        assert ws_only.route_of(B=2, N=300, K=64, D=64)["route"] == "domain"
        assert not ws_only.covered(B=1, N=128, K=64, D=200) and not ws_only.covered(B=1, N=128, K=64, D=36)
        assert ws_only.run(fallback=lambda **t: "fallback", **tensors(1, 128, 64, 200)) == "fallback"
        ws_only.run(**tensors(1, 128, 64, 200))
    """)
    assert "D=200" in one_line_error(p, "ws_only.ShapeNotCovered")


@pytest.mark.gpu
def test_an_exported_kernel_matches_the_oracle_from_torch(tmp_path, compile_cache):
    """Each exported kernel on its routed shapes, from torch, on fresh random inputs with poisoned outputs; the rows
    are landed as measured on this GPU's model, as a package for it would be exported (another model is refused)."""
    import importlib

    import numpy as np
    import torch

    from cake_core.problems.base import input_sampler, parse_shape_key
    from cake_core.runtime.gpu import gpu_model
    from warehouse.queries import export_rows
    model = gpu_model()
    land(tmp_path / "warehouse", gpu_model=model)
    exported = export_problem(get_problem(PROBLEM), export_rows(tmp_path / "warehouse", PROBLEM),
                              ExportRequest(out=tmp_path / "dist", name="kmeans_gpu_pkg", gpu_model=model,
                                            cache_dir=compile_cache))
    assert exported.manifest["gpu_model"] == model and len(exported.manifest["exact"]) >= 5
    sys.path.insert(0, str(exported.path.parent))
    try:
        pkg = importlib.import_module("kmeans_gpu_pkg")
    finally:
        sys.path.pop(0)
    prob = get_problem(PROBLEM)
    for key in exported.manifest["exact"]:
        shape = parse_shape_key(key, prob.dims)
        inputs = prob.make_inputs(shape, input_sampler(7, shape))
        ts = {n: torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16 if prob.tensor(n).dtype == "bf16"
                                                                else torch.float32).cuda()
              for n, v in inputs.items()}
        ts["out"] = torch.full((shape["B"], shape["N"]), -0x7FFFFFFF, dtype=torch.int32, device="cuda")
        stream = torch.cuda.Stream()
        pkg.run(stream=stream, **ts)
        stream.synchronize()
        want = prob.oracle(inputs)
        ok, err, msg = prob.compare({"out": ts["out"].cpu().numpy().astype(np.int64)}, want)
        assert ok, (key, pkg.route_of(**shape), msg)
