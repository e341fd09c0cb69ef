#!/usr/bin/env python
"""results/README.md: every file in results/ and its subfolders (that git tracks), grouped by method, each table with
its first heading, the command that made it and its status, its raw numbers (JSON) and plots (PNG) beside it.

    python scripts/maint/results_index.py                 # writes results/README.md
    python scripts/maint/results_index.py --check         # exit 1 if results/README.md misses a file or is stale

Read from the files: a table's first heading and 'Command' / 'Made by' line, a JSON's ``command``; a JSON or PNG
belongs to the table its name starts with. Status: **superseded** in results/archive/, else **current**.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")
OUT = os.path.join(RESULTS, "README.md")

# (file-name prefix, method, the page that documents it), in the index's order; the first matching prefix wins
METHODS = [
    ("claims", "The papers' central claims (rendered from the store, paired tests over seeds)", "README.md"),
    ("ladder_", "Which method (rendered from the store: the grids' students deployed and measured in one run)",
     "README.md"),
    ("pet_", "PET", "user_dir/pet/README.md"),
    ("store/", "The results store (every grid cell's record and outputs)", "scripts/README.md"),
    ("demo", "PET", "user_dir/pet/README.md"),
    ("variator", "Variator", "user_dir/variator/README.md"),
    ("ghost", "GhostBERT", "user_dir/ghost/README.md"),
    ("apc", "APC", "user_dir/apc/README.md"),
    ("glue", "GLUE teachers", "user_dir/bert/README.md"),
    ("teacher_cache", "The teacher-output cache", "user_dir/tools/README.md"),
    ("teacher_", "Translation teachers", "scripts/README.md"),
    ("deploy", "Deployment", "user_dir/deploy/README.md"),
    ("serving", "Serving Variator", "user_dir/serving/README.md"),
    ("archive/", "Archive: superseded tables, kept as they were written (the scripts that made them are deleted; "
                 "git keeps them)", None),
]
COMMAND_LINE = re.compile(r"^(?:\*\*)?(Commands?\b|Made by\b|Report made by\b)", re.I)


def method_and_page(name):
    return next(((m, page) for prefix, m, page in METHODS if name.startswith(prefix)), ("Other", None))


def first_heading(text):
    return next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("# ")), "")


def command_of_table(text):
    """The command a table names: the backticked commands of its first Command/Made-by line, or the first line of
    the code block right after it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not COMMAND_LINE.match(line.strip()):
            continue
        spans = [s for s in re.findall(r"`([^`]+)`", line) if " " in s]
        if spans:
            return spans[0], len(spans) - 1
        for following in lines[i + 1:i + 4]:
            if following.strip() and not following.startswith("```"):
                return following.strip(), 0
    return None, 0


def command_of_json(path):
    try:
        data = json.load(open(path))
    except ValueError:
        return None
    return data.get("command") if isinstance(data, dict) and isinstance(data.get("command"), str) else None


def owner(name, tables):
    """The table a JSON or plot belongs to: the longest table stem its name starts with."""
    stem = os.path.splitext(name)[0].replace("/outputs/", "/")
    matches = [t for t in tables if stem == t[:-3] or stem.startswith(t[:-3] + "_")]
    return max(matches, key=len) if matches else None


def results_files(results=RESULTS):
    """The files of results/ and its subfolders (claims/, claims/outputs/), as paths relative to results/, that git
    tracks (a file not yet committed is someone's work in progress), or every file where there is no git checkout."""
    proc = subprocess.run(["git", "ls-files", "--", "."], capture_output=True, text=True, cwd=results)
    if proc.returncode == 0:
        names = proc.stdout.split()
    else:
        names = [os.path.relpath(os.path.join(folder, n), results) for folder, _, files in os.walk(results)
                 for n in files]
    # the store's data (records, outputs, references, ladder runs) is read by scripts/experiments/render.py, not indexed
    # file by file: store/README.md stands for it
    return sorted(n for n in names if n != "README.md" and not any(part.startswith(".") for part in n.split("/"))
                  and not (n.startswith("store/") and n != "store/README.md"))


def entries(results=RESULTS):
    names = results_files(results)
    tables = [n for n in names if n.endswith(".md")]
    rows = []
    for name in tables:
        text = open(os.path.join(results, name), encoding="utf-8").read()
        command, more = command_of_table(text)
        if name.startswith("archive/"):  # kept as written: its command names a script since deleted
            command, more = "(in the file; its script is deleted)", 0
        files = [n for n in names if n != name and not n.endswith(".md") and owner(n, tables) == name]
        if command is None:
            command = next((c for c in (command_of_json(os.path.join(results, f)) for f in files if f.endswith(".json"))
                            if c), None)
        rows.append({"name": name, "heading": first_heading(text), "command": command, "more_commands": more,
                     "status": "superseded" if name.startswith("archive/") else "current",
                     "method": method_and_page(name), "files": files})
    owned = {f for r in rows for f in r["files"]}
    for name in names:  # a JSON or plot of no table: its own row
        if name not in owned and not name.endswith(".md"):
            rows.append({"name": name, "heading": "(a file of no table)", "more_commands": 0, "status": "current",
                         "command": command_of_json(os.path.join(results, name)) if name.endswith(".json") else None,
                         "method": method_and_page(name), "files": []})
    return rows


def index_markdown(rows):
    out = ["# Results", "",
           "Every file in this folder, grouped by method: each table with the command that made it and its status -- "
           "**current**, or **superseded** (results/archive/: kept as written, its script deleted) -- and, beside it, "
           "its raw numbers (JSON) and plots (PNG). Each table holds its command, machine and date in full; the rendered "
           "ones are made from the store ([store/README.md](store/README.md)) by `python scripts/experiments/render.py`.",
           "", "Generated by `python scripts/maint/results_index.py` from the files themselves.", ""]
    for method, page in dict.fromkeys([(m, p) for _, m, p in METHODS] + [("Other", None)]):
        group = [r for r in rows if r["method"] == (method, page)]
        if not group:
            continue
        out += [f"## {method}" + (f" ([page](../{page}))" if page else ""), "",
                "| file | status | what | command | raw numbers and plots |", "|---|---|---|---|---|"]
        for r in sorted(group, key=lambda r: (r["status"] != "current", r["name"])):
            command = (r["command"] if r["command"] and r["command"].startswith("(") else f"`{r['command']}`"
                       if r["command"] else "(none written in the file)")
            if r["more_commands"]:
                command += f" and {r['more_commands']} more (in the file)"
            files = ", ".join(f"[{f}]({f})" for f in r["files"]) or "-"
            out.append(f"| [{r['name']}]({r['name']}) | {r['status']} | {r['heading'].replace('|', '/')} | "
                       f"{command.replace('|', '/')} | {files} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with results/README.md instead of writing it")
    args = p.parse_args(argv)
    text = index_markdown(entries())
    if args.check:
        current = open(OUT, encoding="utf-8").read() if os.path.isfile(OUT) else ""
        if current != text:
            sys.exit("results/README.md is stale: run python scripts/maint/results_index.py")
        return
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
