#!/usr/bin/env bash
echo "scripts/pet_gpu.sh is now scripts/recipes/pet_gpu.sh (README: user_dir/pet/README.md)" >&2
exec bash "$(dirname "${BASH_SOURCE[0]}")/recipes/pet_gpu.sh" "$@"
