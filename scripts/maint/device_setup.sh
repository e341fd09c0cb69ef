#!/usr/bin/env bash
# Set up fairseq and the plug-in on a lent CUDA machine without internet, from carried wheels: what
# scripts/experiments/grid.py --executor device runs there when fairseq does not import.
#
#   bash scripts/maint/device_fetch.sh           # here, where PyPI is reachable: wheels/gpu/ (carry it)
#   bash scripts/maint/device_setup.sh           # there: WORK/site (default work/device/site), on PYTHONPATH
#
# The machine's own torch is used (a CUDA torch is ~800 MB: never carried). If fairseq or a package it needs is
# missing, the wheels in WHEELS (default wheels/gpu, from scripts/maint/device_fetch.sh) go into WORK/site
# (pip --target) and fairseq-fixed is built from its source archive against this torch, as scripts/setup_env.sh
# builds it (no build isolation, parallel build_ext, no ninja), without its CUDA extensions (fairseq builds them
# only with CUDA_HOME set; translation needs none) and without torchaudio (every install is --no-deps).
# Environment: PYTHON (default python3: the one that holds torch), WHEELS, WORK (default work/device).
# Ends with fairseq, fairseq_cli.train and user_dir imported with PYTHONPATH=$PWD:WORK/site, or an error naming
# what is missing and the fetch command that gets it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"; WHEELS="${WHEELS:-wheels/gpu}"; WORK="${WORK:-work/device}"
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc reports OMP_NUM_THREADS where it is set
say() { printf '[device_setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "device_setup.sh: $*" >&2; exit 2; }
mkdir -p "$WORK"
SITE="$ROOT/$WORK/site"; [[ "$WORK" = /* ]] && SITE="$WORK/site"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
read -r TORCH_VERSION PYVER < <("$PYTHON" -c 'import sys, torch
print(torch.__version__, "%d.%d" % sys.version_info[:2])' 2>/dev/null) || true
[ -n "${PYVER:-}" ] || die "$PYTHON cannot import torch: the set-up uses the machine's own torch (set PYTHON)"

# module -> distribution, for what fairseq, the plug-in and preprocess/ import
REQUIRED="torch:torch numpy:numpy scipy:scipy sklearn:scikit-learn sacrebleu:sacrebleu regex:regex yaml:PyYAML
  tqdm:tqdm packaging:packaging hydra:hydra-core omegaconf:omegaconf antlr4:antlr4-python3-runtime
  bitarray:bitarray sacremoses:sacremoses subword_nmt:subword-nmt"
missing() {  # the distributions of REQUIRED and fairseq-fixed (and what builds it) that PYTHON cannot import
  "$PYTHON" - $REQUIRED fairseq:fairseq-fixed <<'PY'
import importlib.util, sys
lacking = [d for m, d in (a.split(":") for a in sys.argv[1:]) if importlib.util.find_spec(m) is None]
if "fairseq-fixed" in lacking:  # built from its source here: its build needs these
    lacking += [d for m, d in [("Cython", "Cython"), ("setuptools", "setuptools"), ("wheel", "wheel")]
                if importlib.util.find_spec(m) is None]
print(" ".join(lacking))
PY
}
setup() {
  local lacking wheels_for=() fairseq_source spec
  lacking="$(missing)"
  [ -z "$lacking" ] && { echo "preinstalled" > "$WORK/setup.done"; return; }
  local installed="$lacking"
  say "$PYTHON lacks: $lacking (from $WHEELS into $SITE)"
  for spec in $lacking; do [ "$spec" != fairseq-fixed ] && wheels_for+=("$spec"); done
  if [ ${#wheels_for[@]} -gt 0 ]; then
    [ -d "$WHEELS" ] || die "no $WHEELS: run 'bash scripts/maint/device_fetch.sh --python-version $PYVER' where PyPI is reachable and carry $WHEELS"
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
      --find-links "$WHEELS" --target "$SITE" "${wheels_for[@]}" ||
      die "installing ${wheels_for[*]} from $WHEELS failed: fetch them for Python $PYVER with bash scripts/maint/device_fetch.sh --python-version $PYVER --packages '...'"
  fi
  if [[ " $lacking " == *" fairseq-fixed "* ]]; then
    fairseq_source="$(ls "$WHEELS"/fairseq_fixed-0.12.3.1.tar.gz 2>/dev/null || true)"
    [ -n "$fairseq_source" ] || die "no $WHEELS/fairseq_fixed-0.12.3.1.tar.gz: run bash scripts/maint/device_fetch.sh"
    mkdir -p "$WORK/build"
    if ! ls "$WORK"/build/fairseq_fixed-*.whl >/dev/null 2>&1; then
      say "building fairseq-fixed against torch $TORCH_VERSION ($CORES cores; minutes)"
      local cfg no_ninja
      cfg="$(mktemp)"; printf '[build_ext]\nparallel = %s\n' "$CORES" > "$cfg"
      # a `ninja` that fails `ninja --version` makes torch use its plain (parallel-safe) builder
      no_ninja="$(mktemp -d)"; printf '#!/bin/sh\nexit 1\n' > "$no_ninja/ninja"; chmod +x "$no_ninja/ninja"
      env -u CUDA_HOME PATH="$no_ninja:$PATH" DIST_EXTRA_CONFIG="$cfg" \
        "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-index --no-build-isolation --no-deps \
        -w "$WORK/build.tmp" "$fairseq_source" > "$WORK/build.log" 2>&1 ||
        { tail -20 "$WORK/build.log" >&2; die "building fairseq-fixed failed (log: $WORK/build.log)"; }
      mv "$WORK"/build.tmp/fairseq_fixed-*.whl "$WORK/build/"
      rm -rf "$cfg" "$no_ninja" "$WORK/build.tmp"
    fi
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --upgrade \
      --target "$SITE" "$WORK"/build/fairseq_fixed-*.whl
  fi
  lacking="$(missing)"
  [ -z "$lacking" ] || die "still missing after the set-up: $lacking; fetch them here with: bash scripts/maint/device_fetch.sh --python-version $PYVER --packages 'NAME==VERSION ...'"
  echo "installed into $WORK/site from $WHEELS: $installed$([[ " $installed " != *" fairseq-fixed "* ]] ||
    echo " (fairseq-fixed built from its source against torch $TORCH_VERSION)")" > "$WORK/setup.done"
}
START=$(date +%s)
if [ -f "$WORK/setup.done" ] && [ -z "$(missing)" ]; then
  say "done before ($(cat "$WORK/setup.done"))"
else
  setup
  echo "$(( $(date +%s) - START ))" > "$WORK/setup.seconds"
fi
"$PYTHON" -c "import fairseq, fairseq_cli.train, user_dir" > "$WORK/import.log" 2>&1 ||
  { tail -5 "$WORK/import.log" >&2; die "fairseq or the plug-in does not import with $PYTHON (log: $WORK/import.log)"; }
say "done; run with PYTHONPATH=$PYTHONPATH"
