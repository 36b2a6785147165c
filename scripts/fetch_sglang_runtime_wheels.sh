#!/usr/bin/env bash
# Download what SGLang's own model runner needs on a GPU machine that has torch 2.11 / CUDA 13 and
# Python 3.12 but neither SGLang nor a network, in three folders: .peers/sglang-runtime/part1 (SGLang, slimmed, and
# the small wheels the image lacks; 27 MB), .peers/sglang-runtime/part2 (sglang-kernel, slimmed, and
# FlashMLA; 25 MB) and .peers/sglang-runtime/flashinfer (FlashInfer's header files, 8 MB). Each part travels with
# the checkout in a call of its own (<= 64 MiB; part1 with .peers/deepgemm.tar.xz, part2 with the headers);
# scripts/sglang_gpu_check.sh installs the wheels with pip --no-deps --no-index --target and extracts the headers.
#
#   bash scripts/fetch_sglang_runtime_wheels.sh
#
# Versions: SGLang 0.5.23 and the versions its own install resolves to (pyproject's `sglang` extra),
# except sglang-kernel: SGLang pins 0.4.10, which is built against torch 2.14's C++ ABI and does not
# load under torch 2.11 (undefined c10::cuda::CUDAErrorLogCapture); 0.4.5 is built for torch 2.11 /
# CUDA 13 and exports the ops this path uses. Its 383 MB wheel is slimmed to what the DSA path on
# Hopper loads (the Python files, sm90/common_ops, spatial_ops: 15 MB): flash_ops (FA3, 1.1 GB),
# flashmla_ops (FlashMLA comes from sgl-flash-mla), infllm_ops and sm100/ are dropped.
# The list of small wheels was found by importing SGLang's one-batch path, model runner, DSA backend,
# DeepSeek models and Engine with every distribution outside the device image hidden.
set -euo pipefail
shopt -s extglob  # slim's patterns: !(...) keeps named files of a dropped folder
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DEST=.peers/sglang-runtime
PLAT=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
PART1=(sglang==0.5.23 apache-tvm-ffi==0.1.11 orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pydantic==2.14.4
       pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 starlette==1.10.0
       fastapi==0.165.0 uvicorn==0.54.0 pyzmq==27.3.0 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7
       python-multipart==0.0.34 sniffio==1.3.1 ipython==9.18.1 traitlets==5.16.1 dill==0.4.1
       compressed-tensors==0.18.0 loguru==0.7.3 gguf==0.19.0 opentelemetry-api==1.45.2 openai==2.8.0
       distro==1.9.0 xgrammar==0.2.7 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 soundfile==0.13.1 cffi==2.1.1)
PART2=(sgl-flash-mla==1.0.0)
KERNEL=sglang-kernel==0.4.5
mkdir -p "$DEST/part1" "$DEST/part2"
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         "${PLAT[@]}" -d "$@"; }
dl "$DEST/part1" "${PART1[@]}"
dl "$DEST/part2" "${PART2[@]}"
STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
# slim WHEEL DEST PATHS...: unpack a wheel, drop PATHS (globs inside it), drop them from its RECORD, repack into DEST.
slim() {
  local whl=$1 dest=$2; shift 2
  rm -rf "$STAGE/x" && mkdir "$STAGE/x" && (cd "$STAGE/x" && unzip -q "$whl")
  (cd "$STAGE/x" && for pattern in "$@"; do rm -rf $pattern; done)  # unquoted: each pattern expands as a glob
  "$PY" scripts/fix_wheel_record.py "$STAGE/x"
  local name; name="$(basename "$whl")"
  rm -f "$dest/$name"
  (cd "$STAGE/x" && zip -q -r -9 "$OLDPWD/$dest/$name" .)
}
dl "$STAGE" "$KERNEL"
slim "$(ls "$STAGE"/sglang_kernel-*.whl)" "$DEST/part2" sgl_kernel/sm100 'sgl_kernel/flash_ops*.so' \
  'sgl_kernel/flashmla_ops*.so' 'sgl_kernel/infllm_ops*.so'
# SGLang itself, slimmed to what the one-batch path, the Engine, launch_server, bench_serving and few-shot GSM8K
# (sglang.test.few_shot_gsm8k, which `sglang-fp4-indexer ab` runs) import (39 MB to 15 MB): the diffusion runtime
# (multimodal_gen), its other tests and the Rust extensions of the Rust HTTP server (SGLANG_RUST_SERVER), gRPC, the
# Rust benchmark client and multimodal preprocessing are dropped.
mv "$DEST"/part1/sglang-*.whl "$STAGE/"
slim "$(ls "$STAGE"/sglang-*.whl)" "$DEST/part1" sglang/multimodal_gen 'sglang/test/!(__init__.py|few_shot_gsm8k.py)' \
  'sglang/srt/rust_extensions/_server*.so' 'sglang/srt/rust_extensions/_bench*.so' \
  'sglang/srt/rust_extensions/_grpc*.so' 'sglang/srt/rust_extensions/_multimodal*.so'
# tvm-ffi without libbacktrace's sources: SGLang's JIT kernels build against its headers (include/) and load
# libtvm_ffi, which stay. Its test library stays too: tvm_ffi's core module links libtvm_ffi_testing.so (readelf -d),
# and `import tvm_ffi` fails without it.
mv "$DEST"/part1/apache_tvm_ffi-*.whl "$STAGE/"
slim "$(ls "$STAGE"/apache_tvm_ffi-*.whl)" "$DEST/part1" tvm_ffi/3rdparty/libbacktrace
# FlashInfer 0.7.2 (the version SGLang 0.5.23 resolves), whose header files SGLang's JIT speculative sampling kernel
# includes: only its wheel's flashinfer/data folder (the headers SGLang's JIT looks up; 8 MB as xz, the wheel is
# 62 MB), extracted into the install folder by scripts/sglang_gpu_check.sh.
dl "$STAGE" flashinfer-python==0.7.2
rm -rf "$STAGE/fi" && mkdir "$STAGE/fi" && (cd "$STAGE/fi" && unzip -q "$(ls "$STAGE"/flashinfer_python-*.whl)" 'flashinfer/data/*')
mkdir -p "$DEST/flashinfer"
tar -cf - -C "$STAGE/fi" ./flashinfer/data | xz -T0 -9e >"$DEST/flashinfer/flashinfer_headers-0.7.2.tar.xz"
du -sh "$DEST/part1" "$DEST/part2" "$DEST/flashinfer"
