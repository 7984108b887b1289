"""GPU models as Ray resources (tasks/gpus.py), without starting Ray: names, resources, how many runners a run
gets, what a local Ray declares."""
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


@pytest.fixture
def fake_start(monkeypatch):
    """start_ray's calls to ray.init, recorded instead of run (a local Ray 'comes up' on 127.0.0.1)."""
    import types

    import ray
    import ray._private.ray_constants as constants

    import tasks.ray_runtime as rr

    for k, v in rr.RAY_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(rr.SINGLE_NODE_ENV, "1")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", constants.ENABLE_RAY_CLUSTER)
    for k in ("CAKE_RAY_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    calls: list[dict] = []
    monkeypatch.setattr(rr, "_init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(rr, "check_address", lambda address: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(gcs_address="127.0.0.1:6380"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr("tasks.gpus.local_gpu_names", lambda: ["NVIDIA H200", "NVIDIA H200"])
    return calls


def test_a_local_ray_of_a_flow_declares_the_machines_gpu_models_on_loopback(fake_start):
    from tasks.ray_runtime import ensure_ray

    assert ensure_ray(gpus=True)
    (kw,) = fake_start
    assert kw["resources"] == {"gpu_model:H200": 2.0} and kw["num_gpus"] == 2
    assert kw["address"] == "local" and kw["_node_ip_address"] == "127.0.0.1"


def test_a_cpu_only_ray_or_a_joined_cluster_declares_no_gpu_model(fake_start, monkeypatch):
    from tasks.ray_runtime import ensure_ray

    assert ensure_ray(gpus=False)
    assert fake_start[-1]["num_gpus"] == 0 and "resources" not in fake_start[-1]
    monkeypatch.setenv("CAKE_RAY_ADDRESS", "ray://head:10001")
    assert ensure_ray(gpus=True)            # the cluster's nodes declare their own models
    assert fake_start[-1]["address"] == "ray://head:10001"
    assert "resources" not in fake_start[-1] and "num_gpus" not in fake_start[-1]
