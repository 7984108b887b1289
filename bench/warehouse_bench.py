"""Warehouse benchmark: ingestion rate and failure-view query time over 1 M attempts.

    python bench/warehouse_bench.py [--out bench/results/warehouse.json] [--attempts 1000000]

Ingestion: attempts/s and measurements/s through ``Warehouse.append`` (Great
Expectations validation + atomic Parquet write) at batch sizes 1, 100 and 10k.
Query: ``failure_clusters`` and ``failure_history`` over N synthetic attempts
appended in 4 batches (validation time of those batches is reported too).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from warehouse import Warehouse
from warehouse.expectations import OUTCOMES, STAGES

T0 = datetime(2026, 11, 1)


def synthetic_attempts(n: int, offset: int = 0, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed + offset)
    ids = np.arange(offset, offset + n)
    outcome_p = np.array([0.30, 0.15, 0.25, 0.08, 0.04, 0.03, 0.05, 0.10])  # OUTCOMES order
    outcome = rng.choice(len(OUTCOMES), n, p=outcome_p)
    stage_of = {"verify_failed": "verify", "compile_failed": "compile", "filtered": "cost_filter",
                "wrong": "check", "runtime_fault": "check", "timeout": "time", "checked": "check",
                "measured": "time"}
    outcomes = np.array(OUTCOMES, dtype=object)[outcome]
    stages = np.array([stage_of[o] for o in OUTCOMES], dtype=object)[outcome]
    rules = np.array([f"rule_{k}" for k in range(40)], dtype=object)[rng.integers(0, 40, n)]
    failed = np.isin(outcome, [0, 1, 3, 4, 5])
    rule = np.where(outcome == 0, rules, None)
    signature = np.where(failed, stages + ":" + np.where(outcome == 0, rules, outcomes) + ":b"
                         + rng.integers(0, 8, n).astype(str).astype(object), None)
    run = rng.integers(0, 200, n)
    created = [T0 + timedelta(seconds=int(s)) for s in rng.integers(0, 30 * 86400, n)]
    ids_s = np.char.add("att-", ids.astype(str)).astype(object)
    return pa.table({
        "attempt_id": ids_s,
        "run_id": np.char.add("run-", run.astype(str)).astype(object),
        "generation": rng.integers(0, 50, n).astype(np.int32),
        "problem": np.array(["kmeans_assign", "gemm", "softmax", "layernorm"], dtype=object)[run % 4],
        "ir_hash": np.char.add("h", ids.astype(str)).astype(object),
        "ir_text": np.full(n, "kernel k { tile m=128 n=128 k=64; stages 3; mma wgmma }", dtype=object),
        "agent": np.full(n, "tactic", dtype=object),
        "harness_version": np.ones(n, np.int32),
        "stage": stages, "outcome": outcomes, "error_rule": rule,
        "error_message": np.where(failed, "failed", None), "signature": signature,
        "features": np.full(n, '{"smem_bytes": 49152, "stages": 3}', dtype=object),
        "prompt_tokens": rng.integers(0, 2000, n).astype(np.int32),
        "completion_tokens": rng.integers(0, 800, n).astype(np.int32),
        "predicted_ms": rng.uniform(0.01, 5, n),
        "gpu_seconds": np.where(outcome >= 3, rng.uniform(0, 2, n), 0.0),
        "created_at": pa.array(created, pa.timestamp("us")),
    })


def synthetic_measurements(n: int, offset: int = 0) -> pa.Table:
    rng = np.random.default_rng(offset)
    med = rng.uniform(0.01, 5, n)
    return pa.table({
        "attempt_id": np.char.add("att-", np.arange(offset, offset + n).astype(str)).astype(object),
        "run_id": np.full(n, "run-0", dtype=object), "shape": np.full(n, "M=128,N=96,K=64", dtype=object),
        "gpu_model": np.full(n, "H200", dtype=object), "l2": np.full(n, "cold", dtype=object),
        "median_ms": med, "p10_ms": med * 0.95, "p90_ms": med * 1.1,
        "runs": np.full(n, 20, np.int32), "correct": np.ones(n, bool), "max_error": np.zeros(n),
        "kind": np.full(n, "search", dtype=object),
    })


def ingest_rate(wh: Warehouse, table: str, make, batch: int, total_rows: int) -> dict:
    batches = max(1, total_rows // batch)
    data = [make(batch, offset=10_000_000 + k * batch) for k in range(batches)]
    t = time.perf_counter()
    for b in data:
        wh.append(table, b)
    dt = time.perf_counter() - t
    return {"table": table, "batch_rows": batch, "batches": batches, "seconds": dt,
            "rows_per_s": batch * batches / dt, "ms_per_batch": 1000 * dt / batches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/warehouse.json")
    ap.add_argument("--attempts", type=int, default=1_000_000)
    ap.add_argument("--root", default=None, help="warehouse folder (default: a fresh temp dir)")
    args = ap.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="cake-wh-bench-"))
    result: dict = {"date": datetime.now().isoformat(timespec="seconds"), "machine": platform.platform(),
                    "root": str(root)}

    t = time.perf_counter()
    import warehouse.expectations as ex  # noqa: F401 - imports great_expectations
    import great_expectations  # noqa: F401
    result["ge_import_s"] = time.perf_counter() - t
    wh = Warehouse(root / "ingest")
    t = time.perf_counter()
    wh.append("attempts", synthetic_attempts(1, offset=99_000_000))  # builds the GX context + suites
    result["first_append_s"] = time.perf_counter() - t

    result["ingest"] = []
    for table, make in (("attempts", synthetic_attempts), ("measurements", synthetic_measurements)):
        for batch, total in ((1, 40), (100, 4000), (10_000, 30_000)):
            r = ingest_rate(wh, table, make, batch, total)
            result["ingest"].append(r)
            print(f"ingest {table:12s} batch {batch:>6}: {r['rows_per_s']:>10.0f} rows/s "
                  f"({r['ms_per_batch']:.1f} ms/batch)", flush=True)

    big = Warehouse(root / "big")
    n, parts = args.attempts, 4
    per = n // parts
    result["big_append"] = []
    for k in range(parts):
        tab = synthetic_attempts(per, offset=k * per)
        t = time.perf_counter()
        big.append("attempts", tab)
        dt = time.perf_counter() - t
        result["big_append"].append({"rows": per, "seconds": dt})
        print(f"append {per} attempts in one batch: {dt:.1f} s", flush=True)

    result["queries"] = {}
    for name, sql in (("failure_clusters", "select * from failure_clusters"),
                      ("failure_history", "select * from failure_history"),
                      ("count_attempts", "select count(*) from attempts")):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            out = big.query(sql)
            times.append(time.perf_counter() - t)
        result["queries"][name] = {"median_s": statistics.median(times), "rows": out.num_rows}
        print(f"query {name:18s} over {n} attempts: {statistics.median(times) * 1000:.0f} ms "
              f"({out.num_rows} rows)", flush=True)
    t = time.perf_counter()
    merged = wh.compact("attempts", grace_s=0)
    result["compact_small_files"] = {"files": merged, "seconds": time.perf_counter() - t}

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
