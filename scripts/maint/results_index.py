#!/usr/bin/env python
"""results/README.md: every file in results/ and its subfolders (that git tracks) with its method, the command that made it, its date and its status,
grouped by method so each method's tables and plots are found together.

    python scripts/maint/results_index.py                 # writes results/README.md
    python scripts/maint/results_index.py --check         # exit 1 if results/README.md misses a file or is stale

Read from the files themselves: a table's first heading and its 'Command' / 'Commands' / 'Made by' line (or the
code block after it), a JSON's ``command``, the git date of each file's last commit (``git log``). A JSON or PNG
belongs to the table whose name it starts with (a file of an ``outputs/`` folder: the table of the folder above).
Only what cannot be derived is kept by hand below: which method a name belongs to (``METHODS``) and each table's
status (``STATUS``, or ``FOLDER_STATUS`` for every table of a subfolder such as claims/): headline (what the method's page quotes as
its main result), part (a part of a headline table, or an ablation or check beside it) or superseded (replaced by
a later table, kept for its history). A file the tables below do not know is listed under "Other" as
"unclassified" (the test in tests/test_readme_numbers.py fails until it is classified).
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

# (file-name prefix, method, the page that documents it); the first matching prefix wins
METHODS = [
    ("archive/", "Archive: superseded tables, kept as they were written (the scripts that made them are deleted; "
                 "git keeps them)", None),
    ("claims", "The papers' central claims (rendered from the store, paired tests over seeds)", "README.md"),
    ("ladder_", "Which method (rendered from the store: the grids' students deployed and measured in one run)",
     "README.md"),
    ("pet_multi30k", "PET", "user_dir/pet/README.md"),
    ("demo", "PET", "user_dir/pet/README.md"),
    ("variator", "Variator", "user_dir/variator/README.md"),
    ("ghostbert", "GhostBERT", "user_dir/ghost/README.md"),
    ("ghost_costs", "GhostBERT", "user_dir/ghost/README.md"),
    ("apc", "APC", "user_dir/apc/README.md"),
    ("glue", "GLUE teachers", "user_dir/bert/README.md"),
    ("teacher_cache", "The teacher-output cache", "user_dir/tools/README.md"),
    ("teacher_", "Translation teachers", "scripts/README.md"),
    ("deploy", "Deployment", "user_dir/deploy/README.md"),
    ("serving", "Serving Variator", "user_dir/serving/README.md"),
]
# status and a few words on what the table is; only tables (.md): their JSON and plots share it
STATUS = {
    "claims.md": ("headline", "one row per central claim of each paper: difference, 95% interval, p, verdict"),
    "pet_multi30k.md": ("headline", "PET's full CPU recipe, measured from the shipped files"),
    "ladder_mt.md": ("headline", "translation: the teacher and the PET grid's students in fairseq and CTranslate2 "
                     "float32/int8, speed measured alone in one run, the training cost from the records, the "
                     "recommendation"),
    "ladder_glue.md": ("headline", "GLUE (MRPC): the teacher and the GLUE grid's students in fairseq and ONNX Runtime "
                       "fp32/int8, speed measured alone in one run, predictions against fairseq's, the training cost "
                       "from the records, the recommendation"),
    "store/README.md": ("part", "the store's layout: every finished grid cell's record and outputs (scripts/experiments/)"),
    "pet_sizes.md": ("part", "the PET claims grid's students sized against PET (rendered by scripts/experiments/render.py)"),
    "demo.md": ("part", "the demo's short PET run (200 + 600 updates)"),
    "archive/iwslt14.md": ("part", "a pipeline check on the paper's IWSLT'14 test set (7k training pairs)"),
    "archive/translation.md": ("headline", "the 800-update benchmark, 3 seeds per method, merged from its parts"),
    "archive/translation_800_pet.md": ("part", "PET and PET without warm-up, merged into translation.md"),
    "archive/translation_800_seed1.md": ("part", "word-KD, Patient-KD, CAN seed 1, merged into translation.md"),
    "archive/translation_800_seeds23.md": ("part", "word-KD, Patient-KD, CAN seeds 2-3, merged into translation.md"),
    "archive/translation_800_seqkd.md": ("part", "sequence-level KD, merged into translation.md"),
    "archive/translation_800_pet_intel.md": ("superseded", "PET's 800-update seeds on an Intel machine; translation.md "
                                     "takes them from translation_800_pet.md"),
    "archive/translation_800_one_machine.md": ("part", "seeds 1-2 retrained and measured on one machine: a check of "
                                       "translation.md"),
    "archive/translation_800_seed1_all.md": ("part", "merged into translation_800_one_machine.md"),
    "archive/translation_800_seed2_all.md": ("part", "merged into translation_800_one_machine.md"),
    "archive/translation_ablations.md": ("part", "PET's ablations (Tables 2, 3, 4/8, 10), one seed"),
    "archive/translation_ablations_2.md": ("part", "PET's ablations, second set, one seed"),
    "archive/translation_5658_seed1.md": ("part", "word-KD at PET's full budget (5,658 updates), one seed"),
    "archive/translation_long_budget.md": ("part", "PET against word-KD over PET's full budget: validation NLL"),
    "archive/translation_account.md": ("part", "written by hand: where and why our numbers differ from the paper's"),
    "archive/variator.md": ("headline", "plugins on the Multi30k teacher and the MiniLM GLUE teachers"),
    "archive/variator_glue_200_updates.md": ("part", "the SST-2 sweep over k at 200 adaptation updates"),
    "archive/ghostbert.md": ("headline", "pruned only vs GhostBERT on translation and GLUE"),
    "archive/ghostbert_sst2_1000_updates.md": ("part", "SST-2 at m = 3/12 with four times the budget"),
    "ghost_costs_gpu.md": ("part", "the ghost modules' time against pruned only on an H100, fp32/fp16/bf16"),
    "archive/ghost_costs_gpu_whole.md": ("part", "the GPU costs in fp16 with both encoders under CUDA graphs (cudagraphs backend; the option since removed)"),
    "archive/apc.md": ("part", "30 updates: sizes, initialisations, strategies"),
    "archive/apc_300_updates.md": ("headline", "translation at 300 updates: FFN, attention and embedding compression"),
    "archive/apc_glue.md": ("headline", "the APC-50-ff analogue of the MiniLM GLUE teachers vs neuron pruning"),
    "apc_layer_importance.md": ("part", "layer importance of the Multi30k teacher (Figure 3)"),
    "apc_layer_importance_rte.md": ("part", "layer importance of the RTE teacher (Figure 3)"),
    "apc_search_multi30k.md": ("part", "the Optuna size search (section 4.1)"),
    "glue.md": ("headline", "MiniLM-L6 fine-tuned on SST-2, MRPC, RTE"),
    "archive/gpu_check.md": ("headline", "every method with float32, --fp16, --bf16 and fc-train-bf16 on an H100"),
    "archive/gpu_check_apc_fp16_overflow.md": ("superseded", "the first H100 run: APC's fp16 loss-scale overflow, before "
                                       "its refusal (and before the seconds column worked)"),
    "teacher_cache.md": ("headline", "a word-level KD update's CPU time with the teacher online and with its outputs "
                         "cached (rendered from grids/teacher_cache.toml's cells)"),
    "teacher_multi30k.md": ("headline", "the CPU-scale Multi30k teacher against the reference"),
    "archive/deploy_glue.md": ("superseded", "a GLUE task's teacher and compressed encoders in fairseq, Hugging Face "
                               "and ONNX, by a driver since deleted; ladder_glue.md deploys and measures them now, "
                               "bench_ghost_costs.py the ghost modules' cost"),
    "archive/serving.md": ("headline", "fc-serve under a bursty load: fixed k against the adaptive policy (SST-2)"),
    "archive/methods_multi30k_ladder.md": ("headline", "the default ladder (15 models: PET, word-KD, Variator, GhostBERT, "
                                   "APC, PET then APC) at 400 CPU updates each, deployed in fairseq and CTranslate2 "
                                   "float32/int8, against the teacher: Pareto fronts and the recommendation"),
    "archive/methods_glue_sst2.md": ("headline", "the default GLUE ladder (12 models: Variator, pruned only, GhostBERT, APC) "
                             "at 480 CPU updates each on the SST-2 teacher, deployed in fairseq and ONNX Runtime "
                             "fp32/int8, chosen on a held-out slice of train, scored on dev: Pareto fronts and the "
                             "recommendation"),
    "archive/methods_multi30k.md": ("superseded", "PET and word-KD only at 300 updates; methods_multi30k_ladder.md runs "
                                    "the whole default ladder"),
}
# every table of a subfolder of results/ that STATUS does not name
FOLDER_STATUS = {"archive": ("superseded", "a table of the short-budget benchmarks, behind "
                                         "archive/claims_short_cpu_budgets.md")}
STATUS["archive/claims_short_cpu_budgets.md"] = (
    "superseded", "the claims at 200-800 CPU updates per model, before the grid runner (by a script since deleted)")
HAND_WRITTEN = {"archive/translation_account.md"}  # prose, no command made them
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


def git_date(path):
    """The date of the file's last commit, or 'not committed'."""
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", path], capture_output=True, text=True,
                         cwd=ROOT).stdout.strip()
    return out or "not committed"


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
        command, more = ("(written by hand)", 0) if name in HAND_WRITTEN else command_of_table(text)
        status, what = STATUS.get(name) or FOLDER_STATUS.get(os.path.dirname(name).split("/")[0]) or (
            "unclassified", "add it to STATUS in scripts/maint/results_index.py")
        if name.startswith("archive/"):  # kept as written: its command names a script since deleted
            status, command, more = "superseded", "(in the file; its script is deleted)", 0
        method, page = method_and_page(name)
        files = [n for n in names if n != name and not n.endswith(".md") and owner(n, tables) == name]
        if command is None:
            command = next((c for c in (command_of_json(os.path.join(results, f)) for f in files if f.endswith(".json"))
                            if c), None)
        rows.append({"name": name, "heading": first_heading(text), "command": command, "more_commands": more,
                     "status": status, "what": what, "method": method, "page": page,
                     "date": git_date(os.path.join(results, name)), "files": files})
    owned = {f for r in rows for f in r["files"]}
    for name in names:  # a JSON or plot of no table: its own row
        if name not in owned and not name.endswith(".md"):
            method, page = method_and_page(name)
            rows.append({"name": name, "heading": "", "command": command_of_json(os.path.join(results, name))
                         if name.endswith(".json") else None, "more_commands": 0, "status": "unclassified",
                         "what": "a file of no table", "method": method, "page": page,
                         "date": git_date(os.path.join(results, name)), "files": []})
    return rows


def index_markdown(rows):
    order = list(dict.fromkeys([m for _, m, _ in METHODS] + ["Other"]))
    out = ["# Results", "",
           "Every file in this folder, grouped by method: each table with the command that made it, the date of its "
           "last commit and its status -- **headline** (what the method's page quotes as its main result), **part** "
           "(a part of a headline table, or an ablation or check beside it) or **superseded** (replaced by a later "
           "table, kept for its history) -- and, beside it, its raw numbers (JSON) and plots (PNG). Each table holds "
           "its command, machine and date in full.", "",
           "Generated by `python scripts/maint/results_index.py` from the files themselves and git; the status and the "
           "method of a name are kept by hand in that script.", ""]
    for method in order:
        group = [r for r in rows if r["method"] == method]
        if not group:
            continue
        page = group[0]["page"]
        out += [f"## {method}" + (f" ([page](../{page}))" if page else ""), "",
                "| file | status | what | command | last commit | raw numbers and plots |", "|---|---|---|---|---|---|"]
        rank = {"headline": 0, "part": 1, "superseded": 2, "unclassified": 3}
        for r in sorted(group, key=lambda r: (rank.get(r["status"], 3), r["name"])):
            command = (r["command"] if r["command"] and r["command"].startswith("(") else f"`{r['command']}`"
                       if r["command"] else "(none written in the file)")
            if r["more_commands"]:
                command += f" and {r['more_commands']} more (in the file)"
            what = r["what"] + (f": {r['heading']}" if r["heading"] and r["status"] != "unclassified" else "")
            files = ", ".join(f"[{f}]({f})" for f in r["files"]) or "-"
            out.append(f"| [{r['name']}]({r['name']}) | {r['status']} | {what.replace('|', '/')} | "
                       f"{command.replace('|', '/')} | {r['date']} | {files} |")
        plots = [f for r in group for f in r["files"] if f.endswith(".png")]
        headline_plots = [f for r in group if r["status"] == "headline" for f in r["files"] if f.endswith(".png")]
        if headline_plots:
            out += ["", "Plots of the headline tables:", ""] + [f"![{f}]({f})" for f in headline_plots]
        elif plots:
            out += [""]
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
