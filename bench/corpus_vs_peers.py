"""Our kernels against the peers (cuBLAS via torch, flash-kmeans, torch unfused), one process, one GPU.

    PYTHONPATH=. python3 bench/corpus_vs_peers.py --out $OUT
    PYTHONPATH=. python3 bench/corpus_vs_peers.py --problems tinygemm --shapes 'M=1,N=4096,K=4096'
    PYTHONPATH=. python3 bench/corpus_vs_peers.py --problems gemm_bf16,tinygemm --program my_gemm.cake

For each problem (``--problems``, default all) and each shape of its bench set (``Problem.bench.shape_set``, rows of the ``--roles`` given, default ``headline``, and every role where the target is a geomean; ``--shapes`` replaces them):
compile our seed, the problem's best-known programs (``Problem.best_files``; ``--no-best`` leaves
them out), with ``--variants`` every other program of the problem's ``kernels/``, and every
``--program FILE`` whose parameters are the problem's (lower + nvcc,
sm_90a), check and time each with ``cake_core.runtime.gpu.check_and_time`` (fresh seeded inputs,
poisoned outputs, fp64 oracle, perturbation check, re-check after timing; CUDA events, warm-up,
L2 flushed by a 256 MiB read before every timed run, median of ≥ 20); then run every peer of the
problem (``cake_core.runtime.peers``) on the same inputs, check its output against the same oracle
(a wrong peer is timed but marked PEER WRONG, with the error), and time it with the same protocol.

Large shapes: when a shape's fp64 oracle would take long on the CPU (over ``--full-oracle-flops``
flops or ``--full-oracle-bytes`` bytes), ours and the peers are checked on a random subset of output
rows (``--subset-rows``; kmeans_assign: points, kmeans_update: clusters, gemm/knn: rows/queries)
against the oracle computed for those rows alone (``Problem.oracle_rows``); the row says so.

Per row: shape, ours ms, peer ms, speed-up (peer / ours), the floor max(flops / bf16 tensor rate, bytes / HBM
bandwidth) of the card it runs on (``cake_core/targets/gpus``: the H200's 790 TFLOP/s and 4.22 TB/s, the H100's
989 TFLOP/s and 3.35 TB/s) and the fraction of it each reaches. A short table is printed last; the rows go to
``corpus_vs_peers.json`` and ``corpus_vs_peers.md`` under ``--out`` (default $OUT) after every shape,
so a run cut short still leaves what it measured. ``--deadline-s`` skips shapes once it has passed.

``--timer graph`` times ours and the peers alike by graph replay instead: per replay, after the flush,
a CUDA graph launches the kernel (or the peer's call) back to back ``cake_core.runtime.timing.GRAPH_LAUNCHES``
times, each on its own input copy; ms per launch (see ``cake_core.runtime.gpu``). Every row records its
timer.

Last, the targets (``Problem.bench``: the reference peer of each problem, the speed-up asked for, or the
fraction of the floor that also counts): per shape, our fastest correct program against the faster
of the reference peers, and per problem the geometric mean of those ratios over the shapes run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.errors import CakeError  # noqa: E402
from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.lower import compile_kernel, lower  # noqa: E402
from cake_core.model.base import geomean  # noqa: E402
from cake_core.problems import list_problems, get_problem, shape_key  # noqa: E402
from cake_core.problems.base import parse_shape_key  # noqa: E402
from cake_core.runtime.gate import pick_rows  # noqa: E402
from cake_core.runtime.peers import PeerUnavailable, make_peer, peer_names, time_peer  # noqa: E402
from cake_core.problems import corpus_file, corpus_files  # noqa: E402
from cake_core.runtime.timing import GRAPH_LAUNCHES  # noqa: E402

PROBLEMS = {p.name: p for p in list_problems()}

# the floor's rates: the card's (main() sets them from cake_core/targets/gpus); the H200's until then
PEAK_BF16_FLOPS = 790e12      # docs/architecture.md §10: cuBLAS bf16 8192³ on this H200, upper end
PEAK_BYTES_PER_S = 4.22e12    # docs/architecture.md §10: measured copy bandwidth (read + write)


def target(problem_name: str):
    """The problem's bench target (``Problem.bench``), None where it has none."""
    return PROBLEMS[problem_name].bench if problem_name in PROBLEMS else None


def weight_floor_ms(problem_name: str, shape) -> float:
    """The target's floor: its ``floor_bytes`` at the measured bandwidth."""
    return 1e3 * target(problem_name).floor_bytes(shape) / PEAK_BYTES_PER_S


def verdicts(rows: list[dict]) -> tuple[list[str], dict]:
    """The target table (markdown lines) and its rows as data: per shape our fastest correct program
    against the fastest correct reference peer."""
    out = ["| problem | shape | ours (best) | ours ms | reference | ref ms | ref/ours | target | % floor | met |",
           "|---|---|---|---:|---|---:|---:|---|---:|---|"]
    data: dict = {}
    for row in rows:
        t = target(row["problem"])
        if t is None:
            continue
        d = data.setdefault(row["problem"], {"ratios": [], "rows": [], "missing": []})
        if row.get("skipped"):
            d["missing"].append(row["shape_key"])
            continue
        ours = [o for o in row["ours"] if o.get("correct") and o.get("median_ms")]
        refs = [p for p in row["peers"] if p.get("correct") and p.get("median_ms") and p.get("key", p["peer"]) in t.peers]
        if not ours or not refs:
            d["missing"].append(row["shape_key"])
            out.append(f"| {row['problem']} | {row['shape_key']} | {'-' if not ours else ''} | | "
                       f"{'no correct reference peer' if not refs else ''} | | | | | no |")
            continue
        o = min(ours, key=lambda r: r["median_ms"])
        p = min(refs, key=lambda r: r["median_ms"])
        ratio = p["median_ms"] / o["median_ms"]
        counted = not t.shapes or row["shape_key"] in t.shapes
        want = f">= {t.speedup:g}x"
        met = ratio >= t.speedup
        if t.floor_slack:
            wf = weight_floor_ms(row["problem"], row["shape"])
            want += f" or <= {t.floor_slack * wf:.4f} ms"
            met = met or o["median_ms"] <= t.floor_slack * wf
        d["ratios"].append(ratio)
        d["rows"].append({"shape": row["shape_key"], "ours": o["program"], "ours_ms": o["median_ms"],
                          "ref": p["peer"], "ref_ms": p["median_ms"], "ratio": ratio, "counted": counted,
                          "met": met if counted else None, "pct_floor": 100 * row["floor_ms"] / o["median_ms"]})
        out.append(f"| {row['problem']} | {row['shape_key']} | {o['program']} | {fmt_ms(o['median_ms'])} | {p['peer']} "
                   f"| {fmt_ms(p['median_ms'])} | {ratio:.3g}x | {want if counted else '(not a target row)'} "
                   f"| {100 * row['floor_ms'] / o['median_ms']:.1f}% | {('yes' if met else 'NO') if counted else '-'} |")
    for name, d in data.items():
        g = geomean(d["ratios"])
        d["geomean"] = g
        t = target(name)
        if t.geomean is not None:
            # a shape without a correct program of ours (or a reference) counts against the geomean
            gap = f"; {len(d['missing'])} without a ratio: {', '.join(d['missing'])}" if d["missing"] else ""
            met = bool(d["ratios"]) and not d["missing"] and g >= t.geomean
            out.append(f"| {name} | geomean of {len(d['ratios'])} shapes{gap} | | | | | {g:.3g}x | >= {t.geomean:g}x | "
                       f"| {'yes' if met else 'NO'} |")
    return out, data


def floor_ms(problem, shape) -> float:
    return 1e3 * max(problem.flops(shape) / PEAK_BF16_FLOPS, problem.bytes(shape) / PEAK_BYTES_PER_S)


def compile_program(path: str, text: str, cache: Path) -> dict:
    """{'ok', 'lowered', 'compiled', 'error', 'resources', 'seconds'} for one program text."""
    try:
        lr = lower(parse_program(text, path), path)
    except Exception as e:  # noqa: BLE001 - a syntax error in a --program file is reported, not raised
        return {"ok": False, "error": f"parse: {e}"}
    if not lr.ok:
        return {"ok": False, "error": "; ".join(d.format(path) for d in lr.diagnostics)}
    cr = compile_kernel(lr.value, arch="sm_90a", cache_dir=cache)
    if not cr.ok:
        return {"ok": False, "error": "; ".join(d.format(path) for d in cr.diagnostics)}
    return {"ok": True, "lowered": lr.value, "compiled": cr.value, "program": parse_program(text, path), "text": text,
            "resources": asdict(cr.value.resources),
            "seconds": cr.value.seconds, "kernel": cr.value.kernel_name}


def fits(problem, lowered) -> bool:
    names = {a.name for a in lowered.params}
    return names <= set(problem.inputs) | set(problem.outputs) and set(problem.outputs) <= names \
        and set(lowered.dims) <= set(problem.dims)


def run_ours(gpu, prog: dict, problem, n_rows, shape, args) -> dict:
    """Check and time one of our kernels on one shape (on ``n_rows`` random output rows when not None); a
    dict for the JSON row."""
    comp, lowered = prog["compiled"], prog["lowered"]
    t0 = time.perf_counter()
    try:
        # accumulating kernels (kmeans_update) are zeroed by the runtime before every launch, timed or not
        (r,) = gpu.check_and_time(comp, lowered, problem, [shape], seed=args.seed, reps=args.reps,
                                  warmup=args.warmup, timeout_s=args.timeout_s, timer=args.timer,
                                  program=prog.get("program"), rows=n_rows)
        res = asdict(r)
        if res.get("refused"):      # outside the program's domain: never launched, so not wrong either
            res.update(correct=None, outcome="refused")
    except gpu.GPURefused as e:   # refused before launch (TMA cannot describe the shape...): not run, not wrong
        res = {"correct": None, "outcome": "refused", "message": f"{type(e).__name__}: {e}", "median_ms": None,
               "max_error": None}
    except Exception as e:  # noqa: BLE001 - one kernel's failure is a row, not the end of the run
        res = {"correct": False, "outcome": "error", "message": f"{type(e).__name__}: {e}", "median_ms": None,
               "max_error": None}
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def run_peer(problem, peer_name: str, shape, inputs, rows, want, args) -> dict:
    """Check (against ``want``: the oracle, or its row subset ``rows``) and time one peer on one shape."""
    t0 = time.perf_counter()
    res: dict = {"peer": peer_name, "key": peer_name}
    peer = None
    try:
        from cake_core.runtime.timing import graph_launches  # noqa: PLC0415
        copies = graph_launches(sum(int(v.nbytes) for v in inputs.values())) if args.timer == "graph" else None
        peer = make_peer(problem, peer_name, inputs, copies=copies)
        res.update(peer=peer.peer, library=peer.library, note=peer.note, copies=peer.copies,
                   rtol=peer.rtol or problem.rtol)
        if peer.rtol is not None:    # e.g. a bf16 C where the problem's is fp32
            problem = dataclasses.replace(problem, rtol=peer.rtol)

        def check(tag: str) -> tuple[bool, float, str]:
            got = peer.fetch()
            return problem.compare(got if rows is None else problem.take_rows(got, rows, shape), want)

        import torch  # noqa: PLC0415 - make_peer succeeded, so torch is there
        if peer.reset:
            peer.reset()
        peer.run(0)
        torch.cuda.synchronize()
        ok, err, msg = check("first run")
        res.update(correct=ok, max_error=err, message=("" if ok else f"PEER WRONG: {msg}"))
        t = time_peer(peer, reps=args.reps, warmup=args.warmup, timer=args.timer)
        res.update(t)
        ok2, err2, msg2 = check("after timing")
        if not ok2:
            res.update(correct=False, message=res["message"] + f"; PEER WRONG after timing: {msg2}")
        res["max_error"] = max(err, err2)
        res["outcome"] = "measured" if (ok and ok2) else "peer_wrong"
    except PeerUnavailable as e:
        res.update(correct=None, outcome="unavailable", message=str(e), median_ms=None)
    except Exception as e:  # noqa: BLE001 - a peer that crashes is reported, the run goes on
        res.update(correct=False, outcome="error", message=f"{type(e).__name__}: {e}", median_ms=None,
                   traceback=traceback.format_exc(limit=4))
    finally:
        if peer is not None:
            peer.release()
        try:
            import torch  # noqa: PLC0415
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def fmt_ms(v) -> str:
    return "-" if v is None else (f"{v:.4f}" if v < 10 else f"{v:.1f}")


def table(rows: list[dict]) -> list[str]:
    """Markdown lines: one per (shape, our program, peer)."""
    out = ["| problem | shape | check | ours | ours ms | peer | peer ms | peer/ours | floor ms | ours %floor "
           "| peer %floor |", "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.get("skipped"):
            out.append(f"| {row['problem']} | {row['shape_key']} | skipped: {row['skipped']} | | | | | | | | |")
            continue
        fl = row["floor_ms"]
        for o in row["ours"] or [{"program": "-", "median_ms": None, "correct": None}]:
            for p in row["peers"] or [{"peer": "-", "median_ms": None}]:
                om, pm = o.get("median_ms"), p.get("median_ms")
                ok_o = "ok" if o.get("correct") else ("WRONG" if o.get("outcome") == "wrong"
                                                      else o.get("outcome") or "-")
                ok_p = "ok" if p.get("correct") else {"peer_wrong": "PEER WRONG", "unavailable": "n/a"}.get(
                    p.get("outcome"), p.get("outcome") or "-")
                out.append(
                    f"| {row['problem']} | {row['shape_key']} | {row['check']} | {o['program']} ({ok_o}) | {fmt_ms(om)}"
                    f" | {p['peer']} ({ok_p}) | {fmt_ms(pm)} | {(pm / om) if om and pm else float('nan'):.3g}x"
                    f" | {fl:.4f} | {100 * fl / om if om else float('nan'):.2f}% "
                    f"| {100 * fl / pm if pm else float('nan'):.1f}% |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--shapes", default="", help="';'-separated shape keys (one problem), e.g. 'M=1,N=4096,K=4096'")
    ap.add_argument("--roles", default="", help="shape roles of the bench set to run (default: headline, and "
                                                "every role for a problem whose target is a geomean)")
    ap.add_argument("--program", action="append", default=[], help="another Cake IR file to run (repeatable)")
    ap.add_argument("--no-seed", action="store_true", help="leave the naive seed out")
    ap.add_argument("--no-best", action="store_true", help="leave the problems' best-known programs out")
    ap.add_argument("--variants", action="store_true",
                    help="also every other program of the problem's kernels/ whose parameters fit the problem")
    ap.add_argument("--peers", default="", help="only these peers (names from cake_core.runtime.peers.PEERS)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timer", choices=("event", "graph"), default="event",
                    help="event: each launch alone between CUDA events; graph: back-to-back launches from a CUDA "
                         "graph, each on its own input copy, time per launch (ours and the peers alike)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=240.0, help="watchdog per wait of our kernels")
    ap.add_argument("--subset-rows", type=int, default=0, help="rows checked on large shapes (default per problem)")
    ap.add_argument("--full-oracle-flops", type=float, default=2e10)
    ap.add_argument("--full-oracle-bytes", type=float, default=2.5e8)
    ap.add_argument("--deadline-s", type=float, default=0, help="skip shapes once this many seconds have passed")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = ap.parse_args()
    t_start = time.perf_counter()
    problems = [get_problem(n) for n in args.problems.split(",") if n]
    if args.shapes and len(problems) != 1:
        print("--shapes needs exactly one problem in --problems", file=sys.stderr)
        return 2
    wanted = {n for n in args.peers.split(",") if n}
    known = {n for p in problems for n in peer_names(p)}
    if wanted - known:
        print(f"--peers: no peer {', '.join(sorted(wanted - known))} for {args.problems}; their peers: "
              f"{', '.join(sorted(known)) or 'none'}", file=sys.stderr)
        return 2

    from cake_core.runtime import gpu  # noqa: PLC0415
    from cake_core.targets.gpu import get_gpu, gpu_for_name  # noqa: PLC0415
    global PEAK_BF16_FLOPS, PEAK_BYTES_PER_S
    model = gpu.gpu_model()
    card = get_gpu(gpu_for_name(model))
    PEAK_BF16_FLOPS, PEAK_BYTES_PER_S = card.bf16_tensor_flops, card.hbm_bytes_per_s
    print(f"gpu: {model} (floor at {card.name}'s {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s, "
          f"{PEAK_BYTES_PER_S / 1e12:.2f} TB/s)", flush=True)
    try:
        import torch  # noqa: PLC0415
        print(f"torch {torch.__version__}, cuda {torch.version.cuda}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"torch: not importable ({e}); peers will be reported unavailable", flush=True)

    extra = [(p, Path(p).read_text()) for p in args.program]
    cache = Path(tempfile.mkdtemp(prefix="cake-cubins-"))
    rows: list[dict] = []
    programs: dict = {}
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": model, "command": " ".join(sys.argv),
              "floor": {"bf16_flops_per_s": PEAK_BF16_FLOPS, "bytes_per_s": PEAK_BYTES_PER_S},
              "protocol": ("CUDA events; warm-up; 256 MiB read before each timed run (cold, clean L2); inputs rotated "
                           "among up to 4 copies when under 64 MiB; median of >= reps") if args.timer == "event" else
                          ("CUDA graph replays of back-to-back launches, each on its own input copy (up to "
                           f"{GRAPH_LAUNCHES}); CUDA events around each replay; warm-up; 256 MiB read before "
                           "each replay (cold, clean L2); ms per launch; median of >= reps replays"),
              "timer": args.timer,
              "programs": programs, "rows": rows}

    def save() -> None:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "corpus_vs_peers.json").write_text(json.dumps(record, indent=1, default=str))
            lines, record["targets"] = verdicts(rows)
            head = [f"timer: {args.timer} ({record['protocol']})", ""]
            (args.out / "corpus_vs_peers.md").write_text("\n".join(head + table(rows) + [""] + lines) + "\n")

    for problem in problems:
        progs = []
        best = [] if args.no_best else [(f"best:{f}", corpus_file(f).read_text()) for f in problem.best_files]
        seed = [] if args.no_seed else [(f"seed:{problem.seed_file}", problem.seed_text())]
        named = {problem.seed_file, *problem.best_files}
        variants = [] if not args.variants else [(f"variant:{f.name}", f.read_text())
                                                 for f in corpus_files("*.cake") if f.name not in named]
        for label, text in seed + best + variants + extra:
            key = f"{problem.name}/{label}"
            c = compile_program(label, text, cache)
            if c["ok"] and not fits(problem, c["lowered"]):
                continue     # a --program for another problem
            # the IR text travels with its figures: a program made in the call (a chain, an evolved best carried
            # in) is in no commit, and `cake model import-bench` reads it from here
            programs[key] = {k: v for k, v in c.items() if k not in ("lowered", "compiled", "program")}
            print(f"[{problem.name}] {label}: " + (f"compiled {c['kernel']} in {c['seconds']:.1f} s, "
                                                   f"{c['resources']}" if c["ok"] else f"FAILED {c['error']}"),
                  flush=True)
            if c["ok"]:
                progs.append(("seed" if label.startswith("seed:") else Path(label.split(":")[-1]).stem, c))
        if args.shapes:
            shapes = [(parse_shape_key(k, problem.dims), "given") for k in args.shapes.split(";") if k]
        else:
            ss = problem.shape_set(problem.bench.shape_set if problem.bench else problem.shape_sets[-1])
            t = problem.bench
            # a geomean target is over the whole bench set: every role of it unless --roles narrows it
            roles = set(args.roles.split(",")) if args.roles else \
                (set(ss.roles) if t is not None and t.geomean is not None else {"headline"})
            shapes = [(s, r) for s, r in zip(ss.shapes, ss.roles) if r in roles]
        peers = [] if args.no_peers else [p for p in peer_names(problem) if not wanted or p in wanted]
        for shape, role in shapes:
            row = {"problem": problem.name, "shape": shape, "shape_key": shape_key(shape), "role": role,
                   "flops": problem.flops(shape), "bytes": problem.bytes(shape), "floor_ms": floor_ms(problem, shape),
                   "ours": [], "peers": []}
            rows.append(row)
            if args.deadline_s and time.perf_counter() - t_start > args.deadline_s:
                row["skipped"] = f"deadline ({args.deadline_s:g} s) passed"
                print(f"[{problem.name}] {row['shape_key']}: skipped, deadline passed", flush=True)
                save()
                continue
            big = problem.flops(shape) > args.full_oracle_flops or problem.bytes(shape) > args.full_oracle_bytes
            rows_sel, n_rows = None, None
            if big and problem.rows is not None:
                # our kernels: the gate checks n random rows against the fp64 reference computed on the GPU;
                # the peers: the same number of rows against the numpy oracle of those rows
                n_rows = args.subset_rows or problem.subset_rows
                rows_sel = pick_rows(problem, shape, n_rows, args.seed + 1)
                row["check"] = f"{rows_sel.size} of {problem.rows.count(shape)} rows"
            else:
                row["check"] = "full oracle"
            ts = time.perf_counter()
            for name, c in progs:
                r = run_ours(gpu, c, problem, n_rows, shape, args)
                r["program"] = name
                row["ours"].append(r)
                print(f"[{problem.name}] {row['shape_key']} ours/{name}: {r.get('outcome')} "
                      f"{fmt_ms(r.get('median_ms'))} ms ({row['check']}; {r['wall_s']} s) {r.get('message', '')}",
                      flush=True)
            try:
                gpu._cupy().get_default_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001
                pass
            if peers:
                inputs = problem.make_inputs(shape, np.random.default_rng(args.seed))
                want = problem.oracle(inputs) if rows_sel is None else problem.oracle_rows(inputs, rows_sel)
                for pn in peers:
                    r = run_peer(problem, pn, shape, inputs, rows_sel, want, args)
                    row["peers"].append(r)
                    print(f"[{problem.name}] {row['shape_key']} peer/{r['peer']}: {r.get('outcome')} "
                          f"{fmt_ms(r.get('median_ms'))} ms ({r['wall_s']} s) {r.get('message', '')}", flush=True)
                del inputs, want
            row["wall_s"] = round(time.perf_counter() - ts, 1)
            save()

    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; gpu {model}; timer {args.timer}; floor = max(flops / "
          f"{PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s, bytes / {PEAK_BYTES_PER_S / 1e12:.2f} TB/s); peer/ours > 1 means "
          "ours is faster\n")
    print("\n".join(table(rows)))
    print()
    print("\n".join(verdicts(rows)[0]))
    save()
    # exit 2 when one of ours ran and was wrong, faulted or hung; a program refused before launch on a shape
    # it does not apply to (TMA at D % 8 != 0) is a row that says so, not a failure
    ours_bad = any(o.get("correct") is False for r in rows for o in r["ours"])
    return 2 if ours_bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CakeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
