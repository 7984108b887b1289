#!/usr/bin/env bash
# One device call (under 10 minutes) for the chained-GEMM paths the CPU suite can only compile; the table prints
# last.
#
#   bash bench/gpu_attention.sh      # run from the repository root on the GPU machine, .gpu/ carried
#
# 1. the GPU tests of the new lowerings against float64, the oracle or the interpreter: the warp-specialised
#    attention (register A, row vectors, the quad reductions; P through swizzled shared memory with role_sync;
#    an elementwise read of a TMA-filled swizzled tile), wgmma with an M-major a, trisolve, and the role-aware
#    elementwise ops;
# 2. mha against torch's scaled_dot_product_attention at two prefill shapes: the naive seed, the hand-written
#    warp-specialised reference (problems/mha/kernels/mha_ws.cake), and what warp_specialize makes of the seed
#    (then pipeline_wgmma on it), written by this script with the tactics as a cold run would.
# Each part has its own time limit, so a slow part leaves the others their share. Writes under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
python3 - "$OUT" <<'PY'
import sys
import numpy as np
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
from cake_core.problems import get_problem
p = apply("warp_specialize", parse_program(get_problem("mha").seed_text()), np.random.default_rng(0))
open(f"{sys.argv[1]}/mha_ws_tactic.cake", "w").write(p.text())
q = apply("pipeline_wgmma", p, np.random.default_rng(0))
open(f"{sys.argv[1]}/mha_ws_tactic_pipelined.cake", "w").write((p if hasattr(q, "reason") else q).text())
PY
part gpu-tests 200 env GPU_TESTS="tests/runtime/test_mha_ws_gpu.py tests/runtime/test_wgmma_a_major_gpu.py \
    tests/runtime/test_trisolve_gpu.py tests/runtime/test_role_compute_gpu.py" bash bench/gpu.sh tests -rf
part mha 150 env OUT="$OUT/mha" bash bench/gpu.sh corpus --problems mha \
    --program cake_core/problems/mha/kernels/mha_ws.cake --program "$OUT/mha_ws_tactic.cake" \
    --program "$OUT/mha_ws_tactic_pipelined.cake" --shapes "H=32,T=1024,DH=128;H=8,T=8192,DH=128" --reps 10
table "gpu attention"
