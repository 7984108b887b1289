"""Write the shape portfolios into the problems' shape sets, each with a seeded, recorded hold-out.

    python bench/import_portfolios.py PORTFOLIO_DIR      # the folder of kmeans_124.csv, knn_build_112.csv, ...

Sources (the paper's 434-row KNN/KMeans portfolio, FlashML-org/flashlib, branch ``nightly``, merge commit
06efbfaf, ``cake_exports/{kmeans,knn_build,knn_search}``) and the GEMM decode portfolio, which is built here from
model layer dimensions (below) before any tuning. Every shape set is written once per distinct shape (a shape
that repeats in the source keeps its labels joined); a share ``HOLD_OUT`` of each is drawn with ``SEED`` and
marked ``held_out``: never searched, reported apart (a set that holds the rows of an earlier set keeps that
set's draw on them, ``INHERITED``, so a row searched before is never held out after, nor the reverse). A row
the problem cannot express yet is left out and counted in the provenance note next to the set
(``shapes/<set>.md``). Run again, it writes the same files.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "cake_core" / "problems"
HOLD_OUT = 0.15
SEED = 20261205

SOURCE = ("FlashML-org/flashlib, branch `nightly`, merge commit 06efbfaf, `cake_exports/{name}`: "
          "`{records}` ({rows} rows)")

# Decode GEMMs (C[M,N] = A[M,K] @ B[K,N], B the weights) of the linear layers of one transformer block, per
# model, from the models' published configs: hidden size H, intermediate size I, attention heads h with head dim d
# and KV heads g: qkv (N = (h + 2g) d, K = H), o (N = H, K = h d), gate+up fused (N = 2I, K = H), down (N = H, K = I).
MODELS = {
    # name: (H, I, h, g, d)
    "Llama-3.1-8B": (4096, 14336, 32, 8, 128),
    "Llama-3.1-70B": (8192, 28672, 64, 8, 128),
    "Qwen2.5-7B": (3584, 18944, 28, 4, 128),
    "Qwen2.5-32B": (5120, 27648, 40, 8, 128),
    "Mistral-Nemo-12B": (5120, 14336, 32, 8, 128),
}
KNN_DIMS = ("B", "Q", "M", "D", "k", "S")      # knn_search's dims; S: 1 a self-search, 2 a database of its own
DECODE_M = (1, 4, 16, 64)           # decode batch sizes: one sequence to a full small batch (tinygemm: M <= 64)


def _held_out(keys: list[str], name: str) -> set[str]:
    """The held-out share of ``keys``: a seeded draw, the same on every run (seeded by SEED and the set's name)."""
    words = [SEED, int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")]
    order = np.random.default_rng(words).permutation(len(keys))
    return {keys[i] for i in order[: round(HOLD_OUT * len(keys))]}


def _carried(keys: list[str], name: str, earlier: str, to_earlier: Callable[[str], str | None]) -> set[str]:
    """The held-out share of ``keys``, a set that holds the rows of an ``earlier`` set (``to_earlier``: a key's key
    there, None for a row it lacks): the earlier set's draw over its own keys, carried over row by row (so no row
    changes role), and the rows it lacks drawn apart, the same way, with this set's name."""
    old = [to_earlier(k) for k in keys]
    held = _held_out([o for o in old if o is not None], earlier)
    return {k for k, o in zip(keys, old) if o in held} | _held_out([k for k, o in zip(keys, old) if o is None], name)


def _knn_build_as_topk(key: str) -> str | None:
    """A knn_search build row's key in knn_topk's build set (B = 1 rows, N the database rows), or None."""
    s = dict((d, int(v)) for d, v in (p.split("=") for p in key.split(",")))
    return f"Q={s['Q']},N={s['M']},D={s['D']},k={s['k']}" if s["B"] == 1 else None


# a set that holds the rows of an earlier one keeps that one's held-out draw (see _carried):
# (problem, set) -> (its held-out keys, given its keys; what its provenance note says of the draw)
INHERITED = {("knn_search", "knn_build_portfolio"): (
    lambda keys: _carried(keys, "knn_search/knn_build_portfolio", "knn_build_portfolio", _knn_build_as_topk),
    "; its rows with B = 1 keep the draw of the indices-only problem's `knn_build_portfolio`, which holds them "
    "(M is N there), the rows it lacks drawn apart")}


def held_out_of(problem: str, name: str, keys: list[str]) -> set[str]:
    """The held-out rows of set ``name`` of ``problem`` whose row keys are ``keys`` (in the set's order)."""
    inherited = INHERITED.get((problem, name))
    return inherited[0](keys) if inherited is not None else _held_out(keys, name)


def _write(problem: str, name: str, dims: tuple[str, ...], rows: list[dict], note: str) -> tuple[int, int]:
    """One shape set ``name`` of ``problem`` (distinct shapes, labels joined) and its provenance note (which names no
    other problem: a problem's folder names none but itself)."""
    by_key: dict[str, dict] = {}
    for r in rows:
        key = ",".join(f"{d}={int(r[d])}" for d in dims)
        got = by_key.setdefault(key, {**{d: int(r[d]) for d in dims}, "label": [], "source": []})
        got["label"].append(r.get("label", ""))
        got["source"].append(r.get("source", ""))
    keys = list(by_key)
    held = held_out_of(problem, name, keys)
    folder = PROBLEMS / problem / "shapes"
    with (folder / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([*dims, "role", "label", "source"])
        for key in keys:
            r = by_key[key]
            w.writerow([*(r[d] for d in dims), "held_out" if key in held else "headline",
                        "+".join(sorted(set(filter(None, r["label"])))), "+".join(sorted(set(filter(None, r["source"]))))])
    how = INHERITED.get((problem, name), (None, ""))[1]
    (folder / f"{name}.md").write_text(
        f"# Shape set `{name}` of `{problem}`\n\n{note}\n\n"
        f"{len(keys)} distinct shapes; {len(held)} held out ({HOLD_OUT:.0%}, drawn with seed {SEED} and the set's "
        f"name by `bench/import_portfolios.py`{how}): never searched, reported apart.\n")
    return len(keys), len(held)


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def kmeans(src: Path) -> tuple[int, int]:
    rows = _read(src / "kmeans_124.csv")
    note = (SOURCE.format(name="kmeans", records="kmeans/benchmarks/source_shape_records.json", rows=len(rows)) +
            ". Columns B, N, K, D as the problem's dims; `label` and `source` are the paper's (why the row is "
            "there). Every row is expressible.")
    return _write("kmeans_assign", "kmeans_portfolio", ("B", "N", "K", "D"), rows, note)


def knn_build(src: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """The build portfolio twice: as knn_topk expresses it (B = 1, indices only) and whole, as knn_search does."""
    rows = _read(src / "knn_build_112.csv")
    fit = [{**r, "N": r["M"]} for r in rows if r["B"] == "1" and r["self_search"] == "0"]
    source = SOURCE.format(name="knn_build", records="knn_build/benchmarks/shape_records.json", rows=len(rows))
    note = (source + ". The build lane (database norms computed inside the call), as `knn_topk` defines it: the "
            f"source's M (database rows) is N here. {len(rows) - len(fit)} rows are left out: a batch (B = 2), which "
            "`knn_topk` does not express. Its rows with Q == N are the source's `build` rows, self-searches there (the "
            "database is the queries); here they search a database of their own of as many rows. The batched "
            "problem with distances and self-searches holds every row as the source defines it (its "
            "`knn_build_portfolio`), with these held-out rows.")
    topk = _write("knn_topk", "knn_build_portfolio", ("Q", "N", "D", "k"), fit, note)
    # the shared CSV's self_search is 0 on every build row: those records carry `build` instead (a self-search:
    # the database is the queries), true on exactly the rows with Q == M
    whole = [{**r, "S": 1 if r["Q"] == r["M"] else 2} for r in rows]
    note = (source + ". Every row, as `knn_search` defines it (queries against their database, distances and "
            "indices out, no norm given: the build lane's timed boundary, where the row norms are computed in the "
            "call). S = 1 (a self-search) on the source's `build` rows, which are exactly those with Q == M "
            "(`knn_build/generated/knn_build/demo.py`: build requires Q == M, database = query); the shared "
            "portfolio's `self_search` column is 0 on every build row. One row is float16 in the source "
            "(`build_dtype_fp16_b1_q2048_m2048_d128_k10`); it is bf16 here.")
    return topk, _write("knn_search", "knn_build_portfolio", KNN_DIMS, whole, note)


def knn_search(src: Path) -> tuple[int, int]:
    rows = _read(src / "knn_search_198.csv")
    whole = [{**r, "S": 1 if r["self_search"] == "1" else 2} for r in rows]
    note = (SOURCE.format(name="knn_search", records="knn_search/benchmarks/shape_records.json", rows=len(rows)) +
            ". The search lane (queries and database in, distances and indices out, no norm given), as `knn_search` "
            f"defines it; S = 1 on the {sum(r['S'] == 1 for r in whole)} `self_search` rows (the database is the "
            "queries, Q == M), else 2. Every row is expressible.")
    return _write("knn_search", "knn_search_portfolio", KNN_DIMS, whole, note)


def gemm_decode() -> tuple[int, int]:
    rows = []
    for model, (H, I, h, g, d) in MODELS.items():
        layers = {"qkv": ((h + 2 * g) * d, H), "o": (H, h * d), "gate_up": (2 * I, H), "down": (H, I)}
        for layer, (N, K) in layers.items():
            for M in DECODE_M:
                rows.append({"M": M, "N": N, "K": K, "label": f"{model}.{layer}", "source": "model config"})
    note = ("Decode GEMMs of one transformer block of each of " + ", ".join(MODELS) + " (their published "
            "configs: qkv, o, fused gate+up and down projections, C[M,N] = A[M,K] @ B[K,N]) at batch M in " +
            ", ".join(map(str, DECODE_M)) + "; declared before any tuning.")
    return _write("tinygemm", "gemm_decode_portfolio", ("M", "N", "K"), rows, note)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", type=Path, help="the folder holding kmeans_124.csv, knn_build_112.csv and "
                                              "knn_search_198.csv")
    src = ap.parse_args().source
    build_topk, build_whole = knn_build(src)
    for name, (n, held) in (("kmeans_assign/kmeans_portfolio", kmeans(src)),
                            ("knn_topk/knn_build_portfolio", build_topk),
                            ("knn_search/knn_build_portfolio", build_whole),
                            ("knn_search/knn_search_portfolio", knn_search(src)),
                            ("tinygemm/gemm_decode_portfolio", gemm_decode())):
        print(f"{name}: {n} shapes, {held} held out")


if __name__ == "__main__":
    main()
