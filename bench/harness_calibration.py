"""The calibration miner and the corpus gate on GPU measurements of the whole corpus.

    # on the GPU machine: measure every corpus kernel, then mine and gate a refit (GPU check in the gate)
    bash bench/gpu.sh corpus --variants --no-peers
    PYTHONPATH=. python3 bench/harness_calibration.py --from $OUT/corpus_vs_peers.json --gpu --out $OUT
    # anywhere: the same on the H200 measurements committed under bench/results
    PYTHONPATH=. python3 bench/harness_calibration.py --out /tmp/cal

Lands each correct (kernel, shape) measurement of the given ``corpus_vs_peers`` JSON files in a fresh
warehouse under ``--out`` (``tasks.measured``: verified and predicted here, timed as measured), runs the
review's calibration miner (error classes, refit on the model, judged on held-out attempts) and the
corpus gate (verifier + interpreter, and with ``--gpu`` the GPU correctness check, on every corpus
kernel's gate shapes). Writes ``harness_calibration.json`` (the proposal, its evidence and gate report,
or why none) and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.harness.gate import GateCache, gpu_check  # noqa: E402
from cake_core.harness.review import review  # noqa: E402
from cake_core.harness.version import HarnessSpec  # noqa: E402
from tasks.harness import load_review_input  # noqa: E402
from tasks.measured import bench_rows, land_bench_rows  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="sources", nargs="*", type=Path,
                    default=sorted(RESULTS.glob("corpus-vs-peers-*.json")),
                    help="corpus_vs_peers JSON files (default: the committed H200 results)")
    ap.add_argument("--gpu", action="store_true", help="check the corpus on the GPU in the gate too")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cake-cal-"))
    out.mkdir(parents=True, exist_ok=True)
    root = out / "warehouse"
    t0 = time.perf_counter()
    rows = bench_rows(args.sources)
    landed = land_bench_rows(str(root), rows, "bench-corpus")
    t_land = time.perf_counter() - t0
    gpu = gpu_check(out / "cubins") if args.gpu else None
    t1 = time.perf_counter()
    found, skipped = review(load_review_input(str(root)), HarnessSpec(), kinds=("calibration",), cache=GateCache(),
                            gpu=gpu)
    t_review = time.perf_counter() - t1
    result = {"sources": [str(p) for p in args.sources], "measurements": len(rows), "landed": landed,
              "seconds": {"land": round(t_land, 1), "review_and_gate": round(t_review, 1)},
              "proposals": [{"title": r.proposal.title, "payload": r.proposal.payload, "evidence": r.proposal.evidence}
                            for r in found], "not_proposed": skipped}
    (out / "harness_calibration.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"{len(rows)} measurements from {len(args.sources)} files, {landed} landed ({t_land:.0f} s); "
          f"review + gate {t_review:.0f} s; full report: {out / 'harness_calibration.json'}\n")
    if not found:
        print("no calibration proposed: " + "; ".join(s["why"] for s in skipped))
        return 0
    ev = found[0].proposal.evidence
    print(f"proposal: {found[0].proposal.title}")
    print("| error class | samples | median log(pred/meas) | factor |\n|---|---:|---:|---|")
    for cls, c in ev["cluster"]["classes"].items():
        print(f"| {cls} | {c['samples']} | {c['median_log_ratio']:+.3f} | {c['factor']} |")
    j, g = ev["judged_on_held_out"], ev["gate"]
    print("\n| held out | median abs log error | rank correlation | best predicted best |\n|---|---:|---:|---:|")
    for when in ("before", "after"):
        q = j[when]
        print(f"| {when} | {q['median_abs_log_error']} | {q['rank_correlation']} | {q['best_is_predicted_best']} |")
    print(f"\npredictions changed on held out: {j['predictions_changed']} of {j['held_out_samples']}; gate: "
          f"{'passed' if g['passed'] else 'refused: ' + '; '.join(g['refusals'])} ({g['corpus']['replays']} replays"
          f"{', GPU checked' if g['gpu'] else ''}, {len(g['corpus']['failing_today'])} failing today)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
