#!/usr/bin/env bash
# Download what the benchmark's SGLang peer needs on a GPU machine without network or SGLang
# into .peers/whl (git-ignored; take it along with the checkout).
#
#   bash scripts/fetch_peer_wheels.sh          # SGLang's cp312 wheel + the wheels the device image lacks
#   bash scripts/fetch_peer_wheels.sh --all    # also those the image already has (if it changes)
#
# The lists are single-sourced in sglang_fp4_indexer/bench/peers.py
# (SGLANG_PEER_REQUIREMENTS, SGLANG_PEER_IMAGE_REQUIREMENTS); docs/benchmarks.md
# says how they were found. Target: CPython 3.12, x86_64 glibc Linux (the device:
# Python 3.12.3). pip download --platform does not widen a manylinux tag to older
# ones, so every tag in use is named.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
DEST=.peers/whl
ALL=0
for arg in "$@"; do
  case "$arg" in
    --all) ALL=1 ;;
    *) echo "usage: bash scripts/fetch_peer_wheels.sh [--all]" >&2; exit 2 ;;
  esac
done
mapfile -t REQS < <(PYTHONPATH=. "$PY" - "$ALL" <<'PYEOF'
import sys
from sglang_fp4_indexer.bench.peers import SGLANG_PEER_IMAGE_REQUIREMENTS, SGLANG_PEER_REQUIREMENTS
reqs = list(SGLANG_PEER_REQUIREMENTS) + (list(SGLANG_PEER_IMAGE_REQUIREMENTS) if sys.argv[1] == "1" else [])
print("\n".join(reqs))
PYEOF
)
mkdir -p "$DEST"
"$PY" -m pip download --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${REQS[@]}"
echo "carried wheels in $DEST:"
ls -1 "$DEST"
du -sh "$DEST"
