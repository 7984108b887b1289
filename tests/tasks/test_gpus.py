"""GPU models as Ray resources (tasks/gpus.py), without Ray: names, resources, how many runners a run gets."""
from __future__ import annotations

import pytest

from tasks.gpus import GpuModelMissing, gpu_runners, local_resources, model_name, offered, resource_name


def test_device_names_map_to_their_product_and_never_to_another():
    assert model_name("NVIDIA H200") == "H200" and model_name("H100") == "H100"
    assert model_name("NVIDIA H100 80GB HBM3") == "H100"
    assert model_name("NVIDIA GB200") == "GB200" and model_name("NVIDIA B200") == "B200"
    assert model_name("NVIDIA GeForce RTX 4090") == "NVIDIA-GeForce-RTX-4090"     # unknown: its own name
    assert resource_name("NVIDIA H200") == "gpu_model:H200"
    with pytest.raises(Exception, match="names nothing"):
        model_name("  ")


def test_local_resources_count_each_model():
    assert local_resources(["NVIDIA H200", "NVIDIA H200", "NVIDIA H100 PCIe"]) == {"gpu_model:H200": 2.0,
                                                                                  "gpu_model:H100": 1.0}
    assert local_resources([]) == {}


def test_runners_one_per_gpu_of_the_model_at_most_the_limit():
    res = {"CPU": 64.0, "GPU": 12.0, "gpu_model:H200": 8.0, "gpu_model:H100": 4.0}
    assert offered(res) == {"H100": 4, "H200": 8}
    assert gpu_runners("NVIDIA H200", res) == ("gpu_model:H200", 8)
    assert gpu_runners("H100", res) == ("gpu_model:H100", 4)
    assert gpu_runners("H200", res, limit=2) == ("gpu_model:H200", 2)
    assert gpu_runners("H200", res, limit=20) == ("gpu_model:H200", 8)


def test_a_model_the_cluster_lacks_is_refused_with_what_it_has_and_what_to_do():
    with pytest.raises(GpuModelMissing) as e:
        gpu_runners("NVIDIA B200", {"GPU": 8.0, "gpu_model:H200": 8.0}, where="the Ray cluster (2 nodes)")
    msg = str(e.value)
    assert msg.startswith("the run asks for GPU model B200 (gpu_model:B200) but the Ray cluster (2 nodes) offers "
                          "8 x H200;")
    assert "--resources='{\"gpu_model:B200\": N}'" in msg and "CAKE_GPU_MODEL" in msg and "CAKE_GPU=off" in msg
    with pytest.raises(GpuModelMissing, match="it has 4 GPU\\(s\\) without a model resource"):
        gpu_runners("H200", {"GPU": 4.0})        # nodes started without --resources
    with pytest.raises(GpuModelMissing, match="offers no GPU model resource"):
        gpu_runners("H200", {"CPU": 2.0})
