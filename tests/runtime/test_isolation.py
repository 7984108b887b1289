"""Fault isolation on the GPU through tasks.workers.ActorPool + GpuRunner (real local Ray, num_gpus=1; marked `gpu`).

A faulting (illegal address), a hanging (2e9-iteration loop) and a NaN-producing candidate between good
ones: runtime_fault, timeout (the pool kills the actor mid-kernel and a fresh one takes over), wrong
(non-finite); the good ones are measured. bench/gpu_isolation.py is the full version with timings.
"""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_isolation", ROOT / "bench" / "gpu_isolation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
def test_faults_hangs_and_nans_do_not_take_good_candidates_down():
    ray = pytest.importorskip("ray")
    from tasks.workers import ActorPool, GpuRunner
    iso = _bench()
    texts = iso.candidates()
    with tempfile.TemporaryDirectory() as cache:
        built = iso.build(texts, Path(cache))
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        pool = ActorPool(lambda: GpuRunner.remote(60.0), 1)
        timeouts = {n: (10.0 if n.startswith("hang") else 120.0) for n in texts}
        res, _ = iso.run_batch(pool, built, list(texts), [{"M": 256, "N": 192, "K": 96}, {"M": 96, "N": 80, "K": 72}],
                               seed=3, reps=20, timeouts=timeouts)
        replaced = pool.replaced
        pool.shutdown()
    finally:
        ray.shutdown()
    got = {n: r["outcome"] for n, r in res.items()}
    assert got == {"good_seed": "measured", "fault_illegal_address": "runtime_fault", "good_retile": "measured",
                   "hang_spin": "timeout", "good_mma_sync": "measured", "nan_inf_minus_inf": "wrong"}, res
    assert "illegal" in res["fault_illegal_address"]["message"].lower()
    assert "non-finite" in res["nan_inf_minus_inf"]["message"]
    assert "killed" in res["hang_spin"]["message"]
    assert replaced == 2          # one actor after the fault, one after the hang: each good one after ran on a fresh one
    for n in ("good_seed", "good_retile", "good_mma_sync"):
        assert all(r["median_ms"] > 0 for r in res[n]["runs"])
