#!/usr/bin/env bash
# Pack the headers of DeepGEMM's newer SM90 paged MQA-logits kernel (next_n 4 on a 2-CTA cluster) for the
# benchmark peer deepgemm-fp8-sm90-multicast (sglang_fp4_indexer/bench/deepgemm_sm90_paged.py), which builds
# this project's own launcher against them with nvcc on the GPU machine (no network there).
#
#   bash scripts/pack_deepgemm_multicast.sh [VLLM_WHEEL]
#
# The kernel ships only as a header in the vLLM 0.34.0 wheel: without VLLM_WHEEL, pip downloads it (about
# 240 MB) into a temporary folder. Packed: deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh and every header of
# the wheel's include tree it includes, directly or not (a textual scan of #include lines, every branch of
# every #if taken: a superset of what nvcc reads; cute/cutlass carry their BSD-3 notice in each file), with
# LICENSE (DeepGEMM's MIT licence: the wheel has none for it, so it is taken from $DEEPGEMM_LICENSE, or from
# .peers/deepgemm.tar.xz, which scripts/pack_deepgemm.sh packs from DeepGEMM's repository), LICENSE.vllm (the
# wheel's own) and PACKED_FROM (the wheel and the header's sha256).
# Output: .peers/deepgemm-multicast.tar.xz (git-ignored, xz; about 0.3 MB): take it along with the checkout to
# the GPU machine; scripts/gpu_run.sh unpacks it there and names its include folder in
# SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE. Environment: PYTHON (default python3), VLLM_VERSION (0.34.0),
# OUT_ARCHIVE (default .peers/deepgemm-multicast.tar.xz), DEEPGEMM_LICENSE (a file).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 1 ]; then
  echo "usage: bash scripts/pack_deepgemm_multicast.sh [VLLM_WHEEL]" >&2
  exit 2
fi
PY="${PYTHON:-python3}"
VERSION="${VLLM_VERSION:-0.34.0}"
OUT_ARCHIVE="${OUT_ARCHIVE:-.peers/deepgemm-multicast.tar.xz}"
STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
WHEEL="${1:-}"
if [ -z "$WHEEL" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$STAGE/whl" "vllm==$VERSION"
  WHEEL="$(ls "$STAGE"/whl/*.whl | head -n 1)"
fi
[ -f "$WHEEL" ] || { echo "no wheel at $WHEEL" >&2; exit 2; }
mkdir -p "$(dirname "$OUT_ARCHIVE")"

"$PY" - "$WHEEL" "$STAGE" "$OUT_ARCHIVE" "${DEEPGEMM_LICENSE:-}" <<'PYEOF'
import hashlib, io, os, posixpath, re, sys, tarfile, zipfile

wheel, stage, out, license_file = sys.argv[1:5]
ROOT = "vllm/third_party/deep_gemm/include/"
START = "deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh"
MARKER = b"kNumKVMulticast"
INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)

with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    if ROOT + START not in names:
        sys.exit(f"{wheel}: no {ROOT + START} (not a vLLM wheel with DeepGEMM's SM90 paged kernel)")
    # The include closure of the kernel's header inside the wheel's include tree; headers not in the tree
    # (the CUDA toolkit's: cuda.h, cuda/std/..., cuda_bf16.h) are the compiler's own.
    todo, seen = [START], set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for kind, name in INCLUDE.findall(z.read(ROOT + rel)):
            name = name.decode().strip()
            cands = [posixpath.normpath(posixpath.join(posixpath.dirname(rel), name))] if kind == b'"' else []
            cands.append(posixpath.normpath(name))
            for c in cands:
                if not c.startswith("..") and ROOT + c in names:
                    todo.append(c)
                    break
    header = z.read(ROOT + START)
    if MARKER not in header:
        sys.exit(f"{wheel}: {START} has no {MARKER.decode()} (not the 2-CTA next_n 4 form)")
    top = os.path.join(stage, "deepgemm-multicast")
    for rel in sorted(seen):
        dest = os.path.join(top, "include", rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(z.read(ROOT + rel))
    vllm_license = [n for n in names if re.fullmatch(r"vllm-[^/]+\.dist-info/licenses/LICENSE", n)]
    if vllm_license:
        with open(os.path.join(top, "LICENSE.vllm"), "wb") as f:
            f.write(z.read(vllm_license[0]))

# DeepGEMM's licence (MIT): from $DEEPGEMM_LICENSE, else from the archive scripts/pack_deepgemm.sh made.
text = None
if license_file:
    text = open(license_file, "rb").read()
elif os.path.isfile(".peers/deepgemm.tar.xz"):
    with tarfile.open(".peers/deepgemm.tar.xz") as t:
        text = t.extractfile("DeepGEMM/LICENSE").read()
if not text or b"DeepSeek" not in text:
    sys.exit("no DeepGEMM LICENSE: set DEEPGEMM_LICENSE to DeepGEMM's LICENSE file (github.com/deepseek-ai/DeepGEMM), "
             "or run scripts/pack_deepgemm.sh first (.peers/deepgemm.tar.xz holds it)")
with open(os.path.join(top, "LICENSE"), "wb") as f:
    f.write(text)
wheel_sha = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
with open(os.path.join(top, "PACKED_FROM"), "w") as f:
    f.write(f"{START} from {os.path.basename(wheel)} (sha256 {wheel_sha}); header sha256 "
            f"{hashlib.sha256(header).hexdigest()}; {len(seen)} headers\n")

# A reproducible archive: sorted names, no owners, mtime 0.
def clean(info):
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info

with tarfile.open(out, "w:xz", preset=9) as t:
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            t.add(path, arcname=os.path.relpath(path, stage), filter=clean)
print(open(os.path.join(top, "PACKED_FROM")).read().strip())
PYEOF
du -h "$OUT_ARCHIVE"
