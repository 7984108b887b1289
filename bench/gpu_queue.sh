#!/usr/bin/env bash
# One device call (under 10 minutes) for the measurements waiting on a GPU; the table prints last.
#
#   bash bench/gpu_queue.sh         # from the repository root on the GPU machine, .gpu/ and .whl/ carried
#                                   # (.whl/: the peer wheels; the KNN peer is torch, on the image)
#
# 1. knn-search-lists: knn_search_split_k64 / _k128 against torch's bf16 mm + topk at portfolio rows with k = 24 to
#    80 (before: only the naive seed or the unsplit k32 kernel served them);
# 2. knn-lists-gate: the gate of the four split KNN kernels whose top-k lists live in shared memory (KMAX 64 and
#    128; tests/runtime/test_knn_smem_lists.py) on ragged, empty-share, odd-D and batched shapes;
# 3. knn-lag: knn_search_split_unaligned with its producer 4 stages ahead of the norms it sums instead of 2
#    (bench/knn_search_split_unaligned_l4.cake: L = 4, S = 5): if the small-Q tiles (3.4 us each, stalled on
#    mbarrier waits) wait on loads the producer issues only 2 stages ahead, up to about 1.6x faster there;
# 4. kda-tc: the chunked KDA prefill kernels with their f32 products on the tensor cores (mma_sync on f32 operands:
#    three tf32 products an atom) beside the same kernels on FMAs, at B = 1, T = 8192, H = 64 (no peer: chunk_kda's
#    autotuning takes 90 s a shape); predicted 1.2-1.4x (the products are about half the chunk's time);
# 5. knn-build-lists: knn_topk_split_k64 / _k128 against torch at build-portfolio rows with k = 20 or D > 128
#    (before: no kernel served them).
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT; the parts'
# corpus tables come back in $OUT/queue.tgz (a call brings back 8 files at most).
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
K=cake_core/problems
part knn-search-lists 110 env OUT="$OUT/knn_search" bash bench/gpu.sh corpus --problems knn_search --no-seed --no-best \
    --peers torch --program $K/knn_search/kernels/knn_search_split_k64.cake \
    --program $K/knn_search/kernels/knn_search_split_k128.cake \
    --shapes 'B=1,Q=128,M=131072,D=128,k=64,S=2;B=1,Q=4096,M=32768,D=128,k=64,S=2;B=1,Q=128,M=65536,D=128,k=80,S=2;B=1,Q=128,M=131072,D=128,k=24,S=2' \
    --reps 10
part knn-lists-gate 80 env OUT="$OUT/knn_gate" GPU_TESTS="tests/runtime/test_knn_smem_lists.py tests/runtime/test_mma_tf32_gpu.py" bash bench/gpu.sh tests -q
part knn-lag 80 env OUT="$OUT/knn_lag" bash bench/gpu.sh corpus --problems knn_search --no-seed --no-best \
    --peers torch --program $K/knn_search/kernels/knn_search_split_unaligned.cake \
    --program bench/knn_search_split_unaligned_l4.cake \
    --shapes 'B=1,Q=16,M=131072,D=128,k=10,S=2;B=1,Q=128,M=131072,D=128,k=10,S=2;B=1,Q=1024,M=65536,D=128,k=10,S=2' \
    --reps 10
part kda-tc 120 env OUT="$OUT/kda_tc" bash bench/gpu.sh corpus --problems kda_prefill --no-seed --no-best --no-peers \
    --program bench/kda_prefill_chunked_split_pf.cake --program bench/kda_prefill_chunked_split_pf_tc.cake \
    --program cake_core/problems/kda_prefill/kernels/kda_prefill_chunked.cake --program bench/kda_prefill_chunked_tc.cake \
    --shapes 'B=1,T=8192,H=64,DK=128,DV=128' --reps 5
part knn-build-lists 60 env OUT="$OUT/knn_build" bash bench/gpu.sh corpus --problems knn_topk --no-seed --no-best \
    --peers torch --program $K/knn_topk/kernels/knn_topk_split_k64.cake \
    --program $K/knn_topk/kernels/knn_topk_split_k128.cake \
    --shapes 'Q=1024,N=1024,D=128,k=20;Q=2048,N=2048,D=256,k=10;Q=512,N=512,D=1024,k=10;Q=3072,N=3072,D=128,k=20' \
    --reps 10
tar -czf "$OUT/queue.tgz" -C "$OUT" $(cd "$OUT" && ls -d knn_gate knn_search knn_lag kda_tc knn_build 2>/dev/null)
for d in knn_search knn_lag kda_tc knn_build; do
    [ -f "$OUT/$d/corpus_vs_peers.md" ] && { echo; echo "== $d"; tail -14 "$OUT/$d/corpus_vs_peers.md"; }
done
tail -3 "$OUT/knn-lists-gate.log"
table "gpu queue"
