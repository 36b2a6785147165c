#!/usr/bin/env bash
# Build the DeepGEMM source packed by scripts/pack_deepgemm.sh on the GPU machine.
#
#   bash scripts/build_deepgemm.sh [ARCHIVE] [DEST]    # defaults: .peers/deepgemm.tar.xz, /tmp/deepgemm
#
# Prints the folder to put on the benchmark's peer path (SGLANG_FP4_INDEXER_PEER_SITE)
# as its last line; exits non-zero when the build fails (its log: DEST/build.log).
# The system compiler is used on purpose: on the device image the default g++ (/opt/gcc)
# builds a module that crashes in std::regex at import.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHIVE="${1:-.peers/deepgemm.tar.xz}"
DEST="${2:-/tmp/deepgemm}"
PY="${PYTHON:-python3}"
[ -f "$ARCHIVE" ] || { echo "no DeepGEMM archive at $ARCHIVE (scripts/pack_deepgemm.sh makes it)" >&2; exit 3; }
# A build already made from this archive in DEST (an earlier step of the same device call) is reused.
STAMP="$DEST/DeepGEMM/.built-from"
SUM="$(sha256sum "$ARCHIVE" | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SUM" ]; then echo "$DEST/DeepGEMM"; exit 0; fi
rm -rf "$DEST"; mkdir -p "$DEST"
# Python's tarfile reads the xz archive (no xz binary needed on the machine).
"$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$ARCHIVE" "$DEST"
cd "$DEST/DeepGEMM"
# The archive holds CUTLASS's cute/cutlass headers once, under deep_gemm/include; setup.py reads them from
# third-party/cutlass/include as well (archives packed before this held both copies).
if [ ! -d third-party/cutlass/include/cute ]; then
  mkdir -p third-party/cutlass/include
  cp -r deep_gemm/include/cute deep_gemm/include/cutlass third-party/cutlass/include/
fi
export DG_USE_LOCAL_VERSION=0 MAX_JOBS="${MAX_JOBS:-16}"
if ! CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared" \
     "$PY" setup.py build_ext --inplace >"$DEST/build.log" 2>&1; then
  tail -n 20 "$DEST/build.log" >&2
  exit 1
fi
PYTHONPATH="$DEST/DeepGEMM" "$PY" -c "import deep_gemm; deep_gemm.fp8_paged_mqa_logits; deep_gemm.fp8_mqa_logits" \
  >>"$DEST/build.log" 2>&1 || { tail -n 20 "$DEST/build.log" >&2; exit 1; }
echo "$SUM" > "$STAMP"
echo "$DEST/DeepGEMM"
