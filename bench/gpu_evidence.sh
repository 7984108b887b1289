#!/usr/bin/env bash
# One device call (under 10 minutes) for the GPU evidence the CPU suite cannot give; the table prints last.
#
#   bash bench/gpu_evidence.sh      # run from the repository root on the GPU machine, .gpu/ and .whl/ carried
#
# 1. the GPU tests of the new paths: in/out state tensors, the exported dispatcher from torch, the KDA and
#    example problems, the role-aware compute lowering (tests/... marked gpu);
# 2. `cake evolve rmsnorm --problem-path examples/problems` cold on the GPU, its torch peer measured in the run;
# 3. the KDA naive seeds against flash-linear-attention at a few decode, prefill and varlen prefill shapes, and the
#    MoE naive seed against torch's grouped GEMM (bench/corpus_vs_peers).
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
part gpu-tests 180 env GPU_TESTS="tests/problems/test_state_tensors.py tests/export tests/runtime/test_role_compute_gpu.py tests/runtime/test_scalar_gpu.py tests/runtime/test_gather_rows_gpu.py" \
    bash bench/gpu.sh tests -rf
part rmsnorm 120 env CAKE_TIMEOUT=100 bash bench/gpu.sh cake --problem-path examples/problems evolve rmsnorm \
    --shapes rmsnorm_llm --cold --generations 3 --population 8 --seed 0
part kda-decode 60 env OUT="$OUT/kda_decode" bash bench/gpu.sh corpus --problems kda_decode \
    --shapes "B=1,H=32,DK=128,DV=128;B=32,H=32,DK=128,DV=128;B=256,H=32,DK=128,DV=128" --reps 10
part kda-prefill 60 env OUT="$OUT/kda_prefill" bash bench/gpu.sh corpus --problems kda_prefill \
    --shapes "B=8,T=1024,H=64,DK=128,DV=128" --reps 5
part kda-varlen 60 env OUT="$OUT/kda_varlen" bash bench/gpu.sh corpus --problems kda_varlen \
    --shapes "N=6,T=8192,H=64,DK=128,DV=128" --reps 3
part moe 80 env OUT="$OUT/moe" bash bench/gpu.sh corpus --problems moe \
    --shapes "M=1,H=2048,I=128,E=512,k=10;M=16,H=2048,I=128,E=512,k=10;M=64,H=2048,I=768,E=128,k=8" --reps 5
table "gpu evidence"
