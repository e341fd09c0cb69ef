#!/usr/bin/env bash
# The quickstart runs the method pages quote: each recipe of scripts/recipes/ as its page runs it on the shipped
# Multi30k DE->EN teacher, its score line and measurement copied to results/quickstart_<recipe>.md with the command,
# machine and threads. (PET's full recipe is quoted from results/pet_multi30k.md, the shipped student's
# measurement.) Resumable: a recipe's finished stages are skipped (its work folder WORK/<recipe>/).
#
#   bash scripts/recipes/quickstarts.sh                       # apc, ghostbert (WIDTH=2/4), variator (BOTTLENECK=16),
#                                                     # as their pages run them; work/quickstart/
#   bash scripts/recipes/quickstarts.sh ghostbert             # one of them
#   WORK=work/qs THREADS=2 bash scripts/recipes/quickstarts.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
WORK="${WORK:-work/quickstart}"; THREADS="${THREADS:-1}"
RECIPES=("$@"); [ ${#RECIPES[@]} -gt 0 ] || RECIPES=(apc ghostbert variator)
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

for recipe in "${RECIPES[@]}"; do
  case "$recipe" in
    apc) settings=() ;;
    variator) settings=(BOTTLENECK=16) ;;  # the page's quickstart bottleneck (the benchmark's r)
    ghostbert) settings=(WIDTH=2/4) ;;  # the page's quickstart width
    *) echo "quickstarts.sh: no quickstart for '$recipe' (apc, ghostbert, variator)" >&2; exit 2 ;;
  esac
  command="${settings[*]:+${settings[*]} }bash scripts/recipes/$recipe.sh $WORK/$recipe"
  echo "[$(date +%H:%M:%S)] $command"
  log="$WORK/$recipe.log"; mkdir -p "$WORK"
  env ${settings[@]+"${settings[@]}"} bash "scripts/recipes/$recipe.sh" "$WORK/$recipe" >> "$log" 2>&1 ||
    { echo "quickstarts.sh: $recipe failed; its log: $log" >&2; exit 1; }
  score="$(grep '^score: ' "$log" | tail -1)"
  out="results/quickstart_$recipe.md"
  {
    echo "# Quickstart: \`scripts/recipes/$recipe.sh\` as its page runs it on the shipped teacher"
    echo
    echo "Command: \`bash scripts/recipes/quickstarts.sh $recipe\`, which runs \`$command\`, $(date -u +%Y-%m-%d)," \
      "$(uname -m), $(getconf _NPROCESSORS_ONLN) cores, $THREADS torch thread(s) per process; other runs may have" \
      "shared the machine (the measurement's machine line gives the load): its speeds are indicative, its scores not" \
      "affected."
    echo
    echo "The recipe's last line:"
    echo
    echo '```'
    echo "$score"
    echo '```'
    if [ -f "$WORK/$recipe/measure.md" ]; then
      echo
      echo "Its measurement (\`$WORK/$recipe/measure.md\`):"
      echo
      sed 's/^#/##/' "$WORK/$recipe/measure.md"
    elif [ -f "$WORK/$recipe/cost.json" ]; then  # Variator: the plugins' FLOPs and speed (user_dir.variator.tools.cost)
      echo
      echo "Its cost measurement (\`$WORK/$recipe/cost.json\`):"
      echo
      echo '```json'
      cat "$WORK/$recipe/cost.json"
      echo
      echo '```'
    fi
  } > "$out"
  echo "[$(date +%H:%M:%S)] $score -> $out"
done
