"""bench/gpu_references.py without a GPU (--cpu: numpy, small shapes): every row correct, the second
reference a cache hit, the JSON and the table written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_references.py"


def test_the_reference_bench_runs_on_numpy_and_reports_cache_hits(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--problems", "kmeans_assign,knn_topk",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "gpu_references.json").read_text())
    assert {x["problem"] for x in rows} == {"kmeans_assign", "knn_topk"}
    assert all(x["correct"] and x["reference_source"] == "computed" and x["cached_source"] == "cached"
               for x in rows), rows
    assert r.stdout.strip().splitlines()[-1].startswith("seconds;")
