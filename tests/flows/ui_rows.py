"""A timed run's rows for the artifact and report tests: the warehouse tests' dataset plus a peer.

Run ``run-a`` (kmeans_assign, 3 generations): each generation 4 failures and one measured winner whose medians
are (1 + s) / (generation + 1) on shapes s = 0 (headline) and 1 (tail), predicted at twice that; the
hand-written kernel is measured at 0.3 ms on both shapes, the peer (added here) at 0.8 and 0.6 ms; each winner
was also checked on a strict shape of its own (added here: a shape of the kernel, not of the run).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "warehouse"))

from wh_fixtures import SHAPES, T0, dataset  # noqa: E402

from warehouse import Warehouse  # noqa: E402

PEER = {SHAPES[0]: 0.8, SHAPES[1]: 0.6}


def fill(root: Path) -> Warehouse:
    """A warehouse at ``root`` holding the dataset and the peer's rows."""
    rows = dataset()
    rows["baselines"] += [dict(run_id="run-a", name="flash_kmeans", source="peer", shape=s,
                               role="headline" if s == SHAPES[0] else "tail", gpu_model="H200", timer="cuda_event",
                               l2="cold-clean", median_ms=ms, p10_ms=ms, p90_ms=ms, runs=20, predicted_ms=None,
                               correct=True, message=None, measured_at=T0) for s, ms in PEER.items()]
    rows["checks"] += [dict(attempt_id=a["attempt_id"], shape="B=2,N=257,K=129,D=65", backend="gpu", correct=True,
                            max_error=1e-6, message="strict shape (several tiles and a tail in every dimension)",
                            kind="strict") for a in rows["attempts"] if a["outcome"] == "measured"]
    for b in rows["baselines"]:
        b["role"] = "headline" if b["shape"] == SHAPES[0] else "tail"
    wh = Warehouse(root)
    for table, batch in rows.items():
        wh.append(table, batch)
    return wh
