#!/usr/bin/env bash
# One device call: a problem evolved over a portfolio (`cake portfolio`, region by region, each region's finalists
# swept over every row), exported (`cake export`), and the exported package run over every row of the portfolio
# beside the peer (bench/portfolio_dispatch.py: 0 wrong, refusals by name, geomean against the peer, held-out rows
# apart), then its host overhead per call (bench/export_overhead.py). The table prints last.
#
#   STATE=pf-kmeans bash bench/gpu_portfolio.sh kmeans_assign kmeans_portfolio flash_kmeans [cake portfolio OPTIONS]
#       # carry .gpu .whl (and .gpu-state/$STATE.tgz to go on: the same options continue the portfolio)
#
# CEDE=1 exports with --cede-to-peer (rows where the peer measured faster are refused, the fallback serves them).
# CAKE_TIMEOUT (default 150 s) stops the portfolio search (SIGINT: what it measured stays) in time for the export
# and the sweep of the package. Writes under $OUT: portfolio.log, export.log, portfolio_dispatch.{md,json},
# dispatch.log, overhead.log, $STATE.tgz (the home, to go on).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: STATE=NAME bash bench/gpu_portfolio.sh PROBLEM SET PEER [cake portfolio OPTIONS]" >&2; exit 2; }
source "$(dirname "$0")/gpu_parts.sh"
problem=$1 set=$2 peer=$3; shift 3
STATE=${STATE:-pf-$problem}
export STATE CAKE_HOME=/tmp/state/$STATE/home
mkdir -p /tmp/site && { [ -e /tmp/site/.unpacked ] || { tar -xJf .gpu/site.tar.xz -C /tmp/site && touch /tmp/site/.unpacked; }; }
mkdir -p /tmp/whl && ls .whl/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target /tmp/whl .whl/*.whl
export PYTHONPATH=/tmp/site:/tmp/whl:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
cake=(python3 -c "from cake_cli.main import main; main()")
part portfolio "$(( ${CAKE_TIMEOUT:-150} + 90 ))" env CAKE_TIMEOUT="${CAKE_TIMEOUT:-150}" \
    bash bench/gpu.sh cake portfolio "$problem" --shapes "$set" "$@"
tail -16 "$OUT/portfolio.log"
# exit 2: the command refused its input (an unknown problem or shape set, a bad option); nothing to export
grep -q "^portfolio *rc=2 " <<< "${rows[-1]}" && { table "portfolio: $problem over $set refused its input"; exit 2; }
dist=/tmp/state/$STATE/dist
rm -rf "$dist"
part export "${EXPORT_S:-90}" env CAKE_GPU=require "${cake[@]}" export "$problem" --shapes "$set" --unmeasured ${CEDE:+--cede-to-peer} --out "$dist" --name "cake_${problem}_pf" --gpu-model "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
tail -4 "$OUT/export.log"
part dispatch "${DISPATCH_S:-120}" python3 bench/portfolio_dispatch.py "$dist/cake_${problem}_pf" --problem "$problem" --shapes "$set" \
    --peer "$peer" --out "$OUT"
tail -5 "$OUT/dispatch.log"
# the host overhead on the first covered row (the package's own shape keys)
first=$(python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(next(iter(m['exact']), ''))" \
    "$dist/cake_${problem}_pf/manifest.json" 2>/dev/null)
[ -n "$first" ] && part overhead 40 python3 bench/export_overhead.py "$dist/cake_${problem}_pf" --shape "$first" \
    --out "$OUT/more"
tail -6 "$OUT/overhead.log" 2>/dev/null
mkdir -p "$OUT/more" && mv "$OUT/export.log" "$OUT/nvidia-smi.txt" "$OUT/more/" 2>/dev/null
tar -czf "$OUT/$STATE.tgz" -C "/tmp/state/$STATE" --exclude=cache --exclude=prefect --exclude=refs --exclude=dist .
table "portfolio: $problem over $set, exported, beside $peer"
