#!/usr/bin/env bash
# One device call: a cold evolution of PROBLEM on SET, as a user runs it, then its report and the best kernel's
# lineage; a long run goes on over calls from its warehouse. The table prints last.
#
#   STATE=moe bash bench/gpu_evolve.sh moe moe_decode 4 8 [more `cake evolve` options]
#       # run `cake evolve moe --shapes moe_decode --cold --generations 4 --population 8 --seed 0`; the home comes
#       # back as $OUT/moe.tgz; carried as .gpu-state/moe.tgz, the next call resumes the run to its generation count
#
# CAKE_TIMEOUT (default 400 s) stops the evolution (SIGINT: it keeps what it recorded) in time for the report,
# the lineage and the state to be written inside the call's limit. Writes under $OUT: evolve.log, report/,
# lineage.log (with the IR), $STATE.tgz and $STATE-samples.parquet (bench/gpu.sh cake).
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: STATE=NAME bash bench/gpu_evolve.sh PROBLEM SET GENERATIONS POPULATION [OPTIONS]" >&2; exit 2; }
source "$(dirname "$0")/gpu_parts.sh"
problem=$1 set=$2 gens=$3 pop=$4; shift 4
STATE=${STATE:-$problem}
export STATE CAKE_HOME=/tmp/state/$STATE/home
mkdir -p /tmp/site && { [ -e /tmp/site/.unpacked ] || { tar -xJf .gpu/site.tar.xz -C /tmp/site && touch /tmp/site/.unpacked; }; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
cake=(python3 -c "from cake_cli.main import main; main()")
# the run to resume: the newest run of PROBLEM in the carried home, if any
mkdir -p /tmp/state/$STATE && [ -f .gpu-state/$STATE.tgz ] && tar -xzf .gpu-state/$STATE.tgz -C /tmp/state/$STATE
prev=$("${cake[@]}" sql --format csv \
    "select run_id from runs_latest where problem = '$problem' order by started_at desc limit 1" 2>/dev/null | tail -n +2)
if [ -n "$prev" ]; then how=(--resume "$prev"); else how=(--cold --seed 0); fi
part evolve "$(( ${CAKE_TIMEOUT:-400} + 90 ))" env CAKE_TIMEOUT="${CAKE_TIMEOUT:-400}" STATE_FROM=/dev/null \
    bash bench/gpu.sh cake evolve "$problem" --shapes "$set" --generations "$gens" --population "$pop" "${how[@]}" "$@"
run=$("${cake[@]}" sql --format csv "select run_id from runs_latest where problem = '$problem' order by started_at desc limit 1" | tail -n +2)
best=$("${cake[@]}" sql --format csv "select attempt_id from run_best where run_id = '$run'" | tail -n +2)
part report 60 "${cake[@]}" report "$run" --out "$OUT/report" --no-publish
part lineage 30 "${cake[@]}" lineage "$best" --ir
grep -v '^ *$' "$OUT/lineage.log" | head -30
table "cold evolution: $problem on $set, run $run, best attempt ${best:-none}"
