"""An exported package (``cake export``) over every row of a portfolio, beside the problem's peer, on one GPU.

    python3 bench/portfolio_dispatch.py DIST/PKG --problem kmeans_assign --shapes kmeans_portfolio \\
        --peer flash_kmeans --out DIR [--reps 20] [--seed 11]

Per row of the shape set (every role; held-out rows reported apart):

- ``covered(**shape)`` and ``route_of(**shape)``: the route the package takes, or its one-line refusal;
- a covered row: the gate's inputs for (``--seed``, shape), drawn on the device (fresh, never the search's), the
  outputs poisoned, one ``run(stream=...)`` from torch, compared with the fp64 oracle (every row, or the gate's
  row subset on a shape too large for it); then ``run`` timed with the peers' protocol (CUDA events, warm-up, L2
  flushed before each run, median of ``--reps``) and checked again after the timed runs;
- a row no route covers: ``run`` must raise ``ShapeNotCovered`` (its line is kept) and ``run(fallback=...)`` must
  call the fallback; the fallback a user would name, the peer, is what serves it (its time, speed-up 1x);
- the peer (``--peer``) on the same inputs, checked against the same oracle and timed the same way.

Writes ``portfolio_dispatch.json`` and ``portfolio_dispatch.md`` under ``--out`` after every row (a cut-short call
keeps what it measured) and prints the summary last: rows, covered, wrong, refused; the geomean of peer / ours over
every row (a refused row counts 1x: the fallback is the peer), over the covered rows, and over the held-out rows
apart; the rows below 1x.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.model.base import geomean as model_geomean  # noqa: E402
from cake_core.pipeline.execute import gate_rows  # noqa: E402
from cake_core.errors import CakeError  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402
from cake_core.problems.base import shape_key  # noqa: E402
from cake_core.problems.peer import PeerRun, to_device  # noqa: E402
from cake_core.runtime.gate import compare_to  # noqa: E402
from cake_core.runtime.gpu import device_kind, device_reference  # noqa: E402
from cake_core.runtime.peers import measure_peer, time_peer  # noqa: E402

TORCH = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "i32": "int32", "i64": "int64", "bool": "bool"}
POISON = {"f32": float("nan"), "f16": float("nan"), "bf16": float("nan"), "i32": -0x7FFFFFFF, "i64": -(2 ** 62),
          "bool": True}


def geomean(xs: list[float | None]) -> float | None:
    """The project's geomean of the figures given (None where there is none)."""
    xs = [x for x in xs if x]
    return model_geomean(xs) if xs else None


def load_package(path: Path):
    sys.path.insert(0, str(path.parent))
    try:
        return importlib.import_module(path.name)
    finally:
        sys.path.pop(0)


def tensors_for(torch, pkg, manifest: dict, problem, shape: dict, inputs: dict) -> dict:
    """The package's arguments at ``shape``: the inputs (the gate's device draw) and poisoned outputs."""
    env = {**manifest["consts"], **shape}
    out = {}
    for spec in manifest["tensors"]:
        dtype = getattr(torch, TORCH[spec["dtype"]])
        if spec["name"] in inputs:
            out[spec["name"]] = to_device(torch, inputs[spec["name"]], dtype)
        else:
            dims = tuple(pkg.evaluate(e, env) for e in spec["shape"])
            fill = 0 if spec["name"] in problem.zeroed_outputs else POISON[spec["dtype"]]
            out[spec["name"]] = torch.full(dims, fill, dtype=dtype, device="cuda")
    for x in pkg._the().scalars:
        out[x] = shape[x]
    return out


def outputs_of(cp, torch, problem, ts: dict) -> dict:
    got = {}
    for name in problem.outputs + problem.states:
        t = ts[name]
        got[name] = cp.asarray(t.float() if t.dtype == torch.bfloat16 else t)
    return got


def measure_row(args, torch, cp, pkg, manifest, problem, shape: dict) -> dict:
    row: dict = {"shape": shape_key(shape), "covered": bool(pkg.covered(**shape))}
    rows = gate_rows(problem, shape)
    inputs, ref = device_reference(cp, problem, shape, args.seed, device_kind(), None, rows)
    ts = tensors_for(torch, pkg, manifest, problem, shape, inputs)
    # the package runs on a side stream (it must honour ``stream=``), ordered after the inputs' copies and the
    # outputs' poison, which torch queued on its current stream
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    if not row["covered"]:
        try:
            pkg.run(stream=stream, **ts)
            row.update(outcome="served_uncovered", message="run() served a shape covered() refused")
        except pkg.ShapeNotCovered as e:
            called = []
            pkg.run(stream=stream, fallback=lambda **a: called.append(sorted(a)), **ts)
            row.update(outcome="refused", message=f"ShapeNotCovered: {e}", fallback_called=bool(called))
    else:
        route = pkg.route_of(**shape)
        row["route"] = route.get("kernel") if isinstance(route, dict) else str(route)
        pkg.run(stream=stream, **ts)
        stream.synchronize()
        ok, err, msg = compare_to(problem, outputs_of(cp, torch, problem, ts), ref)
        row.update(correct=bool(ok), max_error=float(err), message=msg)
        if ok:
            run = PeerRun(problem.name, f"export {manifest['package']}", "", copies=1,
                          run=lambda r: pkg.run(stream=torch.cuda.current_stream(), **ts),
                          fetch=lambda: {})
            t = time_peer(run, reps=args.reps)
            ok2, err2, msg2 = compare_to(problem, outputs_of(cp, torch, problem, ts), ref)
            row.update(ours_ms=t["median_ms"], ours_p10_ms=t["p10_ms"], ours_p90_ms=t["p90_ms"],
                       correct=bool(ok2), max_error=max(float(err), float(err2)), message=msg2 or msg)
        row["outcome"] = "measured" if row["correct"] else "wrong"
    del ts
    if args.peer:
        try:
            m = measure_peer(problem, args.peer, shape, args.seed, reps=args.reps, rows=rows)
            row.update(peer_ms=m.timing["median_ms"], peer_correct=bool(m.correct))
        except Exception as e:  # noqa: BLE001 - a peer that cannot run a row is reported, the sweep goes on
            row.update(peer_ms=None, peer_correct=False, peer_error=f"{type(e).__name__}: {e}"[:300])
    peer = row.get("peer_ms") if row.get("peer_correct") else None
    if row["outcome"] == "measured" and peer:
        row["speedup"] = peer / row["ours_ms"]
    elif row["outcome"] == "refused" and peer:
        row["speedup"] = 1.0          # the fallback (the peer) serves it
    return row


def summary(rows: list[dict], roles: dict[str, str]) -> dict:
    def part(rs: list[dict]) -> dict:
        return {"rows": len(rs), "covered": sum(r["covered"] for r in rs),
                "wrong": sum(r["outcome"] in ("wrong", "served_uncovered") for r in rs),
                "refused": sum(r["outcome"] == "refused" for r in rs),
                "errors": sum(r["outcome"] == "error" for r in rs),
                "geomean_all": geomean([r.get("speedup") for r in rs]),
                "geomean_covered": geomean([r.get("speedup") for r in rs if r["outcome"] == "measured"]),
                "below_1x": [r["shape"] for r in rs if r["outcome"] == "measured" and r.get("speedup", 1) < 1]}
    searched = [r for r in rows if roles[r["shape"]] != "held_out"]
    held = [r for r in rows if roles[r["shape"]] == "held_out"]
    return {"all": part(rows), "searched": part(searched), "held_out": part(held)}


def fmt(v, spec=".4g") -> str:
    return "-" if v is None else format(v, spec)


def markdown(meta: dict, rows: list[dict], roles: dict[str, str], s: dict) -> str:
    out = [f"# {meta['package']} over {meta['problem']}/{meta['shapes']} on {meta['gpu']}", "",
           f"{meta['date']}; peer `{meta['peer']}`; inputs seed {meta['seed']}; {meta['reps']} timed runs a row "
           "(CUDA events, L2 flushed).", "",
           "| part | rows | covered | wrong | refused | errors | geomean peer/ours (refused = 1x) | geomean covered "
           "| below 1x |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in ("all", "searched", "held_out"):
        p = s[k]
        out.append(f"| {k} | {p['rows']} | {p['covered']} | {p['wrong']} | {p['refused']} | {p['errors']} | "
                   f"{fmt(p['geomean_all'], '.3f')} | {fmt(p['geomean_covered'], '.3f')} | {len(p['below_1x'])} |")
    out += ["", "| shape | role | route | outcome | ours ms | peer ms | peer/ours | note |",
            "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        note = r.get("message") or r.get("peer_error") or ""
        out.append(f"| {r['shape']} | {roles[r['shape']]} | {r.get('route', '-')} | {r['outcome']} | "
                   f"{fmt(r.get('ours_ms'))} | {fmt(r.get('peer_ms'))} | {fmt(r.get('speedup'), '.3f')} | "
                   f"{note[:120]} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("package", type=Path, help="the exported package's folder (DIST/NAME)")
    ap.add_argument("--problem", required=True)
    ap.add_argument("--shapes", required=True, help="a shape set of the problem (or a CSV file)")
    ap.add_argument("--peer", default="", help="the peer each row is measured against (Problem.peers)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=11, help="the inputs' seed (not the search's)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()

    try:
        problem = get_problem(args.problem)
        sset = problem.shape_set(args.shapes)
    except CakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (args.package / "manifest.json").is_file():
        print(f"error: {args.package} holds no exported package (no manifest.json); export one with `cake export "
              f"{args.problem} --shapes {args.shapes} --out DIST`", file=sys.stderr)
        return 2

    import cupy as cp
    import torch

    pkg = load_package(args.package.resolve())
    manifest = json.loads((args.package / "manifest.json").read_text())
    roles = {shape_key(s): role for s, role in zip(sset.shapes, sset.roles)}
    meta = {"package": args.package.name, "problem": problem.name, "shapes": sset.name, "peer": args.peer,
            "gpu": torch.cuda.get_device_name(0), "seed": args.seed, "reps": args.reps,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "manifest_gpu": manifest["gpu_model"]}
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.time()
    for i, shape in enumerate(sset.shapes):
        try:
            row = measure_row(args, torch, cp, pkg, manifest, problem, dict(shape))
        except Exception as e:  # noqa: BLE001 - one row's failure is reported, the sweep goes on
            row = {"shape": shape_key(shape), "covered": bool(pkg.covered(**shape)), "outcome": "error",
                   "message": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        print(f"[{i + 1}/{len(sset.shapes)}] {row['shape']} {roles[row['shape']]} {row['outcome']} "
              f"ours {fmt(row.get('ours_ms'))} peer {fmt(row.get('peer_ms'))} x{fmt(row.get('speedup'), '.3f')}",
              flush=True)
        s = summary(rows, roles)
        (args.out / "portfolio_dispatch.json").write_text(json.dumps({**meta, "summary": s, "rows": rows},
                                                                     indent=1, default=str))
        (args.out / "portfolio_dispatch.md").write_text(markdown(meta, rows, roles, s))
    s = summary(rows, roles)
    print(f"{len(rows)} rows in {time.time() - t0:.0f} s")
    for k in ("all", "searched", "held_out"):
        p = s[k]
        print(f"{k:9} rows {p['rows']:4} covered {p['covered']:4} wrong {p['wrong']} refused {p['refused']:4} "
              f"errors {p['errors']} "
              f"geomean {fmt(p['geomean_all'], '.3f')} (covered {fmt(p['geomean_covered'], '.3f')}) "
              f"below 1x {len(p['below_1x'])}")
    return 1 if s["all"]["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
