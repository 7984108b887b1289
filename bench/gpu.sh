#!/usr/bin/env bash
# One call on the GPU machine: build, check and time everything #6 asks for; the target table prints last.
#
#   bash bench/gpu.sh                     # gpu tests, then every problem's kernels against its peers
#   bash bench/gpu.sh tests -k kmeans     # only the gpu tests (extra args go to pytest)
#   bash bench/gpu.sh corpus --problems gemm_bf16 --reps 30   # only the bench (extra args go to it)
#   bash bench/gpu.sh corpus --variants   # also every unregistered program under cake_core/problems/seeds/
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
    tests|corpus) ;;
    *) echo "bench/gpu.sh: unknown part '$what': all, tests or corpus" >&2; exit 2 ;;
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
rc=0
if [ "$what" = all ] || [ "$what" = tests ]; then
    echo "== gpu tests"
    python3 -m pytest -m gpu tests -o addopts="" -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" \
        "$@" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
    rc=${PIPESTATUS[0]}
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
