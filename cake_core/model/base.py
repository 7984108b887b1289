"""The cost-model interface (as TVM MetaSchedule's): ``update / predict / score``, saved and loaded by ``artifact``.

A model sees ``Sample``s (a program at one shape on one GPU, with ptxas' resources when compiled and the
measured time when known). ``predict`` gives milliseconds (the filter's record and the error factor);
``score`` gives a ranking key comparable among samples of one shape (higher: predicted faster). ``update``
returns a *new* model fitted to measured samples (a new version; the old one is unchanged), so a
calibration is a versioned artefact like any harness change. ``artifact.save_model`` and ``load_model`` keep
a model in one file whose header names kind, version, target, GPU and feature schema.

Backends, one per module: ``analytic.AnalyticModel`` and ``learned.LearnedModel``.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Sequence

import numpy as np

from cake_core.errors import CakeError
from cake_core.ir.program import Program
from cake_core.model.features import Features, extract


class ModelFileError(CakeError):
    """A model file that cannot be used: corrupted, of another target or GPU, of an unknown kind or schema."""


class NotEnoughData(CakeError):
    """Too few measured samples (or groups) to fit a model."""


@dataclass(frozen=True)
class Sample:
    """One program at one shape on one GPU: what a model predicts (and learns from, when measured).

    ``group`` says which samples are compared with each other (the candidates of one shape in one run);
    ``run_id`` is what held-out splits go by.
    """

    program: Program
    shape: tuple[tuple[str, int], ...]
    gpu: str = "H200"
    problem: str = ""
    resources: tuple[tuple[str, int], ...] = ()        # ptxas: registers, spill_bytes, smem_bytes
    measured_ms: float | None = None
    run_id: str = ""
    attempt_id: str = ""
    timer: str = "cuda_event"
    meta: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    @staticmethod
    def of(program: Program, shape: dict[str, int], gpu: str = "H200", resources: Any = None,
           **kw: Any) -> "Sample":
        res = resources if resources is None or isinstance(resources, dict) else vars(resources)
        keep = ("registers", "spill_bytes", "smem_bytes")
        return Sample(program, tuple(shape.items()), gpu,
                      resources=tuple((k, int(res[k])) for k in keep if res and res.get(k) is not None), **kw)

    @property
    def shape_dict(self) -> dict[str, int]:
        return dict(self.shape)

    @property
    def shape_key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape)

    @property
    def group(self) -> tuple[str, str, str, str, str]:
        return (self.run_id, self.problem, self.shape_key, self.gpu, self.timer)

    @property
    def features(self) -> Features:
        return _features(self.program, self.shape, self.gpu, self.resources)


@lru_cache(maxsize=16384)
def _features(program: Program, shape: tuple, gpu: str, resources: tuple) -> Features:
    return extract(program, dict(shape), gpu, dict(resources) if resources else None)


class CostModelBase(abc.ABC):
    """A cost model for one GPU (and its target arch); see the module docstring."""

    kind: str = ""

    def __init__(self, gpu: str, version: str):
        self.gpu = gpu
        self.version = version

    @property
    def target(self) -> str:
        from cake_core.model.charges import load_gpu
        return load_gpu(self.gpu)["arch"]

    @abc.abstractmethod
    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        """Predicted milliseconds, one per sample."""

    def score(self, samples: Sequence[Sample]) -> np.ndarray:
        """Ranking key per sample, higher = predicted faster; comparable among samples of one shape."""
        return -np.log(np.maximum(self.predict(samples), 1e-12))

    def predict_ms(self, program: Program, shapes: Sequence[dict[str, int]]) -> list[float]:
        """Predicted milliseconds of ``program`` at each shape (the IR's own resource estimates)."""
        return [float(x) for x in self.predict([Sample.of(program, s, self.gpu) for s in shapes])]

    @abc.abstractmethod
    def update(self, samples: Sequence[Sample]) -> "CostModelBase":
        """A new model fitted to the measured ``samples`` (raises NotEnoughData when they are too few)."""

    @abc.abstractmethod
    def payload(self) -> dict[str, Any]:
        """What ``save`` stores besides the header (JSON-serialisable)."""

    @classmethod
    @abc.abstractmethod
    def from_payload(cls, gpu: str, version: str, payload: dict[str, Any], header: dict[str, Any]) -> "CostModelBase":
        """The model ``payload`` describes (raises ModelFileError when it does not make sense)."""

    def header_extra(self) -> dict[str, Any]:
        """Header fields beside kind, version, target, GPU and schema (training data, evaluation)."""
        return {}


def geomean(xs: Iterable[float]) -> float:
    """The geometric mean, the one Cake uses everywhere (the warehouse's views write it ``exp(avg(ln(x)))``): how
    a kernel's figures over several shapes, or speed-ups over several kernels, add up to one; nan for none."""
    v = list(xs)
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
