#!/usr/bin/env python
"""The Variator benchmark: plugins of ratio k in {2, 4, 8, 16} on the FFNs of frozen models, trained
with stock ``fairseq-train --user-dir user_dir`` and measured against the model without plugins.

    python scripts/bench_variator.py                       # translation + GLUE -> results/variator.md
    python scripts/bench_variator.py --parts translation   # only the Multi30k teacher
    python scripts/bench_variator.py --parts glue --tasks RTE MRPC
    python scripts/bench_variator.py --quick               # every stage in minutes (a smoke test)

Translation: the reference Multi30k DE->EN teacher (../shared/teachers). Its plugins are trained by
hidden-state distillation on the training side of Multi30k (the teacher is both the pre-trained
and the downstream model here, so the paper's two steps are one), then BLEU on test_2016_flickr
(beam 5) with ``fairseq-generate --task variator_translation --variator-plugins ... --variator-ratio k``.
Also Table 2's ablations at k=4 (mean-pooling compression, copy decompression) and Att-KV.

GLUE: the MiniLM-L6 teachers of ``scripts/glue_teachers.sh`` (SST-2, MRPC, RTE). Plugin pre-training
on the *pre-trained* encoder (the imported MiniLM) over unlabelled sentences (SST-2's training
sentences), then task adaptation on each fine-tuned teacher, initialised from the pre-trained
plugin; dev scores with ``user_dir.tools.glue_predict --variator-plugins``. The adapted plugin is the
checkpoint with the best dev metric (``--glue-select best``, how the teachers and the paper's models are
chosen); the last checkpoint's score is reported beside it.

Cost: ``user_dir.tools.encoder_cost`` -- analytic and profiler-counted encoder FLOPs and the timed
encoder forward at sequence length 128, the backbone and every plugin side by side in one run.

Choices (ours, stated in results/variator.md): bottleneck r = 16 (the paper's r = 64 is 2.1% of
these small backbones' parameters; r = 16 keeps the plugins under 1%), Adam lr 1e-3 (the paper's
pre-training lr) with inverse-sqrt decay, lambda = 0 (distillation only, paper Appendix B).
Finished stages (a DONE file) are never redone; ``--force-cost`` re-measures speed. A plugin is reused
only on the backbone it was trained on (its ``backbone.txt`` holds the checkpoint's SHA-256): after a
teacher changes (e.g. glue_teachers.sh links a better learning rate's run), the benchmark stops and
names the plugin folders to delete.
"""
import argparse
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
TEACHER_DIR = os.path.join(SHARED, "teachers", "multi30k.de-en")
# the reference teacher's architecture (its README)
TRANSLATION_ARCH = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "3",
                    "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                    "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                    "--decoder-attention-heads", "4", "--share-all-embeddings"]
OPTIM = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
         "--warmup-updates", "50", "--warmup-init-lr", "1e-7", "--criterion", "variator_distill",
         "--log-format", "simple", "--log-interval", "25", "--no-epoch-checkpoints", "--num-workers", "0",
         "--cpu", "--seed", "1"]
GLUE_TASKS = {"SST-2": ("accuracy", 32), "MRPC": ("f1", 16), "RTE": ("accuracy", 16)}
PAPER = ("Paper (T5-base, k=4 on FFNs, Table 1): 0.9% extra parameters, 53% of FLOPs saved, average drop < 2 "
         "points; SST-2 94.3 -> 93.6, MRPC F1 92.6 -> 93.8, RTE 82.9 -> 81.1. Table 2 (SST-2): w/o Com 92.3, "
         "w/o DeCom 86.1 vs 93.6.")


def log(msg):
    print(f"[bench_variator {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, logfile, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    with open(logfile, "a") as f:
        f.write("$ " + " ".join(shlex.quote(str(c)) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_variator: command failed ({proc.returncode}); see {logfile}")


def stage(directory, cmds, threads):
    """Run ``cmds`` once: a DONE file marks the stage finished."""
    done = os.path.join(directory, "DONE")
    if os.path.exists(done):
        return
    os.makedirs(directory, exist_ok=True)
    for cmd in cmds:
        run(cmd, os.path.join(directory, "log.txt"), threads)
    open(done, "w").write(time.strftime("%Y-%m-%d %H:%M:%S\n"))


def backbone_digest(backbone):
    """What a plugin is trained on: the SHA-256 of its backbone checkpoint (a teacher link moved to another
    run, or a teacher retrained in place, changes it; copying the file does not). Every ratio k shares a
    backbone, so each file is read once per benchmark run."""
    real = os.path.realpath(backbone)
    stat = os.stat(real)
    return _file_digest(real, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _file_digest(path, size, mtime_ns):  # size and mtime in the key: a file rewritten in place is read again
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


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


def train_plugin(directory, data, task_flags, backbone, k, updates, extra, threads, export_from="checkpoint_last.pt",
                 also_last=False):
    """fairseq-train a plugin of ratio k on ``backbone``; export ``export_from`` as ``directory/plugin.pt``
    (and the last checkpoint as ``plugin_last.pt`` with ``also_last``). Translation takes the best by
    validation MSE (Multi30k's valid set; BLEU is reported on test)."""
    py = sys.executable
    train = [py, "-m", "fairseq_cli.train", data, "--user-dir", "user_dir", *task_flags,
             "--variator-backbone", backbone, "--variator-ratio", k, *extra, *OPTIM,
             "--max-update", updates, "--save-dir", os.path.join(directory, "checkpoints")]
    exports = [(export_from, "plugin.pt")] + ([("checkpoint_last.pt", "plugin_last.pt")] if also_last else [])
    export = [[py, "-m", "user_dir.tools.variator_plugins", "export", os.path.join(directory, "checkpoints", ckpt),
               "--out", os.path.join(directory, name)] for ckpt, name in exports]
    check_backbone(directory, backbone)
    started = time.time()
    stage(directory, [train, *export], threads)
    seconds_file = os.path.join(directory, "train_seconds")
    if not os.path.exists(seconds_file):
        open(seconds_file, "w").write(f"{time.time() - started:.0f}\n")
    return os.path.join(directory, "plugin.pt")


def bleu_of(directory, data, teacher, plugin, k, threads):
    """BLEU4 of fairseq-generate (beam 5) on test, the teacher with plugin ``plugin`` of ratio k."""
    out = os.path.join(directory, "generate.txt")
    if not os.path.exists(out):
        cmd = [sys.executable, "-m", "fairseq_cli.generate", data, "--user-dir", "user_dir",
               "--task", "variator_translation", "--path", teacher, "--variator-ratio", str(k),
               "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", "--cpu"]
        if plugin:
            cmd += ["--variator-plugins", plugin]
        os.makedirs(directory, exist_ok=True)
        run(cmd, out + ".tmp", threads)
        os.replace(out + ".tmp", out)
    match = re.search(r"BLEU4 = ([0-9.]+)", open(out).read())
    if not match:
        sys.exit(f"bench_variator: no BLEU in {out}")
    return float(match.group(1))


def encoder_cost(json_path, data, backbone, plugins, threads, runs, force):
    """Measured once per set of plugins (the file name lists their folders), again with --force-cost."""
    json_path = json_path.replace(".json", "-" + "-".join(os.path.basename(os.path.dirname(p)) for p in plugins) + ".json")
    if force or not os.path.exists(json_path):
        run([sys.executable, "-m", "user_dir.tools.encoder_cost", data, "--path", backbone, "--plugins",
             ",".join(plugins), "--length", "128", "--batch-size", "16", "--runs", str(runs), "--json", json_path],
            json_path + ".log", threads)
    raw = json.load(open(json_path))
    return {row["ratio"]: row for row in raw["rows"]}, raw


def translation(args, work):
    data, teacher = os.path.join(TEACHER_DIR, "data-bin"), os.path.join(TEACHER_DIR, "teacher.pt")
    if not os.path.isfile(teacher):
        sys.exit(f"bench_variator: the reference teacher {teacher} is missing (../shared or FAIRSEQ_COMPRESS_SHARED)")
    task = ["--task", "variator_translation", *TRANSLATION_ARCH, "--max-tokens", "4096",
            "--variator-bottleneck", str(args.bottleneck)]
    variants = {f"k{k}": (k, []) for k in args.ratios}
    variants.update({"k4-mean": (4, ["--variator-compression", "mean"]),
                     "k4-copy": (4, ["--variator-decompression", "copy"]),
                     "k4-att-kv": (4, ["--variator-place", "att-kv"])} if not args.no_ablations else {})
    rows = {"teacher": {"name": "teacher (no plugin)", "k": 0,
                        "bleu": bleu_of(os.path.join(work, "teacher"), data, teacher, None, 0, args.threads)}}
    for name, (k, extra) in variants.items():
        directory = os.path.join(work, name)
        log(f"translation {name}")
        plugin = train_plugin(directory, data, task, teacher, k, args.updates, extra, args.threads,
                              export_from="checkpoint_best.pt")
        rows[name] = {"name": name, "k": k, "plugin": plugin,
                      "bleu": bleu_of(directory, data, teacher, plugin, k, args.threads),
                      "train_seconds": int(open(os.path.join(directory, "train_seconds")).read())}
    cost, raw = encoder_cost(os.path.join(work, "encoder_cost.json"), data, teacher,
                             [rows[f"k{k}"]["plugin"] for k in args.ratios], args.cost_threads, args.cost_runs,
                             args.force_cost)
    return rows, cost, raw


def glue(args, work):
    glue_work = os.path.join(ROOT, "work", "glue")
    model_dir = os.path.join(glue_work, "minilm-p128")
    flags = json.load(open(os.path.join(model_dir, "import.json")))["fairseq_flags"]
    common = ["--user-dir", "user_dir", "--task", "variator_sentence_prediction", *flags, "--init-token", "0",
              "--num-classes", "2", "--shorten-method", "truncate", "--variator-bottleneck", str(args.bottleneck)]
    from user_dir.tools.glue_predict import predict
    from user_dir.common.glue_metrics import glue_score

    results, costs = {}, {}
    pretrained = {}
    sweep = args.tasks if args.glue_sweep is None else args.glue_sweep
    ratios_of = {task: (args.ratios if task in sweep else [4]) for task in args.tasks}
    for k in sorted({k for ks in ratios_of.values() for k in ks}):  # plugin pre-training: the pre-trained MiniLM, unlabelled SST-2 sentences
        log(f"GLUE pre-training k={k}")
        data = os.path.join(glue_work, "data-bin", "SST-2.wordpiece")
        pretrained[k] = train_plugin(os.path.join(work, "pretrain", f"k{k}"), data, common[2:],
                                     os.path.join(model_dir, "model.pt"), k, args.glue_pretrain_updates,
                                     ["--batch-size", "32"], args.threads)
    for task in args.tasks:
        metric, bsz = GLUE_TASKS[task]
        interval = str(max(1, int(args.glue_updates) // args.glue_validations))
        # checkpoint_best is only written when a checkpoint is saved: save at every validation
        select = (["--best-checkpoint-metric", metric, "--maximize-best-checkpoint-metric",
                   "--save-interval-updates", interval, "--keep-interval-updates", "1"]
                  if args.glue_select == "best" else [])
        data = os.path.join(glue_work, "data-bin", f"{task}.wordpiece")
        teacher = os.path.join(glue_work, task, "checkpoints", "checkpoint_best.pt")
        if not os.path.isfile(teacher):
            log(f"GLUE {task}: no teacher at {teacher} (run scripts/glue_teachers.sh); skipped")
            continue
        _, preds, labels, _ = predict(data, teacher, "valid")
        results[task] = {0: {"scores": glue_score(task, preds, labels), "examples": len(labels)}}
        for k in ratios_of[task]:
            log(f"GLUE {task} adaptation k={k}")
            directory = os.path.join(work, task, f"k{k}")
            plugin = train_plugin(directory, data, common[2:] + ["--glue-task", task, "--variator-plugins",
                                                                  pretrained[k]], teacher, k,
                                  args.glue_updates, ["--batch-size", str(bsz), "--validate-interval-updates",
                                                      interval, *select], args.threads,
                                  export_from=f"checkpoint_{args.glue_select}.pt",
                                  also_last=args.glue_select != "last")
            scores = {}
            for name, path in (("scores", plugin), ("last", os.path.join(directory, "plugin_last.pt")),
                               ("without_adaptation", pretrained[k])):
                if name == "last" and args.glue_select == "last":  # the chosen plugin is the last one
                    scores["last"] = scores["scores"]
                    continue
                _, preds, labels, _ = predict(data, teacher, "valid", variator_plugins=path, variator_ratio=k)
                scores[name] = glue_score(task, preds, labels)
            results[task][k] = {**scores, "plugin": plugin,
                                "train_seconds": int(open(os.path.join(directory, "train_seconds")).read())}
        costs[task] = encoder_cost(os.path.join(work, task, "encoder_cost.json"), data, teacher,
                                   [results[task][k]["plugin"] for k in ratios_of[task]], args.cost_threads,
                                   args.cost_runs, args.force_cost)
    return results, costs


def write_report(args, translation_part, glue_part, out):
    lines = ["# Variator: compression plugins on frozen models", "",
             "Made by `python scripts/bench_variator.py " + " ".join(sys.argv[1:]) + "`. "
             f"Plugins on the FFNs of every encoder layer, bottleneck r = {args.bottleneck}, trained by hidden-state "
             "distillation (MSE of the final encoder states, lambda = 0) with stock `fairseq-train --user-dir user_dir "
             "--task variator_translation|variator_sentence_prediction --criterion variator_distill`.", "",
             "Encoder cost: sequence length 128, batch 16 real-text sequences, FLOPs = 2 x multiply-adds of the "
             "matrix products (analytic, checked against `torch.utils.flop_counter` in one run); speed-up = backbone time / "
             "plugged time of the fastest forward over all runs, backbone and plugins timed in turn within each run "
             "(best-of, as Python's `timeit` advises: on this shared VM the slower timings are other processes taking "
             "the CPU; `user_dir.tools.encoder_cost` prints the median-based ratio beside it).", ""]
    machine = None
    if translation_part:
        rows, cost, raw = translation_part
        machine = raw["machine"]
        teacher_bleu = rows["teacher"]["bleu"]
        lines += ["## Translation: Multi30k DE->EN reference teacher (BLEU, test_2016_flickr, beam 5)", "",
                  f"{args.updates} updates per plugin (max 4,096 tokens each). Backbone: {raw['backbone_params']:,} "
                  f"parameters. Cost measured with {raw['threads']} thread(s).", "",
                  "| plugin | BLEU | drop | added params (% of backbone) | encoder FFN FLOPs saved | encoder FLOPs saved "
                  "| encoder speed-up (len 128) | train time |", "|---|---|---|---|---|---|---|---|",
                  f"| none (teacher) | {teacher_bleu:.2f} | - | 0 | - | - | 1.00x | - |"]
        for k in args.ratios:
            r, c = rows[f"k{k}"], cost[k]
            lines.append(f"| k={k} | {r['bleu']:.2f} | {teacher_bleu - r['bleu']:.2f} | {c['plugin_params']:,} "
                         f"({c['plugin_params_percent']:.2f}%) | {c['ffn_flops_saved_percent']:.1f}% | "
                         f"{c['encoder_flops_saved_percent']:.1f}% | {c['speedup']:.2f}x | {r['train_seconds'] / 60:.0f} min |")
        ablations = [n for n in ("k4-mean", "k4-copy", "k4-att-kv") if n in rows]
        if ablations:
            lines += ["", "Ablations at k=4 (Table 2 and section 4.7), same budget:", "", "| variant | BLEU | drop |",
                      "|---|---|---|", f"| k=4 (learned merge, adapter) | {rows['k4']['bleu']:.2f} | "
                      f"{teacher_bleu - rows['k4']['bleu']:.2f} |"]
            names = {"k4-mean": "w/o Com (mean pooling)", "k4-copy": "w/o DeCom (copy)",
                     "k4-att-kv": "Att-KV (keys/values merged, FFN untouched)"}
            for n in ablations:
                lines.append(f"| {names[n]} | {rows[n]['bleu']:.2f} | {teacher_bleu - rows[n]['bleu']:.2f} |")
        flops = [(c["profiler_flops"], c["analytic_flops"]["total"]) for c in cost.values()]
        lines += ["", "Profiler vs analytic encoder FLOPs (GFLOPs): " + ", ".join(
            f"{p / 1e9:.3f} / {a / 1e9:.3f}" for p, a in flops), ""]
    if glue_part and glue_part[0]:
        results, costs = glue_part
        lines += ["## GLUE: MiniLM-L6 teachers (dev)", "",
                  f"Pre-training: {args.glue_pretrain_updates} updates on SST-2 training sentences with the pre-trained "
                  f"MiniLM; adaptation: {args.glue_updates} updates on each fine-tuned teacher, validated "
                  f"{args.glue_validations} times. Score = accuracy (SST-2, RTE) or F1 (MRPC) of the "
                  + ("checkpoint with the best dev score (as the teachers are chosen)" if args.glue_select == "best"
                     else "last checkpoint") + "; 'last' = after the last update; 'w/o PA' = the pre-trained "
                  "plugin used without adaptation.", "",
                  "| task | k | score | drop | last | w/o PA | added params (%) | encoder FFN FLOPs saved | encoder FLOPs "
                  "saved | encoder speed-up (len 128) | adaptation time |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for task, res in results.items():
            metric = GLUE_TASKS[task][0]
            base = res[0]["scores"][metric]
            lines.append(f"| {task} | none | {base:.2f} | - | - | - | 0 | - | - | 1.00x | - |")
            cost, raw = costs[task]
            machine = machine or raw["machine"]
            for k in sorted(k for k in res if k):
                s, c = res[k]["scores"][metric], cost[k]
                lines.append(f"| {task} | {k} | {s:.2f} | {base - s:.2f} | {res[k]['last'][metric]:.2f} | "
                             f"{res[k]['without_adaptation'][metric]:.2f} | "
                             f"{c['plugin_params']:,} ({c['plugin_params_percent']:.2f}%) | "
                             f"{c['ffn_flops_saved_percent']:.1f}% | {c['encoder_flops_saved_percent']:.1f}% | "
                             f"{c['speedup']:.2f}x | {res[k]['train_seconds'] / 60:.0f} min |")
        lines += ["", "Dev sets are small: " + ", ".join(
            f"{task} {res[0]['examples']} examples (one example = {100 / res[0]['examples']:.2f} points of accuracy)"
            for task, res in results.items()) + ". Speed-ups measured with "
            + ", ".join(f"{task} {raw['threads']} thread(s)" for task, (_, raw) in costs.items()) + ".", ""]
    lines += ["## The paper", "", PAPER, "", f"Machine: {machine}. Date: {time.strftime('%Y-%m-%d')}.", ""]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    open(out, "w").write("\n".join(lines))
    print("\n".join(lines))


def plot(args, translation_part, glue_part, png):
    try:
        import logging
        import matplotlib
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    if translation_part:
        rows, cost, _ = translation_part
        xs = [100.0] + [100 - cost[k]["encoder_flops_saved_percent"] for k in args.ratios]
        ys = [rows["teacher"]["bleu"]] + [rows[f"k{k}"]["bleu"] for k in args.ratios]
        axes[0].plot(xs, ys, "o-")
        for x, y, label in zip(xs, ys, ["none"] + [f"k={k}" for k in args.ratios]):
            axes[0].annotate(label, (x, y))
        axes[0].set(xlabel="encoder FLOPs (% of the backbone)", ylabel="BLEU", title="Multi30k DE->EN")
    if glue_part and glue_part[0]:
        results, costs = glue_part
        for task, res in results.items():
            cost = costs[task][0]
            metric = GLUE_TASKS[task][0]
            ks = sorted(k for k in res if k)
            xs = [100.0] + [100 - cost[k]["encoder_flops_saved_percent"] for k in ks]
            ys = [res[0]["scores"][metric]] + [res[k]["scores"][metric] for k in ks]
            axes[1].plot(xs, ys, "o-", label=f"{task} ({metric})")
        axes[1].set(xlabel="encoder FLOPs (% of the backbone)", ylabel="dev score", title="GLUE (MiniLM-L6)")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["translation", "glue"], choices=["translation", "glue"])
    p.add_argument("--ratios", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--tasks", nargs="+", default=list(GLUE_TASKS), choices=list(GLUE_TASKS))
    p.add_argument("--glue-sweep", nargs="*", default=None, choices=list(GLUE_TASKS),
                   help="GLUE tasks that get every ratio of --ratios; the others get k=4 only (default: all)")
    p.add_argument("--bottleneck", type=int, default=16, help="adapter bottleneck r (paper: 64; see the docstring)")
    p.add_argument("--updates", default="400", help="training updates per translation plugin")
    p.add_argument("--glue-pretrain-updates", default="200")
    p.add_argument("--glue-updates", default="800", help="adaptation updates per GLUE plugin")
    p.add_argument("--glue-validations", type=int, default=8, help="dev evaluations during each GLUE adaptation")
    p.add_argument("--glue-select", default="best", choices=["best", "last"],
                   help="the adapted plugin: the checkpoint with the best dev metric, or the last one")
    p.add_argument("--no-ablations", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each training run")
    p.add_argument("--cost-threads", type=int, default=2, help="torch threads of the timed encoder")
    p.add_argument("--cost-runs", type=int, default=7)
    p.add_argument("--force-cost", action="store_true", help="re-measure encoder cost")
    p.add_argument("--quick", action="store_true", help="a few updates per stage, a smoke test (not results)")
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-variator"))
    p.add_argument("--out", default=os.path.join(ROOT, "results", "variator.md"))
    args = p.parse_args(argv)
    if args.quick:
        args.updates = args.glue_pretrain_updates = args.glue_updates = "4"
        args.cost_runs = 1
        args.work = args.work + "-quick"
        args.out = os.path.join(args.work, "variator.md")
    sys.path.insert(0, ROOT)
    translation_part = translation(args, os.path.join(args.work, "translation")) if "translation" in args.parts else None
    glue_part = glue(args, os.path.join(args.work, "glue")) if "glue" in args.parts else None
    write_report(args, translation_part, glue_part, args.out)
    plot(args, translation_part, glue_part, os.path.splitext(args.out)[0] + "_score_vs_flops.png")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"translation": translation_part[:2] if translation_part else None,
                   "glue": glue_part if glue_part else None}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
