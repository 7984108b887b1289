"""A warehouse of kmeans_assign measurements with a known export: real IR texts from the problem's kernels/,
measurement rows made with tests/warehouse/wh_fixtures' helpers.

Kernels (by file) and what each shape of ``kmeans_assign_small`` should route to on the H200:

- ``kmeans_assign.cake`` (the naive seed, SEED): correct everywhere at 1.0 ms: wins shapes 4 and 5 and the
  held-out shape 6;
- ``kmeans_assign_ws.cake`` (TMA, WS): fastest on shapes 1 and 2; on shape 1 its confirmation (0.2) beats its
  search median (0.25); a graph-timed 0.001 ms on shape 3 counts for nothing (not a cold CUDA-event time);
- ``kmeans_assign_unaligned.cake`` (persistent, UNALIGNED): fastest on shape 3; 0.01 ms but wrong on shape 4;
- ``kmeans_assign_persistent.cake`` (FAILED): fastest on shape 5, but wrong when the final stage confirmed it;
- one H100 measurement, so the warehouse holds two GPU models.

Peers: ``flash_kmeans`` measured on shapes 1 and 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "warehouse"))
from wh_fixtures import T0, attempt, dataset, measurement  # noqa: E402

from cake_core.problems import get_problem  # noqa: E402
from cake_core.problems.base import shape_key  # noqa: E402

PROBLEM = "kmeans_assign"
SHAPE_SET = "kmeans_assign_small"
RUN = "exp-1"
FILES = {"SEED": "kmeans_assign.cake", "WS": "kmeans_assign_ws.cake", "UNALIGNED": "kmeans_assign_unaligned.cake",
         "FAILED": "kmeans_assign_persistent.cake"}


def shapes() -> list[str]:
    return [shape_key(s) for s in get_problem(PROBLEM).shape_set(SHAPE_SET).shapes]


def expected() -> dict[str, str]:
    """Shape key -> the kernel (FILES key) the export must route it to on the H200."""
    s = shapes()
    return {s[0]: "WS", s[1]: "WS", s[2]: "UNALIGNED", s[3]: "SEED", s[4]: "SEED", s[5]: "SEED"}


def ir_hash(name: str) -> str:
    from cake_core.ir.text import parse_program
    return parse_program(get_problem(PROBLEM).kernel_text(FILES[name])).hash


def land(root: Path, gpu_model: str = "H200") -> None:
    """Write the rows into the warehouse at ``root``, measured on ``gpu_model`` (the one H100 row stays H100)."""
    from warehouse import Warehouse

    prob = get_problem(PROBLEM)
    s = shapes()
    run = dataset()["runs"][1] | {"run_id": RUN, "problem": PROBLEM, "shape_set": SHAPE_SET}
    attempts = {}
    for i, name in enumerate(FILES):
        attempts[name] = attempt(i, RUN, 0) | {"problem": PROBLEM, "ir_text": prob.kernel_text(FILES[name]),
                                               "ir_hash": ir_hash(name)}
    aid = {n: a["attempt_id"] for n, a in attempts.items()}
    m = [measurement(aid["SEED"], RUN, k, 1.0) for k in s]
    m += [measurement(aid["WS"], RUN, s[0], 0.25), measurement(aid["WS"], RUN, s[0], 0.2, kind="confirm"),
          measurement(aid["WS"], RUN, s[1], 0.3),
          measurement(aid["WS"], RUN, s[2], 0.001) | {"timer": "cuda_graph"},
          measurement(aid["UNALIGNED"], RUN, s[2], 0.5),
          measurement(aid["UNALIGNED"], RUN, s[3], 0.01, correct=False),
          measurement(aid["FAILED"], RUN, s[4], 0.05),
          measurement(aid["SEED"], RUN, s[0], 0.9) | {"gpu_model": "H100"}]
    m = [r | {"gpu_model": gpu_model} if r["gpu_model"] == "H200" else r for r in m]
    sets = prob.shape_set(SHAPE_SET)
    shape_rows = [{"shape_set": SHAPE_SET, "problem": PROBLEM, "shape": shape_key(d), "dims": json.dumps(d),
                   "role": role} for d, role in zip(sets.shapes, sets.roles)]
    peers = [dataset()["baselines"][0] | {"run_id": RUN, "name": "flash_kmeans", "source": "peer", "shape": k,
                                          "median_ms": ms} for k, ms in ((s[0], 0.4), (s[1], 0.5))]
    checks = [{"attempt_id": aid["FAILED"], "shape": s[4], "backend": "gpu", "correct": False, "max_error": 0.5,
               "message": "wrong on fresh inputs", "kind": "confirm"}]
    wh = Warehouse(root)
    wh.append("runs", [run])
    wh.append("measurements", m)
    wh.append("shapes", shape_rows)
    wh.append("baselines", peers)
    wh.append("checks", checks)
    wh.append("attempts", list(attempts.values()))
    assert T0   # the rows' clock: wh_fixtures'
