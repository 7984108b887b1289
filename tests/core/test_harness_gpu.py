"""The corpus gate with the GPU correctness check (GPU machine: python3 -m pytest -m gpu tests -o addopts="")."""
import pytest

from cake_core.harness.gate import GateCache, corpus, gpu_check, replay
from cake_core.harness.version import HarnessSpec

pytestmark = pytest.mark.gpu


def test_every_corpus_kernel_that_passes_the_interpreter_passes_the_gpu_on_its_gate_shapes(tmp_path):
    kernels = corpus()
    cache = GateCache()
    cpu = replay(kernels, HarnessSpec(), HarnessSpec(), cache)
    gpu = replay(kernels, HarnessSpec(), HarnessSpec(), cache, gpu=gpu_check(tmp_path / "cubins"))
    assert cache.gpu, "the GPU check never ran"
    assert cpu["failing_today"] == [] and gpu["failing_today"] == [], gpu["failing_today"]
    assert gpu["replays"] == cpu["replays"] > 60
