#!/usr/bin/env python
"""A grid's validation curves from the store: each record's last training stage after its earlier stages' updates
(PET's warm-up validates another task: not drawn), as a Markdown table and a PNG beside it. Whether a comparison at
one budget would come out the same at another, and whether the epoch cap binds.

    python scripts/bench/learning_curves.py grids/pet.toml --seeds 1 --out results/pet_curves.md
"""
import argparse
import os
import sys

from benchlib import plot_panels, write_text  # benchlib also puts scripts/experiments/ on sys.path
from grid import ROOT, Grid

COLUMNS = {"loss": 2, "nll": 3}


def curves(grid, seeds=None, metric="loss"):
    """{"CELL sSEED": {total updates: value}} over the grid's current records that hold a validation curve."""
    out = {}
    for cell in grid.cells:
        for record in grid.current_records(cell.name):
            if record["seed"] != cell.seed or (seeds and record["seed"] not in seeds):
                continue
            stages = [c["stage"] for c in record["commands"] if record["training"].get(c["stage"])]
            offset = sum(record["training"][s]["updates"] for s in stages[:-1])
            points = record["training"][stages[-1]].get("validation") if stages else None
            if points:
                out[cell.label.replace("-s", " s")] = {offset + p[1]: p[COLUMNS[metric]] for p in points
                                                       if p[COLUMNS[metric]] is not None}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", help="a grid file (grids/*.toml)")
    p.add_argument("--seeds", default=None, help="seeds, comma-separated (default: every seed with a record)")
    p.add_argument("--metric", choices=sorted(COLUMNS), default="loss",
                   help="validation loss (what fairseq's --patience watches; default) or NLL")
    p.add_argument("--store", default=None, help="the store (default results/store)")
    p.add_argument("--out", required=True, help="Markdown output; the plot goes beside it as .png")
    args = p.parse_args(argv)
    grid = Grid(args.grid, store=args.store)
    found = curves(grid, args.seeds and {int(s) for s in args.seeds.split(",")}, args.metric)
    if not found:
        raise SystemExit(f"learning_curves: no record of {args.grid} in {grid.store.root} holds a validation curve")
    command = "python scripts/bench/learning_curves.py " + " ".join(a for a in (argv or sys.argv[1:]))
    png = plot_panels(os.path.splitext(args.out)[0] + ".png", [dict(
        series=[dict(x=list(c), y=list(c.values()), marker="o", markersize=2, label=label) for label, c in found.items()],
        xlabel="training updates (all stages)", ylabel=f"validation {args.metric} (fairseq's, per epoch)", grid=True,
        legend={})], command=command)
    updates = sorted({u for c in found.values() for u in c})
    lines = [f"# Validation {args.metric} against training updates: {os.path.relpath(grid.path, ROOT)}", "",
             f"Made by `{command}` from the store's records (each student's last training stage; earlier stages' "
             "updates placed before it).", "", "| updates | " + " | ".join(found) + " |", "|---" * (len(found) + 1) + "|"]
    lines += [f"| {u:,} | " + " | ".join(f"{c[u]:.3f}" if u in c else "-" for c in found.values()) + " |"
              for u in updates]
    lines += ["", f"Plot: `{os.path.basename(png)}`"] if png else []
    write_text(args.out, "\n".join(lines) + "\n")
    print(f"[curves] wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
