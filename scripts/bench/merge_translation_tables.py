#!/usr/bin/env python
"""One table from several tables of ``scripts/bench/bench_translation.py``: the runs of a grid trained
and measured in parts (other seeds, other sessions, other machines) summarised together.

    python scripts/bench/merge_translation_tables.py results/archive/translation_800_pet.md \\
        results/archive/translation_800_seed1.md results/archive/translation_800_seeds23.md --out results/translation.md

It reads each table's per-run rows (BLEU, sacreBLEU, sentences/s and the teacher measured in the
same run; unrounded from the table's raw measurement ``<table>.json`` where it is kept, checked
against the table, else as the table rounds them) and its method rows (parameters, compression,
size), and writes the mean +- sample std of BLEU over every run of a method, with the tables each
method came from, and its own JSON beside ``--out`` (every run and each method's summary, unrounded). Timings from different
measurements (machines, loads) do not compare as sentences/s, so the merged table gives each run's
speed-up over the teacher measured in the same run, averaged over a method's runs.

It stops, naming the file, when a table is not a benchmark table, when the tables disagree on the
teacher's BLEU or the training budget (they would not measure the same thing), when a method's size
differs between tables, or when two tables hold the same run (method and seed).
"""
import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time

import translation_students as students
from benchlib import ROOT

BUDGET = re.compile(r"trains for (\d+) updates from scratch \(PET: the first (\d+)")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def cell_number(text):
    return float(text.split("+-")[0].replace(",", "").rstrip("%x"))


def read_table(path):
    """One bench table -> dict(budget, machine, teacher: row, runs: [student row], sizes: {method: row})."""
    with open(path) as f:
        lines = f.read().splitlines()

    def fail(why):
        raise SystemExit(f"{path}: {why} (is it a table written by scripts/bench/bench_translation.py?)")

    budget = next((BUDGET.search(line).groups() for line in lines if BUDGET.search(line)), None)
    if budget is None:
        fail("no training budget ('trains for N updates ...') in its header")
    machine = next((line[len("Machine: "):].rstrip(".") for line in lines if line.startswith("Machine: ")), None)
    if machine is None:
        fail("no 'Machine:' line")
    # "- `method`: description" under the table's "Methods:" heading
    descriptions = dict(re.match(r"- `([^`]+)`: (.*)", line).groups() for line in lines if re.match(r"- `[^`]+`: ", line))
    sizes, runs = {}, []
    header = None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = row
            continue
        if set(line) <= set("|-"):
            continue
        if header[:3] == ["method", "seeds", "BLEU (tok)"]:
            col = dict(zip(header, row))
            sizes.setdefault(row[0], dict(params=int(cell_number(col["non-emb params"])),
                                          compression=cell_number(col["compression"]),
                                          weights_mb=cell_number(col["weights MB"])))
        elif header[:4] == ["run", "BLEU (tok)", "sacreBLEU", "sent/s"]:
            runs.append(dict(name=row[0], bleu_tok=cell_number(row[1]), sacrebleu=cell_number(row[2]),
                             sentences_per_s=cell_number(row[3])))
    raw = os.path.splitext(path)[0] + ".json"
    if os.path.isfile(raw):
        runs = raw_runs(raw, runs)
    else:
        raw = None
    teacher = [r for r in runs if r["name"] == "teacher"]
    if len(teacher) != 1 or "teacher" not in sizes:
        fail("no teacher row in its per-run or method table")
    teacher = teacher[0]
    runs = [r for r in runs if r is not teacher]
    for r in runs:
        r["teacher_speed"] = teacher["sentences_per_s"]
        r["speedup"] = r["sentences_per_s"] / teacher["sentences_per_s"]
        r["method"] = students.method_of(r["name"])
        if r["method"] not in sizes:
            fail(f"run {r['name']} has no method row")
    return dict(path=path, budget=(int(budget[0]), int(budget[1])), machine=machine, teacher=teacher, runs=runs,
                sizes=sizes, descriptions=descriptions, raw=raw)


def raw_runs(raw, shown):
    """The per-run rows of a table from its raw measurement (``<table>.json``, unrounded), checked against
    the rows the table shows (``shown``, rounded): the same runs, and each value as the table rounds it."""
    with open(raw) as f:
        rows = json.load(f)["rows"]
    runs = [dict(name=r["name"], bleu_tok=r["bleu_tok"], sacrebleu=r["sacrebleu"], sentences_per_s=r["sentences_per_s"])
            for r in rows]
    if [r["name"] for r in runs] != [r["name"] for r in shown]:
        raise SystemExit(f"{raw}: runs {[r['name'] for r in runs]}, but its table shows {[r['name'] for r in shown]}")
    for r, t in zip(runs, shown):
        for key, digits in (("bleu_tok", 2), ("sacrebleu", 2), ("sentences_per_s", 1)):
            if f"{r[key]:.{digits}f}" != f"{t[key]:.{digits}f}":
                raise SystemExit(f"{raw}: {r['name']} {key} {r[key]:.{digits}f}, but its table shows "
                                 f"{t[key]:.{digits}f}: the table was not written from this measurement")
    return runs


def merge(paths):
    """Checks the tables measure the same thing and merges their runs: {method: [run]}, sources."""
    tables = [read_table(p) for p in paths]
    first = tables[0]
    t0 = first["teacher"]
    by_method, seen = {}, {}
    for t in tables:
        teacher = t["teacher"]
        if abs(teacher["bleu_tok"] - t0["bleu_tok"]) > 0.005:
            raise SystemExit(f"{t['path']}: teacher BLEU {teacher['bleu_tok']:.2f}, but {first['path']} has "
                             f"{t0['bleu_tok']:.2f}: not the same teacher or test set")
        if t["budget"] != first["budget"]:
            raise SystemExit(f"{t['path']}: trained for {t['budget'][0]} updates ({t['budget'][1]} warm-up), but "
                             f"{first['path']} for {first['budget'][0]} ({first['budget'][1]}): not one budget")
        for r in t["runs"]:
            if r["name"] in seen:
                raise SystemExit(f"run {r['name']} is in both {seen[r['name']]} and {t['path']}: merge each run once")
            seen[r["name"]] = t["path"]
            size = t["sizes"][r["method"]]
            runs = by_method.setdefault(r["method"], [])
            if runs and runs[0]["size"]["params"] != size["params"]:
                raise SystemExit(f"{r['method']}: {size['params']:,} non-embedding parameters in {t['path']}, "
                                 f"{runs[0]['size']['params']:,} in {runs[0]['table']}: not the same model")
            runs.append(dict(r, size=size, table=t["path"]))
    return by_method, tables


def source_cell(path):
    """A merged run's table as its cell: a results/ table linked from results/ (where the merged table goes,
    e.g. ``[archive/x.md](archive/x.md)``), any other by its name."""
    results = os.path.join(ROOT, "results")
    path = os.path.abspath(path)
    if path.startswith(results + os.sep):
        link = os.path.relpath(path, results)
        return f"[{link}]({link})"
    return f"`{os.path.basename(path)}`"


def merged_summary(by_method, tables, command):
    order = list(by_method)  # first appearance in the tables, in the order given
    descriptions = {}
    for t in reversed(tables):  # each method described as the first table holding it describes it
        descriptions.update(t["descriptions"])
    teacher = tables[0]["teacher"]
    tsize = tables[0]["sizes"]["teacher"]
    updates, warmup = tables[0]["budget"]

    def shown(values):
        return f"{statistics.mean(values):.2f} +- {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    def rel(path):
        return os.path.relpath(path, ROOT)

    lines = ["# Translation benchmark: compressing the Multi30k DE->EN teacher (merged tables)", "",
             f"Teacher: 3+3 layers, width 256, {teacher['bleu_tok']:.2f} BLEU. Test set: test_2016_flickr, beam 5. "
             f"Every student trains for {updates} updates from scratch (PET: the first {warmup} on the simplified "
             "warm-up task). The runs were trained and measured in parts, each part by `scripts/bench/bench_translation.py` "
             "into its own table (listed below with its machine); this table merges them: BLEU is the mean +- sample "
             "std over all runs of a method, and speed the mean of each run's speed-up over the teacher measured in "
             "the same run (sentences/s from different measurements do not compare). Compression = non-embedding "
             "parameters in % of the teacher's. The paper's column: IWSLT'14 DE->EN, Transformer teacher "
             f"{students.PAPER_TEACHER_BLEU} BLEU (PET Table 7) -- a different scale, for orientation only.", "",
             "| method | seeds | BLEU (tok) | sacreBLEU | non-emb params | compression | weights MB | speed-up | "
             "from | paper: compression, BLEU |", "|---|---|---|---|---|---|---|---|---|---|",
             f"| teacher | - | {teacher['bleu_tok']:.2f} | {teacher['sacrebleu']:.2f} | {tsize['params']:,} | 100.00% | "
             f"{tsize['weights_mb']:.1f} | 1.00x | all | 100%, {students.PAPER_TEACHER_BLEU} |"]
    stats = {}
    for m in order:
        runs = by_method[m]
        bleu = [r["bleu_tok"] for r in runs]
        speedup = statistics.mean(r["speedup"] for r in runs)
        size = runs[0]["size"]
        stats[m] = dict(bleu=(statistics.mean(bleu), statistics.stdev(bleu) if len(bleu) > 1 else 0.0),
                        speed=speedup, compression=size["compression"])
        paper = students.PAPER.get(m)
        paper = f"{paper[0] + '%, ' if paper[0] else ''}{paper[1]}" if paper else ""
        sources = ", ".join(dict.fromkeys(source_cell(r["table"]) for r in runs))
        lines.append(f"| {m} | {len(runs)} | {shown(bleu)} | {shown([r['sacrebleu'] for r in runs])} | "
                     f"{size['params']:,} | {size['compression']:.2f}% | {size['weights_mb']:.1f} | {speedup:.2f}x | "
                     f"{sources} | {paper} |")
    lines += students.warmup_table(teacher, stats)
    lines += ["", "Methods:", ""] + [f"- `{m}`: {descriptions.get(m, '(not described in its table)')}" for m in order]
    lines += ["", "Per run:", "", "| run | BLEU (tok) | sacreBLEU | sent/s | teacher's sent/s, same run | speed-up | table |",
              "|---|---|---|---|---|---|---|"]
    for m in order:
        for r in by_method[m]:
            lines.append(f"| {r['name']} | {r['bleu_tok']:.2f} | {r['sacrebleu']:.2f} | {r['sentences_per_s']:.1f} | "
                         f"{r['teacher_speed']:.1f} | {r['speedup']:.2f}x | {source_cell(r['table'])} |")
    lines += ["", "Tables merged (each with the command that trains and measures its runs; per-run values from "
              "the table's raw measurement where it is kept, else as the table rounds them):", ""]
    lines += [f"- `{rel(t['path'])}` ({'raw: `' + os.path.basename(t['raw']) + '`' if t['raw'] else 'rounded: its raw measurement was not kept'}): "
              f"{t['machine']}" for t in tables]
    lines += ["", f"Date: {time.strftime('%Y-%m-%d')}.", "", "Command:", "```", command, "```", ""]
    return "\n".join(lines), stats, dict(teacher, sentences_per_s=1.0)




def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="+", help="Markdown tables written by scripts/bench/bench_translation.py")
    p.add_argument("--out", required=True, help="merged Markdown table (plots beside it, same name)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    for path in args.tables:
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: no such table")
    command = "python scripts/bench/merge_translation_tables.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    by_method, tables = merge(args.tables)
    text, stats, teacher = merged_summary(by_method, tables, command)
    prefix = os.path.splitext(args.out)[0]
    plots = students.plot_students(stats, teacher, prefix, command=command,
                                   speed_label="speed-up over the teacher (beam 5, CPU, same run)")
    if plots:
        text += "\nPlots (cf. PET Fig 5): " + ", ".join(f"`{os.path.basename(p)}`" for p in plots) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(prefix + ".json", "w") as f:
        json.dump(merged_record(by_method, tables, stats, command), f, indent=1)
    print(text)
    print(f"[merge] wrote {args.out} and {prefix}.json", file=sys.stderr)


def merged_record(by_method, tables, stats, command):
    """The merged table's numbers unrounded (its JSON): every run as read from its part, each method's summary."""
    return {"command": command, "date": time.strftime("%Y-%m-%d"),
            "tables": [dict(path=os.path.relpath(t["path"], ROOT), machine=t["machine"],
                            raw=os.path.relpath(t["raw"], ROOT) if t["raw"] else None,
                            teacher=t["teacher"]) for t in tables],
            "runs": [{k: v for k, v in dict(r, table=os.path.relpath(r["table"], ROOT)).items() if k != "size"}
                     for runs in by_method.values() for r in runs],
            "methods": {m: dict(seeds=len(by_method[m]), bleu_mean=st["bleu"][0], bleu_std=st["bleu"][1],
                                speedup=st["speed"], compression=st["compression"],
                                non_embedding_params=by_method[m][0]["size"]["params"])
                        for m, st in stats.items()}}


if __name__ == "__main__":
    main()
