#!/usr/bin/env bash
# One device call (under 10 minutes) for the frontier problems the CPU suite cannot time; the table prints last.
#
#   bash bench/gpu_frontier.sh      # run from the repository root on the GPU machine, .gpu/ and .whl/ carried
#                                   # (.whl/: fla-core and einops for the KDA peers, flash-kmeans)
#
# 1. the GPU tests of the new paths against the interpreter: scalar (gmem and smem sources, clamping), gather and
#    the grouped GEMM over gathered rows, fetch_add and compact (the token permutation by expert feeding it),
#    in/out state tensors, the exported dispatcher from torch, the role-aware
#    compute lowering;
# 2. the KDA naive seeds (and the prefill seeds with prefetch, and the chunked naive prefill program) against flash-linear-attention at decode, prefill
#    and varlen prefill shapes;
# 3. the MoE naive seed, and the seed with its expert and intermediate-tile loops spread over CTAs by grid_loop
#    (written by this script with the tactic, as a cold run would), and that with the copies of its two loops issued
#    a trip ahead by prefetch, against torch routing + _grouped_mm at
#    Alpha-MoE M = 1 and 16 and Qwen3-30B-A3B M = 64, the routed-weight floor beside them;
# 4. the mha naive seed (and with prefetch) against torch's scaled_dot_product_attention at two prefill shapes.
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
python3 - "$OUT" <<'PY'
import sys
import numpy as np
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
p = parse_program(get_problem("moe").seed_text())
for _ in range(2):
    p = apply("grid_loop", p, np.random.default_rng(0))
open(f"{sys.argv[1]}/moe_grid.cake", "w").write(p.text())
for _ in range(2):     # the reduction over H, then the down projection's tiles
    p = apply("prefetch", p, np.random.default_rng(0))
open(f"{sys.argv[1]}/moe_grid_prefetch.cake", "w").write(p.text())
for name in ("kda_prefill", "kda_varlen", "mha"):     # each loop of the seed that qualifies, a trip ahead
    p = parse_program(get_problem(name).seed_text())
    for _ in range(3):
        q = apply("prefetch", p, np.random.default_rng(0))
        p = p if hasattr(q, "reason") else q
    open(f"{sys.argv[1]}/{name}_prefetch.cake", "w").write(p.text())
PY
part gpu-tests 170 env GPU_TESTS="tests/runtime/test_scalar_gpu.py tests/runtime/test_gather_rows_gpu.py tests/runtime/test_token_permute_gpu.py \
    tests/problems/test_state_tensors.py tests/export tests/runtime/test_role_compute_gpu.py" bash bench/gpu.sh tests -rf
part kda-decode 50 env OUT="$OUT/kda_decode" bash bench/gpu.sh corpus --problems kda_decode \
    --shapes "B=1,H=32,DK=128,DV=128;B=8,H=32,DK=128,DV=128;B=256,H=32,DK=128,DV=128" --reps 10
part kda-prefill 50 env OUT="$OUT/kda_prefill" bash bench/gpu.sh corpus --problems kda_prefill \
    --program "$OUT/kda_prefill_prefetch.cake" --program cake_core/problems/kda_prefill/kernels/kda_prefill_chunked.cake \
    --shapes "B=8,T=1024,H=64,DK=128,DV=128" --reps 3
part kda-varlen 50 env OUT="$OUT/kda_varlen" bash bench/gpu.sh corpus --problems kda_varlen \
    --program "$OUT/kda_varlen_prefetch.cake" \
    --shapes "N=6,T=8192,H=64,DK=128,DV=128" --reps 3
part moe 120 env OUT="$OUT/moe" bash bench/gpu.sh corpus --problems moe --program "$OUT/moe_grid.cake" \
    --program "$OUT/moe_grid_prefetch.cake" \
    --shapes "M=1,H=2048,I=128,E=512,k=10;M=16,H=2048,I=128,E=512,k=10;M=64,H=2048,I=768,E=128,k=8" --reps 10
part mha 80 env OUT="$OUT/mha" bash bench/gpu.sh corpus --problems mha --program "$OUT/mha_prefetch.cake" \
    --shapes "H=32,T=1024,DH=128;H=8,T=8192,DH=128" --reps 5
table "gpu frontier"
