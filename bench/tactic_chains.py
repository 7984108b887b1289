"""Kernels made by chains of structural tactics from each problem's naive seed, written as IR files.

    python3 bench/tactic_chains.py --out DIR            # writes DIR/<problem>__<chain>.cake, one per chain
    python3 bench/corpus_vs_peers.py --problems kmeans_assign --program DIR/kmeans_assign__ws_tma_res.cake ...

What evolution can reach, by hand-picked paths: each chain applies tactics in order to the naive seed (never to
a stored program) and then sets tile constants; the files are what ``corpus_vs_peers.py --program`` times
beside the hand-written kernels and the peers. Every program is verified and checked on the CPU interpreter
here before it is written; a chain that refuses or fails is reported and skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cake_core.agents.rewrite import Refused  # noqa: E402
from cake_core.agents.tactics import apply, ring_consts  # noqa: E402
from cake_core.ir.text import parse_program  # noqa: E402
from cake_core.ir.verify import verify  # noqa: E402
from cake_core.problems import get_problem  # noqa: E402
from cake_core.runtime.cpu import check_on_cpu  # noqa: E402

WS = ["warp_specialize", "tma"]
RES = WS + ["resident", "batch_wgmma"]
# (problem, name, constants of the seed set first, tactics, constants set afterwards, bounds the tactics see)
CHAINS = [
    ("kmeans_assign", "ws_tma_res_pp_persist_bk128", {}, RES + ["pingpong", "persistent"], {"BK": 128, "S": 4}, {"D": 128}),
    ("kmeans_assign", "ws_tma_res_pp_persist_bk256", {}, RES + ["pingpong", "persistent"], {"BK": 256, "S": 4}, {"D": 128}),
    ("kmeans_assign", "ws_tma_res_pp_mc_bk256", {}, RES + ["pingpong", "multicast"], {"BK": 256, "S": 4}, {"D": 128}),
    ("kmeans_assign", "ws_tma_res_persist_bk128", {}, RES + ["persistent"], {"BK": 128, "S": 4}, {"D": 128}),
    ("kmeans_assign", "ws_tma_res_pp_bk256", {}, RES + ["pingpong"], {"BK": 256, "S": 4}, {"D": 128}),
    ("gemm_bf16", "ws_tma_bn256", {"BM": 128}, WS, {"BN": 256, "S": 4}, {}),
    ("gemm_bf16", "ws_tma_group_pipe_bn256", {"BM": 128}, WS + ["group_tiles", "pipeline_wgmma"], {"BN": 256, "S": 4, "G": 16}, {}),
    ("gemm_bf16", "ws_tma_group_pipe_persist_bn256", {"BM": 128}, WS + ["group_tiles", "pipeline_wgmma", "persistent"], {"BN": 256, "S": 4, "G": 16}, {}),
    ("gemm_bf16", "ws_tma_pipe_persist_bn256", {"BM": 128}, WS + ["pipeline_wgmma", "persistent"], {"BN": 256, "S": 4}, {}),
    ("gemm_bf16", "ws_tma_pipe_bn128", {"BM": 128}, WS + ["pipeline_wgmma"], {"BN": 128, "S": 4}, {}),

    ("knn_topk", "ws_tma_res_cluster_bn128", {"BQ": 128}, RES + ["cluster_split"], {"BN": 128, "S": 4, "SPLIT": 4}, {"D": 128}),
    ("knn_topk", "ws_tma_res_pp_cluster_bn128", {"BQ": 128}, RES + ["pingpong", "cluster_split"], {"BN": 128, "S": 4, "SPLIT": 4}, {"D": 128}),
    ("knn_topk", "ws_tma_res_pp_cluster3_bn256", {"BQ": 128}, RES + ["pingpong", "cluster_split"], {"BN": 256, "S": 4, "SPLIT": 3}, {"D": 128}),
    ("tinygemm", "ws_tma_cluster", {}, WS + ["pipeline_wgmma", "cluster_split"], {"BN": 128, "S": 4, "SPLIT": 2}, {}),
    ("tinygemm", "ws_tma_splitk", {}, WS + ["split_k", "pipeline_wgmma"], {"BN": 128, "S": 6, "SPLIT": 8}, {}),

    ("moe", "grid_experts_tiles", {}, ["grid_loop", "grid_loop"], {}, {}),
]


def build(problem: str, pre: dict[str, int], tactics: list[str], post: dict[str, int], bounds: dict[str, int],
          seed: int = 0):
    """The chain's program, or the refusal that stopped it. Ring depths set afterwards move with their
    buffers (``restage``'s rule): only constants that size no ring are set directly."""
    p = parse_program(get_problem(problem).seed_text()).with_consts(**pre)
    rng = np.random.default_rng(seed)
    for t in tactics:
        out = apply(t, p, rng, bounds)
        if isinstance(out, Refused):
            return out
        p = out
    rings = ring_consts(p)
    for k, v in post.items():
        if k in rings:
            while p.const_env[k] != v:
                out = restage_to(p, k, v)
                if isinstance(out, Refused):
                    return out
                p = out
    return p.with_consts(**{k: v for k, v in post.items() if k in p.const_env and k not in rings})


def restage_to(p, k: str, v: int):
    """One restage step of ring ``k`` toward ``v`` (restage moves a ring by one)."""
    for s in range(64):
        out = apply("restage", p, np.random.default_rng(s))
        if isinstance(out, Refused):
            return out
        if abs(out.const_env.get(k, 0) - v) < abs(p.const_env[k] - v):
            return out
    return Refused(f"restage did not move {k} toward {v}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--problems", default="")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, args.problems.split(",")))
    failed = 0
    for problem, name, pre, tactics, post, bounds in CHAINS:
        if wanted and problem not in wanted:
            continue
        prob = get_problem(problem)
        p = build(problem, pre, tactics, post, bounds)
        if isinstance(p, Refused):
            print(f"{problem}/{name}: refused: {p.reason}")
            failed += 1
            continue
        shapes = prob.shape_set(prob.shape_sets[0]).cpu_shapes(prob.cpu_limit)
        aligned = [s for s in shapes if not [d for d in verify(p, shapes=[s]) if d.is_error]]
        errors = [d for d in verify(p) if d.is_error]
        bad = [c for c in check_on_cpu(p, prob, aligned, 0) if not c.correct] if aligned else []
        if errors or bad or not aligned:
            print(f"{problem}/{name}: fails: {[d.message for d in errors] or [c.message for c in bad] or 'no shape'}")
            failed += 1
            continue
        path = args.out / f"{problem}__{name}.cake"
        path.write_text(dataclasses.replace(p, name=f"{problem}_{name}").text())
        print(f"{path}  ({' > '.join(tactics)}; checked on {len(aligned)} CPU shapes)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
