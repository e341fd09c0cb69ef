#!/usr/bin/env bash
echo "scripts/pet_multi30k.sh is now scripts/recipes/pet.sh (any teacher and data; README: user_dir/pet/README.md)" >&2
exec bash "$(dirname "${BASH_SOURCE[0]}")/recipes/pet.sh" "${1:-$(dirname "${BASH_SOURCE[0]}")/../work/pet-multi30k}" "${@:2}"
