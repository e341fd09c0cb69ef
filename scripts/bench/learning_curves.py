#!/usr/bin/env python
"""Validation NLL against training updates for several fairseq-train logs, on one axis: the check of
whether a comparison at one budget would come out the same at another (the students' reference
NLL on Multi30k's valid set, whatever their criterion). Writes a Markdown table (NLL at each budget
every run reached), the curves as read beside it (its name with .json) and a PNG.

    python scripts/bench/learning_curves.py \\
      --run "PET (3 warm-up epochs, then KD)" work/pet-full/kd.log 738 \\
      --run "word-KD (plain student)" work/bench-translation/u5658-w738-e128-d96/word-kd-s1/kd/train.log 0 \\
      --out results/archive/translation_long_budget.md

Each ``--run LABEL LOG OFFSET``: OFFSET updates are added to the log's own (a KD stage that started
from a warm-up of OFFSET updates is placed after it; the warm-up's own validation loss is on a
different task and is not plotted). A log a resumed run appended to keeps the last line per update.
"""
import argparse
import json
import os
import re
import shlex
import sys

from benchlib import plot_panels

VALID = re.compile(r"\| valid \| epoch \d+ \| valid on 'valid' subset .*?\| nll_loss ([0-9.]+) .*?\| num_updates (\d+)")


def valid_curve(log_path, offset=0):
    """{total updates: validation NLL} from a fairseq-train log."""
    if not os.path.isfile(log_path):
        raise SystemExit(f"--run: no log at {log_path}")
    curve = {}
    with open(log_path) as f:
        for match in VALID.finditer(f.read()):
            curve[int(match.group(2)) + offset] = float(match.group(1))
    if not curve:
        raise SystemExit(f"--run: {log_path} has no validation line (is it a fairseq-train log?)")
    return dict(sorted(curve.items()))


def curves_table(curves):
    """Rows at every update count that any run validated at; '-' where a run has no value there."""
    labels = list(curves)
    updates = sorted({u for c in curves.values() for u in c})
    lines = ["| updates | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for u in updates:
        lines.append(f"| {u:,} | " + " | ".join(f"{curves[label][u]:.3f}" if u in curves[label] else "-"
                                                 for label in labels) + " |")
    return lines


def plot_curves(curves, path, command=None):
    """Every run's validation NLL against its training updates; returns the PNG's path (None: no matplotlib)."""
    lines = [dict(x=list(curve), y=list(curve.values()), marker="o", markersize=3, label=label)
             for label, curve in curves.items()]
    return plot_panels(path, [dict(series=lines, xlabel="training updates (all stages)", grid=True, legend={},
                                   ylabel="validation NLL (bits/token, fairseq's nll_loss)")], command=command)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", nargs=3, action="append", required=True, metavar=("LABEL", "LOG", "OFFSET"),
                   help="a curve: its label, its fairseq-train log, updates before the log's first (a warm-up stage)")
    p.add_argument("--title", default="Validation NLL against training updates", help="the Markdown heading")
    p.add_argument("--note", default="", help="a paragraph under the heading (what is compared, how it was trained)")
    p.add_argument("--out", required=True, help="Markdown output; the plot goes beside it as .png")
    args = p.parse_args(argv)
    curves = {}
    for label, log, offset in args.run:
        if not offset.isdigit():
            raise SystemExit(f"--run {label}: OFFSET must be a number of updates, got {offset!r}")
        curves[label] = valid_curve(log, int(offset))
    command = "python scripts/bench/learning_curves.py " + " ".join(
        f"--run {shlex.quote(label)} {log} {offset}" for label, log, offset in args.run) + "".join(
        f" --{flag} {shlex.quote(value)}" for flag, value in (("title", args.title), ("note", args.note))
        if value and value != p.get_default(flag))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    png = plot_curves(curves, os.path.splitext(args.out)[0] + ".png", command + f" --out {args.out}")
    lines = [f"# {args.title}", ""] + ([args.note, ""] if args.note else []) + curves_table(curves) + [
        "", "Logs: " + "; ".join(f"{label}: `{log}` (+{offset} updates)" for label, log, offset in args.run) + ".",
        "", "Command:", "```", command + f" --out {args.out}", "```"]
    raw = os.path.splitext(args.out)[0] + ".json"
    lines += ["", f"Curves as read from the logs (the table's JSON): `{os.path.basename(raw)}`."]
    if png:
        lines += ["", f"Plot: `{os.path.basename(png)}`"]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(raw, "w") as f:
        json.dump({"command": command + f" --out {args.out}", "runs": [
            dict(label=label, log=log, offset=int(offset), valid_nll={str(u): v for u, v in curves[label].items()})
            for label, log, offset in args.run]}, f, indent=1)
    print("\n".join(lines))
    print(f"[curves] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
