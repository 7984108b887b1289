#!/usr/bin/env bash
# One device call: the KDA decode kernel a cold H100 run evolved (bench/results/programs/kda-decode-h100-2026-12-06-
# evolved.cake), with its state and product tiles moved into registers (`registers`, twice) and then its barriers
# that order nothing removed (`drop_syncs`), each written by the tactics here as a run would, timed beside
# flash-linear-attention's fused_recurrent_kda at decode shapes; the GPU test of the rmem reduction those children
# lower to; and, given GENERATIONS, the cold evolution resumed from its warehouse (STATE=kdad). The table prints last.
#
#   bash bench/gpu_kda_decode.sh [GENERATIONS]     # carry .gpu .whl (and .gpu-state to resume the run)
set -uo pipefail
source "$(dirname "$0")/gpu_parts.sh"
python3 - "$OUT" <<'PY'
import sys
import numpy as np
from cake_core.agents.tactics import apply
from cake_core.ir.text import parse_program
p = parse_program(open("bench/results/programs/kda-decode-h100-2026-12-06-evolved.cake").read())
for i in range(2):
    p = apply("registers", p, np.random.default_rng(i))
open(f"{sys.argv[1]}/kda_decode_registers.cake", "w").write(p.text())
p = apply("drop_syncs", p, np.random.default_rng(0))
open(f"{sys.argv[1]}/kda_decode_registers_drop_syncs.cake", "w").write(p.text())
PY
part reduce-tests 150 env GPU_TESTS="tests/runtime/test_reduce_rmem_gpu.py" bash bench/gpu.sh tests -rf
part kda-decode 120 env OUT="$OUT/kda_decode" bash bench/gpu.sh corpus --problems kda_decode \
    --program bench/results/programs/kda-decode-h100-2026-12-06-evolved.cake \
    --program "$OUT/kda_decode_registers.cake" --program "$OUT/kda_decode_registers_drop_syncs.cake" \
    --shapes "B=1,H=32,DK=128,DV=128;B=8,H=32,DK=128,DV=128;B=128,H=32,DK=128,DV=128;B=256,H=32,DK=128,DV=128" --reps 20
grep -v "^ *$" "$OUT/kda-decode.log" | tail -30
if [ $# -ge 1 ]; then
    part evolve-call "$(( ${CAKE_TIMEOUT:-280} + 160 ))" env CAKE_TIMEOUT="${CAKE_TIMEOUT:-280}" STATE=kdad \
        bash bench/gpu_evolve.sh kda_decode kda_decode_llm "$1" 8
    tail -14 "$OUT/evolve-call.log"
fi
# a call brings back 8 files: the state, the samples and the logs stay at the top, the rest goes one folder down
mkdir -p "$OUT/more" && mv "$OUT"/*.cake "$OUT"/*.xml "$OUT"/reduce-tests.log "$OUT"/evolve.log "$OUT"/report.log \
    "$OUT/more/" 2>/dev/null
table "kda decode: the evolved kernel, + registers, + drop_syncs, against fla"
