#!/usr/bin/env python
"""The report of one ``scripts/demo.sh`` run (``REPORT=results/demo.md bash scripts/demo.sh``): the teacher-vs-PET table
its measurement printed, the typed sentences' translations, how long each stage took on this machine and the machine's
load, so the README's expected BLEU and minutes come from a file a rerun remakes.

    python scripts/bench/demo_report.py work/demo --out results/demo.md --command "bash scripts/demo.sh" \\
        --sentences work/demo/sentences.de --load-before "0.1 0.2 0.3"
"""
import argparse
import json
import os
import shutil
import sys

from benchlib import write_text  # it also puts the checkout (user_dir/) on sys.path


def stages(path, total):
    """[(title, seconds)] from demo.sh's stages.tsv (each stage's start, in seconds since the demo began)."""
    with open(path) as f:
        rows = [(title, int(start)) for start, title in (line.rstrip("\n").split("\t", 1) for line in f)]
    return [(title, nxt[1] - start) for (title, start), nxt in zip(rows, rows[1:] + [("end", total)])
            if not title.startswith("done")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="the demo's WORK folder (stages.tsv, pet/measure.json, translations.*)")
    p.add_argument("--out", required=True, help="Markdown report; the measurement's JSON is written beside it")
    p.add_argument("--command", required=True, help="the command that ran the demo")
    p.add_argument("--sentences", required=True, help="the typed German sentences")
    p.add_argument("--load-before", default="unknown", help="load average (1, 5, 15 min) when the demo started")
    args = p.parse_args(argv)
    from user_dir.tools.measure import machine_description

    measure_json = os.path.join(args.work, "pet", "measure.json")
    for path in (measure_json, os.path.join(args.work, "stages.tsv"), args.sentences):
        if not os.path.isfile(path):
            raise SystemExit(f"demo_report: {path} missing (did scripts/demo.sh finish?)")
    with open(measure_json) as f:
        rows = {r["name"]: r for r in json.load(f)["rows"]}
    t, s = rows["teacher"], rows["pet"]
    full = rows.get("pet-full-recipe")  # the shipped full-recipe student, when the repository has it
    with open(os.path.join(args.work, "stages.tsv")) as f:
        last_start = int(f.read().splitlines()[-1].split("\t")[0])
    timeline = stages(os.path.join(args.work, "stages.tsv"), last_start)
    total = sum(sec for _, sec in timeline)
    with open(args.sentences, encoding="utf-8") as f:
        german = f.read().splitlines()
    translations = {}
    for name in ("teacher", "pet") + (("pet-full-recipe",) if full else ()):
        with open(os.path.join(args.work, f"translations.{name}"), encoding="utf-8") as f:
            translations[name] = f.read().splitlines()
    with open(os.path.join(args.work, "pet", "measure.md")) as f:
        measure_md = f.read()
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# The demo: the shipped teacher compressed with PET for a fixed number of updates", "",
        f"Made by `{args.command}`, which wrote this file (scripts/bench/demo_report.py).", "",
        "| | teacher | PET (demo budget) |" + (" PET (shipped, full recipe) |" if full else ""),
        "|---|---|---|" + ("---|" if full else ""),
        *[f"| {label} | " + " | ".join(cell(r) for r in [t, s] + ([full] if full else [])) + " |"
          for label, cell in [
              ("BLEU (tok)", lambda r: f"{r['bleu_tok']:.2f}"), ("sacreBLEU", lambda r: f"{r['sacrebleu']:.2f}"),
              ("non-embedding parameters", lambda r: f"{r['non_embedding_params']:,}" + (
                  "" if r is t else f" ({r['compression_rate']:.2f}%)")),
              ("sentences/s", lambda r: f"{r['sentences_per_s']:.1f}" + ("" if r is t else f" ({r['speedup']:.2f}x)"))]],
        "",
        "Time per stage on this machine (wall clock):", "",
        "| stage | minutes |", "|---|---|", *[f"| {title} | {sec / 60:.1f} |" for title, sec in timeline],
        f"| total | {total / 60:.1f} |", "",
        f"Machine: {machine_description()}. Threads: "
        + (f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}" if os.environ.get("OMP_NUM_THREADS")
           else "torch's default") + f". Load average (1, 5, 15 min) at the start: {args.load_before}; "
        f"at the end: {load_after}.", "",
        "Typed sentences (fairseq-interactive, beam 5):", "",
        *[f"- {de}\n  - teacher: {te}\n  - PET (demo budget): {pe}" + (f"\n  - PET (shipped): {fu}" if full else "")
          for de, te, pe, fu in zip(german, translations["teacher"], translations["pet"],
                                    translations.get("pet-full-recipe", [""] * len(german)))], "",
        "## The measurement command's table", "", measure_md]
    write_text(args.out, "\n".join(lines))
    shutil.copyfile(measure_json, os.path.splitext(args.out)[0] + ".json")
    print(f"[demo_report] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
