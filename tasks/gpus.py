"""GPU models as Ray resources: which GPUs a run gets, on this machine or on a Ray cluster.

Every node advertises its GPUs twice: Ray's own ``GPU`` count, and a custom resource per GPU model,
``gpu_model:H200`` (:data:`RESOURCE_PREFIX` + the model). A local Ray started by Cake declares the
latter from ``nvidia-smi`` (:func:`local_resources`); the nodes of a cluster are started with it
(``ray start --head --resources='{"gpu_model:H200": 8}'``). Each GPU runner asks for one ``GPU`` and one
unit of its model, so on a mixed cluster a kernel is timed on the GPU the run asked for, and a run gets
one runner per GPU of that model that the cluster offers (:func:`gpu_runners`), wherever they are.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Mapping

from cake_core.errors import CakeError
from cake_core.targets import known_gpus

RESOURCE_PREFIX = "gpu_model:"
NVIDIA_SMI_TIMEOUT_S = 20


class GpuModelMissing(CakeError):
    """The Ray cluster offers no GPU of the model a run asked for."""


def model_name(device_name: str) -> str:
    """The model a device name names: a known product (``NVIDIA H200`` -> ``H200``), else the device name
    with runs of other characters than letters, digits, ``.`` and ``-`` turned into ``-``
    (``NVIDIA GeForce RTX 4090`` -> ``NVIDIA-GeForce-RTX-4090``): never another product's name."""
    upper = device_name.upper()
    for name in sorted(known_gpus(), key=lambda n: -len(n)):
        if re.search(rf"(^|[^A-Z0-9]){re.escape(name.upper())}($|[^A-Z0-9])", upper):
            return name
    cleaned = re.sub(r"[^A-Za-z0-9.\-]+", "-", device_name.strip()).strip("-")
    if not cleaned:
        raise CakeError(f"GPU model {device_name!r} names nothing; name a model such as H200")
    return cleaned


def resource_name(device_name: str) -> str:
    """The Ray resource of a device name's model: ``gpu_model:H200``."""
    return RESOURCE_PREFIX + model_name(device_name)


def local_gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs on this machine (``['NVIDIA H200']``, one per GPU); [] if none or no driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def local_resources(device_names: list[str]) -> dict[str, float]:
    """The custom resources a local Ray declares for these GPUs: ``{"gpu_model:H200": 2.0}``."""
    out: dict[str, float] = {}
    for name in device_names:
        key = resource_name(name)
        out[key] = out.get(key, 0.0) + 1.0
    return out


def offered(resources: Mapping[str, float]) -> dict[str, int]:
    """GPUs per model in a Ray resource table (``ray.cluster_resources()``): ``{"H200": 8}``."""
    return {k[len(RESOURCE_PREFIX):]: int(v) for k, v in sorted(resources.items())
            if k.startswith(RESOURCE_PREFIX) and int(v) >= 1}


def _describe(models: dict[str, int]) -> str:
    return ", ".join(f"{n} x {m}" for m, n in models.items()) or "no GPU model resource"


def gpu_runners(asked: str, resources: Mapping[str, float], *, limit: int | None = None,
                where: str = "the Ray cluster") -> tuple[str, int]:
    """How many GPU runners a run asking for ``asked`` (a model or a device name) gets: one per GPU of that
    model in ``resources`` (and per Ray ``GPU``), at most ``limit``.

    Returns
    -------
    (resource, count)
        The resource each runner requests (``gpu_model:H200``) and the number of runners.

    Raises
    ------
    GpuModelMissing
        ``resources`` hold no GPU of that model: the message says what was asked, what is offered, what to do.
    """
    key = resource_name(asked)
    models = offered(resources)
    have = min(models.get(key[len(RESOURCE_PREFIX):], 0), int(resources.get("GPU", 0)))
    if have < 1:
        gpus = int(resources.get("GPU", 0))
        untagged = f"; it has {gpus} GPU(s) without a model resource" if gpus and not models else ""
        raise GpuModelMissing(
            f"the run asks for GPU model {key[len(RESOURCE_PREFIX):]} ({key}) but {where} offers "
            f"{_describe(models)}{untagged}; start its GPU nodes with `ray start ... --resources="
            f"'{{\"{key}\": N}}'` (N: the node's GPUs of that model), set CAKE_GPU_MODEL to a model it offers, "
            f"or CAKE_GPU=off to check on the CPU")
    return key, have if limit is None else max(1, min(have, limit))

