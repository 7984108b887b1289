#!/usr/bin/env bash
# One device call over several portfolios in turn: bench/gpu_portfolio.sh for each, each under its own search time,
# each packed into $OUT/STATE.out.tgz when it ends (its logs, the dispatch sweep, STATE.tgz to go on: a call brings
# back at most 8 files, so one file a portfolio); the dispatch summaries and the tables print last.
#
#   bash bench/gpu_portfolios.sh "pf-kmeans 150 kmeans_assign kmeans_portfolio flash-kmeans --regions 4 --warm" \
#                                "pf-knn-search 120 knn_search knn_search_portfolio torch --regions 2 --warm"
#       # carry .gpu .whl (and .gpu-state/STATE.tgz for a portfolio to go on where it stopped)
#
# Each argument: STATE SEARCH_S PROBLEM SET PEER [cake portfolio OPTIONS]. SEARCH_S is the portfolio search's time
# (CAKE_TIMEOUT); the export, the dispatch sweep and the overhead add about a minute.
set -uo pipefail
[ $# -ge 1 ] || { echo 'usage: bash bench/gpu_portfolios.sh "STATE SEARCH_S PROBLEM SET PEER [OPTIONS]" ...' >&2; exit 2; }
OUT=${OUT:-$PWD/out}
here=$(dirname "$0")
tables=()
for spec in "$@"; do
    read -r -a a <<< "$spec"
    [ ${#a[@]} -ge 5 ] || { echo "not STATE SEARCH_S PROBLEM SET PEER [OPTIONS]: $spec" >&2; exit 2; }
    state=${a[0]} search=${a[1]}
    mkdir -p "$OUT/$state"
    STATE=$state CAKE_TIMEOUT=$search OUT="$OUT/$state" bash "$here/gpu_portfolio.sh" "${a[@]:2}" \
        > "$OUT/$state/call.log" 2>&1
    tables+=("$(sed -n '/^== portfolio/,$p' "$OUT/$state/call.log")")
    grep -E '^(all|searched|held_out) ' "$OUT/$state/dispatch.log" 2>/dev/null | sed "s/^/$state: /"
    tar -czf "$OUT/$state.out.tgz" -C "$OUT" "$state" && rm -rf "${OUT:?}/$state"
done
for t in "${tables[@]}"; do echo; echo "$t"; done
