# Sourced by the one-call device scripts (bench/gpu_frontier.sh, bench/gpu_evolve.sh): each part of a call runs
# under its own time limit, so a slow part leaves the others their share; `table TITLE` prints one row a part last.
# Writes each part's log as $OUT/NAME.log.
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
rows=()
part() {   # part NAME LIMIT_S COMMAND...: run, keep the log, note the exit status and the time
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    rows+=("$(printf '%-14s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -1 "$OUT/$name.log" | cut -c1-90)")")
}
table() {  # table TITLE: the parts' rows, with the GPU's name
    echo
    echo "== $1 ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
    for r in "${rows[@]}"; do echo "$r"; done
}
