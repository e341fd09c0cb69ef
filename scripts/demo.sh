#!/usr/bin/env bash
# The main demo: compress the shipped Multi30k DE->EN teacher (checkpoints/multi30k.de-en/) with PET
# for a fixed number of updates (simplified-task warm-up, then word-level KD into a 4+4-logical-layer
# shared student), print teacher vs PET through the measurement command (BLEU on test_2016_flickr,
# non-embedding parameters and compression rate, size, sentences/s, memory), then translate a few
# typed German sentences with the teacher and the students through fairseq-interactive.
#
#   bash scripts/demo.sh                     # PET 200 warm-up + 600 KD updates (time and BLEU: README)
#   WARMUP_UPDATES=600 KD_UPDATES=3000 bash scripts/demo.sh   # a longer run: better student
#   SMOKE=1 bash scripts/demo.sh             # end-to-end check in a few minutes (4 + 8 updates on 2,000
#                                            # training pairs, 2 validation batches, 50 test sentences):
#                                            # the student's numbers are meaningless
#   SKIP_SETUP=1 ...                         # use the active Python environment instead of scripts/setup_env.sh
#   REPORT=results/demo.md bash scripts/demo.sh   # also write the run as a report (table, translations, each
#                                            # stage's minutes, machine and load): what README quotes
#
# Bounded by updates, not minutes, so the numbers it prints are the same on every machine up to float
# noise. Works on a fresh clone: the teacher, its BPE codes and dictionaries and the data ship inside the
# repository. Outputs go to work/demo/ (data-bin, checkpoints, logs); the table to work/demo/pet/measure.md.
# The full-length PET recipe (3 + 20 epochs, ~3 hours on 2 cores) is bash scripts/recipes/pet.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SMOKE="${SMOKE:-0}"
WORK="${WORK:-$ROOT/work/demo}"
SHIPPED="$ROOT/checkpoints/multi30k.de-en"
TEACHER="$SHIPPED/teacher.pt"
SHIPPED_PET="$SHIPPED/pet_student.pt"  # the full-recipe PET student (scripts/recipes/pet.sh), measured beside the demo's
if [ "$SMOKE" = 1 ]; then
  WARMUP_UPDATES="${WARMUP_UPDATES:-4}"; KD_UPDATES="${KD_UPDATES:-8}"
  DATA_EXTRA=(--train-lines 2000); TRAIN_EXTRA="--max-valid-steps 2"; MEASURE_EXTRA="--max-sentences 50"; RUNS=1
else
  WARMUP_UPDATES="${WARMUP_UPDATES:-200}"; KD_UPDATES="${KD_UPDATES:-600}"
  DATA_EXTRA=(); TRAIN_EXTRA=""; MEASURE_EXTRA=""; RUNS=3
fi
# minutes on 2 CPU cores, measured with the defaults (README, "Two commands"); scaled for other budgets
SEC_PER_UPDATE=1.1; SEC_PER_MEASURE=60
minutes() { python3 -c "print(max(1, round($1 / 60)))"; }
START=$(date +%s)
mkdir -p "$WORK"; STAGES_TSV="$WORK/stages.tsv"; : > "$STAGES_TSV"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
# each stage's start (seconds since the demo began) and title, for the report
say() { printf '\n=== [%s, %ss in] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - START ))" "$*"
        printf '%s\t%s\n' "$(( $(date +%s) - START ))" "${*%% (*}" >> "$STAGES_TSV"; }

if [ "${SKIP_SETUP:-0}" = 1 ]; then
  say "1/4 set-up skipped (SKIP_SETUP=1): using $(command -v python)"
else
  say "1/4 set-up (minutes the first time, then cached)"
  bash scripts/setup_env.sh
  source "${VENV:-$ROOT/.venv}/bin/activate"
fi
[ -f "$TEACHER" ] || { echo "demo.sh: no shipped teacher at $TEACHER" >&2; exit 2; }

say "2/4 data: embedded Multi30k DE->EN -> lowercase, Moses tokens -> the teacher's BPE codes and dictionary -> fairseq binary (about 1 minute)"
python -m preprocess.prepare_multi30k --src de --tgt en --dest "$WORK/data-bin" --bpe-codes "$SHIPPED/code" \
  --srcdict "$SHIPPED/dict.de.txt" "${DATA_EXTRA[@]}"

rm -rf "$WORK/pet"  # always afresh (fairseq would otherwise resume an earlier run)
say "3/4 PET: ${WARMUP_UPDATES} warm-up updates, then ${KD_UPDATES} KD updates from the shipped teacher (about $(minutes "($WARMUP_UPDATES + $KD_UPDATES) * $SEC_PER_UPDATE") min), then teacher vs PET on test_2016_flickr, beam 5, $RUNS timed run(s) (about $(minutes "$RUNS * $SEC_PER_MEASURE") min)"
# short stages: a shorter LR warm-up so a few hundred updates reach the peak learning rate; outputs
# bounded at 1.2 x source length + 10 tokens, as fairseq's IWSLT recipe validates
ALSO=""; [ -f "$SHIPPED_PET" ] && ALSO="pet-full-recipe=$SHIPPED_PET"
MEASURE_ALSO="$ALSO" TEACHER="$TEACHER" DATA="$WORK/data-bin" WARMUP_UPDATES="$WARMUP_UPDATES" KD_UPDATES="$KD_UPDATES" \
  EXTRA="--warmup-updates 100 --log-interval 25 $TRAIN_EXTRA" RUNS="$RUNS" \
  MEASURE_EXTRA="--max-len-a 1.2 --max-len-b 10 $MEASURE_EXTRA" REPORT="$WORK/pet/pet.md" \
  bash scripts/recipes/pet.sh "$WORK/pet"

say "4/4 typed German sentences through fairseq-interactive, lowercased, Moses + the teacher's BPE as the data was made (under a minute)"
SENTENCES="$WORK/sentences.de"
cat > "$SENTENCES" <<'EOF'
Ein Mann fährt mit dem Fahrrad über eine Brücke.
Zwei Kinder spielen im Schnee vor einem roten Haus.
Eine Frau in einem blauen Kleid singt auf einer Bühne.
EOF
translate() {  # $1 name, $2 checkpoint -> $WORK/translations.$1 (detokenised hypotheses, input order)
  python -c "import sys; sys.stdout.write(sys.stdin.read().lower())" < "$SENTENCES" |
    fairseq-interactive "$SHIPPED" --path "$2" --user-dir "$ROOT/user_dir" --source-lang de --target-lang en \
      --tokenizer moses --moses-no-escape --moses-no-dash-splits --bpe subword_nmt --bpe-codes "$SHIPPED/code" \
      --beam 5 --max-len-a 1.2 --max-len-b 10 --cpu > "$WORK/interactive.$1.log" 2>&1 ||
    { tail -20 "$WORK/interactive.$1.log" >&2; exit 1; }
  grep '^D-' "$WORK/interactive.$1.log" | sort -t- -k2 -n | cut -f3 > "$WORK/translations.$1"
}
translate teacher "$TEACHER"
translate pet "$WORK/pet/kd/checkpoint_best.pt"
sed 's/^/  teacher:  /' "$WORK/translations.teacher" > "$WORK/shown.teacher"
sed 's/^/  pet:      /' "$WORK/translations.pet" > "$WORK/shown.pet"
SHOWN=("$WORK/shown.teacher" "$WORK/shown.pet")
if [ -f "$SHIPPED_PET" ]; then
  translate pet-full-recipe "$SHIPPED_PET"
  sed 's/^/  pet-full: /' "$WORK/translations.pet-full-recipe" > "$WORK/shown.pet-full-recipe"
  SHOWN+=("$WORK/shown.pet-full-recipe")
fi
paste -d '\n' "$SENTENCES" "${SHOWN[@]}"

say "done: the table above is in $WORK/pet/measure.md"
if [ -n "${REPORT:-}" ]; then
  COMMAND="bash scripts/demo.sh"
  for VAR in WARMUP_UPDATES KD_UPDATES; do [ "$SMOKE" = 1 ] || COMMAND="$VAR=${!VAR} $COMMAND"; done
  [ "$SMOKE" = 1 ] && COMMAND="SMOKE=1 $COMMAND"
  python scripts/bench/demo_report.py "$WORK" --out "$REPORT" --command "REPORT=$REPORT $COMMAND" \
    --load-before "$LOAD_BEFORE" --sentences "$SENTENCES"
fi
