#!/usr/bin/env bash
# One device call (under 10 minutes) for the frontier problems the CPU suite cannot time; the table prints last.
#
#   bash bench/gpu_frontier.sh      # run from the repository root on the GPU machine, .gpu/ and .whl/ carried
#
# 1. the GPU tests of the new ops against the interpreter: scalar (gmem and smem sources, clamping), gather and
#    the grouped GEMM over gathered rows, fetch_add and compact (the token permutation by expert feeding it);
# 2. the MoE naive seed, and the seed with its expert and intermediate-tile loops spread over CTAs by grid_loop
#    (written by this script with the tactic, as a cold run would), against torch routing + _grouped_mm at
#    Alpha-MoE M = 1 and 16 and Qwen3-30B-A3B M = 64, the routed-weight floor beside them;
# 3. the mha naive seed against torch's scaled_dot_product_attention at two prefill shapes.
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
python3 - "$OUT/moe_grid.cake" <<'PY'
import sys
import numpy as np
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
p = parse_program(get_problem("moe").seed_text())
for _ in range(2):
    p = apply("grid_loop", p, np.random.default_rng(0))
open(sys.argv[1], "w").write(p.text())
PY
part gpu-tests 180 env GPU_TESTS="tests/runtime/test_scalar_gpu.py tests/runtime/test_gather_rows_gpu.py tests/runtime/test_token_permute_gpu.py" \
    bash bench/gpu.sh tests -rf
part moe 220 env OUT="$OUT/moe" bash bench/gpu.sh corpus --problems moe --program "$OUT/moe_grid.cake" \
    --shapes "M=1,H=2048,I=128,E=512,k=10;M=16,H=2048,I=128,E=512,k=10;M=64,H=2048,I=768,E=128,k=8" --reps 10
part mha 150 env OUT="$OUT/mha" bash bench/gpu.sh corpus --problems mha \
    --shapes "H=32,T=1024,DH=128;H=8,T=8192,DH=128" --reps 5
table "gpu frontier"
