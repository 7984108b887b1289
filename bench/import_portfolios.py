"""Write the shape portfolios into the problems' shape sets, each with a seeded, recorded hold-out.

    python bench/import_portfolios.py PORTFOLIO_DIR      # the folder of kmeans_124.csv, knn_build_112.csv, ...

Sources (the paper's 434-row KNN/KMeans portfolio, FlashML-org/flashlib, branch ``nightly``, merge commit
06efbfaf, ``cake_exports/{kmeans,knn_build,knn_search}``) and the GEMM decode portfolio, which is built here from
model layer dimensions (below) before any tuning. Every shape set is written once per distinct shape (a shape
that repeats in the source keeps its labels joined); a share ``HOLD_OUT`` of each is drawn with ``SEED`` and
marked ``held_out``: never searched, reported apart. A row the problem cannot express yet is left out and
counted in the provenance note next to the set (``shapes/<set>.md``). Run again, it writes the same files.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
from pathlib import Path

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
DECODE_M = (1, 4, 16, 64)           # decode batch sizes: one sequence to a full small batch (tinygemm: M <= 64)


def _held_out(keys: list[str], name: str) -> set[str]:
    """The held-out share of ``keys``: a seeded draw, the same on every run (seeded by SEED and the set's name)."""
    words = [SEED, int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")]
    order = np.random.default_rng(words).permutation(len(keys))
    return {keys[i] for i in order[: round(HOLD_OUT * len(keys))]}


def _write(problem: str, name: str, dims: tuple[str, ...], rows: list[dict], note: str) -> tuple[int, int]:
    """One shape set ``name`` of ``problem`` (distinct shapes, labels joined) and its provenance note."""
    by_key: dict[str, dict] = {}
    for r in rows:
        key = ",".join(f"{d}={int(r[d])}" for d in dims)
        got = by_key.setdefault(key, {**{d: int(r[d]) for d in dims}, "label": [], "source": []})
        got["label"].append(r.get("label", ""))
        got["source"].append(r.get("source", ""))
    keys = list(by_key)
    held = _held_out(keys, name)
    folder = PROBLEMS / problem / "shapes"
    with (folder / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([*dims, "role", "label", "source"])
        for key in keys:
            r = by_key[key]
            w.writerow([*(r[d] for d in dims), "held_out" if key in held else "headline",
                        "+".join(sorted(set(filter(None, r["label"])))), "+".join(sorted(set(filter(None, r["source"]))))])
    (folder / f"{name}.md").write_text(
        f"# Shape set `{name}` of `{problem}`\n\n{note}\n\n"
        f"{len(keys)} distinct shapes; {len(held)} held out ({HOLD_OUT:.0%}, drawn with seed {SEED} and the set's "
        f"name by `bench/import_portfolios.py`): never searched, reported apart.\n")
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


def knn_build(src: Path) -> tuple[int, int]:
    rows = _read(src / "knn_build_112.csv")
    fit = [{**r, "N": r["M"]} for r in rows if r["B"] == "1" and r["self_search"] == "0"]
    note = (SOURCE.format(name="knn_build", records="knn_build/benchmarks/shape_records.json", rows=len(rows)) +
            ". The build lane (database norms computed inside the call), as `knn_topk` defines it: the source's "
            f"M (database rows) is N here. {len(rows) - len(fit)} rows are left out: a batch (B > 1) or a "
            "self-search, which `knn_topk` does not express.")
    return _write("knn_topk", "knn_build_portfolio", ("Q", "N", "D", "k"), fit, note)


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
    ap.add_argument("source", type=Path, help="the folder holding kmeans_124.csv and knn_build_112.csv")
    src = ap.parse_args().source
    for name, (n, held) in (("kmeans_portfolio", kmeans(src)), ("knn_build_portfolio", knn_build(src)),
                            ("gemm_decode_portfolio", gemm_decode())):
        print(f"{name}: {n} shapes, {held} held out")


if __name__ == "__main__":
    main()
