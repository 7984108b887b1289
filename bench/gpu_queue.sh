#!/usr/bin/env bash
# One device call (under 10 minutes) for the measurements waiting on a GPU; the table prints last.
#
#   bash bench/gpu_queue.sh         # from the repository root on the GPU machine, .gpu/ and .whl/ carried
#                                   # (.whl/: fla-core and einops for the KDA peers)
#
# 1. kda-decode-early: the two evolved KDA decode kernels (512 threads with the state in shared memory; 128
#    threads with it in registers), each also after hoist_loads (the state's load issued first; the 128-thread one
#    after grid_order too), against fla's fused_recurrent_kda at B = 1, 8, 128 and 256 (H = 32);
# 2. kda-split: the chunked KDA prefill kernel after split_state (value columns over two CTAs), and after
#    split_state, 32-row chunks, prefetch and registers, against fla's chunk_kda at one sequence of 8192 tokens
#    (64 and 96 heads: fewer CTAs than SMs unsplit) and eight of 1024 (64 heads). chunk_kda's first call
#    at a shape takes about 90 s (Triton's compile and autotune).
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT; the parts'
# corpus tables come back in $OUT/queue.tgz (a call brings back 8 files at most).
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
part kda-decode-early 80 env OUT="$OUT/kda_decode" bash bench/gpu.sh corpus --problems kda_decode --no-seed \
    --no-best --peers fla.fused_recurrent_kda --program bench/results/programs/kda-decode-h100-2026-12-06-evolved.cake \
    --program bench/kda_decode_evolved_hoisted.cake --program bench/kda_decode_rmem_bv32_ordered.cake \
    --program bench/kda_decode_rmem_bv32_hoisted.cake \
    --shapes 'B=1,H=32,DK=128,DV=128;B=8,H=32,DK=128,DV=128;B=128,H=32,DK=128,DV=128;B=256,H=32,DK=128,DV=128'
part kda-split 240 env OUT="$OUT/kda_split" bash bench/gpu.sh corpus --problems kda_prefill --no-seed --no-best \
    --peers fla.chunk_kda --program bench/kda_prefill_chunked_split.cake \
    --program bench/kda_prefill_chunked_split_pf.cake \
    --shapes 'B=8,T=1024,H=64,DK=128,DV=128;B=1,T=8192,H=96,DK=128,DV=128;B=1,T=8192,H=64,DK=128,DV=128' --reps 5
tar -czf "$OUT/queue.tgz" -C "$OUT" $(cd "$OUT" && ls -d kda_decode kda_split 2>/dev/null)
for d in kda_decode kda_split; do
    [ -f "$OUT/$d/corpus_vs_peers.md" ] && { echo; echo "== $d"; tail -20 "$OUT/$d/corpus_vs_peers.md"; }
done
table "gpu queue"
