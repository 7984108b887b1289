#!/usr/bin/env bash
# One device call (under 10 minutes) for the measurements waiting on a GPU; the table prints last.
#
#   bash bench/gpu_queue.sh         # from the repository root on the GPU machine, .gpu/ and .whl/ carried
#
# The whole gpu-marked suite does not fit one call (113 of its 267 tests ran in 300 s on 2026-12-08), so the
# queue runs it in parts, each under its own limit:
# 1. gpu-stale: the GPU tests that had gone stale since the problems became packages, as fixed on 2026-12-08
#    (test_gpu_refs over all twelve problems, the kmeans_update kernels from their package, the compute-op
#    differential, the seed gate with domain refusals, the tf32 fragment test's tolerance);
# 2. gpu-runtime: the runtime tests the 2026-12-08 call did not reach (grouped GEMM to window offsets; the peers'
#    tests, which build fla's and flash-kmeans' Triton kernels, are left to a call of their own:
#    GPU_TESTS=tests/runtime/test_peers.py bash bench/gpu.sh tests -q).
# 3. knn-unaligned-m64: knn_search_split_unaligned_m64 (the cp.async split kernel on 64-query tiles: twice the CTAs
#    where Q <= 128) beside knn_search_split_unaligned and torch at odd-D portfolio rows; predicted about 1.9x
#    faster than the 128-query kernel at Q <= 128 (0.948 ms at Q = 128, M = 65536, D = 1 on 2026-12-08: about
#    0.5 ms), no change at Q = 2048.
# 4. knn-lists: knn_search_split_k64 / _k128 beside torch again, now that each row's list is swizzled
#    (cake_topk_smem.cuh, list_slot): its 8-way bank conflicts between the quads of a warp are gone from the
#    threshold read, the rank count and the shift; predicted 2-4x faster than 2026-12-08's 4.375 ms (k64) and
#    8.835 ms (k128) at Q = 128, M = 131072, k = 64 (about 1.5 ms and 3 ms; torch 0.61 ms). Its correctness is
#    gpu-runtime's first file (tests/runtime/test_knn_smem_lists.py).
# Each part writes its pytest log and junit XML (or its corpus table) under $OUT/NAME/; they come back in
# $OUT/queue.tgz (a call brings back 8 files at most).
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
R=tests/runtime
part gpu-stale 180 env OUT="$OUT/gpu_stale" GPU_TESTS="$R/test_gpu_refs.py $R/test_gpu.py \
    tests/lower/test_lower_compute.py tests/problems/test_problems.py $R/test_mma_tf32_gpu.py" bash bench/gpu.sh tests -q
part gpu-runtime 250 env OUT="$OUT/gpu_runtime" GPU_TESTS="$R/test_knn_smem_lists.py $R/test_grouped_gemm_gpu.py \
    $R/test_isolation.py $R/test_kmeans_ws.py $R/test_knn_split.py $R/test_knn_ws.py $R/test_mha_ws_gpu.py \
    $R/test_mma_gpu.py $R/test_reduce_rmem_gpu.py $R/test_role_compute_gpu.py $R/test_scalar_gpu.py \
    $R/test_tinygemm_cluster_gpu.py $R/test_tinygemm_gpu.py $R/test_tma.py $R/test_token_permute_gpu.py \
    $R/test_trisolve_gpu.py $R/test_wgmma_a_major_gpu.py $R/test_window_offsets_gpu.py" \
    bash bench/gpu.sh tests -q
K=cake_core/problems/knn_search/kernels
odd_d='B=1,Q=128,M=65536,D=1,k=10,S=2;B=1,Q=64,M=65536,D=1,k=10,S=2;B=1,Q=128,M=65536,D=63,k=10,S=2;'
odd_d+='B=2,Q=64,M=65536,D=129,k=10,S=2;B=1,Q=2048,M=2048,D=3,k=10,S=1'
part knn-unaligned-m64 60 env OUT="$OUT/knn_m64" bash bench/gpu.sh corpus --problems knn_search --no-seed --no-best \
    --peers torch --program $K/knn_search_split_unaligned.cake --program $K/knn_search_split_unaligned_m64.cake \
    --shapes "$odd_d" \
    --reps 10
part knn-lists 60 env OUT="$OUT/knn_lists" bash bench/gpu.sh corpus --problems knn_search --no-seed --no-best \
    --peers torch --program $K/knn_search_split_k64.cake --program $K/knn_search_split_k128.cake \
    --shapes 'B=1,Q=128,M=131072,D=128,k=64,S=2;B=1,Q=4096,M=32768,D=128,k=64,S=2' --reps 10
tar -czf "$OUT/queue.tgz" -C "$OUT" $(cd "$OUT" && ls -d gpu_stale gpu_runtime knn_m64 knn_lists 2>/dev/null)
[ -f "$OUT/knn_lists/corpus_vs_peers.md" ] && { echo; echo "== knn_lists"; grep "^| knn_search" "$OUT/knn_lists/corpus_vs_peers.md"; }
[ -f "$OUT/knn_m64/corpus_vs_peers.md" ] && { echo; echo "== knn_m64"; grep "^| knn_search" "$OUT/knn_m64/corpus_vs_peers.md"; }
for p in gpu-stale gpu-runtime; do echo; echo "== $p"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$p.log" | tail -12; done
table "gpu queue"
