#!/usr/bin/env python
"""The report of one ``scripts/recipes/pet.sh`` run (its last step): teacher vs PET, the paper's numbers beside them,
and the KD stage's validation NLL per epoch (whether the student had converged).

    python scripts/bench/pet_report.py WORK_DIR --command "bash scripts/recipes/pet.sh WORK_DIR" --out WORK_DIR/pet.md
"""
import argparse
import json
import os
import shutil
import sys

from benchlib import write_text  # it also puts scripts/experiments/ on sys.path
from record import validation_curve

# the PET paper's Table 7 (IWSLT'14 De-En): the teacher's BLEU; PET's non-embedding share (%) and BLEU
PAPER_TEACHER_BLEU, PAPER = "34.63", {"pet": ("9.51", "34.36 +- 0.14")}


def pet_report_text(work, command, recipe, train_log=None):
    with open(os.path.join(work, "measure.json")) as f:
        rows = {r["name"]: r for r in json.load(f)["rows"]}
    with open(os.path.join(work, "measure.md")) as f:
        measure_md = f.read()
    t, s = rows["teacher"], rows["pet"]
    paper_compression, paper_bleu = PAPER["pet"]
    train_log = train_log or os.path.join(work, "kd.log")
    trend = ", ".join(f"{p[3]:.2f}" for p in validation_curve(train_log) if p[3] is not None) or f"(no {train_log})"
    return "\n".join([
        "# PET on the CPU: `scripts/recipes/pet.sh` (Multi30k DE->EN)", "",
        f"Made by `{command}` ({recipe}). Test: test_2016_flickr, beam 5.", "",
        "| | teacher | PET | PET's paper (IWSLT'14, Table 7) |", "|---|---|---|---|",
        f"| BLEU (tok) | {t['bleu_tok']:.2f} | {s['bleu_tok']:.2f} | {PAPER_TEACHER_BLEU} -> {paper_bleu} |",
        f"| BLEU drop | - | {t['bleu_tok'] - s['bleu_tok']:.2f} | "
        f"{float(PAPER_TEACHER_BLEU) - float(paper_bleu.split()[0]):.2f} |",
        f"| non-embedding parameters | {t['non_embedding_params']:,} | {s['non_embedding_params']:,} "
        f"({s['compression_rate']:.2f}%) | {paper_compression}% |",
        f"| sentences/s (measured in turn) | {t['sentences_per_s']:.1f} | {s['sentences_per_s']:.1f} "
        f"({s['speedup']:.2f}x) | - |", "",
        f"Validation NLL after each KD epoch ({os.path.relpath(train_log)}): {trend}.", "",
        "## The measurement command's table", "", measure_md])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="the WORK_DIR of scripts/recipes/pet.sh (measure.json, measure.md, kd.log)")
    p.add_argument("--command", required=True, help="the command that made the run, quoted in the report")
    p.add_argument("--recipe", default="", help="one line on the recipe's settings, quoted in the report")
    p.add_argument("--train-log", default=None, help="the KD stage's fairseq-train log (default: WORK/kd.log)")
    p.add_argument("--out", required=True, help="Markdown file to write (the measurement's JSON is copied beside it)")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.work, "measure.json")):
        raise SystemExit(f"pet_report: {args.work}/measure.json missing (run scripts/recipes/pet.sh {args.work} first)")
    text = pet_report_text(args.work, args.command, args.recipe, args.train_log)
    write_text(args.out, text)
    # the measurement's rows beside the report (OUT.json), for plots and later comparisons
    shutil.copyfile(os.path.join(args.work, "measure.json"), os.path.splitext(args.out)[0] + ".json")
    print(f"[pet_report] wrote {args.out} and {os.path.splitext(args.out)[0]}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
