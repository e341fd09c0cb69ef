#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment and installs the plugin into it.
#
#   bash scripts/setup_env.sh            # venv in ./.venv
#   VENV=/path/to/venv bash scripts/setup_env.sh
#
# Why the steps below:
# * torch is installed first and pinned, so nothing later makes pip's resolver fetch a CUDA build
#   of a newer torch on a CPU machine (TORCH_SPEC overrides it, e.g. for a GPU machine).
# * fairseq 0.12.2 (PyPI) does not import on Python >= 3.11 (mutable dataclass defaults);
#   fairseq-fixed 0.12.3.1 does, but is source-only and compiles six C++/Cython extensions.
#   We build it once as a wheel against the installed torch (--no-build-isolation), with a
#   parallel build_ext and without ninja (torch's ninja backend races under parallel builds),
#   and cache the wheel in $WHEEL_CACHE so that the next set-up only installs it.
# * fairseq-fixed requires torchaudio, and the newest on the index (2.11, which declares no torch version)
#   is built for another torch: beside torch 2.13 its C++ library fails to load, and transformers, which
#   imports torchaudio whenever it is installed, then cannot import its BERT model (fc-export-hf's output).
#   Last, after every install: a torchaudio that cannot load is replaced by torch's own minor version where
#   the index has it, else removed (fairseq imports torchaudio only inside its speech functions). Any later
#   `pip install` of fairseq-fixed or of this package brings it back: run this script again after one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
WHEEL_CACHE="${WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fairseq-compress/wheels}"
step() { printf '\n[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

step "virtual environment: $VENV"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip setuptools wheel

step "$TORCH_SPEC (first, so the resolver never replaces it)"
"${PIP[@]}" install -q "$TORCH_SPEC"
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
CONSTRAINTS="$(mktemp)"; trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==${TORCH_VERSION}" > "$CONSTRAINTS"

PYMINOR="$("$VENV/bin/python" -c 'import sys; print(sys.version_info[1])')"
if [ "$PYMINOR" -ge 11 ]; then
  FAIRSEQ_SPEC="fairseq-fixed==0.12.3.1"; FAIRSEQ_WHEEL_GLOB="fairseq_fixed-0.12.3.1-*.whl"
  # the wheel's extensions are built against one torch ABI: key the cache on it
  CACHE_DIR="$WHEEL_CACHE/torch-${TORCH_VERSION}-py3.${PYMINOR}"
  mkdir -p "$CACHE_DIR"
  if ! ls "$CACHE_DIR"/$FAIRSEQ_WHEEL_GLOB >/dev/null 2>&1; then
    step "building $FAIRSEQ_SPEC once (a few minutes; cached in $CACHE_DIR)"
    "${PIP[@]}" install -q cython numpy setuptools wheel
    CFG="$(mktemp)"; printf '[build_ext]\nparallel = %s\n' "$(nproc 2>/dev/null || echo 2)" > "$CFG"
    # a `ninja` that fails `ninja --version` makes torch fall back to its plain (parallel-safe) builder
    NO_NINJA="$(mktemp -d)"; printf '#!/bin/sh\nexit 1\n' > "$NO_NINJA/ninja"; chmod +x "$NO_NINJA/ninja"
    BUILD_DIR="$(mktemp -d)"
    PATH="$NO_NINJA:$PATH" DIST_EXTRA_CONFIG="$CFG" PIP_CONSTRAINT="$CONSTRAINTS" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$BUILD_DIR" "$FAIRSEQ_SPEC"
    mv "$BUILD_DIR"/$FAIRSEQ_WHEEL_GLOB "$CACHE_DIR"/
    rm -rf "$BUILD_DIR" "$CFG" "$NO_NINJA"
  fi
  step "installing cached fairseq wheel"
  PIP_CONSTRAINT="$CONSTRAINTS" "${PIP[@]}" install -q --find-links "$CACHE_DIR" "$FAIRSEQ_SPEC"
fi

step "installing the plugin package and its dependencies (editable)"
PIP_CONSTRAINT="$CONSTRAINTS" "${PIP[@]}" install -q -e "$ROOT[test]"

# After every install above (each one would bring torchaudio back: fairseq-fixed requires it).
step "torchaudio: kept only where it loads beside torch $TORCH_VERSION"
if "$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
  echo "torchaudio loads: kept"
else
  TORCH_MINOR="$("$VENV/bin/python" -c 'import torch; print(".".join(torch.__version__.split("+")[0].split(".")[:2]))')"
  if PIP_CONSTRAINT="$CONSTRAINTS" "${PIP[@]}" install -q --no-deps "torchaudio==${TORCH_MINOR}.*" >/dev/null 2>&1 &&
     "$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
    echo "installed torchaudio $("$VENV/bin/python" -c 'import torchaudio; print(torchaudio.__version__)') (torch $TORCH_MINOR's)"
  else
    "${PIP[@]}" uninstall -q -y torchaudio
    echo "no torchaudio $TORCH_MINOR.* on the package index: removed the one that cannot load (fairseq's text tasks never import it)"
  fi
fi

step "checking the installation"
"$VENV/bin/python" - <<'PY'
import importlib.util

import torch, fairseq, user_dir  # noqa: F401  (importing user_dir registers the plugin)
print(f"torch {torch.__version__}, fairseq {fairseq.__version__}, plugin OK")
if importlib.util.find_spec("transformers") is not None:  # what fc-export-hf's users load its output with
    import transformers.models.bert.modeling_bert  # noqa: F401
    print(f"transformers {transformers.__version__}: BertForSequenceClassification imports")
PY
step "done: activate with 'source $VENV/bin/activate'"
