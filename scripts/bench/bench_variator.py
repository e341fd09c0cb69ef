#!/usr/bin/env python
"""The Variator benchmark: plugins of ratio k in {2, 4, 8, 16} on the FFNs of frozen models, trained
with stock ``fairseq-train --user-dir user_dir`` and measured against the model without plugins.

    python scripts/bench/bench_variator.py                       # translation + GLUE -> work/results/variator.md
    python scripts/bench/bench_variator.py --parts translation   # only the Multi30k teacher (GLUE rows kept)
    python scripts/bench/bench_variator.py --parts glue --tasks RTE --glue-sweep RTE   # only RTE's rows, k 2-16
    python scripts/bench/bench_variator.py --parts               # rewrite the table and plot from the JSON
    python scripts/bench/bench_variator.py --quick               # every stage in minutes (a smoke test)

The seed runs of the committed table (each seed trains in --work/seed<k>/, resumable):

    python scripts/bench/bench_variator.py --parts translation --cost-runs 9 --seeds 1,2,3 --out results/variator.md
    python scripts/bench/bench_variator.py --parts glue --cost-runs 9 --seeds 1,2,3 --out results/variator.md

On a GPU: ``--device cuda --fp16 --jobs 4`` (benchlib.add_device_args; default the CPU in float32) trains and
decodes there, four plugins at once; the encoder timings (encoder_cost, on the CPU) wait until none trains and
run alone.

The table (``--out``) is written from the JSON beside it (same name, .json) alone. A run measures the
parts it is given and keeps every other part of that JSON (``--fresh``: only this run's parts); each
part records the command, machine and date that measured it, and the table names them per part.

Translation: the reference Multi30k DE->EN teacher (shipped in checkpoints/; ``--teacher``). Its plugins are trained by
hidden-state distillation on the training side of Multi30k (the teacher is both the pre-trained
and the downstream model here, so the paper's two steps are one), then BLEU on test_2016_flickr
(beam 5) with ``fairseq-generate --task variator_translation --variator-plugins ... --variator-ratio k``.
Also Table 2's ablations at k=4 (mean-pooling compression, copy decompression) and Att-KV.

GLUE: the MiniLM-L6 teachers of ``scripts/recipes/glue_teachers.sh`` (SST-2, MRPC, RTE; ``--glue-work``). Plugin
pre-training on the *pre-trained* encoder (the imported MiniLM) over unlabelled sentences (SST-2's training
sentences), then task adaptation on each fine-tuned teacher, initialised from the pre-trained plugin; dev
scores with ``user_dir.tools.glue_predict --variator-plugins``.

Selection, the same for every plugin: each training is validated ``--validations`` (translation) or
``--glue-validations`` (GLUE adaptation) times at the same update points; the primary score is the last
checkpoint's (``--glue-select last``, the default; ``best`` makes the best-of-N checkpoint primary), the
best-of-N beside it. Seeds (``--seeds 1,2,3``): every plugin (pre-training too) per seed in
``--work``/seed<k>/; tables give the mean, spread and every seed, and each plugin is compared with the teacher
without plugins (Table 2's ablations with k=4) by a paired test over seeds and test sentences / dev examples
(hypotheses kept as ``hypotheses.txt``, dev predictions as ``dev_*.predictions.json``). Every GLUE row names its teacher (run folder, lr, dev score,
read from the checkpoint), and the table says when it is not the teacher results/glue.md reports now.

Cost: ``user_dir.variator.tools.cost`` -- analytic and profiler-counted FLOPs and two timings, named apart in
every table: the encoder alone on fixed-length blocks (16 x 128 tokens), and (translation) end-to-end beam
search over the test set. Each plugin is timed against the backbone alternately; a speed-up is the median
[min-max] of per-run ratios, flagged as noise when above its FLOP bound.

Where plugins train: ``work/bench-variator/<table name>/`` (``--work``), so each table keeps its own; every
stage folder records the commands that made it (``settings.json``) and a run with other settings stops
instead of reusing or overwriting it. GLUE adaptation folders are named after the teacher (run and SHA-256):
a retrained teacher gets new plugins. A plugin is reused only on the backbone it was trained on (its
``backbone.txt`` holds the checkpoint's SHA-256). Finished stages (a DONE file) are never redone;
``--force-cost`` re-measures speed.

Choices (ours, stated in results/variator.md): bottleneck r = 16 (the paper's r = 64 is 2.1% of
these small backbones' parameters; r = 16 keeps the plugins under 1%), Adam lr 1e-3 (the paper's
pre-training lr) with inverse-sqrt decay, lambda = 0 (distillation only, paper Appendix B).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

from benchlib import (ROOT, SHARED, add_device_args, add_seed_arguments, add_teacher_arguments, bleu_comparison,
                      check_device, default_out, Device, difference, fairseq_train_seconds, fc_flags, fmt,
                      glue_comparison, hypotheses_from_generate, load_parts, logger, minutes_text, multi30k_data_bin,
                      multi30k_references, num, over_seeds, plot_panels, protocol_text, rel, run, run_jobs, seed_dir,
                      seeds_of, seeds_text, selection_flags, sha256_of, shared_path, significance_lines, stage,
                      validation_plan, validation_updates, write_json, write_text)
from benchlib import machine as machine_text
from glue_bench import chosen_on, glue_scores, predictions_path, read_labels, selection_record, teacher_record

# the reference teacher's architecture (its README)
TRANSLATION_ARCH = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "3",
                    "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                    "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                    "--decoder-attention-heads", "4", "--share-all-embeddings"]
OPTIM = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
         "--warmup-updates", "50", "--warmup-init-lr", "1e-7", "--criterion", "variator_distill",
         "--log-format", "simple", "--log-interval", "25", "--no-epoch-checkpoints", "--num-workers", "0"]
LR_TEXT = "Adam, lr 1e-3, inverse_sqrt with a 50-update warm-up, the same for every plugin"
GLUE_TASKS = {"SST-2": ("accuracy", 32), "MRPC": ("f1", 16), "RTE": ("accuracy", 16)}
ABLATIONS = {"k4-mean": "w/o Com (mean pooling)", "k4-copy": "w/o DeCom (copy)",
             "k4-att-kv": "Att-KV (keys/values merged, FFN untouched)"}  # Table 2 and section 4.7, at k=4
PAPER = ("Paper (T5-base, k=4 on FFNs, Table 1): 0.9% extra parameters, 53% of FLOPs saved, average drop < 2 "
         "points; SST-2 94.3 -> 93.6, MRPC F1 92.6 -> 93.8, RTE 82.9 -> 81.1. Table 2 (SST-2): w/o Com 92.3, "
         "w/o DeCom 86.1 vs 93.6.")


log = logger("bench_variator")
backbone_digest = sha256_of  # what a plugin is trained on: its backbone checkpoint's SHA-256


def check_backbone(directory, backbone):
    """A plugin (finished or resumable) is reused only on the backbone it was trained on: plugins distil
    that backbone's hidden states, and on another one they would be silently wrong. ``backbone.txt``
    holds the digest and, for a reader, the path it was trained on."""
    path, digest = os.path.join(directory, "backbone.txt"), backbone_digest(backbone)
    recorded = open(path).read().split() if os.path.exists(path) else None
    if recorded is None and os.path.exists(os.path.join(directory, "DONE")):
        recorded = ["(not recorded)", "a backbone it did not record"]
    if recorded is not None and recorded[0] != digest:
        sys.exit(f"bench_variator: the plugin in {directory} was trained on {' '.join(recorded[1:])} "
                 f"(sha256 {recorded[0][:12]}), but its backbone is now {os.path.realpath(backbone)} "
                 f"(sha256 {digest[:12]}); delete {directory} to train it again on the new backbone")
    if recorded is None:
        os.makedirs(directory, exist_ok=True)
        open(path, "w").write(f"{digest} {os.path.realpath(backbone)}\n")


def train_plugin(directory, data, task_flags, backbone, k, updates, extra, threads, seed, plan, best_metric=None,
                 maximize=False, device=None):
    """fairseq-train a plugin of ratio k on ``backbone`` with seed ``seed``, validated at ``plan``'s points
    (benchlib.validation_plan); export the last checkpoint as ``directory/plugin_last.pt`` and, with two or
    more validations, the best of them (by ``best_metric``, default the validation loss: the distillation MSE)
    as ``plugin_best.pt``; on ``device`` (benchlib.Device's argument, default the CPU). Returns {"last", "best"
    (absent without it), "train_seconds", "validations"}."""
    py = sys.executable
    train = [*Device(device).train(), data, "--user-dir", "user_dir", *task_flags,
             "--variator-backbone", backbone, "--variator-ratio", k, *extra, *OPTIM, *Device(device).train_flags(),
             "--seed", seed,
             *selection_flags(plan, 0, int(updates), best_metric, maximize),
             "--max-update", updates, "--save-dir", os.path.join(directory, "checkpoints")]
    exports = [("checkpoint_last.pt", "plugin_last.pt")] + ([("checkpoint_best.pt", "plugin_best.pt")]
                                                            if len(plan[1]) > 1 else [])
    export = [[py, "-m", "user_dir.variator.tools.plugins", "export", os.path.join(directory, "checkpoints", ckpt),
               "--out", os.path.join(directory, name)] for ckpt, name in exports]
    check_backbone(directory, backbone)
    stage(directory, [train, *export], threads)
    result = {which: os.path.join(directory, name) for which, (_, name) in zip(("last", "best"), exports)}
    return dict(result, train_seconds=fairseq_train_seconds(os.path.join(directory, "log.txt")),
                validations=validation_updates(os.path.join(directory, "log.txt")))


def bleu_of(directory, data, teacher, plugin, k, threads, device=None):
    """BLEU4 of fairseq-generate (beam 5) on test, the teacher with plugin ``plugin`` of ratio k, and its
    detokenised hypotheses (``directory/hypotheses.txt``, in test-set order)."""
    out = os.path.join(directory, "generate.txt")
    if not os.path.exists(out):
        cmd = [sys.executable, "-m", "fairseq_cli.generate", data, "--user-dir", "user_dir",
               "--task", "variator_translation", "--path", teacher, "--variator-ratio", str(k),
               "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", *Device(device).fairseq()]
        if plugin:
            cmd += ["--variator-plugins", plugin]
        os.makedirs(directory, exist_ok=True)
        run(cmd, out + ".tmp", threads)
        os.replace(out + ".tmp", out)
    hyps = os.path.join(directory, "hypotheses.txt")
    if not os.path.exists(hyps):
        hypotheses_from_generate(out, hyps)
    match = re.search(r"BLEU4 = ([0-9.]+)", open(out).read())
    if not match:
        sys.exit(f"bench_variator: no BLEU in {out}")
    return float(match.group(1)), hyps


def encoder_cost(json_path, data, backbone, plugins, args, generate=0):
    """Measured once per set of plugins (the file name lists their folders), again with --force-cost."""
    json_path = json_path.replace(".json", "-" + "-".join(os.path.basename(os.path.dirname(p)) for p in plugins) + ".json")
    if args.force_cost or not os.path.exists(json_path):
        cmd = [sys.executable, "-m", "user_dir.variator.tools.cost", data, "--path", backbone, "--plugins",
               ",".join(plugins), "--length", "128", "--batch-size", "16", "--runs", str(args.cost_runs),
               "--threads", str(args.cost_threads), "--json", json_path + ".tmp"]
        if generate:
            cmd += ["--generate", str(generate), "--gen-batch-size", "128", "--beam", "5", "--gen-runs",
                    str(args.e2e_runs)]
        run(cmd, json_path + ".log", args.cost_threads, alone=True)  # timed: no other command of this run
        os.replace(json_path + ".tmp", json_path)
    return json.load(open(json_path))


def part_header(args, settings):
    return {"command": "python scripts/bench/bench_variator.py " + " ".join(shlex.quote(a) for a in args.argv),
            "date": time.strftime("%Y-%m-%d"), "machine": machine_text(), "settings": settings, "notes": [],
            "seeds": args.seeds}


def translation(args, work):
    data, teacher = args.data or multi30k_data_bin(), args.teacher
    if not os.path.isfile(teacher):
        sys.exit(f"bench_variator: --teacher {teacher}: no such checkpoint")
    task = ["--task", "variator_translation", *TRANSLATION_ARCH, "--max-tokens", "4096",
            "--variator-bottleneck", str(args.bottleneck)]
    variants = {f"k{k}": (k, []) for k in args.ratios}
    variants.update({"k4-mean": (4, ["--variator-compression", "mean"]),
                     "k4-copy": (4, ["--variator-decompression", "copy"]),
                     "k4-att-kv": (4, ["--variator-place", "att-kv"])} if not args.no_ablations else {})
    plan = validation_plan(int(args.updates), int(args.updates), args.validations, "--validations")
    bleu, teacher_hyps = bleu_of(os.path.join(work, "translation", "teacher"), data, teacher, None, 0, args.threads,
                                 args)
    rows = {"teacher": {"name": "teacher (no plugin)", "k": 0, "bleu": bleu, "hypotheses": rel(teacher_hyps)}}
    by_seed = {name: {} for name in variants}

    def train(job):
        seed, (name, (k, extra)) = job
        directory = os.path.join(seed_dir(work, seed), "translation", name)
        log(f"translation {name}, seed {seed}")
        plugin = train_plugin(directory, data, task, teacher, k, args.updates, extra, args.threads, seed, plan,
                              device=args)
        row = {"name": name, "k": k, "plugin": rel(plugin["last"]), "train_seconds": plugin["train_seconds"],
               "validations": plugin["validations"]}
        row["bleu"], row["hypotheses"] = bleu_of(directory, data, teacher, plugin["last"], k, args.threads, args)
        if "best" in plugin:
            row["bleu_best"], _ = bleu_of(os.path.join(directory, "best"), data, teacher, plugin["best"], k,
                                          args.threads, args)
        return row

    jobs = [(seed, variant) for seed in args.seeds for variant in variants.items()]
    for (seed, (name, _)), row in zip(jobs, run_jobs(train, jobs, args.jobs)):
        by_seed[name][seed] = row
    rows.update({name: over_seeds(by_seed[name]) for name in variants})
    references = multi30k_references(os.path.join(work, "translation", "test.raw.en"))
    comparisons = []
    for name, (k, extra) in variants.items():  # every k against the teacher; Table 2's ablations against k=4
        base = "k4" if extra and "k4" in variants else "teacher"
        b = ([rows["teacher"]["hypotheses"]] * len(args.seeds) if base == "teacher"
             else [by_seed["k4"][s]["hypotheses"] for s in args.seeds])
        label = (f"k={k} vs the teacher (no plugin)" if base == "teacher"
                 else f"{ABLATIONS.get(name, name)} vs k=4 (learned merge, adapter)")
        comparisons.append(bleu_comparison(label, name, base, [by_seed[name][s]["hypotheses"] for s in args.seeds], b,
                                           references))
    log("translation cost: encoder on fixed-length blocks and end-to-end translation of the test set")
    first = os.path.join(seed_dir(work, args.seeds[0]), "translation")
    cost = encoder_cost(os.path.join(first, "encoder_cost.json"), data, teacher,
                        [os.path.join(first, f"k{k}", "plugin_last.pt") for k in args.ratios], args,
                        generate=args.e2e_sentences)
    part = part_header(args, {"updates": int(args.updates), "bottleneck": args.bottleneck, "ratios": args.ratios,
                              "threads": args.threads, "validations": args.validations, "plan": list(plan)})
    part.update({"teacher": {"checkpoint": teacher, "sha256": backbone_digest(teacher)}, "rows": rows, "cost": cost,
                 "pairing": "alternate", "comparisons": comparisons, "references": rel(references)})
    return part


def adaptation_dir(work, task, teacher):
    """Each teacher's adapted plugins in their own folder (its run and SHA-256): a retrained teacher (RTE after
    the pair-truncation fix, say) gets new plugins beside the old ones, never reusing or overwriting them."""
    return os.path.join(work, task, f"{teacher['run']}-{teacher['sha256'][:8]}")


def default_work(out):
    """Plugins train in a folder named after the table: no other table's run reuses or overwrites them."""
    return os.path.join(ROOT, "work", "bench-variator", os.path.splitext(os.path.basename(out))[0])


def pretraining_data(args, model_dir, work):
    """SST-2's training sentences as glue_teachers.sh prepares them (WordPiece, 128 tokens), the plugins'
    unlabelled pre-training text; prepared here when only other tasks' teachers were trained (TASKS=RTE)."""
    data = os.path.join(args.glue_work, "data-bin", "SST-2.wordpiece")
    if not os.path.isfile(os.path.join(data, "input0", "train.bin")):
        glue_dir = shared_path("data", "glue", what="the GLUE TSVs (SST-2's sentences: the plugins' pre-training text)")
        run([sys.executable, "-m", "preprocess.prepare_glue", "--task", "SST-2", "--glue-dir", glue_dir, "--dest", data,
             "--tokenizer", "wordpiece", "--wordpiece-vocab", model_dir, "--dict", os.path.join(model_dir, "dict.txt"),
             "--max-length", "128"], os.path.join(work, "prepare_sst2.log"), args.threads)
    return data


def glue(args, work):
    model_dir = os.path.join(args.glue_work, "minilm-p128")
    if not os.path.isfile(os.path.join(model_dir, "import.json")):
        sys.exit(f"bench_variator: no imported MiniLM at {model_dir} (--glue-work); run scripts/recipes/glue_teachers.sh first")
    flags = fc_flags(model_dir)
    common = ["--user-dir", "user_dir", "--task", "variator_sentence_prediction", *flags, "--init-token", "0",
              "--num-classes", "2", "--shorten-method", "truncate", "--variator-bottleneck", str(args.bottleneck)]

    parts, pretrained = {}, {}
    sweep = args.tasks if args.glue_sweep is None else args.glue_sweep
    ratios_of = {task: (args.ratios if task in sweep else [4]) for task in args.tasks}
    plan = validation_plan(int(args.glue_updates), int(args.glue_updates), args.glue_validations, "--glue-validations")
    sentences = pretraining_data(args, model_dir, work)

    def pretrain(job):  # plugin pre-training: the pre-trained MiniLM, unlabelled SST-2 sentences, no validation
        seed, k = job
        log(f"GLUE pre-training k={k}, seed {seed}")
        return train_plugin(os.path.join(seed_dir(work, seed), "glue", "pretrain", f"k{k}"), sentences, common[2:],
                            os.path.join(model_dir, "model.pt"), k, args.glue_pretrain_updates, ["--batch-size", "32"],
                            args.threads, seed, (0, []), device=args)["last"]

    jobs = [(seed, k) for seed in args.seeds for k in sorted({k for ks in ratios_of.values() for k in ks})]
    pretrained.update(zip(jobs, run_jobs(pretrain, jobs, args.jobs)))
    for task in args.tasks:
        metric, bsz = GLUE_TASKS[task]
        data = os.path.join(args.glue_work, "data-bin", f"{task}.wordpiece")
        teacher = os.path.join(args.glue_work, task, "checkpoints", "checkpoint_best.pt")
        if not os.path.isfile(teacher):
            log(f"GLUE {task}: no teacher at {teacher} (run scripts/recipes/glue_teachers.sh); skipped")
            continue
        setup = {"data": data}
        base_file = os.path.join(work, "glue", task, f"teacher-{backbone_digest(teacher)[:8]}.json")
        base = glue_scores(teacher, setup, task, base_file, args.threads)
        examples = base.pop("examples")
        record = teacher_record(teacher, metric, base[metric])
        results = {"0": {"scores": base, "examples": examples, "predictions": rel(predictions_path(base_file))}}
        for k in ratios_of[task]:

            def adapt(seed):
                log(f"GLUE {task} adaptation k={k}, seed {seed}")
                directory = os.path.join(adaptation_dir(os.path.join(seed_dir(work, seed), "glue"), task, record), f"k{k}")
                plugin = train_plugin(directory, data, common[2:] + ["--glue-task", task, "--variator-plugins",
                                                                     pretrained[(seed, k)]], teacher, k,
                                      args.glue_updates, ["--batch-size", str(bsz)], args.threads, seed, plan,
                                      metric, maximize=True, device=args)
                chosen = plugin.get(args.glue_select, plugin["last"])
                scores = {}
                for name, path in (("scores", chosen), ("last", plugin["last"]), ("best", plugin.get("best")),
                                   ("without_adaptation", pretrained[(seed, k)])):
                    if path:
                        out = os.path.join(directory, f"dev_{name}.json")
                        scores[name] = glue_scores(teacher, setup, task, out, args.threads, variator_plugins=path,
                                                   variator_ratio=k)
                        scores[name].pop("examples")
                return dict(scores, plugin=rel(chosen), train_seconds=plugin["train_seconds"],
                            validations=plugin["validations"],
                            predictions=predictions_path(os.path.join(directory, "dev_scores.json")))

            results[str(k)] = over_seeds(dict(zip(args.seeds, run_jobs(adapt, args.seeds, args.jobs))))
        comparisons = [glue_comparison(f"k={k} vs the teacher (no plugin)", f"k{k}", "teacher",
                                       [os.path.join(ROOT, results[str(k)]["predictions"][str(s)]) for s in args.seeds],
                                       [predictions_path(base_file)] * len(args.seeds),
                                       read_labels(predictions_path(base_file)), metric)
                       for k in ratios_of[task]]
        first = adaptation_dir(os.path.join(seed_dir(work, args.seeds[0]), "glue"), task, record)
        cost = encoder_cost(os.path.join(first, "encoder_cost.json"), data, teacher,
                            [os.path.join(first, f"k{k}", "plugin_last.pt") for k in ratios_of[task]], args)
        part = part_header(args, {"pretrain_updates": int(args.glue_pretrain_updates), "updates": int(args.glue_updates),
                                  "validations": args.glue_validations, "select": args.glue_select,
                                  "bottleneck": args.bottleneck, "ratios": ratios_of[task], "threads": args.threads,
                                  "plan": list(plan), "selection": selection_record(data)})
        part.update({"teacher": record, "results": results, "cost": cost, "pairing": "alternate",
                     "comparisons": comparisons})
        parts[task] = part
    return parts


# ---- the JSON beside each table: one record per part, merged across runs ----------------------------------
def legacy_runs(seconds, runs):
    """Per-run timings of a legacy cost measurement: its ``seconds`` list held the runs one after another
    (one value per run, or ``repeats`` forwards per run)."""
    if runs < 1 or len(seconds) % runs:
        raise ValueError(f"{len(seconds)} timings cannot be split into {runs} runs")
    n = len(seconds) // runs
    return [seconds[i * n:(i + 1) * n] for i in range(runs)]


def resummarise_legacy(rows, runs):
    """Speed-ups of a legacy measurement recomputed from its raw timings as the median of per-run ratios
    (the legacy run timed the backbone, then each plugin, in turn within every run)."""
    from user_dir.variator.tools.cost import summarise_speedup
    base = next(r for r in rows if not int(r["ratio"]))
    for r in rows:
        reported = r.pop("speedup", None)
        if not int(r["ratio"]):
            continue
        r["legacy_reported_speedup"] = reported
        r["speedup"] = summarise_speedup(legacy_runs(base["seconds"], runs), legacy_runs(r["seconds"], runs),
                                         base["analytic_flops"]["total"] / r["analytic_flops"]["total"])
    return rows


def glue_md_teachers(text):
    """{task: {column: cell}} from the teacher table of a results/glue.md (found by its header names)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = next((line for line in lines if line.lower().startswith("| task |")), None)
    if header is None:
        raise ValueError("no '| task |' table in this glue.md")
    names = [c.strip() for c in header.strip("|").split("|")]
    table = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == len(names) and cells[0] in GLUE_TASKS:
            table[cells[0]] = dict(zip(names, cells))
    return table


def legacy_teacher(task, raw_path, score, metric, glue_md, rev):
    """The teacher of a legacy GLUE row: the glue.md of revision ``rev`` lists each task's teacher with its
    lr; it is this row's teacher only if its dev score is the one the row measured (checked here)."""
    row = glue_md_teachers(glue_md).get(task)
    column = {"accuracy": "accuracy", "f1": "F1"}[metric]
    if row is None or "lr" not in row or row.get(column) != f"{score:.2f}":
        raise ValueError(f"{task}: results/glue.md at {rev} lists no teacher with {metric} {score:.2f} "
                         f"(it has {row}): cannot label this row's teacher")
    return {"run": f"lr{row['lr']}", "checkpoint": raw_path, "lr": float(row["lr"]), "metric": metric,
            "score": score, "source": f"results/glue.md at commit {rev} (`git show {rev}:results/glue.md`) lists the "
                                      f"{task} teacher at lr {row['lr']} with dev {column} {row[column]}, the score "
                                      f"of this row's teacher"}


def upgrade_legacy(old, md, glue_md, rev):
    """A JSON written before per-part records (``{"translation": [rows, cost], "glue": [results, costs]}``)
    in today's layout. What it lacks comes from the table written beside it (``md``: the command, the
    machine and date) and from ``glue_md`` (the glue.md of revision ``rev``: each GLUE teacher's lr)."""
    made_by = re.search(r"Made by `python scripts/bench/bench_variator.py ?([^`]*)`", md)
    machine = re.search(r"Machine: (.*)\. Date: (\d{4}-\d\d-\d\d)\.", md)
    if not made_by or not machine:
        raise ValueError("the legacy table names no 'Made by' command or no 'Machine: ... Date: ...' line")
    argv = shlex.split(made_by.group(1))
    args = build_parser().parse_args(argv)
    header = {"command": "python scripts/bench/bench_variator.py " + made_by.group(1), "date": machine.group(2),
              "machine": machine.group(1), "pairing": "in turn",
              "notes": ["These rows are regenerated from the JSON of the original run, written before each part "
                        "kept its command (the command, machine and date are those its table named). Their speed-ups "
                        "are recomputed from that run's raw timings as the median [min-max] of per-run ratios; that "
                        "run timed the backbone, then each plugin, in turn within each run (not alternately).",
                        "The plugin files these rows were measured with lay in work/bench-variator/, whose folders "
                        "every configuration of the benchmark shared before each table got its own work folder; "
                        "they are not in this checkout."]}
    new = {"version": 2, "translation": None, "glue": {}}
    if old.get("translation"):
        rows, cost = old["translation"]
        cost_rows = resummarise_legacy(list(cost.values()), args.cost_runs)
        some = next(r for r in cost_rows if r["plugin_params"])
        new["translation"] = dict(header, settings={"updates": int(args.updates), "bottleneck": args.bottleneck,
                                                    "ratios": args.ratios, "threads": args.threads},
                                  # the legacy rows' teacher: the original file beside the checkout
                                  teacher={"checkpoint": os.path.join(SHARED, "teachers", "multi30k.de-en",
                                                                      "teacher.pt")},
                                  rows={n: {**r, "plugin": rel(r["plugin"]) if "plugin" in r else None}
                                        for n, r in rows.items()},
                                  cost={"rows": cost_rows, "runs": args.cost_runs, "threads": args.cost_threads,
                                        "length": 128, "batch_size": 16, "machine": machine.group(1),
                                        "backbone_params": round(100 * some["plugin_params"] / some["plugin_params_percent"]),
                                        "end_to_end": None})
    if old.get("glue"):
        results, costs = old["glue"]
        sweep = args.tasks if args.glue_sweep is None else args.glue_sweep
        for task, res in results.items():
            _, raw = costs[task]
            metric = GLUE_TASKS[task][0]
            raw = dict(raw, rows=resummarise_legacy(raw["rows"], raw["runs"]), end_to_end=None)
            new["glue"][task] = dict(
                header, settings={"pretrain_updates": int(args.glue_pretrain_updates),
                                  "updates": int(args.glue_updates), "validations": args.glue_validations,
                                  "select": args.glue_select, "bottleneck": args.bottleneck,
                                  "ratios": args.ratios if task in sweep else [4], "threads": args.threads},
                teacher=legacy_teacher(task, raw["path"], res["0"]["scores"][metric], metric, glue_md, rev),
                results=res, cost=raw)
    return new


def upgrade_legacy_json(data, json_path, args):
    """A JSON of the legacy layout upgraded (:func:`upgrade_legacy`) with the GLUE teachers of
    ``--legacy-teachers-rev``'s results/glue.md."""
    md_path = os.path.splitext(json_path)[0] + ".md"
    if not args.legacy_teachers_rev:
        sys.exit(f"bench_variator: {json_path} is in the legacy layout; give --legacy-teachers-rev REV (the commit "
                 f"whose results/glue.md lists the GLUE teachers its rows were measured on) to upgrade it")
    glue_md = subprocess.run(["git", "show", f"{args.legacy_teachers_rev}:results/glue.md"], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout
    return dict(upgrade_legacy(data, open(md_path).read(), glue_md, args.legacy_teachers_rev), upgraded=True)


def merge_parts(existing, translation_part, glue_parts):
    """Parts measured now replace their own records only; every other part keeps its record."""
    merged = {"version": 2, "translation": existing.get("translation"), "glue": dict(existing.get("glue") or {})}
    if translation_part:
        merged["translation"] = translation_part
    merged["glue"].update(glue_parts or {})
    return merged




# ---- the table, from the JSON alone -----------------------------------------------------------------------
def speed_cell(row):
    from user_dir.variator.tools.cost import format_speedup
    return format_speedup(row["speedup"]) if int(row["ratio"]) else "1.00x"


def flop_bound(row):
    return f"{row['speedup']['flop_bound']:.2f}x" if int(row["ratio"]) else "1.00x"


def timing_text(cost, pairing):
    how = ("every plugin timed against the backbone alternately (B P B P ..., the order flipped every other run)"
           if pairing == "alternate" else "the backbone, then each plugin, timed in turn within each run")
    return (f"{cost['runs']} runs, {how}, {cost['threads']} thread(s); speed-up = median [min-max] over the runs of "
            "each run's ratio median(backbone time) / median(plugged time)")


def flagged(rows):
    return [r for r in rows if int(r["ratio"]) and r["speedup"]["above_flop_bound"]]


def current_glue_teachers(path):
    """results/glue.md's teacher per task today ({} when it has no readable teacher table)."""
    try:
        return glue_md_teachers(open(path).read())
    except (OSError, ValueError):
        return {}


def variator_report(data, out):
    lines = ["# Variator: compression plugins on frozen models", "",
             f"Made by `python scripts/bench/bench_variator.py` ({os.path.basename(out)} and "
             f"{os.path.splitext(os.path.basename(out))[0]}.json; each part below names the command and machine that "
             "measured it, and a rerun of some parts keeps the others). Plugins on the FFNs of every encoder layer, "
             "trained by hidden-state distillation (MSE of the final encoder states, lambda = 0) with stock "
             "`fairseq-train --user-dir user_dir --task variator_translation|variator_sentence_prediction "
             "--criterion variator_distill`.", "",
             "Two kinds of timing, named in every column: **encoder alone on fixed-length blocks** (16 real-text "
             "sequences of exactly 128 tokens, one encoder forward) and **end-to-end translation** (beam search over "
             "the test set at its real sentence lengths, encoder and decoder). FLOPs = 2 x multiply-adds of the matrix "
             "products (encoder: analytic, equal to `torch.utils.flop_counter`'s count; end-to-end: the counter's). "
             "The FLOP bound of a speed-up is the backbone's FLOPs over the plugged model's: a measured speed-up above "
             "it cannot come from the plugin's arithmetic and is marked as noise.", ""]
    parts = [p for p in [data.get("translation"), *(data.get("glue") or {}).values()] if p]
    shared = [n for n in parts[0].get("notes", []) if all(n in p.get("notes", []) for p in parts)] if parts else []
    lines += [f"Provenance: {n}" for n in shared] + ([""] if shared else [])

    def own(notes):  # a note every part carries is said once, above
        return [n for n in notes if n not in shared]
    t = data.get("translation")
    if t:
        rows, cost, s = t["rows"], t["cost"], t["settings"]
        teacher_bleu = rows["teacher"]["bleu"]
        new = "seeds" in t  # a part made with seeds: means, spreads and every seed; best-of-N beside
        by_k = {int(r["ratio"]): r for r in cost["rows"]}
        e2e = {int(r["ratio"]): r for r in cost["end_to_end"]["rows"]} if cost.get("end_to_end") else {}
        lines += ["## Translation: Multi30k DE->EN reference teacher (BLEU, test_2016_flickr, beam 5)", "",
                  f"Made by `{t['command']}` on {t['date']}; {t['machine']}"
                  + (f"; {seeds_text(t['seeds'])}, {s['threads']} thread(s) per run" if new else "")
                  + f". {s['updates']} updates per plugin (max "
                  f"4,096 tokens each), bottleneck r = {s['bottleneck']}. Backbone: {cost['backbone_params']:,} "
                  f"parameters. Encoder timing: {timing_text(cost, t.get('pairing'))}.", ""]
        if new:
            lines += [protocol_text(s["updates"], tuple(s["plan"]), "validation loss (the distillation MSE)", LR_TEXT)
                      + " Each BLEU: mean +- sample std [min, max] over the seeds, then every seed's value; the "
                      "costs are the first seed's plugins'.", ""]
        lines += ["| plugin | BLEU | drop | added params (% of backbone) | encoder FFN FLOPs saved | encoder FLOPs saved "
                  f"| encoder FLOP bound | encoder alone, fixed {cost['length']}-token blocks: speed-up | end-to-end translation: "
                  "FLOP bound | end-to-end translation: speed-up | train time |" + (" BLEU, best-of-N |" if new else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if new else ""),
                  f"| none (teacher) | {teacher_bleu:.2f} | - | 0 | - | - | 1.00x | 1.00x | "
                  f"{'1.00x' if e2e else 'not measured'} | {'1.00x' if e2e else 'not measured'} | - |" + (" - |" if new else "")]
        for k in s["ratios"]:
            r, c = rows[f"k{k}"], by_k[k]
            e = e2e.get(k)
            minutes = minutes_text(r.get("train_seconds"))
            lines.append(f"| k={k} | {fmt(r['bleu'])} | {fmt(difference(teacher_bleu, r['bleu']))} | {c['plugin_params']:,} "
                         f"({c['plugin_params_percent']:.2f}%) | {c['ffn_flops_saved_percent']:.1f}% | "
                         f"{c['encoder_flops_saved_percent']:.1f}% | {flop_bound(c)} | {speed_cell(c)} | "
                         f"{flop_bound(e) if e else 'not measured'} | {speed_cell(e) if e else 'not measured'} | "
                         f"{minutes} |" + (f" {fmt(r['bleu_best']) if 'bleu_best' in r else '-'} |" if new else ""))
        if e2e:
            e = cost["end_to_end"]
            lines += ["", f"End-to-end translation: beam {e['beam']}, the {e['sentences']} {e['subset']} sentences in "
                      f"batches of {e['batch_size']}, {timing_text(dict(e, threads=cost['threads']), t.get('pairing'))}"
                      "; tokens generated: " + ", ".join(f"{'none' if not int(r['ratio']) else 'k=' + str(r['ratio'])} "
                                                         f"{r['generated_tokens']:,}" for r in e["rows"]) + "."]
        noisy = flagged(cost["rows"]) + flagged(cost["end_to_end"]["rows"] if e2e else [])
        if noisy:
            lines += ["", f"Marked as noise: {len(noisy)} speed-up(s) above their FLOP bound (on a machine other "
                      "processes share, one setting's forwards can land in a quieter moment than its pair's)."]
        ablations = [n for n in ("k4-mean", "k4-copy", "k4-att-kv") if n in rows]
        if ablations:
            names = ABLATIONS
            lines += ["", "Ablations at k=4 (Table 2 and section 4.7), same budget:", "", "| variant | BLEU | drop |",
                      "|---|---|---|", f"| k=4 (learned merge, adapter) | {fmt(rows['k4']['bleu'])} | "
                      f"{fmt(difference(teacher_bleu, rows['k4']['bleu']))} |"]
            lines += [f"| {names[n]} | {fmt(rows[n]['bleu'])} | {fmt(difference(teacher_bleu, rows[n]['bleu']))} |"
                      for n in ablations]
        if t.get("comparisons"):
            lines += [""] + significance_lines(t["comparisons"], "Each plugin (A) against the teacher or k=4 (B), last "
                                               "checkpoints")[:-1]
        lines += ["", "Profiler vs analytic encoder FLOPs (GFLOPs): " + ", ".join(
            f"{c['profiler_flops'] / 1e9:.3f} / {c['analytic_flops']['total'] / 1e9:.3f}" for c in cost["rows"]), ""]
        lines += [f"Note: {n}" for n in own(t.get("notes", []))] + ([""] if own(t.get("notes", [])) else [])
    glue_parts = {task: p for task, p in (data.get("glue") or {}).items() if "seeds" not in p}
    seeded = {task: p for task, p in (data.get("glue") or {}).items() if "seeds" in p}
    if glue_parts:
        current = current_glue_teachers(os.path.join(ROOT, "results", "glue.md"))
        length = "/".join(sorted({str(p["cost"].get("length", 128)) for p in glue_parts.values()}))
        lines += ["## GLUE: MiniLM-L6 teachers (dev)", "",
                  "Each row names the teacher it was measured on (its training run, learning rate and dev score; the "
                  "'none' row is that teacher without plugins). Plugin pre-training on SST-2's training sentences "
                  "with the pre-trained MiniLM, then adaptation on each fine-tuned teacher; score = accuracy (SST-2, "
                  "RTE) or F1 (MRPC); 'last' = after the last update; 'w/o PA' = the pre-trained plugin used without "
                  f"adaptation. Encoder speed-ups: encoder alone on fixed {length}-token blocks.", "",
                  "| task | teacher (run, dev score) | k | score | drop | last | w/o PA | added params (%) | encoder "
                  f"FFN FLOPs saved | encoder FLOPs saved | encoder FLOP bound | encoder alone, fixed {length}-token blocks: "
                  "speed-up | adaptation time |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for task, p in glue_parts.items():
            metric, res, label, base, by_k = glue_part_keys(task, p)
            lines.append(f"| {task} | {label} | none | {base:.2f} | - | - | - | 0 | - | - | 1.00x | 1.00x | - |")
            for k in sorted(int(k) for k in res if int(k)):
                r, c = res[str(k)], by_k[k]
                s = r["scores"][metric]
                last = f"{r['last'][metric]:.2f}" if "last" in r and p["settings"]["select"] != "last" else "(= score)"
                minutes = f"{r['train_seconds'] / 60:.0f} min" if "train_seconds" in r else "-"
                lines.append(f"| {task} | {label} | {k} | {s:.2f} | {base - s:.2f} | {last} | "
                             f"{r['without_adaptation'][metric]:.2f} | {c['plugin_params']:,} "
                             f"({c['plugin_params_percent']:.2f}%) | {c['ffn_flops_saved_percent']:.1f}% | "
                             f"{c['encoder_flops_saved_percent']:.1f}% | {flop_bound(c)} | {speed_cell(c)} | {minutes} |")
        lines.append("")
        groups = {}  # tasks measured by one command share its description
        for task, p in glue_parts.items():
            key = (p["command"], p["date"], p["machine"], timing_text(p["cost"], p.get("pairing")),
                   tuple(own(p.get("notes", []))))
            groups.setdefault(key, []).append(task)
        for (command, date, machine, timing, notes), tasks in groups.items():
            lines.append(f"- {', '.join(tasks)}: made by `{command}` on {date}; {machine}. Timing: {timing}."
                         + "".join(f" Note: {n}" for n in notes))
        for task, p in glue_parts.items():
            s, teacher = p["settings"], p["teacher"]
            metric = GLUE_TASKS[task][0]
            examples = p["results"]["0"].get("examples")
            lines.append(
                f"- {task}: teacher {teacher['checkpoint']} (run {teacher['run']}, lr {teacher['lr']:g}, dev {metric} "
                f"{teacher['score']:.2f}; {teacher['source']}). {s['pretrain_updates']} pre-training and "
                f"{s['updates']} adaptation updates"
                + (f", the checkpoint with the best {chosen_on(s)} score of {s['validations']} validations"
                   if s["select"] == "best" else ", the last checkpoint (no choice on dev)")
                + f", r = {s['bottleneck']}."
                + (f" Dev set: {examples} examples (one example = {100 / examples:.2f} points)." if examples else ""))
            now = current.get(task)
            column = {"accuracy": "accuracy", "f1": "F1"}[metric]
            if now and "lr" in now and (float(now["lr"]) != teacher["lr"] or now.get(column) != f"{teacher['score']:.2f}"):
                lines.append(f"  Not results/glue.md's current {task} teacher (lr {now['lr']}, dev {column} "
                             f"{now.get(column)}): these {task} rows are on an earlier teacher.")
        noisy = [task for task, p in glue_parts.items() if flagged(p["cost"]["rows"])]
        if noisy:
            lines += ["", "Speed-ups marked as noise (above their FLOP bound): "
                      + ", ".join(f"{task} k={r['ratio']}" for task in noisy for r in flagged(glue_parts[task]["cost"]["rows"]))
                      + "."]
        lines.append("")
    if seeded:
        lines += glue_seeds_section(seeded)
    lines += ["## The paper", "", PAPER, ""]
    write_text(out, "\n".join(lines))
    return "\n".join(lines)




def glue_part_keys(task, p):
    """What a GLUE part's rows share: its metric, results, teacher label, the teacher's score, costs by k."""
    metric, teacher = GLUE_TASKS[task][0], p["teacher"]
    label = f"{teacher['run']} ({'F1' if metric == 'f1' else 'acc'} {teacher['score']:.2f})"
    return (metric, p["results"], label, p["results"]["0"]["scores"][metric],
            {int(r["ratio"]): r for r in p["cost"]["rows"]})


def glue_seeds_section(parts):
    """The GLUE parts made with seeds: one table, each score's mean, spread and every seed, best-of-N beside
    the primary (last) score, and the paired tests of every k against its teacher."""
    lines = ["## GLUE: MiniLM-L6 teachers (dev), several seeds", "",
             "Each row names the teacher it was measured on (its training run, learning rate and dev score; the "
             "'none' row is that teacher without plugins). Plugin pre-training on SST-2's training sentences "
             "with the pre-trained MiniLM, then adaptation on each fine-tuned teacher (both per seed); score = "
             "accuracy (SST-2, RTE) or F1 (MRPC), as mean +- sample std [min, max] over the seeds, then every seed's "
             "value; 'w/o PA' = the pre-trained plugin used without adaptation (mean over seeds). Encoder speed-ups "
             "(the first seed's plugins): encoder alone on fixed 128-token blocks.", "",
             "| task | teacher (run, dev score) | k | score | drop | best-of-N | w/o PA | added params (%) | encoder "
             "FLOPs saved | encoder alone, fixed 128-token blocks: speed-up | adaptation time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task, p in parts.items():
        metric, res, label, base, by_k = glue_part_keys(task, p)
        lines.append(f"| {task} | {label} | none | {base:.2f} | - | - | - | 0 | - | 1.00x | - |")
        for k in sorted(int(k) for k in res if int(k)):
            r, c = res[str(k)], by_k[k]
            best = fmt(r["best"][metric]) if "best" in r else "-"
            lines.append(f"| {task} | {label} | {k} | {fmt(r['scores'][metric])} | "
                         f"{fmt(difference(base, r['scores'][metric]))} | {best} | "
                         f"{num(r['without_adaptation'][metric]):.2f} | {c['plugin_params']:,} "
                         f"({c['plugin_params_percent']:.2f}%) | {c['encoder_flops_saved_percent']:.1f}% | "
                         f"{speed_cell(c)} | {minutes_text(r.get('train_seconds'))} |")
    lines.append("")
    for task, p in parts.items():
        s = p["settings"]
        lines.append(f"- {task}: made by `{p['command']}` on {p['date']}; {p['machine']}; {seeds_text(p['seeds'])}, "
                     f"{s['threads']} thread(s) per run. Timing: {timing_text(p['cost'], p.get('pairing'))}. "
                     f"{s['pretrain_updates']} pre-training updates (no validation), then "
                     + protocol_text(s["updates"], tuple(s["plan"]), f"{chosen_on(s)} {GLUE_TASKS[task][0]}", LR_TEXT)
                     + ("" if s["select"] == "last" else " (This part's primary score is the best-of-N checkpoint's, "
                        "--glue-select best.)"))
    lines.append("")
    comparisons = [c for p in parts.values() for c in p.get("comparisons", [])]
    return lines + significance_lines(comparisons, "Each plugin (A) against its teacher without plugins (B), dev")


def plot_variator(data, png):
    """The score against encoder FLOPs (% of the backbone) over k: the translation part, then the GLUE parts."""
    translation, glue = {"series": []}, {"series": []}
    t = data.get("translation")
    if t:
        by_k = {int(r["ratio"]): r for r in t["cost"]["rows"]}
        ks = t["settings"]["ratios"]
        translation = dict(series=[dict(
            x=[100.0] + [100 - by_k[k]["encoder_flops_saved_percent"] for k in ks], style="o-",
            y=[t["rows"]["teacher"]["bleu"]] + [num(t["rows"][f"k{k}"]["bleu"]) for k in ks],
            notes=["none"] + [f"k={k}" for k in ks])],
            xlabel="encoder FLOPs (% of the backbone)", ylabel="BLEU", title="Multi30k DE->EN")
    for task, p in (data.get("glue") or {}).items():
        by_k = {int(r["ratio"]): r for r in p["cost"]["rows"]}
        metric = GLUE_TASKS[task][0]
        ks = sorted(int(k) for k in p["results"] if int(k))
        glue["series"].append(dict(
            x=[100.0] + [100 - by_k[k]["encoder_flops_saved_percent"] for k in ks], style="o-",
            y=[p["results"]["0"]["scores"][metric]] + [num(p["results"][str(k)]["scores"][metric]) for k in ks],
            label=f"{task} ({metric}; teacher {p['teacher']['run']})"))
    if data.get("glue"):
        glue.update(xlabel="encoder FLOPs (% of the backbone)", ylabel="dev score", title="GLUE (MiniLM-L6)", legend={})
    command = " ; ".join(dict.fromkeys(part["command"] for part in [t, *(data.get("glue") or {}).values()]
                                       if part and part.get("command")))
    plot_panels(png, [translation, glue], command=command or None, figsize=(10, 4))


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="*", default=["translation", "glue"], choices=["translation", "glue"],
                   help="what to measure (none: rewrite the table and plot from the JSON beside --out)")
    p.add_argument("--ratios", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--tasks", nargs="+", default=list(GLUE_TASKS), choices=list(GLUE_TASKS))
    p.add_argument("--glue-sweep", nargs="*", default=None, choices=list(GLUE_TASKS),
                   help="GLUE tasks that get every ratio of --ratios; the others get k=4 only (default: all)")
    p.add_argument("--bottleneck", type=int, default=16, help="adapter bottleneck r (paper: 64; see the docstring)")
    p.add_argument("--updates", default="400", help="training updates per translation plugin")
    p.add_argument("--validations", type=int, default=4,
                   help="validations of each translation plugin at the same update points (default 4: every 100 of "
                        "400 updates); the last checkpoint is the primary score, the best-of-N beside it")
    p.add_argument("--glue-pretrain-updates", default="200")
    p.add_argument("--glue-updates", default="800", help="adaptation updates per GLUE plugin")
    p.add_argument("--glue-validations", type=int, default=8,
                   help="evaluations on the held-out selection set ('valid') during each GLUE adaptation, at the "
                        "same update points for every plugin")
    p.add_argument("--glue-select", default="last", choices=["best", "last"],
                   help="the primary score: the last checkpoint (default), or the one with the best held-out metric of "
                        "the validations; the other is shown beside it")
    p.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                   help="scripts/recipes/glue_teachers.sh's work folder: the imported MiniLM, the data and TASK/checkpoints")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each training run")
    add_device_args(p)
    p.add_argument("--jobs", type=int, default=1, help="plugins trained at once (default 1); the timings wait until "
                   "none trains")
    add_teacher_arguments(p, role="the backbone", scope="translation: ")
    p.add_argument("--cost-threads", type=int, default=2, help="torch threads of the timed encoder")
    p.add_argument("--cost-runs", type=int, default=7)
    p.add_argument("--e2e-sentences", type=int, default=1000,
                   help="test sentences translated end to end in the translation part's timing (0: none)")
    p.add_argument("--e2e-runs", type=int, default=5, help="timed runs of the end-to-end translation")
    p.add_argument("--force-cost", action="store_true", help="re-measure encoder cost")
    p.add_argument("--quick", action="store_true", help="a few updates per stage, a smoke test (not results)")
    p.add_argument("--out", default=default_out("variator.md"),
                   help="the table (default work/results/variator.md; the committed one: results/variator.md)")
    add_seed_arguments(p, default="1")
    p.add_argument("--work", default=None, help="where plugins train (default: work/bench-variator/<the table's "
                   "name>, so each table keeps its own plugins; a folder made with other settings is refused)")
    p.add_argument("--fresh", action="store_true", help="write a table of this run's parts only (default: keep the "
                   "parts of the JSON beside --out that this run does not measure)")
    p.add_argument("--note", action="append", default=[], help="a sentence of provenance the JSON cannot know, "
                   "added to the notes of every part this run measures or upgrades (repeatable)")
    p.add_argument("--legacy-teachers-rev", default=None, help="upgrading a JSON of the legacy layout: the commit "
                   "whose results/glue.md lists the GLUE teachers its rows were measured on")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.seeds = seeds_of(parser, args)
    check_device(parser, args)
    args.out = args.out if args.out.endswith(".md") else args.out + ".md"  # --out results/x: x.md and x.json
    args.work = args.work or default_work(args.out)
    if args.quick:
        args.updates = args.glue_pretrain_updates = args.glue_updates = "2"
        args.validations, args.glue_validations = min(args.validations, 2), min(args.glue_validations, 2)
        args.cost_runs, args.e2e_sentences, args.e2e_runs = 1, 16, 1
        args.work = args.work + "-quick"
        args.out = os.path.join(args.work, "variator.md")
    json_path = os.path.splitext(args.out)[0] + ".json"
    existing = load_parts(json_path, lambda data: upgrade_legacy_json(data, json_path, args), fresh=args.fresh)
    translation_part = translation(args, args.work) if "translation" in args.parts else None
    glue_parts = glue(args, args.work) if "glue" in args.parts else None
    if args.note:
        upgraded = existing.pop("upgraded", False)
        for part in [translation_part, *(glue_parts or {}).values()] + (
                [existing.get("translation"), *existing["glue"].values()] if upgraded else []):
            if part:
                part["notes"] = part.get("notes", []) + [n for n in args.note if n not in part.get("notes", [])]
    existing.pop("upgraded", None)
    data = merge_parts(existing, translation_part, glue_parts)
    write_json(json_path, data)
    print(variator_report(data, args.out))
    plot_variator(data, os.path.splitext(args.out)[0] + "_score_vs_flops.png")


if __name__ == "__main__":
    main()
