#!/usr/bin/env bash
# One call on the GPU machine: build, check and time everything #6 asks for; the target table prints last.
#
#   bash bench/gpu.sh                     # gpu tests, then every problem's kernels against its peers
#   bash bench/gpu.sh tests -k kmeans     # only the gpu tests (extra args go to pytest)
#   GPU_TESTS='tests/runtime tests/core' bash bench/gpu.sh tests -v   # those folders' gpu tests, in that order
#   bash bench/gpu.sh corpus --problems gemm_bf16 --reps 30   # only the bench (extra args go to it)
#   bash bench/gpu.sh corpus --variants   # also every unregistered program under cake_core/problems/seeds/
#   bash bench/gpu.sh corpus --problems tinygemm --timer graph   # back-to-back launches from a CUDA graph
#   bash bench/gpu.sh floor --mib 32,128  # what a bare read of W bytes takes under the timing protocol
#   bash bench/gpu.sh chains [PROBLEM=SHAPES ...]   # kernels made by tactic chains from the naive seeds
#                                         # (bench/tactic_chains.py) beside the hand-written ones and the peers
#   bash bench/gpu.sh throughput          # `cake evolve --cold` end to end: candidates per GPU- and wall-minute
#   STATE=tp bash bench/gpu.sh throughput --generations 12   # the same, the runs' warehouses back in $OUT/tp.tgz
#   STATE=fp bash bench/gpu.sh filter_pair --problem tinygemm --shapes tinygemm_decode --keep 4
#                                         # the same cold run with the cost filter and without (bench/filter_pair.py)
#   bash bench/gpu.sh cake evolve kmeans_assign --cold ...   # any cake command as a user runs it, CAKE_GPU=require,
#                                         # CAKE_HOME=$CAKE_HOME (default $OUT/home): its warehouse comes back
#   STATE=fve bash bench/gpu.sh cake experiment frozen-vs-evolving kmeans_assign ... --out /tmp/state/fve/out
#                                         # a job split over calls: /tmp/state/fve comes back as $OUT/fve.tgz and
#                                         # goes on from .gpu-state/fve.tgz (carried) in the next call, or from
#                                         # STATE_FROM=FILE (e.g. a tarball kept under bench/results/state);
#                                         # CAKE_TIMEOUT=500 stops it (SIGINT) in time to write that state;
#                                         # `cake` and `throughput` also bring back the measured samples of their
#                                         # homes as $OUT/NAME-samples.parquet (for bench/results/samples/)
#   bash bench/gpu.sh profile 'regex:kmeans_update_gather' corpus --no-seed --no-best --no-peers ...
#                                         # Nsight Compute on the first launch of the kernels the regex names
#                                         # (PROFILE_COUNT, PROFILE_SKIP), while the named part runs
#
# Needs: the repo root as the working directory; .gpu/site.tar.xz (the pinned bundle of what the bare
# GPU image lacks: ../shared/gpu/make-bundle.sh) and .whl/ (peer wheels, e.g. flash-kmeans) carried
# along; torch, cupy and nvcc from the image. Writes under $OUT (default ./out): gpu-tests.log,
# gpu-tests.xml, corpus_vs_peers.{json,md}, nvidia-smi.txt.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT" /tmp/site /tmp/whl
what=${1:-all}; [ $# -gt 0 ] && shift
case $what in
    all) [ $# -eq 0 ] || { echo "bench/gpu.sh: extra arguments go with 'tests' or 'corpus', not 'all'" >&2; exit 2; } ;;
    tests|corpus|floor|chains|throughput|filter_pair|cake) ;;
    profile)
        [ $# -ge 2 ] || { echo "bench/gpu.sh: profile needs a kernel regex and a part: profile 'regex:NAME' corpus ..." >&2; exit 2; }
        kernels=$1; shift
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
        [ -n "$NCU" ] || { echo "bench/gpu.sh: no ncu (Nsight Compute) on this machine" >&2; exit 2; }
        mkdir -p "$OUT/profile"
        # the clocks stay as they are (METHOD.md); the report's text goes to the log, the report to $OUT
        "$NCU" --clock-control none --target-processes all -k "$kernels" -s "${PROFILE_SKIP:-0}" \
            -c "${PROFILE_COUNT:-1}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
            --section ComputeWorkloadAnalysis --section SourceCounters -o "$OUT/profile/report" -f \
            env OUT="$OUT/profile" bash "$0" "$@" > "$OUT/profile/ncu.log" 2>&1
        rc=$?
        "$NCU" -i "$OUT/profile/report.ncu-rep" --page details > "$OUT/profile/details.txt" 2>&1
        "$NCU" -i "$OUT/profile/report.ncu-rep" --page raw --csv > "$OUT/profile/raw.csv" 2>&1
        "$NCU" -i "$OUT/profile/report.ncu-rep" --page source --csv --print-source sass > "$OUT/profile/sass.csv" 2>&1
        grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued" \
            "$OUT/profile/details.txt" | head -120
        python3 bench/ncu_summary.py "$OUT/profile/raw.csv" "$OUT/profile/sass.csv" | tee "$OUT/profile/summary.txt"
        exit $rc ;;
    *) echo "bench/gpu.sh: unknown part '$what': all, tests, corpus, floor, chains, throughput, filter_pair, cake or profile" >&2; exit 2 ;;
esac
if [ -f .gpu/site.tar.xz ] && [ ! -e /tmp/site/.unpacked ]; then
    tar -xJf .gpu/site.tar.xz -C /tmp/site && touch /tmp/site/.unpacked
fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/whl .whl/*.whl 2>&1 | tail -2
fi
export PYTHONPATH=/tmp/site:/tmp/whl:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
# export_samples NAME HOME...: the measured samples of every home given that has a warehouse, in one Parquet file
# ($OUT/NAME-samples.parquet; a call brings back 8 files at most): commit it under bench/results/samples/, where
# `cake model import-bench` lands it again for the cost model
export_samples() {
    local name=${1:-run} tmp; shift
    tmp=$(mktemp -d)
    for h in "$@"; do
        [ -d "$h/warehouse" ] || continue
        CAKE_HOME="$h" python3 -c "from cake_cli.main import main; main()" model export-samples \
            --out "$tmp/$(basename "$h").parquet" || true
    done
    ls "$tmp"/*.parquet >/dev/null 2>&1 && python3 -c "import glob, sys, pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(sys.argv[1] + '/*.parquet'))]),
               sys.argv[2], compression='zstd')" "$tmp" "$OUT/$name-samples.parquet"
    rm -rf "$tmp"
}
# state_in DIR: a job split over calls goes on from its state: STATE_FROM, else .gpu-state/$STATE.tgz (carried)
state_in() {
    mkdir -p "$1"
    local from=${STATE_FROM:-.gpu-state/${STATE:-none}.tgz}
    [ -f "$from" ] && tar -xzf "$from" -C "$1"
    return 0
}
# state_out DIR: DIR back as one tarball ($OUT/$STATE.tgz: a call returns a bounded number of files), without the
# cubin cache, the Prefect database and the reference outputs, to be carried as .gpu-state/$STATE.tgz next call
state_out() {
    tar -czf "$OUT/$STATE.tgz" -C "$1" --exclude=cache --exclude=prefect --exclude=refs .
    echo "state: $OUT/$STATE.tgz ($(du -h "$OUT/$STATE.tgz" | cut -f1)); carry it as .gpu-state/$STATE.tgz to go on"
}
rc=0
if [ "$what" = all ] || [ "$what" = tests ]; then
    echo "== gpu tests"
    python3 -m pytest -m gpu ${GPU_TESTS:-tests} -o addopts="" -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" \
        "$@" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
    rc=${PIPESTATUS[0]}
fi
if [ "$what" = floor ]; then
    python3 bench/read_floor.py --out "$OUT" "$@"
    exit $?
fi
if [ "$what" = chains ]; then
    python3 bench/tactic_chains.py --out "$OUT/chains" | tee "$OUT/chains.log"
    [ $# -gt 0 ] || set -- "kmeans_assign=B=32,N=65536,K=1024,D=128" "gemm_bf16=M=4096,N=4096,K=4096;M=8192,N=8192,K=8192" \
        "knn_topk=Q=4096,N=1048576,D=128,k=10"
    for spec in "$@"; do
        prob=${spec%%=*}; shapes=${spec#*=}
        progs=(); for f in "$OUT"/chains/"$prob"__*.cake; do progs+=(--program "$f"); done
        echo "== $prob: ${#progs[@]} chain programs"
        python3 bench/corpus_vs_peers.py --out "$OUT/$prob" --problems "$prob" --shapes "$shapes" --no-seed \
            "${progs[@]}" > "$OUT/$prob.log" 2>&1 || rc=$?
        grep -E '^\[' "$OUT/$prob.log" | tail -20
        sed -n '/^total /,$p' "$OUT/$prob.log"
    done
    exit $rc
fi
if [ "$what" = cake ]; then
    if [ -n "${STATE:-}" ]; then
        # a long job split over calls: its state lives in /tmp/state/$STATE (CAKE_HOME defaults there)
        state_in "/tmp/state/$STATE"
        export CAKE_HOME=${CAKE_HOME:-/tmp/state/$STATE/home}
    fi
    export CAKE_HOME=${CAKE_HOME:-$OUT/home} CAKE_GPU=${CAKE_GPU:-require} PREFECT_SERVER_ANALYTICS_ENABLED=false
    # CAKE_TIMEOUT=S: Ctrl-C (SIGINT) after S seconds (cake stops within seconds, keeps what it recorded), so the state
    # below is still written inside the device call's limit and the next call goes on from it
    ${CAKE_TIMEOUT:+timeout -k 60 -s INT "$CAKE_TIMEOUT"} python3 -c "from cake_cli.main import main; main()" "$@"
    rc=$?
    [ -n "${STATE:-}" ] && state_out "/tmp/state/$STATE"
    export_samples "$STATE" "$CAKE_HOME" /tmp/state/${STATE:-none}/*/*-s*
    exit $rc
fi
if [ "$what" = throughput ]; then
    if [ -n "${STATE:-}" ]; then
        # the runs' homes (warehouses) come back as $OUT/$STATE.tgz, as for `cake` above
        mkdir -p "/tmp/state/$STATE"
        python3 bench/evolve_throughput.py --out "$OUT" --home "/tmp/state/$STATE" "$@"
        rc=$?
        state_out "/tmp/state/$STATE"
        export_samples "$STATE" /tmp/state/$STATE/*
        exit $rc
    fi
    python3 bench/evolve_throughput.py --out "$OUT" "$@"
    exit $?
fi
if [ "$what" = filter_pair ]; then
    # the same cold evolution with the cost filter and without it (bench/filter_pair.py); STATE=NAME keeps both
    # homes in $OUT/NAME.tgz, and the next call (carrying it as .gpu-state/NAME.tgz) resumes a run that was cut
    st=/tmp/state/${STATE:-filter_pair}
    state_in "$st"
    python3 bench/filter_pair.py --out "$OUT" --home "$st" "$@"
    rc=$?
    [ -n "${STATE:-}" ] && state_out "$st"
    export_samples "${STATE:-filter_pair}" "$st"/filter "$st"/no-filter
    exit $rc
fi
if [ "$what" = all ] || [ "$what" = corpus ]; then
    echo "== corpus vs peers"
    python3 bench/corpus_vs_peers.py --out "$OUT" "$@" > "$OUT/corpus_vs_peers.log" 2>&1
    rc2=$?
    grep -E '^\[' "$OUT/corpus_vs_peers.log" | tail -40
    sed -n '/^total /,$p' "$OUT/corpus_vs_peers.log"
    [ $rc2 -ne 0 ] && rc=$rc2
fi
exit $rc
