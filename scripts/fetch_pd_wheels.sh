#!/usr/bin/env bash
# Download what SGLang's PD disaggregation needs on the GPU machine (scripts/sglang_gpu_check.sh pd), beyond
# scripts/fetch_sglang_runtime_wheels.sh: the Mooncake transfer engine, slimmed, and the system libraries its
# engine links that the machine's image may lack, into .peers/pd-runtime (one call of its own: carry
# .peers/pd-runtime; the pd step installs the wheel into /tmp/site).
#
#   bash scripts/fetch_pd_wheels.sh            # cp312 wheel for the GPU machine
#   PD_PYTHON_VERSION=3.11 PD_DEST=/tmp/pd311 bash scripts/fetch_pd_wheels.sh   # the same slimming, for this
#                                              # machine's Python (an import check here)
#
# Which wheel: the GPU machine's torch is built for CUDA 13 (libcudart.so.13); mooncake-transfer-engine 0.3.13.post1
# links libcudart.so.12, which that image does not hold, so mooncake-transfer-engine-cuda13 0.3.14 (same engine,
# CUDA 13 build; 50 MB) is taken. SGLang reaches Mooncake through `mooncake.engine.TransferEngine` only
# (distributed/device_communicators/mooncake_transfer_engine.py) on this path: `mooncake.pg` (elastic EP),
# `mooncake.store` (HiCache storage), `mooncake.mooncake_ep_buffer` (EP MoE) and the allocators (custom memory pools)
# are not imported. The slimmed wheel keeps the Python files and every shared object in the NEEDED closure of
# mooncake/engine.so inside the wheel (resolved through its RPATH $ORIGIN:$ORIGIN/../<dist>.libs); the store,
# process group, EP extensions, the master / client / benchmark binaries and the libraries only they link are dropped.
#
# syslibs/: engine.so also links libibverbs.so.1, libmlx5.so.1 (RDMA; loaded even when the TCP transport runs),
# libnuma.so.1 and libcurl.so.4 from the system. They are copied from this machine (Debian 12; the ibverbs ones from
# Debian's packages through apt-get download) with what they link in turn, except glibc's and the C++ runtime's own
# libraries; the pd step links into its search path only those the GPU machine's loader does not find.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PYVER="${PD_PYTHON_VERSION:-3.12}"
DEST="${PD_DEST:-.peers/pd-runtime}"
WHEEL=mooncake-transfer-engine-cuda13==0.3.14
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$STAGE" "$WHEEL"
whl="$(ls "$STAGE"/mooncake_transfer_engine*.whl)"
mkdir "$STAGE/x" && (cd "$STAGE/x" && unzip -q "$whl")
# Keep the NEEDED closure of mooncake/engine.so among the wheel's shared objects; drop every other binary; then
# fix RECORD.
"$PY" - "$STAGE/x" <<'PYEOF'
import glob, os, subprocess, sys
os.chdir(sys.argv[1])
def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return [ln.split("[", 1)[1].rstrip("]") for ln in out.splitlines() if "(NEEDED)" in ln]
libs_dir = glob.glob("*.libs")
search = ["mooncake"] + libs_dir
keep, todo = set(), ["mooncake/engine.so"]
while todo:
    so = todo.pop()
    if so in keep:
        continue
    keep.add(so)
    for name in needed(so):
        for d in search:
            if os.path.exists(os.path.join(d, name)):
                todo.append(os.path.join(d, name))
                break
dropped = 0
for path in glob.glob("mooncake/**/*", recursive=True) + glob.glob("*.libs/*"):
    if not os.path.isfile(path) or path.endswith(".py") or path in keep:
        continue
    if path.endswith((".so", ".c")) or ".so." in path or os.access(path, os.X_OK):
        os.remove(path)
        dropped += 1
print("kept:", " ".join(sorted(keep)), f"({dropped} files dropped)")
PYEOF
"$PY" scripts/fix_wheel_record.py "$STAGE/x"
rm -f "$DEST"/mooncake_transfer_engine*.whl
(cd "$STAGE/x" && zip -q -r -9 "$DEST/$(basename "$whl")" .)
# System libraries engine.so links, with their own (glibc / libstdc++ / libgcc_s excluded).
mkdir -p "$STAGE/deb" "$DEST/syslibs"
(cd "$STAGE/deb" && apt-get download -q libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 >/dev/null \
  && for d in *.deb; do dpkg-deb -x "$d" root; done)
SYS="$STAGE/deb/root/usr/lib/x86_64-linux-gnu:$STAGE/deb/root/lib/x86_64-linux-gnu"
for lib in libibverbs.so.1 libmlx5.so.1 libnuma.so.1 libcurl.so.4; do
  path="$(LD_LIBRARY_PATH="$SYS" "$PY" -c "import ctypes.util, sys, os
for d in sys.argv[2].split(':') + ['/lib/x86_64-linux-gnu', '/usr/lib/x86_64-linux-gnu']:
    if os.path.exists(os.path.join(d, sys.argv[1])): print(os.path.join(d, sys.argv[1])); break" "$lib" "$SYS")"
  [ -n "$path" ] || { echo "$lib not found on this machine" >&2; exit 1; }
  cp -L "$path" "$DEST/syslibs/$lib"
  LD_LIBRARY_PATH="$SYS" ldd "$path" | awk '/=> \// {print $1, $3}' | while read -r name dep; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      *) cp -L "$dep" "$DEST/syslibs/$name" ;;
    esac
  done
done
du -sh "$DEST"/*.whl "$DEST/syslibs"
