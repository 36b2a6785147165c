#!/usr/bin/env bash
# Pack DeepGEMM's public source for a build on the GPU machine (which has nvcc and
# torch but no network), so the benchmark can time DeepGEMM's FP8 scorers
# (fp8_paged_mqa_logits for decode, fp8_mqa_logits for prefill) as peers.
#
#   bash scripts/pack_deepgemm.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR
#
# DEEPGEMM_GIT_DIR: a git directory (bare or not) of github.com/sgl-project/DeepGEMM;
# FMT_GIT_DIR: one of github.com/fmtlib/fmt (the commit DeepGEMM pins as its
# submodule is used when present). CUTLASS/CuTe headers come from the
# sgl-deep-gemm wheel on PyPI (its deep_gemm/include/ holds cute/ and cutlass/).
# Output: .peers/deepgemm.tar.xz (git-ignored, ~1.3 MB, xz): take it along with the checkout to the
# GPU machine; scripts/gpu_run.sh builds it there (scripts/build_deepgemm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
  echo "usage: bash scripts/pack_deepgemm.sh DEEPGEMM_GIT_DIR FMT_GIT_DIR" >&2
  exit 2
fi
DG="$1"; FMT="$2"; PY="${PYTHON:-python3}"
WHEEL_VERSION="${SGL_DEEP_GEMM_VERSION:-0.2.5}"
STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/DeepGEMM" .peers

# 1. DeepGEMM: the files setup.py builds from.
git --git-dir="$DG" archive HEAD csrc deep_gemm setup.py scripts LICENSE | tar -x -C "$STAGE/DeepGEMM"
DG_COMMIT="$(git --git-dir="$DG" rev-parse HEAD)"

# 2. fmt at DeepGEMM's pinned submodule commit (HEAD of FMT_GIT_DIR otherwise).
FMT_PIN="$(git --git-dir="$DG" ls-tree HEAD third-party/fmt | awk '{print $3}')"
FMT_REV=HEAD
if [ -n "$FMT_PIN" ] && git --git-dir="$FMT" cat-file -e "$FMT_PIN^{commit}" 2>/dev/null; then FMT_REV="$FMT_PIN"; fi
mkdir -p "$STAGE/DeepGEMM/third-party/fmt"
git --git-dir="$FMT" archive "$FMT_REV" include src LICENSE | tar -x -C "$STAGE/DeepGEMM/third-party/fmt"

# 3. CuTe / CUTLASS headers from the sgl-deep-gemm wheel, where the build and its JIT look.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$STAGE/whl" "sgl-deep-gemm==$WHEEL_VERSION"
"$PY" - "$STAGE" <<'PYEOF'
import glob, sys, zipfile
stage = sys.argv[1]
(wheel,) = glob.glob(f"{stage}/whl/*.whl")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        for lib in ("cute", "cutlass"):
            prefix = f"deep_gemm/include/{lib}/"
            if name.startswith(prefix) and not name.endswith("/"):
                z.extract(name, f"{stage}/DeepGEMM")
PYEOF
# DeepGEMM's setup.py also reads them from third-party/cutlass/include: scripts/build_deepgemm.sh copies them there on
# the GPU machine, so the archive holds them once (a second copy added 2.5 MiB to a call that carries at most 64 MiB).
echo "DeepGEMM $DG_COMMIT, fmt $(git --git-dir="$FMT" rev-parse "$FMT_REV"), cute/cutlass from sgl-deep-gemm $WHEEL_VERSION" \
  > "$STAGE/DeepGEMM/PACKED_FROM"
tar -C "$STAGE" -cJf .peers/deepgemm.tar.xz DeepGEMM
cat "$STAGE/DeepGEMM/PACKED_FROM"
du -h .peers/deepgemm.tar.xz
