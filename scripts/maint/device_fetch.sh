#!/usr/bin/env bash
# Download, here (where PyPI is reachable), what scripts/maint/device_setup.sh needs on a CUDA machine that has
# no internet: the fairseq-fixed source and the wheels of the packages that machine's Python lacks.
#
#   bash scripts/maint/device_fetch.sh                          # for Python 3.12 (the device image's) -> wheels/gpu/
#   bash scripts/maint/device_fetch.sh --python-version 3.11    # another Python; several can share one folder
#   bash scripts/maint/device_fetch.sh --packages 'cffi==2.0.0'  # also these (what device_setup.sh names)
#   # then, on the GPU machine, with wheels/gpu carried there:
#   bash scripts/maint/device_setup.sh   (scripts/experiments/grid.py --executor device runs it)
#
# What is fetched (--dest, default wheels/gpu, ignored by git; carry it to the GPU machine):
# * fairseq-fixed==0.12.3.1 as its source archive: it compiles C++/Cython extensions against the torch
#   it is built beside, so device_setup.sh builds it there, against that machine's torch (a torch CUDA
#   wheel is ~800 MB: the check uses the torch the machine already has);
# * wheels (--only-binary :all:, manylinux x86_64, CPython --python-version) of what fairseq and the
#   plug-in import and a CUDA image with PyTorch lacks (the one this was planned for holds torch, numpy,
#   scipy, scikit-learn, sacrebleu, regex, PyYAML, Cython, setuptools, wheel, but not these): hydra-core
#   and omegaconf (fairseq's configs, the versions fairseq pins), bitarray (fairseq's indexed data),
#   sacremoses and subword-nmt (preprocess/: Moses tokens, BPE); --packages adds others;
# * antlr4-python3-runtime 4.9.3 (omegaconf's parser), which PyPI has as a source archive only,
#   built here into its pure-Python wheel.
# Nothing resolves dependencies (--no-deps): a package the machine lacks beyond these is named by
# device_setup.sh, and fetched with --packages. torchaudio, which fairseq-fixed requires, is never
# fetched nor installed: fairseq imports it only in its speech code, and the index's newest (2.11) cannot load
# beside another torch (as scripts/setup_env.sh, which removes it). ctranslate2 is not fetched: its 43 MB wheel does
# not fit beside the repository's ~42 MB of tracked files in the 64 MiB a device call carries.
# The end of the run prints the folder's size and the total a device call would carry.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYVER=3.12; DEST=wheels/gpu
PACKAGES="hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 sacremoses==0.2.0 subword-nmt==0.3.8"
FAIRSEQ_SPEC="fairseq-fixed==0.12.3.1"; ANTLR_SPEC="antlr4-python3-runtime==4.9.3"
LIMIT_MIB=64   # what one device call carries: tracked and untracked files plus the carried folders
usage() { sed -n '2,27p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) PYVER="$2"; shift 2 ;;
    --dest) DEST="$2"; shift 2 ;;
    --packages) PACKAGES="$PACKAGES $2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "device_fetch.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || { echo "device_fetch.sh: --python-version must look like 3.12, got '$PYVER'" >&2; exit 2; }
# pip of the project's environment: building fairseq-fixed's source metadata imports torch
PY="${PYTHON:-$ROOT/.venv/bin/python}"
"$PY" -c "import torch" 2>/dev/null || { echo "device_fetch.sh: $PY cannot import torch (set PYTHON)" >&2; exit 2; }
PIP=("$PY" -m pip --disable-pip-version-check)
mkdir -p "$DEST"

echo "[fetch] wheels for CPython $PYVER, manylinux x86_64: $PACKAGES"
# shellcheck disable=SC2086  # PACKAGES is a list of specs
"${PIP[@]}" download -q --no-deps --only-binary=:all: --implementation cp --python-version "$PYVER" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$DEST" $PACKAGES
if ! ls "$DEST"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  echo "[fetch] $ANTLR_SPEC: source only on PyPI, built here into a pure-Python wheel"
  "${PIP[@]}" wheel -q --no-deps -w "$DEST" "$ANTLR_SPEC"
fi
if ! ls "$DEST"/fairseq_fixed-0.12.3.1.tar.gz >/dev/null 2>&1; then
  echo "[fetch] $FAIRSEQ_SPEC source archive"
  "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation -d "$DEST" "$FAIRSEQ_SPEC"
fi

# a manifest the check prints: name, bytes, SHA-256
( cd "$DEST" && for f in *.whl *.tar.gz; do [ -f "$f" ] && printf '%s\t%s\t%s\n' "$f" "$(stat -c %s "$f")" \
    "$(sha256sum "$f" | cut -d' ' -f1)"; done ) > "$DEST/MANIFEST.tsv"
DEST_BYTES=$(du -cb "$DEST" | tail -1 | cut -f1)
TREE_BYTES=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | paste -sd+ | bc)
TOTAL=$((DEST_BYTES + TREE_BYTES))
printf '[fetch] %s: %d files, %.1f MiB; with the working tree (%.1f MiB) a device call carries %.1f MiB of %d\n' \
  "$DEST" "$(wc -l < "$DEST/MANIFEST.tsv")" "$(bc -l <<< "$DEST_BYTES / 1048576")" \
  "$(bc -l <<< "$TREE_BYTES / 1048576")" "$(bc -l <<< "$TOTAL / 1048576")" "$LIMIT_MIB"
[ "$TOTAL" -le $((LIMIT_MIB * 1048576)) ] ||
  { echo "device_fetch.sh: over the device's $LIMIT_MIB MiB: remove what the machine has from $DEST" >&2; exit 1; }
