#!/usr/bin/env python
"""WORK/result.json: what one recipe run made, machine-readable, written by the recipe's last step.

    python scripts/experiments/record.py WORK --recipe pet.sh --name pet --stages data warmup kd measure \\
        --train-stages warmup kd --checkpoint WORK/kd/checkpoint_best.pt --measure WORK/measure.json \\
        --teacher T.pt --data DATA-BIN --device-flags "--cpu" --var SEED=1 --var ENC_DIM=128 ...
    python scripts/experiments/record.py --score WORK/result.json      the run's score line (the recipes' last line)

It holds the recipe's variables; each stage's command (its DONE file) and the wall and CPU seconds of its attempts
(:func:`stage_times`); the teacher's sha256 and the data's fingerprint; the scored checkpoint, its metrics on the report
split and per-example outputs (fc-measure); each training stage's updates, epochs, best epoch, best validation value and
validation curve; the machine; the primary metric of its score line (:func:`score_line`). grid.py files it in the store.
"""
import argparse
import functools
import glob
import hashlib
import json
import os
import platform
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha256_of(path, teacher=False):
    """The SHA-256 of a file (a link followed), read once per process while its size and modification time stay.
    teacher=True: a checkpoint a training wrote (it keeps its optimizer's state: a GLUE teacher a grid's preparation
    makes) also holds its run's timers, so two trainings to the same weights differ: the SHA-256 of its weights then."""
    stat = os.stat(real := os.path.realpath(path))
    return _file_digest(real, stat.st_size, stat.st_mtime_ns, teacher)


@functools.lru_cache(maxsize=None)
def _file_digest(path, size, mtime_ns, teacher):  # size and mtime in the key: a file rewritten in place is read again
    digest = hashlib.sha256()
    if teacher:
        import torch
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state.get("last_optimizer_state"):
            for name, tensor in sorted(state["model"].items()):  # each name, dtype, shape and value
                digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
                digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            return digest.hexdigest()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def data_fingerprint(data):
    """sha256 over the data-bin's dictionaries and every subset's index (.idx: the sizes and offsets of every example),
    so a re-binarised or re-split corpus gets another fingerprint without reading the .bin files."""
    files = sorted(glob.glob(os.path.join(data, "**", "dict*.txt"), recursive=True)
                   + glob.glob(os.path.join(data, "**", "*.idx"), recursive=True))
    if not files:
        raise SystemExit(f"record: {data} holds no dict*.txt or *.idx (a fairseq data-bin?)")
    digest = hashlib.sha256()
    for path in files:
        digest.update(os.path.relpath(path, data).encode() + b"\0" + sha256_of(path).encode() + b"\0")
    return digest.hexdigest()


def machine_of_record(cpu, device_flags=""):
    """The machine the run was measured on: ``cpu`` as fc-measure's --json names it (no import of the plug-in)."""
    described = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                 "threads": os.environ.get("OMP_NUM_THREADS"), "malloc": os.environ.get("MALLOC_MMAP_THRESHOLD_")}
    try:
        import torch

        described["torch"] = torch.__version__
        if "--cpu" not in device_flags.split() and torch.cuda.is_available():
            described["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    described["device"] = "gpu" if "gpu" in described else "cpu"
    return described


def stage_times(directory):
    """[(wall, cpu[, "log"]), ...] of every attempt of a stage: common.sh's line per attempt (a killed one's last heartbeat),
    and before them the fairseq-train runs its log (DIR.log) shows that no line holds (killed before common.sh had a
    heartbeat): each run's span of log timestamps, its CPU time at the recorded attempts' CPU/wall ratio (else 1)."""
    path = os.path.join(directory, "TIMES")
    times = []
    if os.path.exists(path):
        with open(path) as f:
            times = [tuple(float(x) for x in line.split()[:2]) for line in f if line.strip()]
    runs = log_runs(directory.rstrip(os.sep) + ".log")
    if len(runs) > len(times):
        ratio = sum(t[1] for t in times) / sum(t[0] for t in times) if times and sum(t[0] for t in times) else 1.0
        times = [(span, span * ratio, "log") for span in runs[:len(runs) - len(times)]] + times
    return times


STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| ")


def log_runs(log):
    """Seconds from each fairseq-train run's configuration line to its last timestamped line, per run in the log (the
    next run's start-up lines, within 30 s before its configuration line, are not the previous run's)."""
    import datetime

    stamps, starts = [], []
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                found = STAMP.match(line)
                if found:
                    stamps.append(datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").timestamp())
                    if "| fairseq_cli.train | {'_name'" in line:
                        starts.append(stamps[-1])
    ends = starts[1:] + [float("inf")]  # inf - 30 is inf: the last run keeps every later line
    return [max((t for t in stamps if start <= t < end - 30), default=start) - start for start, end in zip(starts, ends)]


VALID = re.compile(r"\| valid \| epoch (\d+) \| valid on 'valid' subset \| loss ([-0-9.e]+) "
                   r"(?:\| nll_loss ([-0-9.e]+) )?.*?\| num_updates (\d+)")


def validation_curve(log):
    """``[[epoch, updates, loss, NLL or None], ...]``: a fairseq-train log's validations (a repeated one: its last)."""
    if not os.path.exists(log):
        return []
    points = {}
    with open(log, errors="replace") as f:
        for line in f:
            found = VALID.search(line)
            if found:
                updates = int(found[4])
                points[updates] = [int(found[1]), updates, float(found[2]), found[3] and float(found[3])]
    return [points[u] for u in sorted(points)]


def training_state(directory):
    """Updates, epochs, best epoch, best validation value and validation curve of a fairseq-train stage's directory."""
    import torch

    last = os.path.join(directory, "checkpoint_last.pt")
    if not os.path.exists(last):
        return None
    state = torch.load(last, map_location="cpu", weights_only=False)
    extra = state.get("extra_state") or {}
    iterator = extra.get("train_iterator") or {}
    epoch = iterator.get("epoch", 1)
    done_epochs = epoch - 1 if iterator.get("iterations_in_epoch", 0) == 0 else epoch - 1 + 0.5
    out = {"updates": int(state["optimizer_history"][-1]["num_updates"]), "epochs": done_epochs,
           "best_validation": extra.get("best")}
    best = os.path.join(directory, "checkpoint_best.pt")
    if os.path.exists(best):
        best_state = torch.load(best, map_location="cpu", weights_only=False)
        best_it = (best_state.get("extra_state") or {}).get("train_iterator") or {}
        out["best_epoch"] = best_it.get("epoch", 1) - 1 if best_it.get("iterations_in_epoch", 0) == 0 \
            else best_it.get("epoch")
        out["best_updates"] = int(best_state["optimizer_history"][-1]["num_updates"])
    out["validation"] = validation_curve(directory.rstrip(os.sep) + ".log")
    return out


def relative(path):
    path = os.path.abspath(path)
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith(os.pardir) else rel


def build(args):
    work = os.path.abspath(args.work)
    commands, wall, cpu = [], 0.0, 0.0
    for name in args.stages:
        done = os.path.join(work, name, "DONE")
        if not os.path.exists(done):
            raise SystemExit(f"record: stage {name} is not finished ({done} missing)")
        with open(done) as f:
            command = f.read().strip()
        times = stage_times(os.path.join(work, name))
        wall += sum(t[0] for t in times)
        cpu += sum(t[1] for t in times)
        python = os.environ.get("PYTHON")
        if python and command.startswith(python + " "):
            command = "python" + command[len(python):]
        command = command.replace(work, "WORK").replace(ROOT + "/", "").replace("ROOT/", "")
        commands.append({"stage": name, "command": command,
                         "attempts": len(times), "wall_s": round(sum(t[0] for t in times), 1),
                         "cpu_s": round(sum(t[1] for t in times), 1)})
        if any(len(t) > 2 for t in times):  # killed runs timed from the log, their CPU estimated (stage_times)
            commands[-1]["attempts_from_log"] = sum(len(t) > 2 for t in times)
    training = {name: training_state(os.path.join(work, name)) for name in args.train_stages}
    with open(args.measure) as f:
        measured = json.load(f)
    rows = {r["name"]: r for r in measured["rows"]}
    if args.name not in rows:
        raise SystemExit(f"record: {args.measure} has no row named {args.name!r} (rows: {', '.join(rows)})")
    row = rows[args.name]
    metric_keys = ("bleu_tok", "sacrebleu", "accuracy", "f1", "mcc", "pearson", "spearman")
    variables = dict(v.split("=", 1) for v in args.var)
    also = {}
    for name in args.also:  # other rows of the same measurement (e.g. the backbone a claim compares with)
        if name not in rows:
            raise SystemExit(f"record: --also {name}: {args.measure} has no such row (rows: {', '.join(rows)})")
        outputs = os.path.join(os.path.dirname(os.path.abspath(args.outputs)), f"{name}.txt") if args.outputs else None
        if outputs and not os.path.exists(outputs):
            raise SystemExit(f"record: --also {name}: no outputs {outputs} (fc-measure --outputs-dir)")
        also[name] = {"metrics": {k: rows[name][k] for k in metric_keys if k in rows[name]},
                      "params": {"total": rows[name].get("params"),
                                 "non_embedding": rows[name].get("non_embedding_params")},
                      "sentences_per_s": rows[name].get("sentences_per_s"),
                      "outputs": os.path.relpath(outputs, work) if outputs else None}
    cost = None
    if args.cost:  # the plugged model's cost row (user_dir/variator/tools/cost.py --json): FLOPs and measured speed
        with open(args.cost) as f:
            measured_cost = json.load(f)
        row_cost = [r for r in measured_cost["rows"] if r["ratio"] != 0][-1]
        cost = {"encoder_flops_saved_percent": row_cost["encoder_flops_saved_percent"],
                "ffn_flops_saved_percent": row_cost["ffn_flops_saved_percent"],
                "extra_params_percent": row_cost["plugin_params_percent"],
                "speedup": row_cost["speedup"]["median"], "length": measured_cost["length"],
                "batch_size": measured_cost["batch_size"]}
    if args.primary_metric and args.primary_metric not in row:
        raise SystemExit(f"record: --primary-metric {args.primary_metric}: the row {args.name!r} of {args.measure} "
                         "has no such score")
    primary_metric = args.primary_metric or ("bleu_tok" if "bleu_tok" in row else None)
    record = {
        "recipe": args.recipe, "name": args.name, "variables": variables, "commands": commands,
        "teacher": {"path": relative(args.teacher), "sha256": sha256_of(args.teacher, teacher=True)},
        "data": {"path": relative(args.data), "fingerprint": data_fingerprint(args.data)},
        "checkpoint": relative(args.checkpoint), "split": args.split,
        "metrics": {k: row[k] for k in metric_keys if k in row}, "primary_metric": primary_metric,
        "params": {"total": row.get("params"), "non_embedding": row.get("non_embedding_params")},
        "sentences": row.get("sentences"), "sentences_per_s": row.get("sentences_per_s"),
        "outputs": os.path.relpath(os.path.abspath(args.outputs), work) if args.outputs else None,
        "references": os.path.abspath(args.references) if args.references else None,
        "also": also, "cost": cost, "training": training,
        "updates": sum((t or {}).get("updates", 0) for t in training.values()),
        "epochs": sum((t or {}).get("epochs", 0) for t in training.values()),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "machine": machine_of_record(measured.get("cpu") or platform.machine(), args.device_flags),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    return record


def score_line(result, work):
    """The score line of a run, from its result (WORK/result.json, or its record in the store); ``work``: its work
    folder as the line names it. Variator (variator.sh): the plugged backbone against the backbone alone, with the
    plugin's cost; every other recipe (common.sh's print_score): the student against the teacher's row filed beside it
    (record: --also teacher), at its share of the teacher's non-embedding parameters, or with its own count where no
    teacher was measured. Translation scores BLEU (tok), GLUE the task's primary metric on dev."""
    task = (result.get("variables") or {}).get("GLUE_TASK")
    if task and not result.get("primary_metric"):
        raise ValueError(f"a {task} result that names no primary metric (filed before results did): no score line")
    metric = result.get("primary_metric") or "bleu_tok"
    student, teacher = result["metrics"][metric], (result.get("also") or {}).get("teacher")
    if result["recipe"] == "variator.sh":
        cost = result["cost"]
        what = f"{task} dev {metric}" if task else "BLEU4"  # BLEU (tok): fairseq-generate's BLEU4
        return (f"score: variator k={result['variables']['K']} {what} {student:.2f} (backbone alone "
                f"{teacher['metrics'][metric]:.2f}), {cost['encoder_flops_saved_percent']:.1f}% of the encoder's FLOPs "
                f"saved with {cost['extra_params_percent']:.2f}% extra parameters -- {work}")
    what = f"{task} dev {metric}" if task else "BLEU (tok)"
    if teacher:
        rate = 100.0 * result["params"]["non_embedding"] / teacher["params"]["non_embedding"]
        against = (f" (teacher {teacher['metrics'][metric]:.2f}) at {rate:.2f}% of the teacher's non-embedding "
                   "parameters")
    else:
        against = f", {result['params']['non_embedding']:,} non-embedding parameters"
    return (f"score: {result['name']} {what} {student:.2f}{against}, {result['sentences']} sentences -- "
            f"{os.path.normpath(os.path.join(work, 'measure.md'))}")


def score_main(argv):
    p = argparse.ArgumentParser(prog="record.py --score", description="The score line of a run's WORK/result.json, "
                                "its work folder named from the current folder.")
    p.add_argument("result", help="WORK/result.json")
    args = p.parse_args(argv)
    with open(args.result) as f:
        result = json.load(f)
    print(score_line(result, os.path.relpath(os.path.dirname(os.path.abspath(args.result)))))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--score"]:
        return score_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="the recipe's work folder")
    p.add_argument("--recipe", required=True, help="the recipe's file name (e.g. pet.sh)")
    p.add_argument("--name", required=True, help="the student's row name in --measure")
    p.add_argument("--stages", nargs="+", required=True, help="the recipe's stages, in order")
    p.add_argument("--train-stages", nargs="*", default=[], help="the stages that ran fairseq-train")
    p.add_argument("--checkpoint", required=True, help="the checkpoint scored")
    p.add_argument("--measure", required=True, help="fc-measure's --json of the scoring stage")
    p.add_argument("--outputs", default=None, help="the student's per-example outputs (fc-measure --outputs-dir)")
    p.add_argument("--references", default=None,
                   help="the references the outputs are scored against (raw text for sacreBLEU), filed beside them")
    p.add_argument("--also", action="append", default=[],
                   help="another row of --measure filed beside the student, its metrics and outputs (repeatable)")
    p.add_argument("--cost", default=None, help="the plugged model's cost (user_dir/variator/tools/cost.py --json)")
    p.add_argument("--primary-metric", default=None,
                   help="the score of the run's score line: GLUE, the task's first metric (glue_metrics.TASK_METRICS); "
                   "default bleu_tok where the row has it")
    p.add_argument("--split", default="test", help="the report split the metrics are measured on")
    p.add_argument("--teacher", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--device-flags", default="")
    p.add_argument("--var", action="append", default=[], help="NAME=VALUE of a recipe variable (repeatable)")
    p.add_argument("--out", default=None, help="default WORK/result.json")
    args = p.parse_args(argv)
    record = build(args)
    out = args.out or os.path.join(args.work, "result.json")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, out)
    metrics = ", ".join(f"{k} {v:.2f}" for k, v in record["metrics"].items())
    print(f"result: {record['name']} {metrics}; {record['updates']} updates, {record['epochs']:g} epochs, "
          f"{record['wall_s'] / 60:.1f} min wall -- {os.path.relpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
