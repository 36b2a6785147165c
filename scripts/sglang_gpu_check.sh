#!/usr/bin/env bash
# The plugin inside SGLang's own model runner on a GPU machine without SGLang or a network
# (scripts/sglang_one_batch.py says what runs and what is checked). Wheels from
# scripts/fetch_sglang_runtime_wheels.sh, DeepGEMM from scripts/pack_deepgemm.sh.
#
# The slimmed wheels, DeepGEMM's sources (xz) and the checkout fit one call while the checkout stays under about 13.5 MB
# (carry .peers/sglang-runtime/part1, .peers/sglang-runtime/part2 and .peers/deepgemm.tar.xz, and .peers/jit-cache
# where an earlier call brought JIT caches back); past that, carry part2 (with .peers/sglang-runtime/flashinfer,
# 8 MB) in the next call: each call installs the parts it finds and a warm machine keeps them. The steps can follow each other in one command or in calls that
# follow each other while the machine keeps /tmp:
#   bash scripts/sglang_gpu_check.sh install   # installs, prints the versions
#   bash scripts/sglang_gpu_check.sh runner    # one-batch FP8, FP4, FP4 eager
#   bash scripts/sglang_gpu_check.sh engine    # sglang.Engine with MTP (speculative decoding), FP8 then FP4;
#                                              # without speculative decoding if that does not start
#   bash scripts/sglang_gpu_check.sh mtp       # EAGLE (MTP) 1 step / 2 draft tokens and 3 / 4, FP8 then FP4, every
#                                              # top-k row read by the test-only trace plugin and checked
#   bash scripts/sglang_gpu_check.sh e2e       # DeepSeek-V3.2-size layers in SGLang's bench_one_batch, FP8 and FP4,
#                                              # with the decode profile by kernel category
#   bash scripts/sglang_gpu_check.sh serving   # the same model behind launch_server, SGLang's bench_serving,
#                                              # FP8 then FP4 (SERVE_POOL_TOKENS: a KV-limited load)
#   bash scripts/sglang_gpu_check.sh profile   # the same server, FP8 then FP4: SGLang's profiler over a few decode
#                                              # steps per PROFILE_SHAPES entry, summed by kernel category
#   bash scripts/sglang_gpu_check.sh hicache   # the radix cache's prefix reuse and HiCache's eviction and reload, FP4
#                                              # then FP8, on the tiny model (scripts/hicache_radix_gpu.py)
#   bash scripts/sglang_gpu_check.sh soak      # thousands of requests that disconnect, abort and retract, FP4 then
#                                              # FP8, with the checks of scripts/soak.py (tiny model, MTP on);
#                                              # soak-check: the checks of loads run with SOAK_CHECK=0
#   bash scripts/sglang_gpu_check.sh warm      # starts the tiny model's MTP servers (FP8, FP4) once, so that a fresh
#                                              # machine's JIT compile is paid in a command of its own (JIT_CACHE_OUT=1)
#   bash scripts/sglang_gpu_check.sh ab        # `sglang-fp4-indexer ab` end to end (both arms, both orders) on the
#                                              # tiny model with MTP (AB_SIZE=v32-layers: the real-size layers)
#   bash scripts/sglang_gpu_check.sh topk      # SGLang's decode and verify top-k kernels against the exact top-k at
#                                              # real and dummy-weight score scales (scripts/sglang_topk_probe.py)
#   bash scripts/sglang_gpu_check.sh server    # one request to launch_server with --enable-fp4-indexer
#   bash scripts/sglang_gpu_check.sh pd        # PD disaggregation on one GPU (scripts/pd_gpu.py): FP4 prefill ->
#                                              # FP4 decode over Mooncake TCP against a plain FP4 server, then FP8
#                                              # prefill -> FP4 decode refused at bootstrap. Needs .peers/pd-runtime
#                                              # (scripts/fetch_pd_wheels.sh), brought along in a command of its own.
# Each step installs whatever wheels it finds under .peers/sglang-runtime into /tmp/site.
# Output: $OUT (default ./out): summary.json, table.txt, logs.tar.gz; the table is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
# Every step is named before anything is installed or started (the header above says what each does).
STEPS="install runner engine mtp e2e serving profile hicache soak soak-check warm ab topk server pd"
for arg in "${@:-runner}"; do
  case "$arg" in
    -h|--help) { sed -n '2,4p' "$0"; sed -n '/^#   bash scripts\/sglang_gpu_check.sh install/,/^# Output:/p' "$0"; } \
                 | sed 's/^# \{0,1\}//'; exit 0 ;;
  esac
  case " $STEPS " in
    *" $arg "*) ;;
    *) echo "usage: bash scripts/sglang_gpu_check.sh STEP [STEP ...] with STEP one of: $STEPS (got '$arg'; --help says what each does)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-$PWD/out}"
WORK=/tmp/sglang-check
mkdir -p "$OUTDIR" "$WORK/logs"
# When this call began (steps run in processes of their own below): SOAK_CALL_S counts from here.
export CALL_T0="${CALL_T0:-$(date +%s)}"
# Several steps in one call: bash scripts/sglang_gpu_check.sh install mtp serving (each as if called alone, in order).
if [ $# -gt 1 ]; then
  rc=0
  for step in "$@"; do bash "$0" "$step" || rc=$?; done
  exit $rc
fi
STEP="${1:-runner}"
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1  # sglang-kernel 0.4.5 (built for torch 2.11) instead of the pinned 0.4.10
# The slimmed sglang-kernel leaves out FA3, through which SGLang prefills prompts up to its dense threshold
# (index_topk) densely: the server's warm-up request and /health's one-token generation are such prompts.
# Threshold 0 keeps every prefill of every stage on the sparse path (SGLang keeps a threshold set by hand).
export SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0
# SGLang sets DeepGEMM's DG_JIT_CACHE_DIR from its own SGLANG_DG_CACHE_DIR at import, so both name the same folder;
# SGLang's other compile caches go under SGLANG_CACHE_DIR.
export DG_JIT_CACHE_DIR="$WORK/deepgemm-jit" SGLANG_DG_CACHE_DIR="$WORK/deepgemm-jit" SGLANG_CACHE_DIR="$WORK/sglang-cache" \
  TRITON_CACHE_DIR="$WORK/triton" TVM_FFI_CACHE_DIR="$WORK/tvm-ffi"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
# SGLang's radix cache keeps its tree in a Rust TreeCore by default; on this machine's torch (2.11, not SGLang's pinned
# 2.14.1) its first insert fails ("insert value must be an int64 tensor, got Uint8"), FP8 and FP4 alike. SGLang's
# Python TreeCore, which it falls back to itself where the Rust one cannot load, serves the steps that keep the
# radix cache on (soak, ab).
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND="${SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND:-python}"
# Only FlashInfer's header files are installed (below): SGLang must not take it for an importable package.
export SGLANG_IS_FLASHINFER_AVAILABLE=false

# DeepGEMM builds from its sources (about 75 s on 16 cores) while pip installs the wheels: it needs the machine's
# torch only, not the wheels.
DG_BUILD=
if [ -f .peers/deepgemm.tar.xz ] && [ ! -f "$WORK/deepgemm.site" ]; then
  bash scripts/build_deepgemm.sh .peers/deepgemm.tar.xz /tmp/deepgemm >"$WORK/logs/deepgemm_build.log" 2>&1 &
  DG_BUILD=$!
fi
for part in .peers/sglang-runtime/part1 .peers/sglang-runtime/part2; do
  if ls "$part"/*.whl >/dev/null 2>&1 && [ ! -f "$WORK/$(basename $part).installed" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$part"/*.whl >>"$WORK/logs/pip.log" 2>&1 && touch "$WORK/$(basename $part).installed" \
      || echo "pip install of $part failed (logs/pip.log)"
  fi
done
# FlashInfer 0.7.2's header files (the version `pip install sglang==0.5.23` resolves; its wheel's flashinfer/data,
# 8 MB as xz, carried with part2; scripts/fetch_sglang_runtime_wheels.sh): SGLang JIT-compiles its speculative sampling
# kernel (a sampled request's verify under MTP) against them and stops the server where they are missing. They come
# with an __init__.py that fails on import: SGLang's JIT finds the headers by find_spec, which does not run it, while
# sglang-kernel (which takes FlashInfer's norm kernels when `import flashinfer.norm` works) and SGLang (told by
# SGLANG_IS_FLASHINFER_AVAILABLE=false above) keep their own kernels, as in every run before the headers were carried.
FI_TAR=$(ls .peers/sglang-runtime/flashinfer/*.tar.xz 2>/dev/null | head -n 1)
if [ -n "$FI_TAR" ] && [ ! -f "$WORK/flashinfer.installed" ]; then
  mkdir -p /tmp/site && tar -xJf "$FI_TAR" -C /tmp/site \
    && printf '%s\n' '"""FlashInfer header files only (flashinfer/data), for SGLang JIT kernels that include them; not its package."""' \
         'raise ImportError("flashinfer: only its header files are installed here (scripts/sglang_gpu_check.sh)")' \
         >/tmp/site/flashinfer/__init__.py \
    && touch "$WORK/flashinfer.installed" || echo "FlashInfer's headers not extracted"
fi
# PD disaggregation's transfer engine (scripts/fetch_pd_wheels.sh): the slimmed Mooncake wheel into /tmp/site; of the
# system libraries its engine links, only those this machine's loader does not find are linked into /tmp/pd-syslibs.
if ls .peers/pd-runtime/*.whl >/dev/null 2>&1 && [ ! -f "$WORK/pd-runtime.installed" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .peers/pd-runtime/*.whl >>"$WORK/logs/pip.log" 2>&1 && touch "$WORK/pd-runtime.installed" \
    || echo "pip install of .peers/pd-runtime failed (logs/pip.log)"
fi
if [ -f /tmp/site/mooncake/engine.so ] && [ -d .peers/pd-runtime/syslibs ]; then
  mkdir -p /tmp/pd-syslibs
  for _ in 1 2 3 4 5 6; do  # each round links what is missing, then looks again at what those link
    missing=$(LD_LIBRARY_PATH=/tmp/pd-syslibs ldd /tmp/site/mooncake/engine.so /tmp/pd-syslibs/*.so* 2>/dev/null \
      | awk '/not found/ {print $1}' | sort -u)
    linked=0
    for lib in $missing; do
      [ -f ".peers/pd-runtime/syslibs/$lib" ] && [ ! -e "/tmp/pd-syslibs/$lib" ] \
        && ln -s "$PWD/.peers/pd-runtime/syslibs/$lib" "/tmp/pd-syslibs/$lib" && linked=1
    done
    [ $linked = 1 ] || break
  done
  echo "pd syslibs linked: $(ls /tmp/pd-syslibs | tr '\n' ' ') still missing (libcudart/libcuda come from torch / the driver): $missing" >>"$WORK/logs/pd_syslibs.log"
fi
# The plugin itself, installed so that SGLang's loader finds its entry point (sglang.srt.plugins).
if [ ! -f "$WORK/plugin.installed" ] || [ sglang_fp4_indexer -nt "$WORK/plugin.installed" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/site . \
    >>"$WORK/logs/pip.log" 2>&1 && touch "$WORK/plugin.installed" || echo "plugin install failed (logs/pip.log)"
fi
if [ -n "$DG_BUILD" ]; then
  wait "$DG_BUILD" && tail -n 1 "$WORK/logs/deepgemm_build.log" >"$WORK/deepgemm.site" || echo "DeepGEMM build failed"
fi
# The test-only top-k trace plugin (scripts/topk_trace): registers nothing unless FP4_INDEXER_TOPK_TRACE_DIR is set.
if [ ! -f "$WORK/topk_trace.installed" ] || [ scripts/topk_trace/fp4_indexer_topk_trace.py -nt "$WORK/topk_trace.installed" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target /tmp/site \
    scripts/topk_trace >>"$WORK/logs/pip.log" 2>&1 && touch "$WORK/topk_trace.installed" || echo "topk_trace install failed (logs/pip.log)"
fi
# JIT caches (DeepGEMM's, Triton's, tvm-ffi's, SGLang's) brought back from an earlier machine into .peers/jit-cache/: a fresh
# machine otherwise compiles for about 4 minutes during its first graph capture. JIT_CACHE_OUT=1 writes each cache
# to $OUT/jit-<name>.tar.gz at the end (each kept when under 16 MB, what comes back from a call); copy those files
# into .peers/jit-cache/ and carry that folder.
if ls .peers/jit-cache/jit-*.tar.gz >/dev/null 2>&1 && [ ! -f "$WORK/jit-cache.extracted" ]; then
  for f in .peers/jit-cache/jit-*.tar.gz; do tar -xzf "$f" -C "$WORK" || echo "jit cache $f not extracted"; done
  touch "$WORK/jit-cache.extracted"
fi
DG_SITE="$(cat "$WORK/deepgemm.site" 2>/dev/null)"
export PYTHONPATH="/tmp/site${DG_SITE:+:$DG_SITE}"
"$PY" scripts/sglang_one_batch.py make-model "$WORK/tiny" >/dev/null

# The server flags of the soak, warm and ab steps (dummy weights, an FP8 MLA KV cache, MTP as shipped: EAGLE 3 steps /
# 4 draft tokens, decode CUDA graphs up to batch 32): one list, so that the warm step compiles what the others run.
MTP_FLAGS=(--load-format dummy --kv-cache-dtype fp8_e4m3 --random-seed 0 --speculative-algorithm EAGLE
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --disable-prefill-cuda-graph
  --cuda-graph-max-bs-decode 32)

mtp_server() {  # model format port log [flags...]: launch_server in the background with MTP_FLAGS (soak, warm)
  local model=$1 fmt=$2 port=$3 log=$4; shift 4
  "$PY" -m sglang.launch_server --model-path "$model" --host 127.0.0.1 --port "$port" "${MTP_FLAGS[@]}" \
    --max-total-tokens "${SOAK_POOL_TOKENS:-262144}" "$@" $([ "$fmt" = fp4 ] && echo --enable-fp4-indexer) >"$log" 2>&1 &
}

wait_healthy() {  # port pid seconds: status 0 once /health answered 200, 1 when the server exited or time ran out
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$3" ]; do
    "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=5)" \
      >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 2
  done
  return 1
}

call_left() {  # seconds [margin]: what is left of SECONDS since the call began (CALL_T0), less MARGIN
  echo $(( $1 - ($(date +%s) - CALL_T0) - ${2:-0} ))
}

stage() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$WORK/stages.txt"
  [ $rc = 0 ] || grep -E "Error|error:|Traceback|FAILED" "$WORK/logs/$name.log" | tail -n 6
  return $rc
}

# A stage that fails inside SGLang's start-up (before any request) is run once more with this plugin
# not loaded (SGLANG_PLUGINS names no installed plugin) and CUDA_LAUNCH_BLOCKING=1, as <name>_without_plugin:
# it tells whether the plugin is at fault and which kernel fails first (WITHOUT_PLUGIN_ARGS: arguments added to
# that run, e.g. to leave out --enable-fp4-indexer, which only the plugin defines). Its output file is renamed so that
# the comparison never reads it as the plugin's.
stage_or_bisect() {  # name limit out command...
  local name=$1 limit=$2 out=$3
  shift 3
  stage "$name" "$limit" "$@" && return 0
  grep -qs "Scheduler hit an exception" "$WORK/logs/$name.log" "$out.log" || return 1
  [ -f "$out.log" ] && mv "$out.log" "$WORK/logs/${name}_launch.log"
  [ -f "$out" ] && mv "$out" "$out.with_plugin"
  SGLANG_PLUGINS=none-loaded CUDA_LAUNCH_BLOCKING=1 stage "${name}_without_plugin" "$limit" "$@" ${WITHOUT_PLUGIN_ARGS:-}
  [ -f "$out" ] && mv "$out" "$WORK/logs/${name}_without_plugin.json"
  [ -f "$out.log" ] && mv "$out.log" "$WORK/logs/${name}_without_plugin_launch.log"
  [ -f "$out.with_plugin" ] && mv "$out.with_plugin" "$out"
  return 1
}

# A sample of top-k traces' records into ONE tarball under $OUT (what comes back from a call: at most 8 files of 16 MB),
# each trace folder's records in the order they were written, those that fit 14 MB together (a record larger than
# what is left is skipped, not the rest): the rows behind a failed check, to read here.
soak_check() {  # tag fmt: scripts/soak.py check on the load $OUTDIR/<tag>_<fmt>.json, its server log and its trace
  local tag=$1 fmt=$2 size extra=()
  # The tag names the run (soak[_hicache][_SIZE]): no oracle row where the soak step recorded none (index_scale),
  # and the HiCache row required where the step started HiCache (not only where the server's info says so).
  size=${tag#soak}; size=${size#_hicache}; size=${size#_}
  [ -z "$(index_scale "${size:-tiny}")" ] && extra+=(--no-oracle)
  case "$tag" in soak_hicache*) extra+=(--expect-hicache) ;; esac
  "$PY" scripts/soak.py check "$OUTDIR/${tag}_$fmt.json" --log "$WORK/logs/${tag}_server_$fmt.log" \
    --trace "$WORK/trace_${tag}_$fmt" --draft-tokens 4 --json "$OUTDIR/${tag}_checks_$fmt.json" \
    ${extra[@]+"${extra[@]}"} >>"$OUTDIR/table.txt" 2>&1 \
    || { echo "${tag} $fmt: a check failed (table.txt)"; pack_trace "$OUTDIR/trace_${tag}_$fmt.tar.gz" "$WORK/trace_${tag}_$fmt"; }
  cp "$OUTDIR/${tag}_checks_$fmt.json" "$WORK/soak/" 2>/dev/null
  gzip -c "$WORK/logs/${tag}_server_$fmt.log" >"$OUTDIR/${tag}_server_$fmt.log.gz" 2>/dev/null
}

pack_trace() {  # out-file trace-dir...
  local out=$1 list total=0 size f d
  shift
  list=$(mktemp)
  for d in "$@"; do
    [ -d "$d" ] || continue
    for f in $(ls "$d" | sort -t_ -k1,1n -k2,2n); do
      size=$(stat -c %s "$d/$f")
      [ $((total + size)) -le 14000000 ] || continue
      total=$((total + size)); echo "$(basename "$d")/$f" >>"$list"
    done
  done
  [ -s "$list" ] && tar -czf "$out" -C "$WORK" -T "$list"
  rm -f "$list"
}

# The model a step serves, made once per size, depth and EP degree under $WORK; sets M2 to its folder.
make_rank_model() {  # size layers-or-empty ep-or-empty
  M2="$WORK/$1${2:+-$2}${3:+-ep$3}"
  "$PY" scripts/sglang_one_batch.py make-model "$M2" --size "$1" ${2:+--layers "$2"} ${3:+--ep "$3"} >/dev/null
}

# The trace plugin's index scale for a model size (TRACE_INDEX_SCALE, default "real"): only the bf16 tiny sizes take
# it; SGLang's dummy weights stay as they are on the FP8 block-quantized ones.
index_scale() {  # size
  case "$1" in tiny*) echo "${TRACE_INDEX_SCALE-real}" ;; *) echo "" ;; esac
}

# The GEMM flag of a model size's servers (soak, ab): the FP8 block-quantized sizes take SGLang's Triton block-FP8 GEMMs,
# as the e2e, serving and profile steps do; with DeepGEMM importable SGLang would otherwise pick DeepGEMM's GEMMs and
# pre-compile every shape of them at the server's start (10-20 minutes, SGLang's log says). The tiny sizes are bf16.
size_flags() {  # size
  case "$1" in tiny*) ;; *) echo --fp8-gemm-backend triton ;; esac
}

M="$WORK/tiny"
# SERVE_SPEC="STEPS:DRAFT_TOKENS": SGLang's EAGLE on the model's next-n layer (top-1 drafts), for the serving and
# profile steps.
SPEC=()
if [ -n "${SERVE_SPEC:-}" ]; then
  SPEC=(--speculative-algorithm EAGLE --speculative-num-steps "${SERVE_SPEC%%:*}" --speculative-eagle-topk 1
        --speculative-num-draft-tokens "${SERVE_SPEC##*:}")
fi
case "$STEP" in
  install)
    "$PY" -c "import sglang, sgl_kernel, torch; print('sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__version__, 'torch', torch.__version__)" 2>&1 | tail -n 3
    ;;
  runner)
    stage fp8 250 "$PY" scripts/sglang_one_batch.py run --model "$M" --out "$WORK/fp8.pt"
    stage fp4 150 "$PY" scripts/sglang_one_batch.py run --model "$M" --out "$WORK/fp4.pt" --fp4
    stage fp4_eager 150 "$PY" scripts/sglang_one_batch.py run --model "$M" --out "$WORK/fp4_eager.pt" --fp4 --eager
    ;;
  engine)
    # The first stage on a fresh machine also compiles SGLang's and DeepGEMM's JIT kernels (about 4 minutes).
    # cuBLAS logs why it fails if it does: SGLang's start-up matmul has failed inside cublasCreate with EAGLE,
    # with this plugin loaded or not (benchmarks/results/sglang_engine_mtp_h200_fp8_without_plugin_cublas.log).
    # If the EAGLE Engine fails at start-up, the same Engine runs without speculative decoding, FP8 then FP4
    # (ENGINE_POOL_TOKENS / ENGINE_MEM_FRACTION set SGLang's --max-total-tokens / --mem-fraction-static there).
    # ENGINE_DEFAULT=0 goes straight to the second pair.
    if [ "${ENGINE_DEFAULT:-1}" = 1 ] && CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr stage engine_fp8 280 "$PY" scripts/sglang_one_batch.py engine --model "$M" --out "$WORK/engine_fp8.json"; then
      stage engine_fp4 200 "$PY" scripts/sglang_one_batch.py engine --model "$M" --out "$WORK/engine_fp4.json" --fp4
    else
      POOL=()
      [ -n "${ENGINE_POOL_TOKENS:-}" ] && POOL+=(--max-total-tokens "$ENGINE_POOL_TOKENS")
      [ -n "${ENGINE_MEM_FRACTION:-}" ] && POOL+=(--mem-fraction-static "$ENGINE_MEM_FRACTION")
      stage engine_fp8_plain 280 "$PY" scripts/sglang_one_batch.py engine --model "$M" --out "$WORK/engine_fp8.json" --speculative none ${POOL[@]+"${POOL[@]}"} \
        && stage engine_fp4_plain 200 "$PY" scripts/sglang_one_batch.py engine --model "$M" --out "$WORK/engine_fp4.json" --fp4 --speculative none ${POOL[@]+"${POOL[@]}"}
    fi
    ;;
  mtp)
    # SGLang's EAGLE (MTP on the next-n layer) through sglang.Engine, FP8 then FP4, the top-k of every target
    # verify, draft decode and draft extend call read by the trace plugin (SGLang's --enable-return-indexer-topk
    # capturer makes its start-up cuBLAS call fail on this stack). MTP_CONFIGS: "STEPS:DRAFT_TOKENS ...".
    # MTP_SIZE=tiny-interleaved: the tiny model with interleaved indexer RoPE (GLM-5.x), so SGLang's fused indexer
    # runs and the plugin's rotation inside it is what serves.
    # MTP_ORACLE_LAYERS (default "0": the target model's first layer in verify, and the MTP layer, which is layer 0 of
    # the draft model, in the draft passes; "" for none): the layers whose scorer inputs and cache pages the trace
    # plugin keeps, so that trace-check --oracle holds those rows' top-k to the fp64 oracle on the pages the server held.
    export FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS="${MTP_ORACLE_LAYERS-0}"
    # TRACE_INDEX_SCALE (default "real"; "" for SGLang's dummy weights as they are): the trace plugin gives the tiny
    # models' indexer a real checkpoint's logit scale (its _after_dummy_load), without which every index logit is
    # about 1e-16 and neither SGLang's decode top-k nor the oracle can order them.
    FP4_INDEXER_TOPK_TRACE_INDEX_SCALE="$(index_scale "${MTP_SIZE:-tiny}")"
    export FP4_INDEXER_TOPK_TRACE_INDEX_SCALE
    ORACLE=(); [ -n "$FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS" ] && ORACLE=(--oracle)
    if [ -n "${MTP_SIZE:-}" ]; then
      M="$WORK/$MTP_SIZE"
      "$PY" scripts/sglang_one_batch.py make-model "$M" --size "$MTP_SIZE" >/dev/null
    fi
    for cfg in ${MTP_CONFIGS:-1:2 3:4}; do
      s=${cfg%%:*}; n=${cfg##*:}
      for fmt in fp8 fp4; do
        rm -rf "$WORK/trace_mtp${s}_$fmt"
        stage "mtp${s}_$fmt" "${MTP_LIMIT:-280}" "$PY" scripts/sglang_one_batch.py engine --model "$M" --out "$WORK/mtp${s}_$fmt.json" \
          --spec-steps "$s" --draft-tokens "$n" --trace "$WORK/trace_mtp${s}_$fmt" $([ $fmt = fp4 ] && echo --fp4)
      done
      FP8_RUN=(); [ -f "$WORK/mtp${s}_fp8.json" ] && FP8_RUN=(--fp8 "$WORK/mtp${s}_fp8.json")
      "$PY" scripts/sglang_one_batch.py trace-check ${FP8_RUN[@]+"${FP8_RUN[@]}"} --fp4 "$WORK/mtp${s}_fp4.json" ${ORACLE[@]+"${ORACLE[@]}"} \
        --fp4-log "$WORK/logs/mtp${s}_fp4.log" --json "$OUTDIR/mtp${s}.json" >>"$OUTDIR/table.txt" 2>>"$WORK/logs/compare.log"
      if grep -q '"ok": false' "$OUTDIR/mtp${s}.json" 2>/dev/null; then  # the traces behind a failed check come back
        pack_trace "$OUTDIR/trace_mtp${s}.tar.gz" "$WORK/trace_mtp${s}_fp8" "$WORK/trace_mtp${s}_fp4"
      fi
    done
    ;;
  e2e)
    # DeepSeek-V3.2's real per-layer sizes (make-model --size v32-layers) in SGLang's own bench_one_batch, FP8 then
    # FP4 in the same call, with a torch-profiler trace of 3 decode steps per shape. E2E_SHAPES: "BATCH:INPUT ...".
    # bench_one_batch prefills the whole batch in one pass: from 58 255 tokens (batch x input) SGLang's Triton
    # block-FP8 GEMM overflows its 32-bit output offset in the dense layer's gate-up projection (36 864 outputs)
    # and the pass fails with FP8 and FP4 alike, so the shapes stay at or below 57 344 tokens.
    M2="$WORK/v32-layers"
    # E2E_SHAPES="" (set and empty) runs no profiled shape, only E2E_HOST.
    SHAPES="${E2E_SHAPES-1:57344 2:28672}"
    # Every shape is prefilled in one pass: refuse those past the Triton GEMM's 32-bit offset before any server starts
    # (an earlier call asked for 64 x 4096 = 262 144 tokens in the host-time step and got nothing back).
    for shape in $SHAPES ${E2E_HOST:-}; do
      tokens=$(( ${shape%%:*} * ${shape##*:} ))
      [ "$tokens" -le 57344 ] || { echo "e2e: $shape is $tokens tokens in one prefill pass; at most 57344 (58 255 overflow SGLang's Triton block-FP8 GEMM in this model's dense layer)"; exit 2; }
    done
    "$PY" scripts/sglang_one_batch.py make-model "$M2" --size v32-layers >/dev/null
    for shape in $SHAPES; do
      b=${shape%%:*}; il=${shape##*:}
      for fmt in fp8 fp4; do
        stage "one_batch_${fmt}_${b}x${il}" "${E2E_LIMIT:-300}" "$PY" scripts/sglang_bench.py one-batch --model-path "$M2" \
          --load-format dummy --kv-cache-dtype fp8_e4m3 --fp8-gemm-backend triton --mem-fraction-static 0.3 \
          --random-seed 0 --batch-size "$b" --input-len "$il" --output-len 32 --run-name "$fmt" \
          --result-filename "$OUTDIR/one_batch.jsonl" --profile --profile-stage decode --profile-steps 3 \
          --profile-activities CPU GPU --profile-prefix "$WORK/prof_$fmt" $([ $fmt = fp4 ] && echo --enable-fp4-indexer)
      done
      "$PY" scripts/sglang_bench.py profile-table --steps 3 "$WORK"/prof_fp8_batch${b}_input${il}_*decode*.trace.json.gz \
        "$WORK"/prof_fp4_batch${b}_input${il}_*decode*.trace.json.gz --json "$OUTDIR/profile_${b}x${il}.json" \
        >>"$OUTDIR/table.txt" 2>>"$WORK/logs/compare.log"
    done
    # E2E_HOST="BATCH:INPUT": the same model's decode run eagerly (as SGLang runs batches above its captured sizes),
    # the host time per indexer call written by sglang_bench.py --indexer-host-time; e.g. 64:896 (57 344 tokens).
    if [ -n "${E2E_HOST:-}" ]; then
      b=${E2E_HOST%%:*}; il=${E2E_HOST##*:}
      for fmt in fp8 fp4; do
        stage "host_${fmt}_${b}x${il}" "${E2E_LIMIT:-300}" "$PY" scripts/sglang_bench.py one-batch --model-path "$M2" \
          --load-format dummy --kv-cache-dtype fp8_e4m3 --fp8-gemm-backend triton --mem-fraction-static 0.3 \
          --random-seed 0 --batch-size "$b" --input-len "$il" --output-len 16 --run-name "${fmt}_eager" \
          --result-filename "$OUTDIR/one_batch.jsonl" --disable-cuda-graph --indexer-host-time "$OUTDIR/host_$fmt.json" \
          $([ $fmt = fp4 ] && echo --enable-fp4-indexer)
      done
    fi
    grep -h "FP4 indexer active\|KV Cache is allocated\|max_total_num_tokens" "$WORK"/logs/one_batch_*.log | head -n 8 >>"$OUTDIR/table.txt"
    ;;
  serving)
    # DeepSeek-V3.2-size layers behind python -m sglang.launch_server, SGLang's bench_serving on localhost, FP8 then
    # FP4: SERVE_LENS input lengths, SERVE_OUTPUT_LEN output tokens (default 256), SERVE_PROMPTS prompts at SERVE_CONC
    # concurrency. With
    # SERVE_POOL_TOKENS (KV-limited load) FP8 gets that many pool tokens and FP4 the tokens the same memory holds
    # by SGLang's per-token sizing of this model (656 B MLA + 132 or 68 B index per token and layer).
    # SERVE_SPEC="STEPS:DRAFT_TOKENS": MTP on (SGLang's EAGLE on the model's next-n layer, top-1 drafts); bench_serving
    # then reports the accepted length, which dummy weights make meaningless: read TPOT and the verify-step time.
    # SERVE_FORMATS: which of "fp8 fp4" to run (one per call where both do not fit one call's time); SERVE_EXTRA:
    # more launch_server arguments (e.g. "--cuda-graph-max-bs-decode 4" to capture fewer decode graphs; SGLang 0.5.23 refuses the ambiguous "--cuda-graph-max-bs").
    # SERVE_PREFILL_GRAPHS=1 keeps SGLang's prefill CUDA graphs: their capture (58 token counts, "breakable"
    # backend) took 195 s of one server's start on an H100; by default both servers prefill eagerly
    # (--disable-prefill-cuda-graph), decode runs under CUDA graphs either way.
    # SERVE_SIZE / SERVE_LAYERS / SERVE_EP choose the model as the profile step's PROFILE_* do (e.g. SERVE_SIZE=v32-rank
    # SERVE_EP=32: all 61 layers of a DP-attention + EP32 rank), SERVE_MEM_FRACTION SGLang's --mem-fraction-static
    # (default 0.5; a rank's real memory: 0.9 and no SERVE_POOL_TOKENS), SERVE_READY_S the wait for /health.
    make_rank_model "${SERVE_SIZE:-v32-layers}" "${SERVE_LAYERS:-}" "${SERVE_EP:-}"
    PREFILL_GRAPHS=(--disable-prefill-cuda-graph)
    [ "${SERVE_PREFILL_GRAPHS:-0}" = 1 ] && PREFILL_GRAPHS=()
    PAIR="$WORK/serving_$(basename "$M2")"  # the pair is kept per model: a later size never pairs with this one
    for fmt in ${SERVE_FORMATS:-fp8 fp4}; do
      POOL=()
      if [ -n "${SERVE_POOL_TOKENS:-}" ]; then
        t=$SERVE_POOL_TOKENS; [ $fmt = fp4 ] && t=$(( SERVE_POOL_TOKENS * (656 + 132) / (656 + 68) ))
        POOL=(--max-total-tokens "$t")
      fi
      stage "serving_$fmt" "${SERVE_LIMIT:-540}" "$PY" scripts/sglang_bench.py serving --model "$M2" --out "$OUTDIR/serving_$fmt.jsonl" \
        --input-lens ${SERVE_LENS:-32768 100000} --prompts "${SERVE_PROMPTS:-16}" --concurrency "${SERVE_CONC:-8}" \
        --output-len "${SERVE_OUTPUT_LEN:-256}" \
        ${SERVE_READY_S:+--ready-timeout "$SERVE_READY_S"} \
        $([ $fmt = fp4 ] && echo --fp4) --load-format dummy --kv-cache-dtype fp8_e4m3 --fp8-gemm-backend triton \
        --mem-fraction-static "${SERVE_MEM_FRACTION:-0.5}" --disable-radix-cache --random-seed 0 ${POOL[@]+"${POOL[@]}"} ${SPEC[@]+"${SPEC[@]}"} ${PREFILL_GRAPHS[@]+"${PREFILL_GRAPHS[@]}"} ${SERVE_EXTRA:-}
      cp "$OUTDIR/serving_$fmt.jsonl.server.log" "$WORK/logs/" 2>/dev/null; rm -f "$OUTDIR/serving_$fmt.jsonl.server.log"
      rm -f "${PAIR}_$fmt.jsonl"; cp "$OUTDIR/serving_$fmt.jsonl" "${PAIR}_$fmt.jsonl" 2>/dev/null
      grep -h "KV Cache is allocated\|max_total_num_tokens\|FP4 indexer active" "$WORK/logs/serving_$fmt.jsonl.server.log" \
        2>/dev/null | head -n 3 >>"$OUTDIR/table.txt"
    done
    # The pair is read from $WORK, so FP8 and FP4 may come from calls that follow each other on one machine.
    if [ -f "${PAIR}_fp8.jsonl" ] && [ -f "${PAIR}_fp4.jsonl" ]; then
      "$PY" scripts/sglang_bench.py serving-table --fp8 "${PAIR}_fp8.jsonl" --fp4 "${PAIR}_fp4.jsonl" \
        --json "$OUTDIR/serving_table.json" >>"$OUTDIR/table.txt" 2>>"$WORK/logs/compare.log"
    fi
    ;;
  profile)
    # Where a decode step's time goes behind launch_server (scripts/sglang_bench.py serving-profile): the serving
    # step's model and flags, FP8 then FP4, and per PROFILE_SHAPES entry ("BATCH:INPUT ...") that many requests
    # decoding together while SGLang's profiler records PROFILE_STEPS decode batches; then the table by kernel
    # category per shape (profile-table), and the traces under $OUT where they are small enough to come back.
    # SERVE_SPEC turns MTP on as in the serving step (one decode batch is then one verify cycle). On a fresh machine the
    # first server takes minutes to be ready (151 s with the JIT caches carried, 326 s without): run SERVE_FORMATS=fp8 and SERVE_FORMATS=fp4 in calls that follow each
    # other (the table pairs the traces left in $WORK), with PROFILE_LIMIT (default 540 s) per format.
    # The traces come back packed in $OUT/serving_profile_traces.tar.gz (left out above 15 MB).
    # The critical path (sglang_bench.py timeline): PROFILE_RUN names a run (its traces go to their own folder, so
    # FP8-first and FP4-first runs stay apart and are all read); PROFILE_REPEATS traces per shape while the same
    # requests decode; then the busy time, span, the indexer's exposed time and a layer's time per cycle over every
    # run's traces, FP8 against FP4. PROFILE_SIZE / PROFILE_LAYERS choose the model (make-model: v32-rank with
    # PROFILE_LAYERS layers is a DP-attention + EP8 rank of V3.2 cut to that depth; the timeline projects to 61;
    # PROFILE_EP=16 or 32: a rank of an EP16 / EP32 deployment, 256 / EP routed experts per MoE layer;
    # PROFILE_SIZE=glm5-layers: 3 layers of GLM-5's sizes, SGLang's fused indexer for FP8, the rotation for FP4),
    # PROFILE_WALL seconds of streamed chunks timed at the client before each shape's first trace (the wall time
    # per cycle, sglang_bench.py wall; default 4, 0 for none),
    # PROFILE_MEM_FRACTION SGLang's --mem-fraction-static, PROFILE_ACTIVITIES the profiler's activities.
    make_rank_model "${PROFILE_SIZE:-v32-layers}" "${PROFILE_LAYERS:-}" "${PROFILE_EP:-}"
    SHAPES="${PROFILE_SHAPES:-1:131072 8:65536}"
    MAXBS=1; for shape in $SHAPES; do [ "${shape%%:*}" -gt $MAXBS ] && MAXBS=${shape%%:*}; done
    LIMIT="${PROFILE_LIMIT:-540}"
    TRACEDIR="$WORK/prof_serving/$(basename "$M2")${PROFILE_RUN:+/$PROFILE_RUN}"  # per model: no run pairs across models
    for fmt in ${SERVE_FORMATS:-fp8 fp4}; do
      rm -f "$TRACEDIR/${fmt}_"*.trace.json.gz "$TRACEDIR/${fmt}_"*.wall.json  # never an earlier run's in this run's table
      stage "profile_${PROFILE_RUN:+${PROFILE_RUN}_}$fmt" "$LIMIT" "$PY" scripts/sglang_bench.py serving-profile --model "$M2" \
        --out-dir "$TRACEDIR" --shapes $SHAPES --steps "${PROFILE_STEPS:-5}" $([ $fmt = fp4 ] && echo --fp4) \
        --repeats "${PROFILE_REPEATS:-1}" --activities ${PROFILE_ACTIVITIES:-CPU GPU} --wall-s "${PROFILE_WALL:-4}" \
        --ready-timeout $((LIMIT - 90)) --timeout 180 \
        --load-format dummy --kv-cache-dtype fp8_e4m3 --fp8-gemm-backend triton \
        --mem-fraction-static "${PROFILE_MEM_FRACTION:-0.5}" \
        --disable-radix-cache --random-seed 0 --disable-prefill-cuda-graph --cuda-graph-max-bs-decode "$MAXBS" \
        ${SPEC[@]+"${SPEC[@]}"}
      cp "$TRACEDIR/server_$fmt.log" "$WORK/logs/profile_server_${PROFILE_RUN:+${PROFILE_RUN}_}$fmt.log" 2>/dev/null \
        || echo "profile_$fmt: no server log"
      grep -E "Error|Traceback" "$WORK/logs/profile_server_${PROFILE_RUN:+${PROFILE_RUN}_}$fmt.log" 2>/dev/null | tail -n 4
      grep -h "KV Cache is allocated\|max_total_num_tokens\|FP4 indexer active" \
        "$WORK/logs/profile_server_${PROFILE_RUN:+${PROFILE_RUN}_}$fmt.log" 2>/dev/null | cut -c1-200 | head -n 3 >>"$OUTDIR/table.txt"
    done
    for shape in $SHAPES; do
      b=${shape%%:*}; il=${shape##*:}
      TRACES=()
      for fmt in fp8 fp4; do
        for t in "$TRACEDIR/${fmt}_${b}x${il}.trace.json.gz" "$TRACEDIR/${fmt}_${b}x${il}"_r*.trace.json.gz; do
          [ -f "$t" ] && TRACES+=("$t")
        done
      done
      if [ ${#TRACES[@]} -gt 0 ]; then
        "$PY" scripts/sglang_bench.py profile-table --steps "${PROFILE_STEPS:-5}" "${TRACES[@]}" \
          --json "$OUTDIR/serving_profile_${PROFILE_RUN:+${PROFILE_RUN}_}${b}x${il}.json" >>"$OUTDIR/table.txt" 2>>"$WORK/logs/compare.log" \
          || echo "profile-table ${b}x${il} failed (logs/compare.log)"
      else
        echo "profile ${b}x${il}: no trace"
      fi
    done
    if [ -n "${PROFILE_RUN:-}" ]; then  # every run's traces of this model so far, on the GPU's timeline
      ALL=(); while IFS= read -r t; do ALL+=("$t"); done < <(find "$WORK/prof_serving/$(basename "$M2")" -mindepth 2 \( -name 'fp[48]_*.trace.json.gz' -o -name 'fp[48]_*.wall.json' \) ! -name '*unreadable*' | sort)
      # The served model's depth from its own config (the projection needs it, and at full depth it is the measurement).
      LAYERS=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$M2/config.json")
      FULL=$(cd scripts && "$PY" -c 'import sys, sglang_one_batch as t; print(t.FULL_DEPTH[sys.argv[1]])' \
        "${PROFILE_SIZE:-v32-layers}")  # the depth projected to (make-model's table: V3.2's 61, GLM-5's 78)
      [ ${#ALL[@]} -gt 0 ] && "$PY" scripts/sglang_bench.py timeline --steps "${PROFILE_STEPS:-5}" \
        --layers "$LAYERS" --full-depth "$FULL" "${ALL[@]}" --json "$OUTDIR/timeline.json" \
        >>"$OUTDIR/table.txt" 2>>"$WORK/logs/compare.log" || echo "timeline failed (logs/compare.log)"
    fi
    # The traces (each server's first repeat only where all of them exceed 15 MB) and the wall records.
    for pick in '*.trace.json.gz' '*_r1.trace.json.gz'; do
      (cd "$WORK/prof_serving" 2>/dev/null && find . -name "$pick" | tar -czf "$OUTDIR/serving_profile_traces.tar.gz" -T - 2>/dev/null) \
        || rm -f "$OUTDIR/serving_profile_traces.tar.gz"
      [ "$(stat -c %s "$OUTDIR/serving_profile_traces.tar.gz" 2>/dev/null || echo 0)" -le 15000000 ] && break
      rm -f "$OUTDIR/serving_profile_traces.tar.gz"
    done
    (cd "$WORK/prof_serving" 2>/dev/null && find . -name '*.wall.json' | tar -czf "$OUTDIR/serving_profile_walls.tar.gz" -T - 2>/dev/null) \
      || rm -f "$OUTDIR/serving_profile_walls.tar.gz"
    ;;
  hicache)
    # SGLang's radix cache (prefix reuse) and hierarchical cache (eviction to host memory and reload) with the
    # FP4 index cache, on the tiny model through sglang.Engine (scripts/hicache_radix_gpu.py), FP4 then FP8 (FP8's
    # agreement is the yardstick), then the checks as a table. HICACHE_LIMIT bounds each run; HICACHE_MODES
    # ("radix hicache") and HICACHE_FORMATS ("fp4 fp8") choose which run.
    for mode in ${HICACHE_MODES:-radix hicache}; do
      for fmt in ${HICACHE_FORMATS:-fp4 fp8}; do
        rm -f "$WORK/${mode}_$fmt.json"
        stage "${mode}_$fmt" "${HICACHE_LIMIT:-240}" "$PY" scripts/hicache_radix_gpu.py "$mode" --model "$M" \
          --out "$WORK/${mode}_$fmt.json" $([ $fmt = fp8 ] && echo --fp8)
        cp "$WORK/${mode}_$fmt.json" "$OUTDIR/" 2>/dev/null
      done
    done
    FILES=(); for f in radix_fp4 radix_fp8 hicache_fp4 hicache_fp8; do [ -f "$WORK/$f.json" ] && FILES+=("$WORK/$f.json"); done
    [ ${#FILES[@]} -gt 0 ] && "$PY" scripts/hicache_radix_gpu.py compare "${FILES[@]}" >"$OUTDIR/hicache_table.txt" 2>&1
    ;;
  soak)
    # Under pressure (scripts/soak.py): launch_server on the tiny model with MTP (EAGLE 3 steps / 4 draft tokens), the
    # radix cache and CUDA graphs on, and a KV pool of SOAK_POOL_TOKENS (default 262144) so that SGLang retracts
    # decode requests; then SOAK_REQUESTS (default 3000) requests of 100 to SOAK_MAX_LEN (default 60000) tokens,
    # SOAK_CONCURRENCY (default 32) at a time, a third behind shared prefixes, some disconnecting and some aborted,
    # the bad inputs, and the checks. FP4 then FP8 (SOAK_FORMATS); SOAK_HICACHE=1 adds SGLang's hierarchical cache
    # (eviction to host memory and reload). SOAK_LIMIT (default 420 s) bounds each format; no request is sent
    # after SOAK_SEND_S seconds (default SOAK_LIMIT - 180: the long outputs, 2048 tokens, drain in about 35 s). One format per call (SOAK_FORMATS=fp4, then fp8) fits
    # the device's 600 s per command with the server's start-up. The test-only trace plugin keeps every SOAK_TRACE_EVERY-th batch (default 20) with
    # layer 0's scorer inputs and pages, which soak.py check holds to the fp64 oracle.
    # SGLang admits a request when the pool holds its prompt plus SGLANG_INIT_NEW_TOKEN_RATIO (default 0.7, decaying)
    # of its remaining output for every running request (all of it for a request with ignore_eos, which the load's
    # requests therefore leave unset: the first runs set it, and SGLang never retracted); SOAK_NEW_TOKEN_RATIO (default
    # 0.05) sets that reserve so low that decode outgrows the pool and SGLang retracts requests (a soak that never
    # retracts tests nothing of that path). Retraction then happens only under load: the probes, sent to an idle
    # server, are not retracted, so their outputs stay comparable.
    # SOAK_SIZE=v32-layers: DeepSeek-V3.2's real-size layers (3 of them) instead of the tiny model, for a shorter run.
    # SOAK_CHECK=0: the loads only; the soak-check step then runs their checks (a call of its own on the same machine).
    # SOAK_SAMPLED_FRAC (default 0): the fraction of the load sampled at temperature 0.8. A batch mixing sampled and
    # greedy requests takes FlashInfer's top_k_renorm_prob from its Python package, which this runtime lacks (it
    # carries FlashInfer's headers only): at 0.2 the FP4 server of the first such run stopped there, 12 s into the load.
    HICACHE=(); [ "${SOAK_HICACHE:-0}" = 1 ] && HICACHE=(--enable-hierarchical-cache --hicache-ratio 2)
    # The tiny model's indexer at a real checkpoint's logit scale (TRACE_INDEX_SCALE, as in the mtp step); the
    # FP8 block-quantized sizes keep SGLang's dummy weights as they are.
    SCALE="$(index_scale "${SOAK_SIZE:-tiny}")"
    # The fp64 oracle layer only on the tiny sizes: the FP8 block-quantized sizes keep SGLang's dummy-weight logit
    # scale, at which SGLang's own top-k kernels differ from the exact top-k on long rows (scripts/sglang_topk_probe.py,
    # benchmarks/results/sglang_topk_probe_h100_2026-12-06.txt): there no oracle layer is recorded, soak_check leaves
    # its row out (soak.py check --no-oracle) and the top-k rows are checked for validity.
    ORACLE=0; [ -z "$SCALE" ] && ORACLE=
    tag=soak; [ "${SOAK_HICACHE:-0}" = 1 ] && tag=soak_hicache
    if [ "${SOAK_SIZE:-tiny}" != tiny ]; then
      M="$WORK/$SOAK_SIZE"; tag="${tag}_$SOAK_SIZE"
      "$PY" scripts/sglang_one_batch.py make-model "$M" --size "$SOAK_SIZE" >/dev/null
    fi
    for fmt in ${SOAK_FORMATS:-fp4 fp8}; do
      log="$WORK/logs/${tag}_server_$fmt.log"
      rm -rf "$WORK/trace_${tag}_$fmt"
      FP4_INDEXER_TOPK_TRACE_DIR="$WORK/trace_${tag}_$fmt" FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS="$ORACLE" \
        FP4_INDEXER_TOPK_TRACE_INDEX_SCALE="$SCALE" \
        FP4_INDEXER_TOPK_TRACE_EVERY="${SOAK_TRACE_EVERY:-20}" \
        SGLANG_INIT_NEW_TOKEN_RATIO="${SOAK_NEW_TOKEN_RATIO:-0.05}" \
        mtp_server "$M" "$fmt" 30791 "$log" ${HICACHE[@]+"${HICACHE[@]}"} $(size_flags "${SOAK_SIZE:-tiny}")
      spid=$!
      # /health answers 503 until SGLang's own warm-up request has finished (on a fresh machine its first prefill
      # compiles kernels for about 40 s after "Application startup complete"). The load starts only on a server
      # that answered 200: a load sent earlier batched its sampled warm-up with SGLang's greedy one, and that verify
      # batch took FlashInfer's top_k_renorm_prob, which this runtime lacks (the server stopped).
      t0=$SECONDS; ready=0
      READY_S="${SOAK_READY_S:-540}"
      [ -n "${SOAK_CALL_S:-}" ] && [ "$(call_left "$SOAK_CALL_S")" -lt "$READY_S" ] && READY_S=$(call_left "$SOAK_CALL_S")
      wait_healthy 30791 $spid "$READY_S" && ready=1
      LIMIT="${SOAK_LIMIT:-420}"
      # SOAK_CALL_S: the seconds this step may take in all (the device's limit per command); the load's limit is
      # what is left once the server is ready, less 20 s to stop it and pack the output and, with the checks in the
      # same command (SOAK_CHECK=1), 150 s more for them (they took 106 s after a 231 s load), so that a slow start
      # shortens the load instead of cutting it or its checks. A load limit under 320 s (140 s of sending, the
      # shortest load that retracted and reloaded in the runs so far) sends nothing: a shorter load could fail the
      # retraction and HiCache checks for want of load, not for the server.
      short=0
      if [ -n "${SOAK_CALL_S:-}" ]; then
        LIMIT=$(call_left "$SOAK_CALL_S" $([ "${SOAK_CHECK:-1}" = 1 ] && echo 170 || echo 20)); [ "$LIMIT" -lt 320 ] && short=1
      fi
      if [ $ready = 0 ] || [ $short = 1 ]; then
        echo "${tag}_${fmt} server $([ $ready = 1 ] && echo "ready after $((SECONDS - t0)) s, with $LIMIT s of SOAK_CALL_S left for the load (under 320)" \
          || echo "not ready after $((SECONDS - t0)) s"): no load sent" | tee -a "$WORK/stages.txt"
        kill $spid 2>/dev/null; wait $spid 2>/dev/null
        echo "## ${tag} ${fmt}: no load sent" >>"$OUTDIR/table.txt"
        continue
      fi
      echo "${tag}_${fmt} server ready after $((SECONDS - t0)) s; load limit $LIMIT s" | tee -a "$WORK/stages.txt"
      SEND_DEFAULT=$(( LIMIT - 180 )); [ "$SEND_DEFAULT" -lt 30 ] && SEND_DEFAULT=30
      stage "${tag}_$fmt" "$LIMIT" "$PY" scripts/soak.py load --url http://127.0.0.1:30791 \
        --out "$OUTDIR/${tag}_$fmt.json" --requests "${SOAK_REQUESTS:-3000}" --concurrency "${SOAK_CONCURRENCY:-32}" \
        --max-len "${SOAK_MAX_LEN:-60000}" --time-limit "${SOAK_SEND_S:-$SEND_DEFAULT}" \
        --sampled-frac "${SOAK_SAMPLED_FRAC:-0}"
      kill $spid 2>/dev/null; wait $spid 2>/dev/null
      echo "## ${tag} ${fmt}: $([ -s "$OUTDIR/${tag}_$fmt.json" ] && echo load written || echo no load)" >>"$OUTDIR/table.txt"
      mkdir -p "$WORK/soak"; cp "$OUTDIR/${tag}_$fmt.json" "$WORK/soak/" 2>/dev/null
      [ "${SOAK_CHECK:-1}" = 1 ] && soak_check "$tag" "$fmt"
    done  # the server logs come back in logs.tar.gz
    ;;
  soak-check)
    # The checks of every soak load this machine ran whose checks have not run (SOAK_CHECK=0 on the soak step
    # leaves them for this step: on a fresh machine the first server's start compiles SGLang's JIT kernels for
    # about 4 minutes, and a load with its checks then passes the device's 600 s per command).
    for run in "$WORK"/soak/*.json; do
      [ -f "$run" ] || { echo "soak-check: no soak load on this machine"; break; }
      b=$(basename "$run" .json); tag=${b%_*}; fmt=${b##*_}
      case "$tag" in *_checks) continue ;; esac
      [ -f "$WORK/soak/${tag}_checks_$fmt.json" ] && continue
      cp "$run" "$OUTDIR/"; soak_check "$tag" "$fmt"
    done
    ;;
  warm)
    # A fresh machine's first server start compiles SGLang's and DeepGEMM's JIT kernels (4 to 8 minutes on an H100);
    # this step pays that once, in a call of its own, for the tiny model's MTP servers the soak and ab steps start:
    # WARM_FORMATS (default "fp8 fp4") one after the other, each until /health answers 200 (SGLang's own warm-up
    # request done) or WARM_S (default 540) seconds have passed since the call began. With JIT_CACHE_OUT=1 the
    # caches come back for .peers/jit-cache (above), so that a later machine skips the compile too.
    for fmt in ${WARM_FORMATS:-fp8 fp4}; do
      left=$(call_left "${WARM_S:-540}")
      [ "$left" -gt 30 ] || { echo "warm_$fmt: no time left" | tee -a "$WORK/stages.txt"; break; }
      mtp_server "$WORK/tiny" "$fmt" 30795 "$WORK/logs/warm_server_$fmt.log"
      wpid=$!; t0=$SECONDS
      if wait_healthy 30795 $wpid "$left"; then w="ready after $((SECONDS - t0)) s"; else w="not ready after $((SECONDS - t0)) s"; fi
      kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
      echo "warm_$fmt server $w" | tee -a "$WORK/stages.txt"
    done
    ;;
  ab)
    # `sglang-fp4-indexer ab` end to end, as a deployer runs it, on AB_SIZE (default tiny; v32-layers: the real-size
    # layers) with dummy weights (its quality figures mean nothing there, and its report says so): both orders
    # (AB_ORDERS), GSM8K from AB_GSM8K (default .peers/gsm8k_test_head60.jsonl, the first 60 lines of GSM8K's
    # test.jsonl; left out when absent), AB_QUESTIONS questions, passkey at the input length, a serving benchmark of
    # AB_INPUT_LEN (default 4096) in / AB_OUTPUT_LEN (default 64) out at concurrency 8, and a KV-limited load at
    # AB_KV_CONCURRENCY (default 64) on a pool capped at AB_POOL_TOKENS (default 131072: 31 such requests). MTP as the
    # shipped config (EAGLE 3 steps / 4 draft tokens).
    # AB_READY_S (default 540): each server's wait for /health (a fresh machine's first start compiles SGLang's and
    # DeepGEMM's JIT kernels for 4 to 8 minutes; JIT caches carried in .peers/jit-cache shorten it).
    # The command gets what is left of AB_CALL_S (default 580) seconds since the call began, less 20 (AB_LIMIT: a
    # fixed limit instead), so that steps before it in the same call (install) shorten it.
    AB_SIZE="${AB_SIZE:-tiny}"
    if [ "$AB_SIZE" != tiny ]; then
      M="$WORK/$AB_SIZE"
      "$PY" scripts/sglang_one_batch.py make-model "$M" --size "$AB_SIZE" >/dev/null
    fi
    # SGLang's benchmark client imports Hugging Face datasets, which the runtime wheels leave out and random-ids
    # prompts never call: scripts/bench_standins stands in for it on the clients' path (as in sglang_bench.py serving).
    AB_PATH="$PYTHONPATH"; "$PY" -c "import datasets" 2>/dev/null || AB_PATH="$PYTHONPATH:$PWD/scripts/bench_standins"
    GSM=(); [ -f "${AB_GSM8K:-.peers/gsm8k_test_head60.jsonl}" ] && GSM=(--gsm8k-data "${AB_GSM8K:-.peers/gsm8k_test_head60.jsonl}" --gsm8k-questions "${AB_QUESTIONS:-40}")
    # The command's folder stays on the machine ($WORK/ab_<size>): the same step in a later call on a warm machine
    # resumes it (the arms already finished are kept; AB_FRESH=1 starts over), so a run longer than one command's
    # time limit spreads over several. Each call brings back the whole folder as $OUT/ab_<size>.tar.gz (its arms
    # sit two folders down, deeper than what comes back from a call as files) and the report beside it.
    AB_DIR="$WORK/ab_$AB_SIZE"
    [ "${AB_FRESH:-0}" = 1 ] && rm -rf "$AB_DIR"
    AB_LEFT=$(call_left "${AB_CALL_S:-580}" 20)
    if [ -z "${AB_LIMIT:-}" ] && [ "$AB_LEFT" -lt 60 ]; then
      echo "ab_$AB_SIZE: $AB_LEFT s left of AB_CALL_S: not started" | tee -a "$WORK/stages.txt"; AB_LEFT=
    fi
    [ -n "${AB_LIMIT:-$AB_LEFT}" ] && PYTHONPATH="$AB_PATH" stage "ab_$AB_SIZE" "${AB_LIMIT:-$AB_LEFT}" "$PY" -m sglang_fp4_indexer.cli ab "$M" --out "$AB_DIR" \
      --orders "${AB_ORDERS:-fp8-first,fp4-first}" --input-lens "${AB_INPUT_LEN:-4096}" --output-len "${AB_OUTPUT_LEN:-64}" \
      --concurrency 8 --prompts 16 --kv-limited-concurrency "${AB_KV_CONCURRENCY:-64}" ${GSM[@]+"${GSM[@]}"} \
      --passkey-trials 2 --port 30793 --ready-timeout "${AB_READY_S:-540}" -- \
      "${MTP_FLAGS[@]}" $(size_flags "$AB_SIZE") --max-total-tokens "${AB_POOL_TOKENS:-131072}"
    mkdir -p "$AB_DIR"
    cat "$WORK/logs/ab_$AB_SIZE.log" >>"$AB_DIR/ab_command.log" 2>/dev/null
    tar -czf "$OUTDIR/ab_$AB_SIZE.tar.gz" -C "$WORK" "ab_$AB_SIZE"
    for f in report.json report.png; do [ -f "$AB_DIR/$f" ] && cp "$AB_DIR/$f" "$OUTDIR/ab_${AB_SIZE}_$f"; done
    ;;
  topk)
    # SGLang's two top-k kernels against the exact top-k on random scores at real and at dummy-weight scale
    # (scripts/sglang_topk_probe.py): whether the decode rows' kernel keeps an arbitrary part of a tied fp16 bin.
    stage topk "${TOPK_LIMIT:-300}" "$PY" scripts/sglang_topk_probe.py --json "$OUTDIR/topk_probe.json"
    cat "$WORK/logs/topk.log" >>"$OUTDIR/table.txt"
    ;;
  server)
    # A fresh machine compiles SGLang's and DeepGEMM's JIT kernels while it captures the first decode graph
    # (about 150 s): SERVER_READY_S bounds the wait for /health.
    READY="${SERVER_READY_S:-450}"
    WITHOUT_PLUGIN_ARGS=--fp8 stage_or_bisect server $((READY + 60)) "$WORK/server.json" "$PY" scripts/sglang_one_batch.py server --model "$M" --out "$WORK/server.json" --ready-timeout "$READY"
    ;;
  pd)
    # Run on an H100 (docs/user-guide.md). Three servers one after another on one GPU (prefill + decode, plain, FP8 prefill + FP4
    # decode), each started as `server` starts its one: PD_READY_S bounds each wait for /health, PD_LIMIT the step.
    # The decode and plain servers' top-k are read by the trace plugin (FP4_INDEXER_TOPK_TRACE_DIR, set per server).
    [ -f /tmp/site/mooncake/engine.so ] || { echo "pd: no Mooncake in /tmp/site (carry .peers/pd-runtime)"; exit 1; }
    rm -rf "$WORK"/logs/trace_decode_fp4 "$WORK"/logs/trace_plain_fp4
    LD_LIBRARY_PATH="/tmp/pd-syslibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" stage pd "${PD_LIMIT:-580}" \
      "$PY" scripts/pd_gpu.py --model "$M" --out-dir "$OUTDIR" --log-dir "$WORK/logs" \
      --ready-timeout "${PD_READY_S:-300}" --prompts "${PD_PROMPTS:-3}"
    tar -czf "$WORK/logs/pd_traces.tar.gz" -C "$WORK/logs" trace_decode_fp4 trace_plain_fp4 2>/dev/null \
      && rm -rf "$WORK"/logs/trace_decode_fp4 "$WORK"/logs/trace_plain_fp4
    ;;
  *) echo "step $STEP is in STEPS but has no branch here" >&2; exit 2 ;;  # the steps were checked at the top
esac

ENGINE=()
[ -f "$WORK/engine_fp8.json" ] && [ -f "$WORK/engine_fp4.json" ] && ENGINE=(--engine "$WORK/engine_fp8.json" "$WORK/engine_fp4.json")
SERVER=()
[ -f "$WORK/server.json" ] && SERVER=(--server "$WORK/server.json")
RUNS=()
[ -f "$WORK/fp8.pt" ] && [ -f "$WORK/fp4.pt" ] && [ -f "$WORK/fp4_eager.pt" ] && RUNS=("$WORK/fp8.pt" "$WORK/fp4.pt" "$WORK/fp4_eager.pt")
# Not after the soak, soak-check, warm and ab steps, which make none of these runs: a warm machine may still hold
# another step's, and compare would overwrite the soak's check lines in table.txt.
case "$STEP" in soak|soak-check|warm|ab) RUNS=(); ENGINE=(); SERVER=() ;; esac
if [ ${#RUNS[@]} -gt 0 ] || [ ${#ENGINE[@]} -gt 0 ] || [ ${#SERVER[@]} -gt 0 ]; then
  "$PY" scripts/sglang_one_batch.py compare ${RUNS[@]+"${RUNS[@]}"} ${ENGINE[@]+"${ENGINE[@]}"} \
    ${SERVER[@]+"${SERVER[@]}"} --json "$OUTDIR/summary.json" >"$OUTDIR/table.txt" 2>"$WORK/logs/compare.log"
fi
# After compare (which rewrites table.txt): the pd step's lines.
[ "$STEP" = pd ] && cat "$OUTDIR/pd_table.txt" >>"$OUTDIR/table.txt" 2>/dev/null
[ "$STEP" = hicache ] && cat "$OUTDIR/hicache_table.txt" >>"$OUTDIR/table.txt" 2>/dev/null
cp "$WORK"/server.json.log "$WORK/logs/server_launch.log" 2>/dev/null
tar -czf "$OUTDIR/logs.tar.gz" -C "$WORK" logs stages.txt 2>/dev/null
if [ "${JIT_CACHE_OUT:-0}" = 1 ]; then
  for name in deepgemm-jit triton tvm-ffi sglang-cache; do
    [ -d "$WORK/$name" ] || continue
    tar -czf "$OUTDIR/jit-$name.tar.gz" -C "$WORK" "$name"
    size=$(stat -c %s "$OUTDIR/jit-$name.tar.gz")
    [ "$size" -le 16000000 ] || { echo "jit cache $name is $size B, over what comes back: not kept"; rm -f "$OUTDIR/jit-$name.tar.gz"; }
  done
fi
echo "== device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
cat "$WORK/stages.txt" 2>/dev/null
cat "$OUTDIR/table.txt" 2>/dev/null || tail -n 5 "$WORK/logs/compare.log" 2>/dev/null
