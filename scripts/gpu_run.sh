#!/usr/bin/env bash
# One call on a GPU machine: the GPU tests, then the decode and prefill benchmarks with the peers;
# full logs, JSON and plot under $OUT; a short summary of each printed LAST.
#
# From the repository root on the GPU machine:
#   bash scripts/gpu_run.sh [quick ARGS...] # pytest -m gpu (time-limited), bench --quick ARGS, bench --prefill
#   bash scripts/gpu_run.sh full            # bench over the full grid (48 shapes); no pytest
#   bash scripts/gpu_run.sh bench ARGS...   # bench with your own arguments (e.g. --shapes 64x8x128Kx1); no pytest
#   bash scripts/gpu_run.sh tests [PYTEST ARGS...]  # pytest -m gpu only (TEST_LIMIT default 560 s); the files or
#                                           # -k/--deselect given split the GPU tests over calls that each fit
#   bash scripts/gpu_run.sh memcheck [PYTEST ARGS...]  # the same under compute-sanitizer's memcheck (out-of-bounds
#                                           # and misaligned accesses in kernels; API errors not reported): memcheck.PID.txt per
#                                           # process; rc 0 only when the tests pass with 0 errors (TEST_LIMIT as tests)
# With .peers/ in the checkout the peers run: scripts/fetch_peer_wheels.sh fills .peers/whl (SGLang's
# Triton FP4 scorer), scripts/pack_deepgemm.sh writes .peers/deepgemm.tar.xz (DeepGEMM's FP8
# scorers, built here by scripts/build_deepgemm.sh while the GPU tests run),
# scripts/pack_deepgemm_multicast.sh writes .peers/deepgemm-multicast.tar.xz (the headers of DeepGEMM's newer
# SM90 kernel, peer deepgemm-fp8-sm90-multicast: unpacked to /tmp/deepgemm-mc, its launchers built with nvcc
# by sglang_fp4_indexer.bench.deepgemm_sm90_paged in the background, likewise).
# Environment: OUT (output folder; default ./out), PYTHON (default python3), COMPUTE_SANITIZER (memcheck mode's
# compute-sanitizer; default the one on PATH or under /usr/local/cuda*/bin),
# TEST_LIMIT / BENCH_LIMIT / PREFILL_LIMIT (seconds; quick mode's add up to under 10 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-$PWD/out}"
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

MODE="${1:-quick}"
[ $# -gt 0 ] && shift
case "$MODE" in
  quick) BENCH_ARGS=(--quick "$@"); RUN_TESTS=1; RUN_PREFILL=1; : "${BENCH_LIMIT:=210}" ;;
  full)  BENCH_ARGS=(); RUN_TESTS=0; : "${BENCH_LIMIT:=540}" ;;
  bench) BENCH_ARGS=("$@"); RUN_TESTS=0; : "${BENCH_LIMIT:=540}" ;;
  prefill) BENCH_ARGS=(--prefill "$@"); RUN_TESTS=0; PLOT=0; : "${BENCH_LIMIT:=240}" ;;
  tests) TEST_ARGS=("$@"); RUN_TESTS=1; RUN_BENCH=0; : "${TEST_LIMIT:=560}" ;;
  memcheck) TEST_ARGS=("$@"); RUN_TESTS=1; RUN_BENCH=0; SANITIZE=1; : "${TEST_LIMIT:=560}" ;;
  *) echo "usage: bash scripts/gpu_run.sh [quick|full|bench|prefill|tests|memcheck ARGS...]" >&2; exit 2 ;;
esac
PLOT_ARGS=(--plot "$OUTDIR/bench.png")
[ "${PLOT:-1}" = 0 ] && PLOT_ARGS=()
: "${TEST_LIMIT:=230}" "${PREFILL_LIMIT:=120}" "${RUN_PREFILL:=0}"

# 1. Carried wheels (SGLang's scorer and what its import chain needs) -> /tmp/site.
#    The bench appends /tmp/site to sys.path only when loading the peer, so the
#    device's own packages win everywhere else.
PEER="no wheels from .peers/whl (.peers/whl): SGLang's scorer will be unavailable"
if ls .peers/whl/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site .peers/whl/*.whl >"$OUTDIR/pip.log" 2>&1; then
    export SGLANG_FP4_INDEXER_PEER_SITE=/tmp/site
    PEER="wheels from .peers/whl installed in /tmp/site: $(ls .peers/whl | wc -l) wheels"
  else
    PEER="pip install of .peers/whl failed (see pip.log): SGLang's scorer will be unavailable"
  fi
fi

# 1b. DeepGEMM from source, in the background (about 75 s on 16 cores).
DG="no DeepGEMM archive (.peers/deepgemm.tar.xz): DeepGEMM's scorers will be unavailable"
DG_PID=
if [ -f .peers/deepgemm.tar.xz ]; then
  bash scripts/build_deepgemm.sh .peers/deepgemm.tar.xz /tmp/deepgemm >"$OUTDIR/deepgemm_build.txt" 2>&1 &
  DG_PID=$!
fi

# 1c. The headers of DeepGEMM's newer SM90 kernel -> /tmp/deepgemm-mc, its launchers built in the background
#     (next_n 1/2/4 x H 32/64, about 10-30 s); the bench finds them through these two variables.
MC="no .peers/deepgemm-multicast.tar.xz (scripts/pack_deepgemm_multicast.sh): deepgemm-fp8-sm90-multicast will be unavailable"
MC_PID=
if [ -f .peers/deepgemm-multicast.tar.xz ]; then
  rm -rf /tmp/deepgemm-mc && mkdir -p /tmp/deepgemm-mc
  if "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
       .peers/deepgemm-multicast.tar.xz /tmp/deepgemm-mc 2>/tmp/deepgemm-mc.txt; then
    export SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE=/tmp/deepgemm-mc/deepgemm-multicast/include
    export SGLANG_FP4_INDEXER_DEEPGEMM_SM90_BUILD=/tmp/deepgemm-mc/build
    "$PY" -m sglang_fp4_indexer.bench.deepgemm_sm90_paged build >/tmp/deepgemm-mc.txt 2>&1 &
    MC_PID=$!
  else
    MC="could not unpack .peers/deepgemm-multicast.tar.xz: $(tail -n 1 /tmp/deepgemm-mc.txt)"
  fi
fi

# 2. GPU tests (memcheck mode: under compute-sanitizer, a report per process in memcheck.PID.txt).
TESTS="skipped ($MODE mode)"
SAN=()
if [ "${SANITIZE:-0}" = 1 ]; then
  CS="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)}"
  if [ -n "$CS" ] && [ -x "$CS" ]; then
    # One report per process (%p: a test may start CUDA child processes); torch's caching allocator off, so
    # that an access past a tensor is past its allocation, where memcheck sees it. API errors are not reported:
    # cuda-python looks up driver entry points with cuGetProcAddress, and the ones this driver lacks return
    # CUDA_ERROR_INVALID_VALUE (34 of them, and no other error, in the Hopper GPU tests on an H100 with driver 580;
    # benchmarks/results/memcheck_sm90_api_errors_h100_2026-12-07.txt); a failing
    # call of the code under test raises in the test itself.
    rm -f "$OUTDIR"/memcheck.*.txt
    SAN=("$CS" --tool memcheck --report-api-errors no --error-exitcode 9 --log-file "$OUTDIR/memcheck.%p.txt")
    export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  else
    RUN_TESTS=0; TESTS="not run: no compute-sanitizer (COMPUTE_SANITIZER, PATH, /usr/local/cuda*/bin)${CS:+ at $CS}"
  fi
fi
if [ "$RUN_TESTS" = 1 ]; then
  T0=$SECONDS
  timeout -k 10 "$TEST_LIMIT" ${SAN[@]+"${SAN[@]}"} "$PY" -m pytest -m gpu -q -p no:cacheprovider -rfE --continue-on-collection-errors \
    ${TEST_ARGS[@]+"${TEST_ARGS[@]}"} >"$OUTDIR/pytest_gpu.log" 2>&1
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then TESTS="TIMED OUT after ${TEST_LIMIT}s"; else TESTS="rc=$rc: $(tail -n 1 "$OUTDIR/pytest_gpu.log") ($((SECONDS - T0)) s)"; fi
  if [ ${#SAN[@]} -gt 0 ]; then  # the ERROR SUMMARY line of every process's report, errors added up
    MC_ERRORS=$(cat "$OUTDIR"/memcheck.*.txt 2>/dev/null | awk '/ERROR SUMMARY:/ {n += $4; k++} END {print (k ? n : "none")}')
    TESTS="$TESTS; memcheck: $( [ "$MC_ERRORS" = none ] && echo "no ERROR SUMMARY written (timed out?)" \
      || echo "ERROR SUMMARY: $MC_ERRORS errors in $(ls "$OUTDIR"/memcheck.*.txt | wc -l) report(s)")"
  fi
fi

if [ -n "$DG_PID" ]; then
  if wait "$DG_PID"; then
    DG_SITE="$(tail -n 1 "$OUTDIR/deepgemm_build.txt")"
    export SGLANG_FP4_INDEXER_PEER_SITE="${SGLANG_FP4_INDEXER_PEER_SITE:+$SGLANG_FP4_INDEXER_PEER_SITE:}$DG_SITE"
    DG="built from source in $DG_SITE ($(cat "$DG_SITE/PACKED_FROM" 2>/dev/null))"
  else
    DG="DeepGEMM build failed (see deepgemm_build.txt): DeepGEMM's scorers will be unavailable"
    cp /tmp/deepgemm/build.log "$OUTDIR/deepgemm_build.log" 2>/dev/null
  fi
fi

if [ -n "$MC_PID" ]; then
  # Its log comes back only when a build failed (a call brings back at most 8 files).
  if wait "$MC_PID"; then
    MC="launchers built with nvcc in /tmp/deepgemm-mc/build against $(cut -d' ' -f1-3 /tmp/deepgemm-mc/deepgemm-multicast/PACKED_FROM 2>/dev/null)"
  else
    cp /tmp/deepgemm-mc.txt "$OUTDIR/deepgemm_mc_build.txt"
    cat /tmp/deepgemm-mc/build/*/build_n*_h*.log >>"$OUTDIR/deepgemm_mc_build.txt" 2>/dev/null
    MC="launcher build failed (deepgemm_mc_build.txt; the peer's rows say why): $(grep -m1 FAILED /tmp/deepgemm-mc.txt | cut -c1-200)"
  fi
fi

# 3. The benchmark (its JSON is rewritten after every shape, so a time-out still leaves numbers).
rm -f "$OUTDIR/bench.json" "$OUTDIR/prefill.json"
BENCH_RC=0
if [ "${RUN_BENCH:-1}" = 1 ]; then
  T0=$SECONDS
  timeout -k 10 "$BENCH_LIMIT" "$PY" -m sglang_fp4_indexer.cli bench --device cuda "${BENCH_ARGS[@]}" \
    --json "$OUTDIR/bench.json" ${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"} >"$OUTDIR/bench.log" 2>&1
  BENCH_RC=$?
  BENCH_S=$((SECONDS - T0))
fi

# 3b. Quick mode: the prefill rows too (their own JSON and log).
PREFILL_RC=
if [ "$RUN_PREFILL" = 1 ]; then
  T0=$SECONDS
  timeout -k 10 "$PREFILL_LIMIT" "$PY" -m sglang_fp4_indexer.cli bench --device cuda --prefill \
    --json "$OUTDIR/prefill.json" >"$OUTDIR/prefill.log" 2>&1
  PREFILL_RC=$?
  PREFILL_S=$((SECONDS - T0))
fi

# 4. Summary, last.
echo "== device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
echo "== peer: $PEER"
echo "== DeepGEMM: $DG"
echo "== DeepGEMM SM90 multicast: $MC"
echo "== pytest -m gpu: $TESTS"
if [ "$RUN_TESTS" = 1 ]; then grep -E "^(FAILED|ERROR) " "$OUTDIR/pytest_gpu.log" | head -n 15; fi
bench_status() {  # name rc limit log seconds
  case $2 in
    0) echo "== $1: ok (every timed output passed its check; $5 s)" ;;
    1) echo "== $1: rc=1 (a check failed or a scorer errored; see the table)" ;;
    124|137) echo "== $1: TIMED OUT after $3 s (partial results below)" ;;
    *) echo "== $1: rc=$2; last lines of $4:"; tail -n 15 "$OUTDIR/$4" ;;
  esac
}
[ "${RUN_BENCH:-1}" = 1 ] && bench_status bench "$BENCH_RC" "$BENCH_LIMIT" bench.log "$BENCH_S"
[ -n "$PREFILL_RC" ] && bench_status "bench --prefill" "$PREFILL_RC" "$PREFILL_LIMIT" prefill.log "$PREFILL_S"
echo "== logs: $OUTDIR (pytest_gpu.log, bench.log, bench.json, bench.png, prefill.log, prefill.json, pip.log$([ "$MODE" = memcheck ] && echo ", memcheck.PID.txt"))"
if [ -s "$OUTDIR/bench.json" ]; then
  "$PY" -m sglang_fp4_indexer.bench.report "$OUTDIR/bench.json"
fi
if [ -s "$OUTDIR/prefill.json" ]; then
  "$PY" -m sglang_fp4_indexer.bench.report "$OUTDIR/prefill.json"
fi
[ -s "$OUTDIR/bench.json" ] && { cp benchmarks/results/headline.csv "$OUTDIR/headline.csv" && "$PY" -m sglang_fp4_indexer.bench.history append "$OUTDIR/headline.csv" "$OUTDIR/bench.json" --commit "$(git describe --always --dirty 2>/dev/null)" || echo "== headline.csv: not appended (see above); the run's result is unaffected"; }  # a copy of the headline table with this run's rows
tests_passed() { grep -qE "^[0-9]+ passed" <(tail -n 1 "$OUTDIR/pytest_gpu.log") && ! grep -qE "failed|error" <(tail -n 1 "$OUTDIR/pytest_gpu.log"); }
# memcheck: the tests passed under memcheck, and every report says 0 errors
if [ "$MODE" = memcheck ]; then [ "$RUN_TESTS" = 1 ] && [ "${MC_ERRORS:-none}" = 0 ] && tests_passed; exit $?; fi
if [ "$MODE" = tests ]; then tests_passed; exit $?; fi
[ "$BENCH_RC" = 0 ] && [ "${PREFILL_RC:-0}" = 0 ]
