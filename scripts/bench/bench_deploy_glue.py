#!/usr/bin/env python
"""Compressed GLUE encoders outside fairseq (issue 35): the teacher, GhostBERT's pruned-only and GhostBERT models
and the APC-finalized model of one task, each run in fairseq, Hugging Face transformers and ONNX Runtime (fp32 and
int8), with dev score, size on disk and sentences/s at batch 1 and 32; the exports checked against fairseq on
every dev example of each task of ``--parity-tasks``; and GhostBERT's encoder time against pruned-only at every
width m, paired in one run. Written to work/results/deploy_glue.md (``--out``; + .json, + .png).

    python scripts/bench/bench_deploy_glue.py --glue-task MRPC --glue-work work/glue --ghost work/ghost-mrpc ...
    python scripts/bench/bench_deploy_glue.py --glue-task MRPC --out results/deploy_glue   # the committed table

Models (``--glue-work`` may list several folders, comma-separated; a task's teacher is the first
TASK/checkpoints/checkpoint_best.pt found, with its data-bin/TASK.wordpiece, as scripts/recipes/glue_teachers.sh leaves
them):
* teacher: the fine-tuned MiniLM-L6 (scripts/recipes/glue_teachers.sh);
* pruned only and GhostBERT (``--pruned``, ``--ghost``): scripts/recipes/ghostbert.sh's models (VARIANT=pruned and
  ghost) of that teacher, each given as its checkpoint or as the recipe's work folder, whose result.json names it;
* APC-finalized (``--apc``): scripts/recipes/apc.sh's model, the same way.
A missing model stops the run with the recipe command that makes it (on a GPU: DEVICE_FLAGS=--fp16).

Runtimes: fairseq (the checkpoint with ``--user-dir``), transformers (user_dir/deploy/export_hf.py; pruned heads
and per-layer FFN widths zero-padded with ``--zero-pad``, the only form transformers 5 loads; GhostBERT has no
transformers form), ONNX Runtime CPU fp32 and int8 (user_dir/deploy/export_onnx.py, dynamic quantization). Every
runtime reads the same token ids: the exported tokenizer's encoding of the raw dev text (checked equal to
prepare_glue.py's binarised ids on every dev example), fairseq through the vocabulary map. Scores:
user_dir.common.glue_metrics on the predictions of each runtime. Size: the file each runtime loads (fairseq: the
checkpoint's model and configuration without optimizer state). Speed: sentences per second of the model's forward
on already tokenised dev examples in dev order (batch 32: consecutive examples padded to the longest; batch 1: no
padding), ``--threads`` intra-op threads everywhere, the median over ``--runs`` rounds in which every (model,
runtime) runs batch by batch in turn (the order rotating), so all see the same moments of a shared machine.

GhostBERT's cost (the issue's goal: within 10% of pruned-only's encoder time at every m): scripts/bench/bench_ghost_costs.py's
measurement (its docstring says how), on pruned-only and GhostBERT encoders cut from the teacher by ghost_prune at
every ``--widths`` m, with the ONNX Runtime ratio beside it; ``--ghost-costs-only`` reruns this timing alone and
keeps the other sections of the report's JSON (the section then names its own command).

A CPU benchmark by design (no ``--device``): ONNX Runtime's CPU provider and its int8 weights are what it
compares; the models it reads may be trained anywhere.
"""
import argparse
import json
import os
import statistics
import sys

from benchlib import (ROOT, default_out, logger, plot_panels, provenance, provenance_text, rel, sha256_of,
                      write_report)
from bench_ghost_costs import add_timing_arguments, forms_text, ghost_costs, costs_table, timed_rounds
from glue_bench import REPORT_SUBSET, first_glue_setup

log = logger("bench_deploy_glue")
RUNTIMES = ("fairseq", "transformers", "onnx fp32", "onnx int8")


# ---- the models --------------------------------------------------------------------------------------------
def task_setup(args, task):
    """glue_bench.glue_setup of ``task`` from the first ``--glue-work`` folder that holds its teacher."""
    return first_glue_setup(args.glue_work, task)


def main_task_setup(args):
    """:func:`task_setup` of ``--glue-task``, or a stop naming the teacher looked for and the recipe that makes it."""
    setup = task_setup(args, args.glue_task)
    if setup is None:
        looked = os.path.join(args.glue_work.split(",")[0], args.glue_task, "checkpoints", "checkpoint_best.pt")
        sys.exit(f"bench_deploy_glue: no {args.glue_task} teacher in --glue-work {args.glue_work} (looked for "
                 f"{looked}); make it with TASKS={args.glue_task} bash scripts/recipes/glue_teachers.sh")
    return setup


RECIPES = {"pruned only": "VARIANT=pruned bash scripts/recipes/ghostbert.sh",
           "GhostBERT": "bash scripts/recipes/ghostbert.sh",
           "APC-finalized": "bash scripts/recipes/apc.sh"}


def recipe_checkpoint(name, path, setup, task):
    """The checkpoint of ``path``: itself if a file, else the one its recipe's record names (a recipe's work folder:
    WORK/result.json, scripts/experiments/record.py), checked to be made from this task's teacher."""
    if os.path.isfile(path):
        return path
    record = os.path.join(path, "result.json")
    if not os.path.isfile(record):
        flag = {"pruned only": "--pruned", "GhostBERT": "--ghost", "APC-finalized": "--apc"}[name]
        sys.exit(f"bench_deploy_glue: {flag} {path}: no checkpoint and no recipe record (result.json); make it with "
                 f"TEACHER={rel(setup['teacher'])} DATA={rel(setup['data'])} GLUE_TASK={task} {RECIPES[name]} {path}")
    with open(record) as f:
        made = json.load(f)
    teacher = made.get("teacher", {}).get("sha256")
    if teacher and teacher != sha256_of(setup["teacher"]):
        sys.exit(f"bench_deploy_glue: {record} was made from another teacher than {rel(setup['teacher'])}")
    checkpoint = made["checkpoint"]
    return checkpoint if os.path.isabs(checkpoint) else os.path.join(ROOT, checkpoint)


def bench_models(args, setup, task):
    """{name: checkpoint} of the four models of the main table: the teacher and the recipes' models of
    ``--pruned``, ``--ghost`` and ``--apc``."""
    models = {"teacher": setup["teacher"]}
    for name, path in (("pruned only", args.pruned), ("GhostBERT", args.ghost), ("APC-finalized", args.apc)):
        models[name] = recipe_checkpoint(name, path, setup, task)
    return models


def training_of(path):
    """How a checkpoint was trained, read beside it: its updates; scripts/recipes/glue_teachers.sh's command.txt of its run
    folder; or the chain of benchmark stages that made it (benchlib's settings.json: each stage's tool and
    --max-update, followed back through --finetune-from-model / --path / the checkpoint a finalize stage read)."""
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401  (the plug-in's checkpoint-loading allow-list)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    out = {"updates": (state.get("optimizer_history") or [{}])[-1].get("num_updates")}
    run_dir = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    if os.path.isfile(os.path.join(run_dir, "command.txt")):
        with open(os.path.join(run_dir, "command.txt")) as f:
            out["command"] = f.read().strip()
    chain, current = [], os.path.realpath(path)
    for _ in range(8):
        stage = os.path.dirname(current)
        stage = os.path.dirname(stage) if os.path.basename(stage) == "checkpoints" else stage
        if not os.path.isfile(os.path.join(stage, "settings.json")) and os.path.isfile(
                os.path.join(stage + "-finalize", "settings.json")):
            stage += "-finalize"
        if not os.path.isfile(os.path.join(stage, "settings.json")):
            break
        with open(os.path.join(stage, "settings.json")) as f:
            cmd = json.load(f)[-1]
        tool = cmd[1] if cmd[0] == "-m" else os.path.basename(cmd[0])
        updates = cmd[cmd.index("--max-update") + 1] if "--max-update" in cmd else None
        name = "fairseq-train" if tool == "fairseq_cli.train" else tool.split(".")[-1]
        chain.append(name + (f" {updates} updates" if updates else ""))
        source = next((cmd[i + 1] for i, a in enumerate(cmd) if a in ("--finetune-from-model", "--path")), None)
        if source is None and tool.endswith(("apc_finalize", "apc.tools.finalize")):
            source = cmd[2]
        if source is None or not os.path.exists(source):
            break
        current = os.path.realpath(source)
    if chain:
        out["stages"] = list(reversed(chain))
    return out


# ---- exports and the token ids every runtime reads ------------------------------------------------------------
def export_model(name, path, data, folder):
    """{"hf": dir or None, "hf_refused": reason, "onnx": dir} of one model (user_dir/tools/export_*.py); an
    earlier run's exports of the same checkpoint file (path, size and modification time) are reused."""
    from user_dir.deploy.export_hf import ExportHFError, export_hf
    from user_dir.deploy.export_onnx import export_onnx

    stamp = {"checkpoint": os.path.abspath(path), "size": os.path.getsize(path), "mtime": os.path.getmtime(path),
             "data": os.path.abspath(data)}
    done = os.path.join(folder, "exported.json")
    if os.path.isfile(done):
        with open(done) as f:
            previous = json.load(f)
        if previous["stamp"] == stamp:
            log(f"{name}: exports of this checkpoint already in {folder}")
            return previous["exports"]
    out = {"onnx": os.path.join(folder, "onnx"), "hf": os.path.join(folder, "hf"), "hf_refused": None}
    log(f"{name}: ONNX export")
    # int8's loss is this benchmark's measurement (every dev example, below), not a reason to stop it
    out["onnx_summary"] = export_onnx(path, out["onnx"], data=data, int8_warn_only=True)
    log(f"{name}: transformers export")
    try:
        out["hf_summary"] = export_hf(path, out["hf"], data=data)
    except ExportHFError as plain:
        try:
            out["hf_summary"] = export_hf(path, out["hf"], data=data, zero_pad=True)
            out["hf_padded_because"] = str(plain).split(": ", 1)[1].split(". --zero-pad")[0]
        except ExportHFError as refused:
            out["hf"], out["hf_refused"] = None, str(refused)
    with open(done, "w") as f:
        json.dump({"stamp": stamp, "exports": out}, f, indent=1)
    return out


def dev_inputs(data, tokenizer_dir, task):
    """The dev set as the exported tokenizer encodes its raw text (one dict per example), its gold labels, and the
    count of examples whose ids differ from prepare_glue.py's binarised ones (must be 0)."""
    import torch
    import transformers
    from fairseq.data import Dictionary, data_utils

    from user_dir.deploy.export_hf import prepared_settings, read_vocab, vocabulary_map, wordpiece

    columns = [c for c in range(2) if os.path.isfile(os.path.join(data, "text", f"{REPORT_SUBSET}.raw.input{c}"))]
    texts = [open(os.path.join(data, "text", f"{REPORT_SUBSET}.raw.input{c}"), encoding="utf-8").read().splitlines()
             for c in columns]
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    encoded = tok(*texts, truncation=True)
    examples = [{k: encoded[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")}
                for i in range(len(texts[0]))]
    settings = prepared_settings(data)
    dictionary = Dictionary.load(os.path.join(data, "input0", "dict.txt"))
    dictionary.add_symbol("<mask>")  # as sentence_prediction adds it
    to_fairseq = vocabulary_map(dictionary, read_vocab(settings), wordpiece(settings).fairseq_specials)
    binarised = [data_utils.load_indexed_dataset(os.path.join(data, f"input{c}", REPORT_SUBSET), dictionary) for c in columns]
    differ = sum(to_fairseq[torch.tensor(e["input_ids"])].tolist() != [dictionary.bos()] + sum(
        (b[i].tolist() for b in binarised), []) for i, e in enumerate(examples))
    regression = not os.path.isfile(os.path.join(data, "text", f"{REPORT_SUBSET}.label.id"))
    label_file = os.path.join(data, "label", f"{REPORT_SUBSET}.label") if regression else \
        os.path.join(data, "text", f"{REPORT_SUBSET}.label.id")
    labels = [float(x) if regression else int(x) for x in open(label_file).read().split()]
    return examples, labels, differ, to_fairseq, tok.pad_token_id


def batches(examples, size, pad_id):
    """Consecutive examples padded to the longest of each batch, as int64 tensors (BERT's ids)."""
    import torch

    out = []
    for i in range(0, len(examples), size):
        chunk = examples[i: i + size]
        width = max(len(e["input_ids"]) for e in chunk)
        batch = {k: torch.full((len(chunk), width), pad_id if k == "input_ids" else 0, dtype=torch.long)
                 for k in ("input_ids", "token_type_ids", "attention_mask")}
        for j, e in enumerate(chunk):
            for k in batch:
                batch[k][j, : len(e[k])] = torch.tensor(e[k])
        out.append(batch)
    return out


class Runners:
    """One forward function per runtime of a model (BERT-id batches in, logits out)."""

    def __init__(self, path, data, exports, to_fairseq, threads):
        import torch
        import transformers

        from user_dir.deploy.export_hf import load_classifier
        from user_dir.deploy.export_onnx import session

        self.fairseq, _, task, _ = load_classifier(path, data)
        self.to_fairseq, self.pad = to_fairseq, task.source_dictionary.pad()
        self.hf = None if not exports["hf"] else \
            transformers.AutoModelForSequenceClassification.from_pretrained(exports["hf"]).eval()
        self.onnx = {kind: session(os.path.join(exports["onnx"], f), threads)
                     for kind, f in (("onnx fp32", "model.onnx"), ("onnx int8", "model.int8.onnx"))}
        self.torch = torch

    def available(self):
        return [r for r in RUNTIMES if r != "transformers" or self.hf is not None]

    def fairseq_src(self, batch):
        return self.to_fairseq[batch["input_ids"]].masked_fill(batch["attention_mask"].eq(0), self.pad)

    def __call__(self, runtime, batch, src=None):
        from user_dir.deploy.export_onnx import run_session

        with self.torch.no_grad():
            if runtime == "fairseq":
                return self.fairseq(self.fairseq_src(batch) if src is None else src, features_only=True,
                                    classification_head_name="sentence_classification_head")[0]
            if runtime == "transformers":
                return self.hf(**batch).logits
        return run_session(self.onnx[runtime], batch["input_ids"], batch["attention_mask"])


def scores_and_parity(runners, dev_batches, labels, task):
    """Dev score of every runtime, and each runtime's largest logit difference to fairseq and prediction agreement."""
    import torch

    from user_dir.common.glue_metrics import glue_score

    logits = {r: torch.cat([runners(r, b) for b in dev_batches]).float() for r in runners.available()}
    regression = logits["fairseq"].size(-1) == 1
    out = {}
    for r, lg in logits.items():
        preds = lg.view(-1).tolist() if regression else lg.argmax(-1).tolist()
        ref = logits["fairseq"]
        out[r] = {"score": glue_score(task, preds, labels),
                  "max_abs_diff": (lg - ref).abs().max().item(),
                  "agreement": 1.0 if regression else (lg.argmax(-1) == ref.argmax(-1)).float().mean().item()}
    return out


def sizes(name, path, runners, exports, work):
    """Bytes on disk of what each runtime loads (fairseq: the loaded model's state dict, its tied embeddings
    stored once as fairseq saves them, and the configuration; no optimizer state)."""
    import torch

    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    stripped = os.path.join(work, "sizes", name.replace(" ", "_") + ".pt")
    os.makedirs(os.path.dirname(stripped), exist_ok=True)
    torch.save({"cfg": state["cfg"], "model": runners.fairseq.state_dict()}, stripped)
    out = {"fairseq": os.path.getsize(stripped),
           "onnx fp32": os.path.getsize(os.path.join(exports["onnx"], "model.onnx")),
           "onnx int8": os.path.getsize(os.path.join(exports["onnx"], "model.int8.onnx"))}
    if exports["hf"]:
        out["transformers"] = os.path.getsize(os.path.join(exports["hf"], "model.safetensors"))
    os.remove(stripped)
    return out


def parameters(runners):
    from user_dir.common.counting import count_parameters

    out = {"fairseq": count_parameters(runners.fairseq).total}
    if runners.hf is not None:
        out["transformers"] = sum(p.numel() for p in runners.hf.parameters())
    return out


# ---- the run ------------------------------------------------------------------------------------------------
def measure_deployments(args):
    import torch

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    result = {"provenance": provenance("bench_deploy_glue.py", args.argv, args.threads, []),
              "load_start": list(load_start), "task": args.glue_task}
    setup = main_task_setup(args)
    models = bench_models(args, setup, args.glue_task)
    result["models"] = {k: rel(v) for k, v in models.items()}
    result["training"] = {k: training_of(v) for k, v in models.items()}
    rows = []
    runners, dev = {}, None
    for name, path in models.items():
        exports = export_model(name, path, setup["data"], os.path.join(args.work, "exports", args.glue_task,
                                                                      name.replace(" ", "_")))
        if dev is None:
            examples, labels, differ, to_fairseq, pad_id = dev_inputs(setup["data"], exports["onnx"], args.glue_task)
            examples = examples[: args.examples] if args.examples else examples
            labels = labels[: len(examples)]
            dev = {"examples": examples, "labels": labels, "differ": differ, "b32": batches(examples, 32, pad_id),
                   "b1": batches(examples[: args.single_examples], 1, pad_id)}
            result["dev_examples"], result["ids_differ"] = len(examples), differ
        runners[name] = Runners(path, setup["data"], exports, to_fairseq, args.threads)
        log(f"{name}: dev scores in every runtime")
        row = {"name": name, "checkpoint": rel(path), "hf_refused": exports["hf_refused"],
               "hf_padded_because": exports.get("hf_padded_because"),
               "runtimes": scores_and_parity(runners[name], dev["b32"], dev["labels"], args.glue_task),
               "bytes": sizes(name, path, runners[name], exports, args.work), "params": parameters(runners[name]),
               "int8_export": exports["onnx_summary"].get("int8")}
        rows.append(row)
    log("speed: every (model, runtime) in turn, rotating, per round")
    speed = {}
    for label, key, n in (("batch 32", "b32", args.speed_batches), ("batch 1", "b1", None)):
        chosen = dev[key][:n] if n else dev[key]
        configs = {}
        for name, r in runners.items():
            srcs = [r.fairseq_src(b) for b in chosen]  # the fairseq ids, mapped before timing
            for runtime in r.available():
                configs[(name, runtime)] = (lambda i, r=r, rt=runtime, srcs=srcs:
                                            r(rt, chosen[i], srcs[i]) if rt == "fairseq" else r(rt, chosen[i]))
        for fn in configs.values():
            fn(0)  # warm-up
        times = timed_rounds(configs, range(len(chosen)), args.runs, log_every=1)
        sentences = sum(b["input_ids"].size(0) for b in chosen)
        speed[label] = {f"{n}|{rt}": sentences / statistics.median(t) for (n, rt), t in times.items()}
        speed[label + " sentences"] = sentences
    result["rows"], result["speed"] = rows, speed
    if args.parity_tasks:
        result["parity"] = parity(args)
    log("GhostBERT against pruned only at every m")
    result["ghost_costs"] = ghost_costs(args, setup, os.path.join(args.work, "ghost_costs"))
    result["load_end"] = list(os.getloadavg())
    return result


def measure_ghost_costs(args, json_path):
    """``--ghost-costs-only``: the GhostBERT-vs-pruned timing alone, every other section kept from ``json_path``."""
    import torch

    if not os.path.isfile(json_path):
        sys.exit(f"bench_deploy_glue: --ghost-costs-only keeps the other sections of {rel(json_path)}, which does not "
                 "exist (run without --ghost-costs-only first, or give --out)")
    with open(json_path) as f:
        result = json.load(f)
    torch.set_num_threads(args.threads)
    setup = main_task_setup(args)
    start = os.getloadavg()
    result["ghost_costs"] = ghost_costs(args, setup, os.path.join(args.work, "ghost_costs"))
    result["ghost_costs_provenance"] = provenance("bench_deploy_glue.py", args.argv, args.threads, [])
    result["ghost_costs_load"] = [list(start), list(os.getloadavg())]
    return result


def parity(args):
    """Each parity task's teacher exported and checked on every dev example: ids, logits, predictions."""
    out = {}
    for task in args.parity_tasks.split(","):
        setup = task_setup(args, task)
        if setup is None:
            out[task] = {"missing": f"no teacher in --glue-work {args.glue_work}"}
            continue
        log(f"parity on {task}'s dev set")
        exports = export_model(f"{task} teacher", setup["teacher"], setup["data"],
                               os.path.join(args.work, "exports", task, "teacher"))
        examples, labels, differ, to_fairseq, pad_id = dev_inputs(setup["data"], exports["onnx"], task)
        runners = Runners(setup["teacher"], setup["data"], exports, to_fairseq, args.threads)
        out[task] = {"examples": len(examples), "ids_differ": differ, "teacher": rel(setup["teacher"]),
                     "training": training_of(setup["teacher"]),
                     "runtimes": scores_and_parity(runners, batches(examples, 32, pad_id), labels, task)}
    return out


# ---- the report -----------------------------------------------------------------------------------------------
def metric_text(score):
    """'f1 87.50 / acc 82.35' (glue_metrics' percentages)."""
    keys = [k for k in ("f1", "accuracy", "mcc", "pearson", "spearman") if k in score]
    return " / ".join(f"{'acc' if k == 'accuracy' else k} {score[k]:.2f}" for k in keys)


def training_text(t):
    text = f"{t['updates']} updates" if t.get("updates") is not None else "updates unknown"
    if t.get("command"):
        text += f", trained by `{t['command']}`" if t["command"].startswith(("bash ", "EPOCHS", "TASKS", "CPU_")) \
            else f"; its run's note: {t['command']}"
    if t.get("stages"):
        text += "; stages: " + " -> ".join(t["stages"])
    return text


def deploy_report(result):
    p = result["provenance"]
    lines = [f"# Compressed GLUE encoders deployed: fairseq, transformers, ONNX Runtime ({result['task']})", "",
             provenance_text(p), "",
             f"Load average (1, 5, 15 min) at the start {', '.join(f'{x:.2f}' for x in result['load_start'])}, at "
             f"the end {', '.join(f'{x:.2f}' for x in result['load_end'])}: a machine shared with other jobs; every "
             f"runtime uses {p['threads']} intra-op thread(s) (torch.set_num_threads, ONNX Runtime "
             "intra_op_num_threads; inter-op 1).", "",
             "Models: " + "; ".join(f"{k}: `{v}` ({training_text(result['training'][k])})"
                                    for k, v in result["models"].items()) + ".", "",
             f"Dev set: {result['dev_examples']} examples, tokenised from the raw text by the exported tokenizer "
             f"(ids equal to prepare_glue.py's binarised ones on {result['dev_examples'] - result['ids_differ']} of "
             f"{result['dev_examples']}). Scores by user_dir.common.glue_metrics on each runtime's own predictions; "
             "max |diff|: the largest logit difference to fairseq over the dev set; agree: predictions equal to "
             "fairseq's. Size: the file the runtime loads (fairseq: model and configuration, no optimizer state; "
             "transformers: model.safetensors; ONNX: model.onnx / model.int8.onnx).", ""]
    b32, b1 = result["speed"]["batch 32"], result["speed"]["batch 1"]
    lines += [f"Speed: sentences/s of the forward on tokenised dev examples in dev order; batch 32: "
              f"{result['speed']['batch 32 sentences']} sentences in padded batches of 32; batch 1: "
              f"{result['speed']['batch 1 sentences']} sentences one at a time; the median over rounds, in each of which "
              "every (model, runtime) runs batch by batch in turn.", "",
              "| model | runtime | dev | max abs diff | agree | size (MB) | params | sent/s batch 1 | sent/s batch 32 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        for runtime in RUNTIMES:
            if runtime not in row["runtimes"]:
                reason = row["hf_refused"] or "not exported"
                lines.append(f"| {row['name']} | {runtime} | refused: {reason.split(';')[0]} | | | | | | |")
                continue
            r = row["runtimes"][runtime]
            size = row["bytes"].get(runtime)
            params = row["params"].get(runtime, row["params"]["fairseq"] if runtime.startswith("onnx") else None)
            key = f"{row['name']}|{runtime}"
            diff = "" if runtime == "fairseq" else f"{r['max_abs_diff']:.1e}"
            lines.append(f"| {row['name']} | {runtime} | {metric_text(r['score'])} | {diff} | "
                         f"{100 * r['agreement']:.1f}% | {size / 2**20:.1f} | "
                         f"{'' if params is None else f'{params:,}'} | {b1[key]:.1f} | {b32[key]:.1f} |")
    lines.append("")
    for row in result["rows"]:
        if row.get("hf_padded_because"):
            lines.append(f"- {row['name']}, transformers: zero-padded (`--zero-pad`) because of {row['hf_padded_because']}; "
                         "the same function at the padded size.")
        if row["hf_refused"]:
            lines.append(f"- {row['name']}, transformers: refused: {row['hf_refused']}")
    lines.append("")
    if result.get("parity"):
        lines += ["## Every dev example through the exports (the teachers)", "",
                  "Teachers: " + "; ".join(f"{task}: `{p_['teacher']}` ({training_text(p_['training'])})"
                                           for task, p_ in result["parity"].items() if "teacher" in p_) + ".", "",
                  "| task | examples | ids equal to prepare_glue | runtime | max abs diff | predictions equal | dev |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for task, p_ in result["parity"].items():
            if "missing" in p_:
                lines.append(f"| {task} | {p_['missing']} | | | | | |")
                continue
            for runtime, r in p_["runtimes"].items():
                lines.append(f"| {task} | {p_['examples']} | {p_['examples'] - p_['ids_differ']} | {runtime} | "
                             f"{r['max_abs_diff']:.1e} | {100 * r['agreement']:.2f}% | {metric_text(r['score'])} |")
        lines.append("")
    costs = result["ghost_costs"]
    if isinstance(costs, list):  # a JSON written before bench_ghost_costs.py: its rows at 16 x 128, on the CPU
        costs = {"rows": costs, "time_batch": 16, "onnx": any("onnx: ghost" in r for r in costs)}
    lines += ["## GhostBERT's ghost modules against pruned only (encoder time, paired)", ""]
    if result.get("ghost_costs_provenance"):  # measured by a later --ghost-costs-only run
        lines += ["This section: " + provenance_text(result["ghost_costs_provenance"])
                  + f" Load average (1, 5, 15 min) at its start "
                  f"{', '.join(f'{x:.2f}' for x in result['ghost_costs_load'][0])}, at its end "
                  f"{', '.join(f'{x:.2f}' for x in result['ghost_costs_load'][1])}.", ""]
    lines += ["Encoders cut from the teacher by ghost_prune at each m (scripts/bench/bench_ghost_costs.py's measurement; "
              "its --device cuda run on a GPU: results/ghost_costs_gpu.md). " + forms_text(costs)
              + (" ONNX Runtime: the pruned-only and GhostBERT classifiers exported by fc-export-onnx (the ghost "
                 "module in its traced out-of-place form, ghost_module.shifted_ghost_graph)." if costs.get("onnx")
                 else ""), "", *costs_table(costs), ""]
    return "\n".join(lines)


def plot_deploy(result, png, plt=None):
    """The dev score against sentences/s at batch 32, one line per model through its runtimes."""
    metric = next(k for k in ("f1", "accuracy", "mcc", "pearson") if k in result["rows"][0]["runtimes"]["fairseq"]
                  ["score"])
    lines = []
    for row in result["rows"]:
        points = sorted((result["speed"]["batch 32"][f"{row['name']}|{runtime}"], r["score"][metric], runtime)
                        for runtime, r in row["runtimes"].items())
        lines.append(dict(x=[p[0] for p in points], y=[p[1] for p in points], style="o-", label=row["name"],
                          notes=[p[2] for p in points], note_style=dict(fontsize=7),
                          note_offset=[(3, 4 if i % 2 else -10) for i in range(len(points))]))
    return plot_panels(png, [dict(
        series=lines, xscale="log", ylabel=f"{result['task']} dev {metric}", grid=True, legend=dict(fontsize=8),
        xlabel=f"sentences/s at batch 32 ({result['provenance']['threads']} thread, log scale)")],
        command=result["provenance"]["command"], figsize=(7.5, 4.8), plt=plt)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--glue-task", default="MRPC", help="the task of the main table (default MRPC)")
    p.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                   help="scripts/recipes/glue_teachers.sh's work folder(s), comma-separated; a task's teacher is the first "
                        "TASK/checkpoints/checkpoint_best.pt found (default work/glue)")
    p.add_argument("--pruned", default=os.path.join(ROOT, "work", "deploy-glue", "pruned"),
                   help="the pruned-only model: a checkpoint, or the work folder of VARIANT=pruned "
                        "scripts/recipes/ghostbert.sh (its result.json names it; default work/deploy-glue/pruned)")
    p.add_argument("--ghost", default=os.path.join(ROOT, "work", "deploy-glue", "ghost"),
                   help="the GhostBERT model: a checkpoint or scripts/recipes/ghostbert.sh's work folder "
                        "(default work/deploy-glue/ghost)")
    p.add_argument("--apc", default=os.path.join(ROOT, "work", "deploy-glue", "apc"),
                   help="the APC-finalized model: a checkpoint or scripts/recipes/apc.sh's work folder "
                        "(default work/deploy-glue/apc)")
    p.add_argument("--parity-tasks", default="SST-2,MRPC,RTE",
                   help="tasks whose teachers are checked on every dev example ('' for none; default SST-2,MRPC,RTE)")
    add_timing_arguments(p)  # --widths --prune-batches --onnx-ratios --threads --runs --repeats --time-batch
    p.add_argument("--examples", type=int, default=0, help="dev examples of the main table (default 0: all)")
    p.add_argument("--speed-batches", type=int, default=4, help="batches of 32 timed per round (default 4)")
    p.add_argument("--single-examples", type=int, default=32, help="examples timed at batch 1 per round (default 32)")
    p.add_argument("--work", default=os.path.join(ROOT, "work", "deploy-glue"), help="exports and scratch files")
    p.add_argument("--out", default=None, help="the report's path without extension (default "
                                               "work/results/deploy_glue; results/deploy_glue for the committed one)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from OUT.json")
    p.add_argument("--ghost-costs-only", action="store_true",
                   help="measure only the GhostBERT-vs-pruned timing and keep every other section of OUT.json (the "
                        "section then names its own command, machine and load)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    out = args.out or default_out("deploy_glue")
    out = out[:-3] if out.endswith(".md") else out
    if args.report_only:
        with open(out + ".json") as f:
            result = json.load(f)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        result = measure_ghost_costs(args, out + ".json") if args.ghost_costs_only else measure_deployments(args)
    written = write_report(out + ".md", deploy_report(result), out + ".json", result,
                           lambda plt, png: plot_deploy(result, png, plt), out + ".png")
    log(f"wrote {', '.join(written)}")


if __name__ == "__main__":
    main()
