"""The GPU side of the gate's references (marked `gpu`, run on the H200): inputs drawn on the device, the
fp64 reference computed there against the numpy oracle on the same inputs, the comparison on the device,
the cache, and the gate end to end (which check each shape got, a large shape checked in full).

    python3 -m pytest -m gpu tests/runtime/test_gpu_refs.py -o addopts="" -s
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from cake_core.problems import list_problems, get_problem
from cake_core.problems.base import input_sampler, to_host
from cake_core.runtime.gate import compare_to
from cake_core.runtime.references import ReferenceCache, reference
from cake_core.problems import corpus_file

PROBLEMS = {p.name: p for p in list_problems()}

pytestmark = pytest.mark.gpu

# the GPU reference and the numpy oracle are both fp64 over the same bf16 values: they agree to rounding
GPU_REF_RTOL = 1e-9
SHAPES = {"gemm_bf16": [{"M": 96, "N": 80, "K": 72}, {"M": 257, "N": 136, "K": 264}],
          "tinygemm": [{"M": 5, "N": 136, "K": 520}, {"M": 64, "N": 264, "K": 1032}],
          "kmeans_assign": [{"B": 2, "N": 150, "K": 100, "D": 40}, {"B": 3, "N": 257, "K": 516, "D": 120}],
          "kmeans_update": [{"B": 2, "N": 150, "K": 20, "D": 40}, {"B": 3, "N": 769, "K": 2049, "D": 65}],
          "knn_topk": [{"Q": 40, "N": 150, "D": 40, "k": 10}, {"Q": 129, "N": 2177, "D": 120, "k": 15}]}


def _shapes(name: str) -> list[dict]:
    """The shapes a problem's references are checked at: those above, else the first two rows of its default
    (small) shape set, so every problem, a package added later included, is checked."""
    if name in SHAPES:
        return SHAPES[name]
    p = PROBLEMS[name]
    assert p.shape_sets, f"{name} declares no shape set"
    return list(p.shape_set(p.shape_sets[0]).shapes[:2])


@pytest.fixture(scope="module")
def cp():
    from cake_core.runtime.gpu import gpu_model
    if gpu_model() is None:
        pytest.skip("no usable NVIDIA GPU here")
    import cupy
    return cupy


def _kernel_like(p, want, cp):
    """What a correct kernel writes (the reference's outputs in the kernels' dtypes), on the device."""
    dtypes = {x.name: x.dtype for x in p.tensors}
    return {n: cp.asarray(want[n]).astype(cp.int32 if dtypes[n] in ("i32", "i64") else cp.float32)
            for n in p.outputs}


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_device_inputs_are_random_seeded_and_never_zero(cp, name):
    p = PROBLEMS[name]
    shape = _shapes(name)[0]
    a = p.make_inputs(shape, input_sampler(7, shape, cp))
    b = p.make_inputs(shape, input_sampler(7, shape, cp))
    c = p.make_inputs(shape, input_sampler(8, shape, cp))
    for n in p.inputs:
        assert type(a[n]).__module__.startswith("cupy"), n
        ha = to_host(a[n])
        np.testing.assert_array_equal(ha, to_host(b[n]))
        assert not np.array_equal(ha, to_host(c[n]))
        assert np.count_nonzero(ha) > 0.5 * ha.size and np.unique(ha).size > 2, n


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_the_gpu_reference_matches_the_fp64_numpy_oracle_within_its_bound(cp, name):
    p = PROBLEMS[name]
    for shape in _shapes(name):
        dev = p.make_inputs(shape, input_sampler(3, shape, cp))
        host = {k: to_host(v) if not k.startswith("_") else v for k, v in dev.items()}
        t0 = time.perf_counter()
        g = p.oracle(dev)
        cp.cuda.Device().synchronize()
        t_gpu = time.perf_counter() - t0
        t0 = time.perf_counter()
        w = p.oracle(host)
        t_cpu = time.perf_counter() - t0
        print(f"\n{name} {shape}: GPU fp64 reference {t_gpu * 1e3:.1f} ms, numpy {t_cpu * 1e3:.1f} ms")
        for n in [k for k in w if k in p.outputs or k in ("_dmin", "_dk")]:
            gv, wv = to_host(g[n]).astype(np.float64), np.asarray(w[n], np.float64)
            if n in ("out", "idx"):
                continue          # indices: ties may resolve either way; checked by the comparison below
            err = np.abs(gv - wv).max() / max(np.abs(wv).max(), 1e-30)
            assert err <= GPU_REF_RTOL, (name, n, err)
        # the GPU's choice of indices is what the fp64 oracle accepts, at the GPU reference's own bound
        got = {n: to_host(g[n]) for n in p.outputs}      # as computed (fp64): a cast to f32 alone is 3e-8 off
        strict = dataclasses.replace(p, rtol=GPU_REF_RTOL)
        ok, err, msg = strict.compare(got, w)
        assert ok, (name, shape, msg)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_the_comparison_runs_on_the_device_and_fails_a_poisoned_output(cp, name):
    p = PROBLEMS[name]
    shape = _shapes(name)[0]
    x = p.make_inputs(shape, input_sampler(4, shape, cp))
    ref = reference(p, x, shape, 4, device="cuda:test")
    good = _kernel_like(p, ref.want, cp)
    ok, err, msg = compare_to(p, good, ref)
    assert ok and isinstance(err, float), msg
    for n in p.outputs:
        bad = {k: v.copy() for k, v in good.items()}
        flat = bad[n].reshape(-1)
        flat[flat.size // 2] = np.nan if bad[n].dtype.kind == "f" else -0x7FFFFFFF
        ok, _, msg = compare_to(p, bad, ref)
        assert not ok and msg.startswith(f"{n}:"), (n, msg)        # the failure names the poisoned output


def test_the_second_reference_is_a_cache_hit(cp, tmp_path):
    p = get_problem("kmeans_assign")
    shape = SHAPES["kmeans_assign"][1]
    cache = ReferenceCache(tmp_path / "refs")
    first = reference(p, p.make_inputs(shape, input_sampler(2, shape, cp)), shape, 2, device="cuda:test", cache=cache)
    second = reference(p, p.make_inputs(shape, input_sampler(2, shape, cp)), shape, 2, device="cuda:test", cache=cache)
    assert (first.source, second.source) == ("computed", "cached") and cache.hits == 1
    assert type(second.want["out"]).__module__.startswith("cupy")
    np.testing.assert_array_equal(to_host(first.want["out"]), to_host(second.want["out"]))


def _compile(problem, name, tmp_path):
    from cake_core.ir.text import parse_program
    from cake_core.lower import compile_kernel, lower
    prog = parse_program(corpus_file(name).read_text(), name)
    lr = lower(prog, name)
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=tmp_path)
    assert cr.ok, [d.message for d in cr.diagnostics]
    return prog, lr.value, cr.value


def test_the_gate_says_which_check_each_shape_got_and_refuses_outside_the_domain(cp, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    knn = get_problem("knn_topk")
    prog, lk, comp = _compile(knn, "knn_topk_split_pp.cake", tmp_path)
    refs = ReferenceCache(tmp_path / "refs")
    shapes = [{"Q": 129, "N": 2177, "D": 120, "k": 15}, {"Q": 130, "N": 300, "D": 64, "k": 40}]
    first = check_and_time(comp, lk, knn, shapes, seed=3, time=False, timeout_s=30, program=prog, refs=refs)
    again = check_and_time(comp, lk, knn, shapes[:1], seed=3, time=False, timeout_s=30, program=prog, refs=refs)
    ok, refused = first
    assert ok.correct and ok.check == "full" and ok.rows_checked == 129 and "1 row recomputed" in ok.perturbed, ok
    assert ok.reference == "computed" and again[0].reference == "cached" and again[0].correct
    assert refused.refused and not refused.correct and "k = 40 > 16" in refused.message
    (sub,) = check_and_time(comp, lk, knn, [{"Q": 4096, "N": 1000000, "D": 128, "k": 10}], seed=3, time=False,
                            timeout_s=120, program=prog, rows=256)
    assert sub.correct and sub.check == "rows" and sub.rows_checked == 256, sub


def test_a_headline_cell_is_checked_in_full_on_the_gpu(cp, tmp_path):
    from cake_core.runtime.gpu import check_and_time
    km = get_problem("kmeans_assign")
    prog, lk, comp = _compile(km, "kmeans_assign_ws.cake", tmp_path)
    shape = {"B": 32, "N": 65536, "K": 1024, "D": 128}
    t0 = time.perf_counter()
    (r,) = check_and_time(comp, lk, km, [shape], seed=5, time=False, timeout_s=60, program=prog,
                          refs=ReferenceCache(tmp_path / "refs"))
    took = time.perf_counter() - t0
    print(f"\nkmeans_assign B=32 N=65536 K=1024 D=128, full check on the GPU: {took:.1f} s ({r.reference}; {r.perturbed})")
    assert r.correct and r.check == "full" and r.rows_checked == 32 * 65536, r.message
