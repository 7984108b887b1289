"""One proposal of each kind from real runs, approved by policy, and a later run that uses each (CPU).

    PYTHONPATH=. python3 bench/harness_kinds.py --out /tmp/kinds

The product path end to end, on the embedded services (a Prefect server on a free 127.0.0.1 port, a
local Ray, CPU only): ``evolve`` cold-start runs (the naive seed the only program the agent starts from) of knn_topk,
kmeans_assign and gemm_bf16 on their small shape sets (the tactic agent with its whole tactic table;
checked on the interpreter), the committed H200 measurements of the
corpus landed as measured attempts (``tasks.measured``), then the ``harness-review`` flow with the
``approve-gated`` policy (every proposal the corpus gate passes is approved, each a new version), then
one later ``evolve`` run under the last version per kind, and what it shows: the rule stopping
candidates at verify, candidates written with the composite op and checked, predictions of the refit
model, candidates made by the macro tactic. Writes ``harness_kinds.json`` (every proposal with its
evidence and gate report, and the later runs) and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = (("knn_topk", "knn_topk_small", 0), ("kmeans_assign", "kmeans_assign_small", 2), ("gemm_bf16", "gemm_small", 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _against_v0(preds: list[dict], run_id: str) -> list[dict]:
    """The seed's recorded predictions in ``run_id`` beside what the built-in model predicts."""
    from cake_core.harness.version import HarnessSpec
    from cake_core.problems import get_problem
    from cake_core.problems.base import parse_shape_key
    prob = get_problem(run_id.split("-")[0])
    seed = HarnessSpec().read(prob.seed_text())
    v0 = HarnessSpec().cost_model()
    return [{"shape": p["shape"], "model": p["model_version"], "ms": p["predicted_ms"],
             "v0_ms": v0.estimate(seed, parse_shape_key(p["shape"], prob.dims)).ms}
            for p in preds if p["run_id"] == run_id]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cake-kinds-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update({"CAKE_HOME": str(out / "home"), "CAKE_PREFECT_PORT": str(_free_port()), "CAKE_GPU": "off"})
    from cake_cli.config import load_settings
    from cake_cli.services import prefect_server, ray_runtime
    from flows.evolve import evolve_flow
    from flows.harness import harness_review_flow
    from tasks.harness import load_harness
    from tasks.measured import bench_rows, land_bench_rows
    from warehouse import Warehouse

    settings = load_settings()
    root = str(settings.warehouse_root)
    cache = str(settings.home / "cache")
    t0 = time.perf_counter()
    record: dict = {"command": " ".join(sys.argv), "runs": {}, "later": {}}
    with prefect_server(settings), ray_runtime(settings, num_gpus=0):
        for problem, shapes, seed in RUNS:
            record["runs"][problem] = evolve_flow(problem=problem, shape_set=shapes, run_id=f"{problem}-1",
                                                  generations=args.generations, population=args.population,
                                                  seed=seed, warehouse_root=root, cache_dir=cache,
                                                  cold=True)["outcomes"]
        record["measured_landed"] = land_bench_rows(root, bench_rows(sorted(RESULTS.glob("corpus-vs-peers-*.json"))),
                                                    "h200-corpus")
        t_runs = time.perf_counter() - t0
        record["review"] = harness_review_flow(warehouse_root=root, min_support=3, policy="approve-gated")
        t_review = time.perf_counter() - t0 - t_runs
        spec = load_harness(root)
        wh = Warehouse(root)
        props = {p["proposal_id"]: p for p in wh.query("select * from proposals_latest").to_pylist()}
        later = {"knn_topk": ("knn_topk_small", 1), "tinygemm": ("tinygemm_small", 4),
                 "kmeans_update": ("kmeans_update_small", 0), "gemm_bf16": ("gemm_small", 7)}
        for problem, (shapes, seed) in later.items():
            evolve_flow(problem=problem, shape_set=shapes, run_id=f"{problem}-later", generations=args.generations,
                        population=args.population, seed=seed, warehouse_root=root, cache_dir=cache, cold=True)
        rows = wh.query("select run_id, tactic, outcome, error_rule, ir_text from attempts "
                        "where run_id like '%-later'").to_pylist()
        preds = wh.query("""select a.run_id, p.model_version, p.shape, p.predicted_ms from predictions p
                            join attempts a using (attempt_id) where a.tactic = 'seed'""").to_pylist()
    rules = [r.id for r in spec.learned_rules]
    comps = [c.name for c in spec.composites]
    macros = [m.name for m in spec.macros]
    record["later"] = {
        "harness_version": spec.version,
        "stopped_by_learned_rules": sum(r["error_rule"] in rules for r in rows),
        "with_composite_calls": {"attempts": sum(any(f"{c}(" in r["ir_text"] for c in comps) for r in rows),
                                 "checked": sum(any(f"{c}(" in r["ir_text"] for c in comps) and
                                                r["outcome"] == "checked" for r in rows)},
        "with_macro_tactics": sum(any(m in (r["tactic"] or "") for m in macros) for r in rows),
        "kmeans_update_seed_predictions": _against_v0(preds, "kmeans_update-later"),
    }
    record["proposals"] = [{k: (json.loads(v) if k in ("payload", "evidence", "gate_report") and v else v)
                            for k, v in p.items()} for p in props.values()]
    record["seconds"] = {"runs": round(t_runs, 1), "review": round(t_review, 1),
                         "total": round(time.perf_counter() - t0, 1)}
    (out / "harness_kinds.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"\nruns {t_runs:.0f} s, review {t_review:.0f} s, harness v{spec.version}; full record: "
          f"{out / 'harness_kinds.json'}\n")
    print("| kind | proposal | gate | decision |\n|---|---|---|---|")
    for p in record["proposals"]:
        g = p["gate_report"] or {}
        print(f"| {p['kind']} | {p['title'][:70]} | {'passed' if g.get('passed') else 'refused'} "
              f"({g.get('seconds', 0):.0f} s) | {p['status']} |")
    lt = record["later"]
    changed = sum(abs(p["ms"] / p["v0_ms"] - 1) > 0.01 for p in lt["kmeans_update_seed_predictions"])
    print(f"\nlater runs under v{spec.version}: {lt['stopped_by_learned_rules']} candidates stopped by a learned rule, "
          f"{lt['with_composite_calls']['attempts']} written with a composite ({lt['with_composite_calls']['checked']} "
          f"checked), {lt['with_macro_tactics']} made by a macro tactic; the naive kmeans_update's predictions differ "
          f"from v0's on {changed} of {len(lt['kmeans_update_seed_predictions'])} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
