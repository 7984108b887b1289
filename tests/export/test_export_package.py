"""An exported package, imported where Cake is not: a fresh ``python -I`` whose sys.path holds the output folder
and the standard library only. Routes answer there; a tampered manifest, a wrong dtype and a shape no route
covers are refused in one line before any CUDA call (so on a CPU machine); the fallback serves the last. The
GPU test runs an exported kernel from torch against the problem's oracle. A held-out shape is routed by its own
measurements only when asked; with ``--unmeasured`` a shape with no exact route goes to the kernel of the nearest
measured shape whose domain holds it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cake_core.export.build import ExportRequest, SelectionError, export_problem
from cake_core.export.dispatcher_template import domain_refusal
from cake_core.export.package import render_init
from cake_core.lower.compile import nvcc_path
from cake_core.problems import get_problem
from cake_core.problems.base import parse_shape_key
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
def landed(tmp_path_factory):
    """export_rows' measurements, as ``warehouse.queries.export_rows`` reads them."""
    from warehouse.queries import export_rows
    if nvcc_path() is None:
        pytest.skip("export compiles each kernel with nvcc, absent here")
    root = tmp_path_factory.mktemp("landed") / "warehouse"
    land(root)
    return export_rows(root, PROBLEM)


def export(landed, out: Path, name: str, compile_cache: Path, **request):
    return export_problem(get_problem(PROBLEM), landed, ExportRequest(out=out, name=name, gpu_model="H200",
                                                                      cache_dir=compile_cache, **request))


@pytest.fixture(scope="module")
def exported(landed, tmp_path_factory, compile_cache):
    return export(landed, tmp_path_factory.mktemp("export") / "dist", "kmeans_pkg", compile_cache)


@pytest.fixture(scope="module")
def nearest(landed, tmp_path_factory, compile_cache):
    """Every measured shape but the held-out one, and domain routes (--unmeasured)."""
    return export(landed, tmp_path_factory.mktemp("nearest") / "dist", "kmeans_near", compile_cache,
                  domain_routes=True)


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
    want = {k: FILES[v].removesuffix(".cake") for k, v in expected().items() if k != s[5]}
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
        assert not kmeans_pkg.covered(B=1, N=96, K=129, D=64)      # held out: measured, but not routed by it
        assert not [m for m in sys.modules if m.split(".")[0] in
                    ("cake_core", "cake_cli", "warehouse", "flows", "tasks", "numpy", "duckdb", "prefect", "ray")]
    """)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r == {"kernel": r["kernel"], "kernel_name": "kmeans_assign_ws", "route": "exact", "median_ms": 0.2,
                 "peer_ms": 0.4, "held_out": False, "nearest_shape": None, "nearest_ms": None}
    assert s[5] == "B=1,N=96,K=129,D=64" and s[5] not in exported.manifest["exact"]
    assert exported.held_out_left == [s[5]]


@needs_nvcc
def test_a_held_out_shape_is_routed_by_its_measurements_only_when_asked(landed, tmp_path, compile_cache):
    s = shapes()
    res = export(landed, tmp_path / "dist", "held_pkg", compile_cache, shapes=(s[5],), include_held_out=True)
    assert list(res.manifest["exact"]) == [s[5]] and res.held_out_left == []
    assert res.manifest["routes"][res.manifest["exact"][s[5]]]["shapes"][s[5]]["held_out"] is True
    with pytest.raises(SelectionError, match="all held out; pass --include-held-out"):
        export(landed, tmp_path / "dist", "held_pkg", compile_cache, shapes=(s[5],))


@needs_nvcc
def test_a_kernel_that_no_longer_lowers_is_set_aside_and_its_shapes_go_to_the_next_fastest(landed, tmp_path,
                                                                                           compile_cache):
    """The WS kernel's text, as the warehouse holds it, is refused by today's lowering (lower.acc_layout): the
    export sets it aside with the reason and routes its shapes to the next fastest kernel measured there."""
    from export_rows import ir_hash

    from cake_core.export.build import ExportError
    bad = (Path(__file__).parent / "no_longer_lowers.cake").read_text()
    ws = ir_hash("WS")
    rows = {**landed, "measurements": [m | {"ir_text": bad} if m["ir_hash"] == ws else m
                                       for m in landed["measurements"]]}
    res = export(rows, tmp_path / "dist", "aside_pkg", compile_cache)
    assert list(res.skipped) == [ws]
    assert "does not lower" in res.skipped[ws] and "mma_sync accumulator" in res.skipped[ws]
    assert res.manifest["skipped"] == [{"ir_hash": ws, "why": res.skipped[ws]}]
    assert ws not in {r.ir_hash for r in res.routes}
    s, want = shapes(), expected()
    routed = set(res.manifest["exact"])
    assert {s[0], s[1]} <= routed and routed == {k for k, v in want.items() if k != s[5]}
    # every kernel's text refused: nothing to export, said in one line
    none = {**landed, "measurements": [m | {"ir_text": bad} for m in landed["measurements"]]}
    with pytest.raises(ExportError, match="no kernel measured correct on H200 still builds"):
        export(none, tmp_path / "dist2", "none_pkg", compile_cache)


def first_domain_kernel(manifest: dict, shape: dict) -> str | None:
    """The kernel a shape with no exact route went to before the nearest-shape decision: the first domain route
    (by shapes won) whose kernel's domain holds it."""
    kernels = {k["id"]: k for k in manifest["kernels"]}
    return next((r["kernel"] for r in manifest["routes"] if r["kind"] == "domain"
                 and not domain_refusal(kernels[r["kernel"]]["domain"], shape, kernels[r["kernel"]]["consts"])), None)


@needs_nvcc
def test_an_unmeasured_shape_goes_to_the_kernel_of_the_nearest_measured_shape(nearest):
    s = shapes()
    m = nearest.manifest
    assert [r["kind"] for r in m["routes"]] == ["exact"] * 3 + ["domain"] * 3 and s[5] not in m["exact"]
    # the WS kernel won s[0] and s[1] (1,128,64,32 and 2,150,100,40), the naive one s[3] and s[4] (1,33,7,9 and
    # 2,160,150,48), the unaligned one s[2] (3,77,130,20); each asked shape is near one of them
    asked = {"B=1,N=256,K=64,D=32": ("kmeans_assign_ws", s[0], 0.2),
             "B=2,N=160,K=152,D=48": ("kmeans_assign", s[4], 1.0),
             "B=3,N=77,K=130,D=24": ("kmeans_assign_unaligned", s[2], 0.5),
             s[5]: ("kmeans_assign", s[4], 1.0)}
    p = run_isolated(nearest.path.parent, f"""
        import json, kmeans_near
        got = {{}}
        for key in {list(asked)!r}:
            shape = {{k: int(v) for k, v in (kv.split("=") for kv in key.split(","))}}
            assert kmeans_near.covered(**shape), key
            got[key] = kmeans_near.route_of(**shape)
        print(json.dumps(got))
    """)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for key, (kernel, source, ms) in asked.items():
        r = got[key]
        assert (r["kernel_name"], r["route"], r["nearest_shape"], r["nearest_ms"]) == (kernel, "nearest", source, ms)
        assert r["median_ms"] is None and r["held_out"] is False
    # the first domain route holding the shape would have sent the second to the WS kernel (it won as many shapes
    # as the naive one, faster) and the third to the naive one (the WS kernel refuses K=130)
    kid = {k["kernel_name"]: k["id"] for k in m["kernels"]}
    old = {k: first_domain_kernel(m, parse_shape_key(k, m["dims"])) for k in asked}
    assert old == {"B=1,N=256,K=64,D=32": kid["kmeans_assign_ws"], "B=2,N=160,K=152,D=48": kid["kmeans_assign_ws"],
                   "B=3,N=77,K=130,D=24": kid["kmeans_assign"], s[5]: kid["kmeans_assign"]}
    assert {k: got[k]["kernel"] for k in asked} == {k: kid[kernel] for k, (kernel, _, _) in asked.items()}


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
def test_a_route_launches_on_each_device_with_that_devices_function_and_the_streams_handle(exported):
    # libcuda replaced by a recorder: what run() loads, makes current and launches, for tensors on device 0, then on
    # device 1, then on device 0 again, on a stream object, then on another
    p = run_isolated(exported.path.parent, """
        import kmeans_pkg

        class Driver:
            def __init__(self):
                self.calls, self.loaded = [], 0
            def device_name(self, ordinal):
                return "NVIDIA H200"
            def sm_count(self, ordinal):
                return 132
            def use_device(self, ordinal):
                self.current = ordinal
            def function(self, cubin, name, smem, limit):
                self.loaded += 1
                return 1000 * (self.current + 1) + self.loaded
            def encode_tmap(self, address, spec, dims, strides, box, at):
                pass
            def memset_zero(self, address, nbytes, stream):
                pass
            def launch(self, fn, grid, threads, smem, stream, params):
                self.calls.append((self.current, fn, stream))

        class OnDevice(Fake):
            def __init__(self, shape, dtype, device):
                super().__init__(shape, dtype)
                self.device = device
            def data_ptr(self):
                return 4096 * (self.device + 1)
            def get_device(self):
                return self.device

        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle

        drv = kmeans_pkg._dispatcher._driver = Driver()
        def on(device):
            return {k: OnDevice(v.shape, v.dtype, device) for k, v in tensors(1, 128, 64, 32).items()}
        s7, s9 = Stream(7), Stream(9)
        for device, stream in ((0, s7), (1, s7), (0, s9), (0, None)):
            kmeans_pkg.run(stream=stream, **on(device))
        (d0, f0, h0), (d1, f1, h1), (d2, f2, h2), (d3, f3, h3) = drv.calls
        assert (d0, d1, d2, d3) == (0, 1, 0, 0) and f0 == f2 == f3 != f1 and f0 // 1000 == 1 and f1 // 1000 == 2
        assert (h0, h1, h2, h3) == (7, 7, 9, 0)
        assert drv.loaded == 2, drv.loaded
    """)
    assert p.returncode == 0, p.stderr


@needs_nvcc
def test_an_out_of_domain_shape_is_refused_by_the_domain_routes(landed, tmp_path, compile_cache):
    """Exported with --unmeasured routes and only the TMA and unaligned kernels: D past their 128 is refused by
    run() before any CUDA call; D=36, nearest the TMA kernel's shape but not a multiple of 8, goes to the
    unaligned kernel; a shape inside the TMA kernel's domain and nearest its shapes goes to it."""
    s = shapes()
    res = export(landed, tmp_path / "dist", "tma_unaligned", compile_cache, shapes=(s[0], s[1], s[2]),
                 domain_routes=True)
    assert [r["kind"] for r in res.manifest["routes"]] == ["exact", "exact", "domain", "domain"]
    p = run_isolated(tmp_path / "dist", f"""
        import tma_unaligned as pkg
        r = pkg.route_of(B=2, N=300, K=64, D=64)
        assert r["route"] == "nearest" and r["kernel_name"] == "kmeans_assign_ws", r
        r = pkg.route_of(B=1, N=128, K=64, D=36)
        assert r["kernel_name"] == "kmeans_assign_unaligned" and r["nearest_shape"] == {s[2]!r}, r
        assert not pkg.covered(B=1, N=128, K=64, D=200) and pkg.route_of(B=1, N=128, K=64, D=200) is None
        assert pkg.run(fallback=lambda **t: "fallback", **tensors(1, 128, 64, 200)) == "fallback"
        pkg.run(**tensors(1, 128, 64, 200))
    """)
    line = one_line_error(p, "tma_unaligned.ShapeNotCovered")
    assert "D=200" in line and "no kernel's domain" in line


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


@needs_nvcc
def test_with_cede_to_peer_the_shapes_where_the_peer_was_faster_are_left_to_the_fallback(landed, tmp_path,
                                                                                         compile_cache):
    """The peer measured 0.1 ms on shape 2, where the WS kernel measured 0.3: with --cede-to-peer that shape has no
    route (refused naming the peer's time, served by fallback=), nor has an unmeasured shape whose nearest measured
    shape it is; shape 1 (0.2 against the peer's 0.4) stays routed. Without the flag, shape 2 is routed."""
    from export_rows import ir_hash

    from cake_core.export.build import ExportError
    s = shapes()
    rows = {**landed, "peers": [p | {"median_ms": 0.1} if p["shape"] == s[1] else p for p in landed["peers"]]}
    res = export(rows, tmp_path / "dist", "ceded_pkg", compile_cache, cede_to_peer=True, domain_routes=True)
    assert res.ceded == {s[1]: {"peer": "flash_kmeans", "peer_ms": 0.1, "ours_ms": 0.3, "ir_hash": ir_hash("WS")}}
    assert res.manifest["ceded"] == res.ceded
    assert s[0] in res.manifest["exact"] and s[1] not in res.manifest["exact"]
    plain = export(rows, tmp_path / "dist2", "plain_pkg", compile_cache)
    assert s[1] in plain.manifest["exact"] and "ceded" not in plain.manifest and plain.ceded == {}
    assert s[1] == "B=2,N=150,K=100,D=40"
    p = run_isolated(res.path.parent, """
        import ceded_pkg
        assert ceded_pkg.covered(B=1, N=128, K=64, D=32) and ceded_pkg.route_of(B=1, N=128, K=64, D=32)["median_ms"] == 0.2
        for shape in (dict(B=2, N=150, K=100, D=40), dict(B=2, N=152, K=100, D=40)):   # ceded; nearest to it
            assert not ceded_pkg.covered(**shape) and ceded_pkg.route_of(**shape) is None, shape
        seen = []
        got = ceded_pkg.run(fallback=lambda **t: seen.append(1) or "peer", **tensors(2, 150, 100, 40))
        assert got == "peer" and seen == [1]
        ceded_pkg.run(**tensors(2, 150, 100, 40))
    """)
    line = one_line_error(p, "ceded_pkg.ShapeNotCovered")
    assert "left to the peer: flash_kmeans measured 0.1 ms there against this package's 0.3 ms" in line, line
    slow = {**landed, "peers": [p | {"median_ms": 0.01} for p in landed["peers"]],
            "measurements": [m for m in landed["measurements"] if m["shape"] in (s[0], s[1])]}
    with pytest.raises(ExportError, match="the peer measured faster than every kernel on each of the 2 shapes"):
        export(slow, tmp_path / "dist3", "slow_pkg", compile_cache, cede_to_peer=True)
