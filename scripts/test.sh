#!/usr/bin/env bash
# Set up (cached after the first time) and run the whole test suite on the CPU.
#   bash scripts/test.sh [pytest arguments]
# Tests that need the corpora or reference teacher beside the project (../shared) skip, saying why.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
"${VENV:-$ROOT/.venv}/bin/python" -m pytest -q -rs --durations=10 tests "$@"
