#!/usr/bin/env bash
# One device call (under 10 minutes) for the measurements waiting on a GPU; the table prints last.
#
#   bash bench/gpu_queue.sh         # from the repository root on the GPU machine, .gpu/ and .whl/ carried
#                                   # (.whl/: fla-core and einops for the KDA peer, flash-kmeans)
#
# 1. knn-norms: the split KNN kernel whose consumers sum the database norms themselves (no producer handshake,
#    bench/knn_split_m64_consumer_norms.cake) beside the one with the handshake, against torch bmm + topk at
#    Q=1 and Q=128 over M=131072;
# 2. kmeans-deep: the warp-specialized kmeans_assign kernel for D <= 512 (never timed) against flash-kmeans at
#    three of the portfolio's D > 128 rows;
# 3. kda-split: the chunked KDA prefill kernel, the same after split_state (value columns over two CTAs), and
#    after split_state, 32-row chunks, prefetch and registers, against fla's chunk_kda at one sequence of 8192
#    tokens (64 and 96 heads: fewer CTAs than SMs unsplit) and eight of 1024 (64 heads);
# 4. offset-windows: the GPU tests of windows at any offset with a limit, and the varlen chunked program.
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT; the parts'
# corpus tables come back in $OUT/queue.tgz (a call brings back 8 files at most).
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
part knn-norms 120 env OUT="$OUT/knn_norms" bash bench/gpu.sh corpus --problems knn_search --no-seed --no-best \
    --peers torch --program bench/knn_split_m64_consumer_norms.cake \
    --program cake_core/problems/knn_search/kernels/knn_search_split_m64.cake \
    --shapes 'B=1,Q=1,M=131072,D=128,k=10,S=2;B=1,Q=128,M=131072,D=128,k=10,S=2'
part kmeans-deep 120 env OUT="$OUT/kmeans_deep" bash bench/gpu.sh corpus --problems kmeans_assign --no-seed \
    --peers flash_kmeans --shapes 'B=4,N=8192,K=1024,D=480;B=3,N=512,K=8192,D=416;B=2,N=2048,K=1024,D=224'
part kda-split 120 env OUT="$OUT/kda_split" bash bench/gpu.sh corpus --problems kda_prefill --no-seed --no-best \
    --program cake_core/problems/kda_prefill/kernels/kda_prefill_chunked.cake \
    --program bench/kda_prefill_chunked_split.cake --program bench/kda_prefill_chunked_split_pf.cake \
    --shapes 'B=1,T=8192,H=64,DK=128,DV=128;B=1,T=8192,H=96,DK=128,DV=128;B=8,T=1024,H=64,DK=128,DV=128' --reps 5
part offset-windows 100 env OUT="$OUT/offset_windows" GPU_TESTS="tests/runtime/test_window_offsets_gpu.py" \
    bash bench/gpu.sh tests -rf
tar -czf "$OUT/queue.tgz" -C "$OUT" $(cd "$OUT" && ls -d knn_norms kmeans_deep kda_split offset_windows 2>/dev/null)
for d in knn_norms kmeans_deep kda_split; do
    [ -f "$OUT/$d/corpus_vs_peers.md" ] && { echo; echo "== $d"; tail -20 "$OUT/$d/corpus_vs_peers.md"; }
done
table "gpu queue"
