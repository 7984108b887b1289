"""The corpus gate: replay the kernel corpus under a proposed harness.

No program that passes under the current harness may fail under the proposed
one; the report also says how many of the cluster's failing attempts the
change would have stopped before the GPU, and the GPU seconds they cost.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from cake_core.harness.version import HarnessSpec
from cake_core.ir.text import parse
from cake_core.ir.verify import verify


@dataclass
class GateReport:
    passed: bool
    corpus_size: int
    newly_failing: list[str]
    caught: int
    cluster_size: int
    gpu_seconds_saved: float

    def to_dict(self) -> dict:
        return asdict(self)


def _blocked(text: str, spec: HarnessSpec) -> bool:
    r = parse(text)
    if r.program is None:
        return True
    return any(d.is_error for d in verify(r.program, learned=spec.learned_rules))


def corpus_gate(current: HarnessSpec, proposed: HarnessSpec, corpus: list[tuple[str, str]],
                cluster: list[tuple[str, float]]) -> GateReport:
    """corpus: (name, IR text) of passing kernels; cluster: (IR text, gpu_seconds) of the failures."""
    newly = [name for name, text in corpus if not _blocked(text, current) and _blocked(text, proposed)]
    caught = [(t, s) for t, s in cluster if _blocked(t, proposed) and not _blocked(t, current)]
    return GateReport(not newly, len(corpus), newly, len(caught), len(cluster), sum(s for _, s in caught))
