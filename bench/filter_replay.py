"""Replay the cost filter on a run that timed every candidate (`cake evolve --no-filter`).

A `--no-filter` run still has the model rank every candidate (table ``predictions``: a score per candidate
and shape) and then times them all, so each generation can be replayed offline: which candidates would a
filter have passed, and would the generation's measured best have been among them? Four filters of ``keep``
candidates, or ``keep`` + 1:

- ``mean``: the top ``keep`` by the model's score averaged over the shapes (``cost_filter``'s order);
- ``shape-first``: the top ``keep`` by their best place on any one shape, ties by the mean score;
- ``mean+random``: ``mean`` and one more drawn at random from the rest (the expectation over 200 draws);
- ``mean+shape-winner``: ``mean`` and the rest's best placed on some one shape (``cost_filter`` with
  ``explore=1``, what a run does).

Figures per filter:
- *gen best kept*: generations whose fastest kernel (geometric mean over the shapes, timed on every search
  shape) gets through;
- *cell best kept*: (generation, shape) cells whose fastest kernel at that shape gets through;
- *kept / best*: per cell, the fastest kernel let through over the cell's fastest, as a geometric mean (1.0:
  the filter never cost anything).

    python bench/filter_replay.py --home HOME [--keep 4] [--out F.json]

HOME is a Cake home (or a folder holding ``warehouse/``) with one `--no-filter` run, e.g. the ``no-filter``
arm of ``bench/filter_pair.py``; nothing is timed and no GPU is needed. Only correct measurements count.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cake_core.model.base import geomean  # noqa: E402
from cake_core.model.filter import explore_picks, mean_order  # noqa: E402
from warehouse import Warehouse  # noqa: E402


DRAWS = 200                     # random draws the mean+random filter is averaged over


def passed(name: str, scores: np.ndarray, keep: int, draw: int = 0) -> set[int]:
    """The candidates filter ``name`` lets through (``draw``: which random draw, for mean+random)."""
    if name == "shape-first":
        return set(explore_picks(scores, range(scores.shape[0]), keep))    # every candidate by its best place
    order = mean_order(scores)
    top, rest = set(order[:keep]), order[keep:]
    if name == "mean" or not rest:
        return top
    if name == "mean+random":
        return top | {int(np.random.default_rng(draw).choice(rest))}
    return top | set(explore_picks(scores, rest, 1))


FILTERS = ("mean", "shape-first", "mean+random", "mean+shape-winner")


def generations(wh: Warehouse, run_id: str) -> list[dict]:
    """Per generation: candidate ids, their score matrix (candidates x shapes) and search medians."""
    rows = wh.query("select a.generation, p.attempt_id, p.shape, p.score from predictions p "
                    "join attempts a using (attempt_id) where a.run_id = ? and p.score is not null",
                    [run_id]).to_pylist()
    meas = wh.query("select attempt_id, shape, min(median_ms) as ms from measurements "
                    "where run_id = ? and kind = 'search' and correct group by all", [run_id]).to_pylist()
    ms = {(m["attempt_id"], m["shape"]): m["ms"] for m in meas}
    by_gen: dict[int, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        by_gen[r["generation"]][r["attempt_id"]][r["shape"]] = r["score"]
    out = []
    for g in sorted(by_gen):
        ids = sorted(by_gen[g])
        shapes = sorted({s for a in ids for s in by_gen[g][a]})
        ids = [a for a in ids if all(s in by_gen[g][a] for s in shapes)]
        scores = np.array([[by_gen[g][a][s] for s in shapes] for a in ids])
        out.append({"generation": g, "ids": ids, "shapes": shapes, "scores": scores,
                    "ms": {(a, s): ms[(a, s)] for a in ids for s in shapes if (a, s) in ms}})
    return out


def replay(gens: list[dict], keep: int) -> dict:
    res = {}
    for name in FILTERS:
        draws = DRAWS if name == "mean+random" else 1
        gen_hits = gen_n = cell_hits = cell_n = 0
        losses = []
        for d in range(draws):
            for g in gens:
                if len(g["ids"]) <= keep + 1:        # everything (or all but one) passes: nothing to grade
                    continue
                kept = {g["ids"][i] for i in passed(name, g["scores"], keep, d)}
                full = [a for a in g["ids"] if all((a, s) in g["ms"] for s in g["shapes"])]
                if full:
                    best = min(full, key=lambda a: sum(math.log(g["ms"][(a, s)]) for s in g["shapes"]))
                    gen_n += 1
                    gen_hits += best in kept
                for s in g["shapes"]:
                    timed = {a: g["ms"][(a, s)] for a in g["ids"] if (a, s) in g["ms"]}
                    kept_t = [t for a, t in timed.items() if a in kept]
                    if not timed or not kept_t:
                        continue
                    cell_n += 1
                    cell_hits += min(timed.values()) in kept_t
                    losses.append(min(kept_t) / min(timed.values()))
        res[name] = {"gen_best_kept": round(gen_hits / draws, 2), "generations": gen_n // draws,
                     "cell_best_kept": round(cell_hits / draws, 2), "cells": cell_n // draws,
                     "kept_over_best_geomean": round(geomean(losses), 4)
                     if losses else None}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", required=True, help="Cake home (or folder with warehouse/) of a --no-filter run")
    ap.add_argument("--keep", type=int, default=4, help="candidates per generation the filter passes (default 4)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    root = Path(args.home)
    if not (root / "warehouse").is_dir():
        print(f"filter_replay: no warehouse under {root}; give the Cake home of a --no-filter run", file=sys.stderr)
        return 2
    wh = Warehouse(root / "warehouse")
    runs = wh.query("select run_id, problem, shape_set, cost_filter from runs_latest").to_pylist()
    unfiltered = [r for r in runs if not r["cost_filter"]]
    if not unfiltered:
        print(f"filter_replay: {root} holds no --no-filter run (every run there filtered its candidates, so "
              "what it dropped was never timed)", file=sys.stderr)
        return 2
    report = []
    for r in unfiltered:
        res = replay(generations(wh, r["run_id"]), args.keep)
        report.append({**r, "keep": args.keep, "orders": res})
        print(f"{r['run_id']} ({r['problem']} on {r['shape_set']}), keep {args.keep}")
        print("| filter | gen best kept | cell best kept | kept / best (geomean over cells) |")
        print("|---|---:|---:|---:|")
        for name, x in res.items():
            print(f"| {name} | {x['gen_best_kept']} of {x['generations']} | {x['cell_best_kept']} of {x['cells']} "
                  f"| {x['kept_over_best_geomean']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
