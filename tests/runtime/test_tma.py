"""TMA tensor maps from the host: encode_tensor_maps (CPU, the driver mocked) and the warp-specialized
GEMM seed through check_and_time on the H200 (marked `gpu`).

    PYTHONPATH=$PWD python3 -m pytest -m gpu tests/runtime/test_tma.py -q -p no:cacheprovider -o addopts=""
"""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from cake_core.ir.check import check_text
from cake_core.ir.text import parse_program
from cake_core.lower import compile_kernel, lower
from cake_core.problems import get_problem
from cake_core.runtime import tma
from cake_core.problems import corpus_file

ROOT = Path(__file__).resolve().parents[2]
WS = corpus_file("gemm_bf16_ws.cake").read_text()
N256 = corpus_file("gemm_bf16_ws_n256.cake").read_text()
GEMM = get_problem("gemm_bf16")
# ragged in M, N and K against BM=128, BN=64, BK=64 (N and K multiples of 8: TMA's 16-byte strides);
# K > 4 * BK wraps the 4-stage ring several times
WS_SHAPES = [{"M": 128, "N": 64, "K": 64}, {"M": 64, "N": 8, "K": 8}, {"M": 200, "N": 72, "K": 136},
             {"M": 129, "N": 136, "K": 520}, {"M": 1000, "N": 1000, "K": 1000},
             {"M": 2047, "N": 1032, "K": 520}, {"M": 333, "N": 512, "K": 1288}]
# the n256 seed (BN=256, grouped raster of G=16 tile rows): N ragged inside and past the 64-column blocks,
# a partial last group of tile rows (M = 2100: 17 tile rows)
N256_SHAPES = [{"M": 128, "N": 256, "K": 64}, {"M": 64, "N": 8, "K": 8}, {"M": 200, "N": 72, "K": 136},
               {"M": 129, "N": 264, "K": 520}, {"M": 333, "N": 520, "K": 392}, {"M": 2100, "N": 520, "K": 72},
               {"M": 300, "N": 1000, "K": 24}]


def _lowered(text: str = WS, name: str = "gemm_bf16_ws.cake"):
    r = lower(parse_program(text, name), name)
    assert r.ok, r.diagnostics
    return r.value


# ------------------------------------------------------------------ CPU: argument building


class _Arr:
    """A stand-in device array: shape, C-contiguity and ``.data.ptr`` as CuPy has them."""

    def __init__(self, shape, ptr, contiguous=True):
        self.shape = tuple(shape)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.data = types.SimpleNamespace(ptr=ptr)


def _fake_driver(calls: list):
    """A cuda.bindings.driver lookalike: enums as namespaces of names, the encode call recorded."""
    class Enum:
        def __getattr__(self, name):
            return name

    def encode(dtype, rank, addr, dims, strides, box, estr, inter, swz, l2, oob):
        calls.append(dict(dtype=dtype, rank=rank, addr=addr, dims=[int(d) for d in dims],
                          strides=[int(s) for s in strides], box=[int(b) for b in box],
                          estr=[int(e) for e in estr], inter=inter, swizzle=swz, l2=l2, oob=oob))
        return "OK", types.SimpleNamespace(opaque=[len(calls) * 1000 + i for i in range(16)])

    return types.SimpleNamespace(cuuint64_t=int, cuuint32_t=int, CUtensorMapDataType=Enum(),
                                 CUtensorMapInterleave=Enum(), CUtensorMapSwizzle=Enum(),
                                 CUtensorMapL2promotion=Enum(), CUtensorMapFloatOOBfill=Enum(),
                                 CUresult=types.SimpleNamespace(CUDA_SUCCESS="OK"), cuTensorMapEncodeTiled=encode)


def test_encode_builds_driver_arguments_innermost_first():
    lk = _lowered()
    shape = {"M": 300, "N": 200, "K": 136}
    arrays = {"a": _Arr((300, 136), 0x7000_0000), "b": _Arr((136, 200), 0x7100_0000), "c": _Arr((300, 200), 0)}
    calls: list = []
    maps = tma.encode_tensor_maps(lk, arrays, shape, driver=_fake_driver(calls))
    assert [c["dims"] for c in calls] == [[136, 300], [200, 136]]           # innermost (K, then N) first
    assert [c["strides"] for c in calls] == [[136 * 2], [200 * 2]]          # bytes, rank - 1 of them
    assert [c["box"] for c in calls] == [[64, 128], [64, 64]]               # IR box (128, 64) reversed
    assert [c["addr"] for c in calls] == [0x7000_0000, 0x7100_0000]
    assert all(c["dtype"] == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" and c["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_128B"
               and c["oob"] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE" and c["estr"] == [1, 1] and c["rank"] == 2
               for c in calls)
    # one 128-byte by-value scalar per map, in kernel-argument order, holding the driver's 16 words
    assert len(maps) == 2 and all(m.dtype == tma.TMAP_DTYPE and m.dtype.itemsize == 128 for m in maps)
    assert np.frombuffer(maps[1].tobytes(), "<u8").tolist() == [2000 + i for i in range(16)]


def test_specs_are_the_pure_part():
    lk = _lowered()
    specs = tma.tensor_map_specs(lk, {"a": 1024, "b": 2048}, {"M": 64, "N": 8, "K": 8})
    assert [(s.name, s.global_dims, s.global_strides, s.box_dims) for s in specs] == [
        ("cake_tmap_a_0", (8, 64), (16,), (64, 128)), ("cake_tmap_b_1", (8, 8), (16,), (64, 64))]


@pytest.mark.parametrize("shape, dim", [({"M": 128, "N": 64, "K": 100}, "K"), ({"M": 128, "N": 100, "K": 64}, "N")])
def test_unaligned_symbolic_dims_are_refused_with_a_clear_message(shape, dim):
    lk = _lowered()
    why = tma.refusal(lk, shape)
    assert why and f"{dim} % 8 == 0 for bf16" in why and "200 B" in why and "Refused before launch" in why
    calls: list = []
    arrays = {"a": _Arr((128, shape["K"]), 0x1000), "b": _Arr((shape["K"], shape["N"]), 0x2000)}
    with pytest.raises(tma.TMARefused, match=f"{dim} % 8 == 0"):
        tma.encode_tensor_maps(lk, arrays, shape, driver=_fake_driver(calls))
    assert calls == []                                                       # the driver is never asked
    assert tma.refusal(lk, {"M": 7, "N": 8, "K": 16}) is None                # M is free: not a stride


def test_static_unaligned_dims_fire_the_verifier_rule():
    diags = check_text(WS.replace("a: gmem[bf16, (M, K)]", "a: gmem[bf16, (M, 100)]"), "x.cake")
    assert any(d.rule == "tma.global_align" for d in diags)
    assert not any(d.rule == "tma.global_align" for d in check_text(WS, "x.cake"))


def test_bad_arrays_are_refused():
    lk = _lowered()
    shape = {"M": 128, "N": 64, "K": 64}
    drv = _fake_driver([])
    with pytest.raises(tma.TMARefused, match="16-byte aligned"):
        tma.encode_tensor_maps(lk, {"a": _Arr((128, 64), 0x1008), "b": _Arr((64, 64), 0x2000)}, shape, driver=drv)
    with pytest.raises(tma.TMARefused, match="C-contiguous"):
        tma.encode_tensor_maps(lk, {"a": _Arr((128, 64), 0x1000, False), "b": _Arr((64, 64), 0x2000)}, shape,
                               driver=drv)
    with pytest.raises(tma.TMARefused, match="expects"):
        tma.encode_tensor_maps(lk, {"a": _Arr((128, 32), 0x1000), "b": _Arr((64, 64), 0x2000)}, shape, driver=drv)


def test_launcher_appends_the_maps_after_pointers_and_dims(monkeypatch):
    from cake_core.runtime import gpu
    lk = _lowered()
    ptrs = iter(range(0x10000, 0x100000, 0x1000))
    fake_cp = types.SimpleNamespace(empty=lambda shape, dtype: _Arr(shape, next(ptrs)))
    calls: list = []
    monkeypatch.setattr(tma, "_driver", lambda: _fake_driver(calls))
    monkeypatch.setattr(tma, "_initialised", True)
    shape = {"M": 200, "N": 72, "K": 136}
    L = gpu._Launcher(fake_cp, None, lk, GEMM, shape, None, 1.0)
    dev = {"a": _Arr((200, 136), 0x5000_0000), "b": _Arr((136, 72), 0x6000_0000)}
    args = L.args(dev)
    assert args[0] is dev["a"] and args[1] is dev["b"] and args[2] is L.outputs["c"]
    assert [int(x) for x in args[3:6]] == [shape[d] for d in lk.dims] and all(isinstance(x, np.int32) for x in args[3:6])
    assert len(args) == 8 and all(isinstance(x, np.void) and x.dtype.itemsize == 128 for x in args[6:])
    assert [c["addr"] for c in calls] == [0x5000_0000, 0x6000_0000]
    with pytest.raises(gpu.GPURefused, match="K % 8 == 0"):
        gpu._Launcher(fake_cp, None, lk, GEMM, {"M": 64, "N": 64, "K": 60}, None, 1.0).args(
            {"a": _Arr((64, 60), 0x5000_0000), "b": _Arr((60, 64), 0x6000_0000)})


def test_module_imports_without_cuda_bindings():
    assert tma.TMAP_DTYPE.itemsize == 128
    assert tma.pack_words(list(range(16))).tobytes()[:8] == (0).to_bytes(8, "little")


def test_n256_seed_matches_the_oracle_in_the_interpreter():
    from cake_core.runtime.cpu import check_on_cpu
    checks = check_on_cpu(parse_program(N256, "gemm_bf16_ws_n256.cake"), GEMM, N256_SHAPES[:5] + N256_SHAPES[6:],
                          seed=11)
    assert all(c.correct for c in checks), [(c.shape, c.message) for c in checks if not c.correct]


def test_n256_encodes_one_narrow_box_map_for_b():
    lk = _lowered(N256, "gemm_bf16_ws_n256.cake")
    specs = tma.tensor_map_specs(lk, {"a": 1024, "b": 2048}, {"M": 300, "N": 520, "K": 136})
    assert [(s.gmem, s.global_dims, s.box_dims, s.swizzle) for s in specs] == [
        ("a", (136, 300), (64, 128), "CU_TENSOR_MAP_SWIZZLE_128B"), ("b", (520, 136), (64, 64), "CU_TENSOR_MAP_SWIZZLE_128B")]


# ------------------------------------------------------------------ GPU: the ws seed runs


@pytest.fixture(scope="module")
def ws_built(tmp_path_factory):
    lk = _lowered()
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path_factory.mktemp("cubins"))
    assert cr.ok, [d.message for d in cr.diagnostics]
    return cr.value, lk


@pytest.mark.gpu
def test_ws_seed_passes_the_gate_on_ragged_shapes(ws_built):
    from cake_core.runtime.gpu import check_and_time, gpu_model
    assert "H200" in (gpu_model() or "") or "H100" in (gpu_model() or "")
    compiled, lk = ws_built
    assert len(WS_SHAPES) >= 6
    runs = check_and_time(compiled, lk, GEMM, WS_SHAPES, seed=11, time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
    assert all(r.outcome == "checked" and r.max_error < GEMM.rtol for r in runs)


@pytest.mark.gpu
def test_ws_seed_is_timed_through_the_runtime(ws_built):
    from cake_core.runtime.gpu import check_and_time
    compiled, lk = ws_built
    (r,) = check_and_time(compiled, lk, GEMM, [{"M": 1024, "N": 1024, "K": 1024}], seed=2, reps=20, timeout_s=20)
    assert r.correct and r.outcome == "measured", r.message
    assert 0 < r.p10_ms <= r.median_ms <= r.p90_ms


@pytest.mark.gpu
def test_ws_seed_refuses_unaligned_k_before_launch(ws_built):
    from cake_core.runtime.gpu import GPURefused, check_and_time
    compiled, lk = ws_built
    with pytest.raises(GPURefused, match=r"K % 8 == 0 for bf16"):
        check_and_time(compiled, lk, GEMM, [{"M": 128, "N": 64, "K": 100}], seed=0, time=False)
    # the context is still healthy: nothing was launched
    (r,) = check_and_time(compiled, lk, GEMM, [{"M": 96, "N": 80, "K": 72}], seed=0, time=False)
    assert r.correct, r.message


@pytest.mark.gpu
def test_a_wrong_ws_kernel_fails_the_gate(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    wrong = WS.replace("store(c[tile(bid.y, BM), tile(bid.x, BN)], acc)", "store(c[tile(bid.x, BM), tile(bid.y, BN)], acc)")
    assert wrong != WS
    lk = _lowered(wrong)
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok
    runs = check_and_time(cr.value, lk, GEMM, [{"M": 256, "N": 128, "K": 64}, {"M": 96, "N": 80, "K": 72}],
                          seed=3, time=False, timeout_s=20)
    assert [r.outcome for r in runs] == ["wrong", "wrong"]


@pytest.mark.gpu
def test_n256_seed_passes_the_gate_on_ragged_shapes(tmp_path):
    from cake_core.runtime.gpu import check_and_time
    lk = _lowered(N256, "gemm_bf16_ws_n256.cake")
    cr = compile_kernel(lk, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    runs = check_and_time(cr.value, lk, GEMM, N256_SHAPES + [{"M": 1000, "N": 1000, "K": 1000}], seed=12,
                          time=False, timeout_s=20)
    bad = [(r.shape, r.outcome, r.message) for r in runs if not r.correct]
    assert not bad, bad
