#!/usr/bin/env python
"""The GhostBERT benchmark: encoders pruned to width multiplier m, "pruned only" against GhostBERT with
the identical procedure (Table 3 / Table 10's comparison), on translation (the encoder of the reference
Multi30k DE->EN teacher, ../shared/teachers, 4 heads) and on GLUE (the MiniLM-L6 teachers of
scripts/glue_teachers.sh, 12 heads), written to results/ghostbert.md (+ .json of the raw numbers, + a
PNG of score against encoder FLOPs).

    nice -n 10 python scripts/bench_ghost.py                     # translation: m = 2/4 and 1/4 (resumable)
    nice -n 10 python scripts/bench_ghost.py --glue-task RTE --widths 12/12,6/12,3/12,1/12 --variants pruned,ghost
    python scripts/bench_ghost.py --report-only                  # the table again from the JSON
    python scripts/bench_ghost.py --quick [--glue-task RTE]      # a smoke test of every stage

The JSON keeps one part per GLUE task and the translation part: a run measures its own part (the
translation part, or each task of ``--glue-task``) and keeps every other part.

Translation, per m and variant (``--ghost-positions none`` = pruned only; ``o,ffn2`` = GhostBERT):
1. ``python -m user_dir.tools.ghost_prune`` -- importance on the valid set, rewiring, slicing;
2. ``fairseq-train --criterion ghost_distill --teacher-path TEACHER --finetune-from-model init.pt``
   (embedding + post-MHA + post-FFN MSE, eq 6), ``--distill-updates`` updates;
3. ``fairseq-train --criterion label_smoothed_cross_entropy --finetune-from-model`` the distilled
   checkpoint, ``--finetune-updates`` updates;
4. ``fairseq-generate`` on test, beam 5 (BLEU4 as fairseq reports it), for the initial pruned
   checkpoint (no training) and the final one.
Every stage is bounded by updates and skipped when its output exists; fairseq-train resumes from
its own checkpoint_last.pt.

GLUE (``--glue-task TASK[,TASK...]``, any task preprocess/prepare_glue.py handles; the teacher is
``--glue-work``/TASK/checkpoints/checkpoint_best.pt, its data ``--glue-work``/data-bin/TASK.wordpiece, as
scripts/glue_teachers.sh leaves them), per m (default 12/12, 6/12, 3/12, 1/12) and variant:
1. ``ghost_prune`` with the importance on the dev set (``--glue-importance-subset valid``: DynaBERT, which
   the paper follows, computes it on the development set; ``train`` is the alternative);
2. ``fairseq-train --task sentence_prediction --criterion ghost_distill`` (eq 6, Table 8's lambdas 0, 1, 1),
   ``--glue-distill-updates`` updates, the last checkpoint kept;
3. ``fairseq-train --criterion glue_sentence_prediction --glue-task TASK`` (cross-entropy, the teachers'
   criterion; MSE with --regression-target for STS-B, read from the teacher), ``--glue-finetune-updates``
   updates, validated ``--glue-validations`` times: the checkpoint with the best dev metric is the model
   (the paper: "the model with the best development set performance"; the teachers were chosen alike), the
   last checkpoint's score beside it;
4. dev scores with ``user_dir.tools.glue_predict``'s predictions and ``user_dir.common.glue_metrics``
   (the teachers' scoring), for the untrained pruned checkpoint, the best and the last.
m = 12/12 with ghost modules is the paper's unpruned "+ghost" row (Table 1, GhostBERT m = 12/12); m = 12/12
pruned only is the teacher given the same two stages (the control). Work folder: ``--work``/glue/TASK/
<teacher run>-<first 8 hex digits of the teacher checkpoint's SHA-256>, so a retrained teacher never
reuses stale stages; every stage keeps the commands that made it (settings.json) and a DONE file, is
skipped when done, refused when this run's settings differ, and resumes from its checkpoint_last.pt.
Table 8 (GPU, BERT-base): batch 32, lr 2e-5, Adam (0.9, 0.999), no warm-up, linear decay, weight decay
0, clipping 1, dropout and attention dropout 0.1, 3 epochs of distillation (1 for MNLI and QQP) and 3 of
fine-tuning (e.g. RTE: 3 x ceil(2,490 / 32) = 234 updates each; SST-2: 6,315). The CPU-scale defaults
keep Table 8's settings but bound each stage to 240 updates (3 RTE epochs) and use the teacher's own
fine-tuning lr (--glue-lr; the MiniLM teachers needed 5e-5 or more: glue_teachers.sh) unless given;
no data augmentation (not available offline), the same for both variants.

Cost, per model: parameters (total, encoder, ghost modules), encoder FLOPs on one sequence of 128
tokens counted by PyTorch's FlopCounterMode (Appendix A.3's protocol: batch 1, length 128, no
embedding lookup; the DWConv ghost modules, which run as shifted multiply-adds the counter does not
see, added analytically: 2 n d k per module), and the encoder's forward time on ``--time-batch`` sequences
of 128 real tokens (translation: test; GLUE: the task's dev sentences, concatenated), every model timed
against the teacher alternately in each of ``--runs`` runs (speed-up = median over runs of
median(teacher) / median(model)).

Our choices for translation on a CPU budget (the paper's Table 8 is for BERT on GLUE): Adam, lr 5e-4 with
linear decay to 0 and no warm-up (Table 8: linear decay, no warm-up), gradient clipping 1, dropout 0.1,
weight decay 0 (Table 8), ``--max-tokens 2048`` batches; the same for both variants.
"""
import argparse
import functools
import importlib.util
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
TEACHER_DIR = os.path.join(SHARED, "teachers", "multi30k.de-en")
# what each variant passes to ghost_prune (and so to its architecture); the name labels the table row
VARIANTS = {"pruned": ["--ghost-positions", "none"], "ghost": ["--ghost-positions", "o,ffn2"],
            "ghost-no-softmax": ["--ghost-no-softmax"], "ghost-no-relu": ["--ghost-no-relu"],
            "ghost-k5": ["--ghost-kernel-size", "5"], "ghost-conv2d": ["--ghost-conv", "conv2d"],
            "ghost-conv1d_s": ["--ghost-conv", "conv1d_s"], "ghost-conv1d_f": ["--ghost-conv", "conv1d_f"],
            "ghost-o": ["--ghost-positions", "o"], "ghost-ffn2": ["--ghost-positions", "ffn2"],
            "ghost-ffn1": ["--ghost-positions", "ffn1"], "ghost-qk": ["--ghost-positions", "qk"],
            "ghost-v": ["--ghost-positions", "v"]}
LABELS = {"teacher": "teacher", "teacher-ce": "teacher + the fine-tuning stage (control)", "pruned": "pruned only", "ghost": "GhostBERT",
          "ghost-no-softmax": "GhostBERT - softmax (Table 4)", "ghost-no-relu": "GhostBERT - ReLU (Table 4)",
          "ghost-k5": "GhostBERT, kernel 5 (Table 9)", "ghost-conv2d": "GhostBERT, Conv2D (Table 5)",
          "ghost-conv1d_s": "GhostBERT, Conv1D_S (Table 5)", "ghost-conv1d_f": "GhostBERT, Conv1D_F (Table 5)",
          "ghost-qk": "GhostBERT, after QK only (Conv2D; V, O unpruned; Table 6)",
          "ghost-v": "GhostBERT, after V only (O unpruned; Table 6)", "ghost-o": "GhostBERT, after O only (Table 6)",
          "ghost-ffn2": "GhostBERT, after FFN2 only (Table 6)", "ghost-ffn1": "GhostBERT, after FFN1 only (Table 6)"}
# the paper's development-set scores (BERT-base backbone), in its metrics: accuracy except CoLA (Matthews) and
# STS-B (Spearman); MRPC is accuracy there. Keyed by (m, variant): Table 1 (BERT-base, GhostBERT at every m),
# Table 10 (pruned only, same procedure), Table 4 (- softmax, - ReLU), Table 9 (kernel 5), Table 5 (Conv1D_S,
# Conv1D_F, Conv2D), Table 11 (positions, m = 1/12; RTE, SST-2, MRPC, CoLA, STS-B only).
PAPER_COLUMNS = ("MNLI", "QNLI", "QQP", "RTE", "SST-2", "MRPC", "CoLA", "STS-B")
PAPER_METRIC = {"CoLA": "mcc", "STS-B": "spearman"}  # accuracy for the others


def _paper(source, *scores, columns=PAPER_COLUMNS):
    return {"source": source, "scores": dict(zip(columns, scores))}


_T11 = ("RTE", "SST-2", "MRPC", "CoLA", "STS-B")
PAPER_GLUE = {
    ("12/12", "teacher"): _paper("Table 1, BERT-base", 84.5, 92.0, 90.9, 71.1, 92.9, 87.8, 58.1, 89.8),
    ("12/12", "ghost"): _paper("Table 1, GhostBERT m = 12/12", 84.7, 92.3, 91.1, 71.8, 93.0, 88.0, 63.6, 89.7),
    ("9/12", "ghost"): _paper("Table 1", 84.8, 92.1, 91.2, 72.6, 92.6, 87.5, 61.1, 89.8),
    ("6/12", "ghost"): _paper("Table 1", 84.7, 92.2, 91.2, 72.2, 92.9, 87.3, 58.1, 89.2),
    ("3/12", "ghost"): _paper("Table 1", 84.3, 91.6, 91.4, 72.9, 94.6, 86.5, 53.9, 89.2),
    ("1/12", "ghost"): _paper("Table 1", 82.8, 90.0, 90.5, 66.1, 92.8, 86.0, 46.1, 87.8),
    ("9/12", "pruned"): _paper("Table 10", 84.2, 91.5, 91.0, 72.2, 92.4, 86.8, 58.4, 89.4),
    ("6/12", "pruned"): _paper("Table 10", 82.9, 90.6, 90.9, 71.8, 92.1, 86.8, 54.2, 88.4),
    ("3/12", "pruned"): _paper("Table 10", 83.6, 91.1, 90.9, 68.6, 92.6, 85.1, 53.7, 88.5),
    ("1/12", "pruned"): _paper("Table 10", 82.0, 88.9, 90.4, 60.7, 91.2, 83.1, 42.6, 86.4),
    ("3/12", "ghost-no-softmax"): _paper("Table 4", 84.3, 91.5, 90.9, 71.8, 92.3, 85.5, 52.6, 89.1),
    ("3/12", "ghost-no-relu"): _paper("Table 4", 84.0, 91.7, 91.0, 70.8, 92.3, 85.8, 47.6, 88.6),
    ("1/12", "ghost-no-softmax"): _paper("Table 4", 82.6, 90.0, 90.4, 65.3, 92.1, 85.5, 40.8, 88.1),
    ("1/12", "ghost-no-relu"): _paper("Table 4", 82.7, 89.8, 90.6, 60.3, 92.0, 84.8, 37.8, 87.1),
    ("3/12", "ghost-k5"): _paper("Table 9", 92.7, 86.5, 53.5, 89.0, 70.4, columns=("SST-2", "MRPC", "CoLA", "STS-B", "RTE")),
    ("1/12", "ghost-k5"): _paper("Table 9", 92.2, 85.3, 41.1, 87.5, 64.6, columns=("SST-2", "MRPC", "CoLA", "STS-B", "RTE")),
    ("3/12", "ghost-conv1d_s"): _paper("Table 5", 83.6, 91.3, 91.1, 70.0, 92.5, 86.5, 52.3, 89.3),
    ("3/12", "ghost-conv1d_f"): _paper("Table 5", 84.0, 91.5, 91.0, 61.7, 92.2, 87.0, 48.9, 89.0),
    ("3/12", "ghost-conv2d"): _paper("Table 5", 83.7, 91.7, 91.0, 68.2, 92.5, 86.5, 50.4, 89.3),
    ("1/12", "ghost-conv1d_s"): _paper("Table 5", 82.6, 90.1, 90.4, 66.1, 92.0, 85.5, 47.5, 88.2),
    ("1/12", "ghost-conv1d_f"): _paper("Table 5", 82.2, 86.6, 90.0, 54.9, 92.3, 72.8, 31.2, 87.3),
    ("1/12", "ghost-conv2d"): _paper("Table 5", 81.7, 89.2, 90.1, 63.2, 91.7, 83.8, 37.9, 88.0),
    ("1/12", "ghost-qk"): _paper("Table 11", 65.3, 91.9, 85.8, 48.5, 87.9, columns=_T11),
    ("1/12", "ghost-v"): _paper("Table 11", 62.1, 91.6, 86.7, 44.3, 87.7, columns=_T11),
    ("1/12", "ghost-o"): _paper("Table 11", 63.2, 91.7, 85.5, 43.8, 87.8, columns=_T11),
    ("1/12", "ghost-ffn1"): _paper("Table 11", 64.6, 91.2, 84.6, 43.3, 87.7, columns=_T11),
    ("1/12", "ghost-ffn2"): _paper("Table 11", 62.5, 91.5, 84.8, 44.9, 87.7, columns=_T11),
}
PAPER = ("Paper (BERT-base, GLUE dev average, Table 3): pruned 78.2 vs GhostBERT 80.3 at m = 1/12, 81.8 vs 83.1 "
         "at m = 3/12, 82.2 vs 83.5 at m = 6/12; ghost modules add 55.3K parameters and 14.2M FLOPs "
         "to BERT-base (section 3.2.1).")


def log(msg):
    print(f"[bench_ghost {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd, logfile, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    with open(logfile, "a") as f:
        f.write("$ " + shlex.join(str(c) for c in cmd) + "\n")
        f.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_ghost: command failed ({proc.returncode}); see {logfile}")


def train_flags(args, updates):
    return ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr), "--lr-scheduler",
            "polynomial_decay", "--total-num-update", str(updates), "--warmup-updates", "0", "--end-learning-rate",
            "0", "--clip-norm", "1", "--dropout", "0.1", "--weight-decay", "0", "--max-tokens", "2048",
            "--max-update", str(updates), "--log-format", "simple", "--log-interval", "50", "--no-epoch-checkpoints",
            "--num-workers", "0", "--cpu", "--seed", str(args.seed)]


def bleu_of(checkpoint, args, logfile):
    out = logfile + ".bleu"
    if not os.path.isfile(out):
        run([sys.executable, "-m", "fairseq_cli.generate", args.data, "--user-dir", "user_dir", "--path", checkpoint,
             "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", "--cpu"], logfile,
            args.threads)
        with open(logfile) as f:
            scores = re.findall(r"BLEU4 = ([0-9.]+)", f.read())
        with open(out, "w") as f:
            f.write(scores[-1] + "\n")
    return float(open(out).read())


def train_variant(args, m, variant):
    work = os.path.join(args.work, f"m{m.replace('/', 'of')}", variant)
    init = os.path.join(work, "init.pt")
    if not os.path.isfile(init + ".flags"):
        run([sys.executable, "-m", "user_dir.tools.ghost_prune", args.data, "--path", args.teacher, "--width-mult", m,
             *VARIANTS[variant], "--out", init, "--cpu", "--subset", "valid"]
            + (["--max-batches", "3"] if args.quick else []), os.path.join(work, "prune.log"), args.threads)
    arch = open(init + ".flags").read().split()
    distill = os.path.join(work, "distill")
    run([sys.executable, "-m", "fairseq_cli.train", args.data, "--user-dir", "user_dir", *arch,
         *train_flags(args, args.distill_updates), "--criterion", "ghost_distill", "--teacher-path", args.teacher,
         "--finetune-from-model", init, "--save-dir", distill], os.path.join(work, "distill.log"), args.threads)
    final = os.path.join(work, "finetune")
    run([sys.executable, "-m", "fairseq_cli.train", args.data, "--user-dir", "user_dir", *arch,
         *train_flags(args, args.finetune_updates), "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", "0.1", "--finetune-from-model", os.path.join(distill, "checkpoint_last.pt"),
         "--save-dir", final], os.path.join(work, "finetune.log"), args.threads)
    return {"m": m, "variant": variant, "init": init, "final": os.path.join(final, "checkpoint_last.pt"),
            "bleu_init": bleu_of(init, args, os.path.join(work, "generate_init.log")),
            "bleu": bleu_of(os.path.join(final, "checkpoint_last.pt"), args, os.path.join(work, "generate.log"))}


def train_control(args):
    """The teacher itself given the fine-tuning stage (``--finetune-updates`` of label-smoothed CE, the same
    flags): what the extra training alone does to this not fully trained teacher."""
    work = os.path.join(args.work, "teacher_ce")
    arch = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "3",
            "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
            "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-all-embeddings"]  # the reference teacher's (its README)
    run([sys.executable, "-m", "fairseq_cli.train", args.data, "--user-dir", "user_dir", *arch,
         *train_flags(args, args.finetune_updates), "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", "0.1", "--finetune-from-model", args.teacher, "--save-dir", work],
        os.path.join(work, "finetune.log"), args.threads)
    final = os.path.join(work, "checkpoint_last.pt")
    return {"m": "4/4", "variant": "teacher-ce", "final": final,
            "bleu": bleu_of(final, args, os.path.join(work, "generate.log"))}


# ---- GLUE ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bench_variator():
    """scripts/bench_variator.py as a module: its stage bookkeeping (settings.json + DONE), the teacher's
    SHA-256 and its record (run, lr, dev score) are this benchmark's too."""
    spec = importlib.util.spec_from_file_location("bench_variator", os.path.join(ROOT, "scripts", "bench_variator.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage(directory, cmds, threads):
    """Run ``cmds`` once in ``directory`` (bench_variator's stage: skipped when DONE, refused when the folder
    was made by other commands)."""
    try:
        bench_variator().stage(directory, cmds, threads)
    except SystemExit as e:
        sys.exit(str(e.code).replace("bench_variator:", "bench_ghost:"))


def glue_setup(args, task):
    """Teacher, data, task flags and metric of GLUE ``task`` from scripts/glue_teachers.sh's work folder."""
    from fairseq import checkpoint_utils

    from user_dir.common.glue_metrics import BEST_CHECKPOINT_METRIC, TASK_METRICS
    from user_dir.common.task_flags import sentence_prediction_flags
    if task not in TASK_METRICS:
        sys.exit(f"bench_ghost: --glue-task {task}: expected one of {', '.join(TASK_METRICS)}")
    teacher = os.path.join(args.glue_work, task, "checkpoints", "checkpoint_best.pt")
    data = os.path.join(args.glue_work, "data-bin", f"{task}.wordpiece")
    if not os.path.isfile(teacher):
        sys.exit(f"bench_ghost: --glue-task {task}: no teacher at {teacher} (--glue-work); train it first: "
                 f"TASKS={task} bash scripts/glue_teachers.sh")
    if not os.path.isdir(os.path.join(data, "input0")):
        sys.exit(f"bench_ghost: --glue-task {task}: no binarised data at {data} (scripts/glue_teachers.sh prepares it)")
    cfg = checkpoint_utils.load_checkpoint_to_cpu(teacher)["cfg"]
    tcfg = cfg["task"]
    if tcfg.get("_name") != "sentence_prediction":
        sys.exit(f"bench_ghost: {teacher} was trained with --task {tcfg.get('_name')}, not sentence_prediction")
    regression = bool(tcfg.get("regression_target"))
    if task == "STS-B" and not regression:
        sys.exit(f"bench_ghost: {teacher}: STS-B is a regression task, but this teacher was not trained with "
                 "--regression-target --num-classes 1")
    flags = sentence_prediction_flags(tcfg)
    lr, model = cfg["optimization"]["lr"], cfg["model"]
    heads = model["encoder_attention_heads"] if isinstance(model, dict) else model.encoder_attention_heads
    return {"heads": heads, "teacher": teacher, "data": data, "task_flags": flags, "regression": regression,
            "metric": TASK_METRICS[task][0], "best_metric": BEST_CHECKPOINT_METRIC.get(task, TASK_METRICS[task][0]),
            "teacher_lr": float(lr if isinstance(lr, (int, float, str)) else lr[0])}


def glue_train_flags(args, updates, lr):
    """Table 8, bounded by ``updates``: batch --glue-batch-size, Adam (0.9, 0.999), no warm-up, linear decay to
    0, weight decay 0, clipping 1, dropout and attention dropout 0.1."""
    return ["--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6", "--lr", str(lr),
            "--lr-scheduler", "polynomial_decay", "--total-num-update", str(updates), "--warmup-updates", "0",
            "--end-learning-rate", "0", "--clip-norm", "1", "--dropout", "0.1", "--attention-dropout", "0.1",
            "--weight-decay", "0", "--batch-size", str(args.glue_batch_size), "--max-update", str(updates),
            "--log-format", "simple", "--log-interval", "10", "--no-epoch-checkpoints", "--num-workers", "0",
            "--cpu", "--seed", str(args.seed)]


def glue_scores(path, setup, task, out, threads):
    """Dev scores of ``path`` (glue_predict's predictions, glue_metrics' metrics), kept in ``out``."""
    if not os.path.isfile(out):
        import torch

        from user_dir.common.glue_metrics import glue_score
        from user_dir.tools.glue_predict import predict
        torch.set_num_threads(threads)
        _, preds, labels, _ = predict(setup["data"], path, "valid")
        scores = dict(glue_score(task, preds, labels), examples=len(labels))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".tmp", "w") as f:
            json.dump(scores, f)
        os.replace(out + ".tmp", out)
    return json.load(open(out))


def glue_variant(args, setup, task, work, m, variant, lr):
    """ghost_prune, distillation, fine-tuning and dev scores of one (m, variant) of GLUE ``task``."""
    py, data, teacher = sys.executable, setup["data"], setup["teacher"]
    work = os.path.join(work, f"m{m.replace('/', 'of')}", variant)
    prune_dir, distill, final = (os.path.join(work, name) for name in ("prune", "distill", "finetune"))
    init = os.path.join(prune_dir, "init.pt")
    stage(prune_dir, [[py, "-m", "user_dir.tools.ghost_prune", data, "--path", teacher, "--width-mult", m,
                       *VARIANTS[variant], "--out", init, "--cpu", "--subset", args.glue_importance_subset,
                       "--batch-size", str(args.glue_batch_size), "--seed", str(args.seed)]
                      + (["--max-batches", "3"] if args.quick else [])], args.threads)
    arch = open(init + ".flags").read().split()
    common = [py, "-m", "fairseq_cli.train", data, "--user-dir", "user_dir", *setup["task_flags"], *arch]
    stage(distill, [common + glue_train_flags(args, args.glue_distill_updates, lr)
                    + ["--criterion", "ghost_distill", "--teacher-path", teacher, "--finetune-from-model", init,
                       "--disable-validation", "--save-dir", os.path.join(distill, "checkpoints")]], args.threads)
    interval = str(max(1, args.glue_finetune_updates // args.glue_validations))
    stage(final, [common + glue_train_flags(args, args.glue_finetune_updates, lr)
                  + ["--criterion", "glue_sentence_prediction", "--glue-task", task, "--finetune-from-model",
                     os.path.join(distill, "checkpoints", "checkpoint_last.pt"), "--best-checkpoint-metric",
                     setup["best_metric"], "--maximize-best-checkpoint-metric", "--validate-interval-updates",
                     interval, "--save-interval-updates", interval, "--keep-interval-updates", "1",
                     "--save-dir", os.path.join(final, "checkpoints")]], args.threads)
    best, last = (os.path.join(final, "checkpoints", f"checkpoint_{w}.pt") for w in ("best", "last"))
    return {"m": m, "variant": variant, "init": init, "final": best,
            "scores_init": glue_scores(init, setup, task, os.path.join(prune_dir, "dev_scores.json"), args.threads),
            "scores": glue_scores(best, setup, task, os.path.join(final, "dev_scores_best.json"), args.threads),
            "scores_last": glue_scores(last, setup, task, os.path.join(final, "dev_scores_last.json"), args.threads),
            "train_seconds": sum(fairseq_train_seconds(os.path.join(d, "log.txt")) for d in (distill, final))}


def fairseq_train_seconds(log):
    """fairseq's own training wall time, summed over the parts of a resumed run ("done training in N
    seconds"); 0 when not found."""
    if not os.path.isfile(log):
        return 0.0
    return sum(float(x) for x in re.findall(r"done training in ([0-9.]+) seconds", open(log).read()))


def glue_part(args, task, runs, header):
    """The GLUE part of ``task``: every (m, variant) of ``runs``, the teacher row and the costs."""
    setup = glue_setup(args, task)
    scores_dir = os.path.join(args.work, "glue", task)
    teacher_scores = glue_scores(setup["teacher"], setup, task,
                                 os.path.join(scores_dir, f"teacher-{bench_variator().backbone_digest(setup['teacher'])[:8]}.json"),
                                 args.threads)
    record = bench_variator().teacher_record(setup["teacher"], setup["metric"], teacher_scores[setup["metric"]])
    work = os.path.join(scores_dir, f"{record['run']}-{record['sha256'][:8]}")
    lr = args.glue_lr if args.glue_lr is not None else setup["teacher_lr"]
    rows = []
    for m, variant in runs:
        log(f"GLUE {task}: m = {m}, {variant}")
        rows.append(glue_variant(args, setup, task, work, m, variant, lr))
    if args.train_only:
        return None
    rows.insert(0, {"m": f"{setup['heads']}/{setup['heads']}", "variant": "teacher", "final": setup["teacher"], "scores": teacher_scores})
    log(f"GLUE {task}: measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args, setup["data"], "valid")):
        row.update(cost)
    part = dict(header, load=round(load, 2), teacher=record, metric=setup["metric"],
                settings={"distill_updates": args.glue_distill_updates, "finetune_updates": args.glue_finetune_updates,
                          "lr": lr, "lr_source": "--glue-lr" if args.glue_lr is not None else "the teacher's",
                          "batch_size": args.glue_batch_size, "validations": args.glue_validations,
                          "best_metric": setup["best_metric"], "importance_subset": args.glue_importance_subset, "work": bench_variator().rel(work)},
                rows=[{k: (bench_variator().rel(v) if k in ("init", "final") else v) for k, v in r.items()} for r in rows])
    return part



def _cpu_sdpa_flops(query, key, value, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count
    return sdpa_flop_count(query, key, value)  # shapes (FlopCounterMode passes a custom formula shapes)


def _cpu_sdpa_mapping():
    """torch's FlopCounterMode counts the CUDA kernels of scaled_dot_product_attention but not the CPU one,
    which fairseq's MultiheadAttention calls when no attention weights are asked for (the stock encoder
    layers): without this, an unpruned encoder's QK^T and AV products (2 x 2 n^2 d per layer) went uncounted
    while the pruned layers' explicit products were counted."""
    import torch
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {op: _cpu_sdpa_flops} if op is not None else {}


def measure_costs(paths, args, data, subset):
    """Parameters, FLOPs at length 128 and alternating encoder timings of ``paths`` (first: teacher), timed
    on 128-token blocks of ``data``'s ``subset`` sentences."""
    import torch
    from fairseq import checkpoint_utils
    from torch.utils.flop_counter import FlopCounterMode

    import user_dir  # noqa: F401
    from user_dir.common.counting import count_parameters
    from user_dir.common.structured_pruning import transformer_encoder
    from user_dir.ghost.ghost_module import flops_outside_torch_counter
    from user_dir.tools.encoder_cost import real_batch

    cpu_sdpa = _cpu_sdpa_mapping()
    torch.set_num_threads(args.threads)
    models, task = [], None
    for path in paths:
        loaded, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
        models.append(loaded[0].eval())
    tokens = real_batch(task, subset, 128, args.time_batch)
    one = tokens[:1]
    costs = []
    for model in models:
        encoder = transformer_encoder(model)
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
            encoder(one, src_lengths=torch.tensor([one.size(1)]))
        ghost = sum(p.numel() for n, p in model.named_parameters() if ".ghost." in n)
        costs.append({"params": count_parameters(model).total, "encoder_params": sum(
            p.numel() for p in encoder.layers.parameters()), "ghost_params": ghost,
            "encoder_flops_128": counter.get_total_flops() + flops_outside_torch_counter(model, one.size(1))})

    def time_encoder(model):
        encoder = transformer_encoder(model)
        lengths = torch.full((tokens.size(0),), tokens.size(1))
        with torch.no_grad():
            start = time.perf_counter()
            encoder(tokens, src_lengths=lengths)
            return time.perf_counter() - start

    for model in models:  # warm-up
        time_encoder(model)
    ratios = {i: [] for i in range(1, len(models))}
    for r in range(args.runs):
        for i in ratios:
            pair = {0: [], i: []}
            for _ in range(args.repeats):
                for which in ((i, 0) if r % 2 else (0, i)):
                    pair[which].append(time_encoder(models[which]))
            ratios[i].append(statistics.median(pair[0]) / statistics.median(pair[i]))
    for i, cost in enumerate(costs):
        cost["speedup"] = 1.0 if i == 0 else statistics.median(ratios[i])
        cost["speedup_range"] = [1.0, 1.0] if i == 0 else [min(ratios[i]), max(ratios[i])]
    return costs


def ghost_costs_at_bert_base():
    """Parameters and FLOPs (length 128) that each ghost-module setting adds to BERT-base (12 layers,
    d = 768, 12 heads, modules after O and after FFN2; after QK / after V at m = 1/12 as in Table 6,
    with what their unpruned V and O add), from our modules' own counts."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from user_dir.common.structured_pruning import PrunedMultiheadAttention
    from user_dir.ghost.ghost_attention import GhostAttention
    from user_dir.ghost.ghost_module import GhostConfig, GhostLinear, flops_outside_torch_counter
    settings = {"DWConv k=3, F=1, shared (paper default)": GhostConfig(),
                "DWConv k=5": GhostConfig(kernel_size=5), "DWConv F=4": GhostConfig(features=4),
                "DWConv unshared per head (M=12)": GhostConfig(shared=False),
                "Conv1D_S": GhostConfig(conv="conv1d_s"), "Conv1D_F (n = 128)": GhostConfig(conv="conv1d_f"),
                "Conv2D": GhostConfig(conv="conv2d")}
    rows = []
    for name, cfg in settings.items():
        module = GhostLinear(768, 768, 12, cfg)
        rows.append({"setting": name, "params": 2 * 12 * module.ghost_parameter_count(),
                     "flops_128": 2 * 12 * module.ghost_flops(128)})

    def cost(attention):
        x = torch.zeros(128, 1, 768)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            attention(x, x, x)
        return (sum(p.numel() for p in attention.parameters()),
                counter.get_total_flops() + flops_outside_torch_counter(attention, 128))
    pruned = cost(PrunedMultiheadAttention(768, 12, 1))
    for position, label in (("qk", "after QK, Conv2D (m = 1/12; with V and O unpruned)"),
                            ("v", "after V, DWConv (m = 1/12; with O unpruned)")):
        params, flops = cost(GhostAttention(768, 12, 1, position, GhostConfig()))
        rows.append({"setting": label, "params": 12 * (params - pruned[0]), "flops_128": 12 * (flops - pruned[1])})
    return rows


def translation_section(t):
    rows = t["rows"]
    teacher = rows[0]
    lines = [
        "## Translation: the Multi30k DE->EN teacher's encoder pruned, with and without ghost modules",
        "",
        f"Made by `{t['command']}` on {t['machine']} ({t['date']}); seed {t['seed']}.",
        "",
        f"Teacher: `{t['teacher']}` (3+3 layers, d = 256, 4 heads, FFN 1024). Width multiplier m keeps "
        "M = floor(4 m) heads and 1024 M / 4 FFN neurons in every encoder layer, chosen by first-order "
        "importance on the valid set (DynaBERT); the decoder is the teacher's. Both variants get the identical "
        f"procedure: {t['distill_updates']} updates of hidden-state distillation from the teacher "
        f"(eq 6), then {t['finetune_updates']} updates of label-smoothed cross-entropy "
        f"(Adam, lr {t['lr']} decaying linearly to 0, dropout 0.1, clip 1, 2,048-token batches). "
        "No data augmentation (not available offline). The control row is the unpruned teacher given the "
        "fine-tuning stage alone (the teacher stopped on a time limit, still improving: extra training by "
        "itself moves its BLEU). BLEU4: fairseq-generate on test_2016_flickr, beam 5.",
        "",
        "| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder speed-up "
        "[min-max] | BLEU, pruned, untrained | BLEU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        untrained = f"{row['bleu_init']:.2f}" if "bleu_init" in row else ""
        lines.append(f"| {LABELS[row['variant']]} | {row['m']} | {cost_cells(row, teacher)} | {untrained} | "
                     f"{row['bleu']:.2f} |")
    by = {(r["m"], r["variant"]): r for r in rows}
    diffs = [f"m = {m}: {by[(m, 'ghost')]['bleu'] - by[(m, 'pruned')]['bleu']:+.2f} BLEU "
             f"({by[(m, 'ghost')]['ghost_params']:,} ghost parameters, "
             f"{100.0 * by[(m, 'ghost')]['ghost_params'] / by[(m, 'ghost')]['params']:.3f}% of the model)"
             for m in dict.fromkeys(r["m"] for r in rows) if (m, "ghost") in by and (m, "pruned") in by]
    if diffs:
        lines += ["", "GhostBERT minus pruned only, same procedure: " + "; ".join(diffs) + "."]
    lines += ["", timing_sentence(t, "test"), ""]
    return lines


def cost_cells(row, teacher):
    """params | encoder-layer params | ghost params | encoder FLOPs (len 128) | speed-up [min-max]"""
    flops_pct = 100.0 * row["encoder_flops_128"] / teacher["encoder_flops_128"]
    return (f"{row['params']:,} | {row['encoder_params']:,} | {row['ghost_params']:,} | "
            f"{row['encoder_flops_128'] / 1e6:.1f}M ({flops_pct:.1f}%) | {row['speedup']:.2f}x "
            f"[{row['speedup_range'][0]:.2f}-{row['speedup_range'][1]:.2f}]")


def timing_sentence(part, subset):
    return (f"Encoder speed: forward of {part['time_batch']} sequences x 128 real {subset} tokens, "
            f"{part['runs']} runs of {part['repeats']} alternating teacher/model forwards, "
            f"{part['threads']} thread(s), on a machine shared with other jobs (load average "
            f"{part['load']} at the start of the measurement).")


METRIC_NAMES = {"accuracy": "acc", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}


def score_text(scores):
    return " / ".join(f"{METRIC_NAMES[k]} {v:.2f}" for k, v in scores.items() if k in METRIC_NAMES)


def glue_label(row, heads):
    full = row["m"] == f"{heads}/{heads}"
    if full and row["variant"] == "pruned":
        return "teacher + the same distillation and fine-tuning (control)"
    if full and row["variant"] == "ghost":
        return "teacher + ghost modules (unpruned, Table 1's GhostBERT m = 12/12)"
    return LABELS[row["variant"]]


def glue_section(task, p):
    rows, s, teacher = p["rows"], p["settings"], p["teacher"]
    heads = int(rows[0]["m"].split("/")[0])
    metric = PAPER_METRIC.get(task, "accuracy")
    lines = [f"## GLUE {task}: the MiniLM-L6 teacher pruned, with and without ghost modules (dev)", "",
             f"Made by `{p['command']}` on {p['machine']} ({p['date']}); seed {p['seed']}.", "",
             f"Teacher: `{teacher['checkpoint']}` (run {teacher['run']}, lr {teacher['lr']:g}, "
             f"{teacher.get('updates')} updates, dev {METRIC_NAMES[teacher['metric']]} {teacher['score']:.2f}; "
             f"sha256 {teacher['sha256'][:12]}). m keeps M = floor({heads} m) heads and M of {heads} FFN folds per "
             f"layer, chosen by first-order importance on the {s['importance_subset']} set (DynaBERT: dev). Every "
             f"variant gets the identical procedure: {s['distill_updates']} updates of distillation (eq 6), then "
             f"{s['finetune_updates']} updates of cross-entropy (`glue_sentence_prediction`), Table 8's settings "
             f"(batch {s['batch_size']}, Adam (0.9, 0.999), lr {s['lr']:g} ({s['lr_source']}) decaying linearly to "
             "0 without warm-up, weight decay 0, clipping 1, dropout 0.1), no data augmentation; the model is the "
             f"fine-tuning checkpoint with the best dev {s.get('best_metric', teacher['metric'])} of "
             f"{s['validations']} validations ('last': the last checkpoint). Scores: `user_dir.tools.glue_predict` "
             f"+ `user_dir.common.glue_metrics` on the {rows[0]['scores']['examples']} dev examples. Paper: BERT-base, "
             f"dev {METRIC_NAMES[metric]}, the table named.", "",
             "| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder speed-up "
             "[min-max] | dev, pruned, untrained | dev | dev, last | training time | paper (BERT-base) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        paper = PAPER_GLUE.get((row["m"], row["variant"]))
        paper_cell = (f"{paper['scores'][task]:.1f} ({paper['source']})" if paper and task in paper["scores"] else "")
        init = score_text(row["scores_init"]) if "scores_init" in row else ""
        last = score_text(row["scores_last"]) if "scores_last" in row else ""
        minutes = f"{row['train_seconds'] / 60:.0f} min" if row.get("train_seconds") else ""
        lines.append(f"| {glue_label(row, heads)} | {row['m']} | {cost_cells(row, rows[0])} | {init} | "
                     f"{score_text(row['scores'])} | {last} | {minutes} | {paper_cell} |")
    by = {(r["m"], r["variant"]): r for r in rows}
    key = teacher["metric"]
    diffs = [f"m = {m}: {by[(m, 'ghost')]['scores'][key] - by[(m, 'pruned')]['scores'][key]:+.2f} "
             f"({by[(m, 'ghost')]['ghost_params']:,} ghost parameters, "
             f"{100.0 * by[(m, 'ghost')]['ghost_params'] / by[(m, 'ghost')]['params']:.3f}% of the model)"
             for m in dict.fromkeys(r["m"] for r in rows) if (m, "ghost") in by and (m, "pruned") in by]
    if diffs:
        lines += ["", f"GhostBERT minus pruned only ({METRIC_NAMES[key]}), same procedure: " + "; ".join(diffs) + "."]
    # the second goal is relative to the teacher (at m = 3/12 within 2 points)
    gaps = [f"m = {r['m']}: {r['scores'][key] - rows[0]['scores'][key]:+.2f}" for r in rows
            if r["variant"] == "ghost" and r["m"] != rows[0]["m"]]
    if gaps:
        lines += ["", f"GhostBERT minus the teacher ({METRIC_NAMES[key]}): " + "; ".join(gaps) + "."]
    lines += ["", timing_sentence(p, "dev"), ""]
    return lines


def write_report(data, out):
    parts = [("translation", data["translation"])] if data.get("translation") else []
    parts += sorted((data.get("glue") or {}).items())
    lines = ["# GhostBERT: pruned encoders with and without ghost modules", "",
             f"Made by `python scripts/bench_ghost.py` (raw numbers: `{os.path.basename(out)}.json`; plot: "
             f"`{os.path.basename(out)}.png`); each part names the command, machine and date that measured it, and "
             "a run of one part keeps the others.", ""]
    if data.get("translation"):
        lines += translation_section(data["translation"])
    for task, part in sorted((data.get("glue") or {}).items()):
        lines += glue_section(task, part)
    costs = data.get("bert_base_ghost_costs") or []
    lines += [] if not costs else ["## What each ghost-module setting adds to BERT-base", "",
              "12 layers, d = 768, after O and after FFN2 unless the row says otherwise; our modules' counts; the "
              "paper: 55.3K parameters and 14.2M FLOPs for the default; Table 5: Conv1D_F +1M / +1.8G over DWConv "
              "at m = 3/12; Table 6: after QK +13M / +3.4G, after V +7M / +1.6G over after O at m = 1/12, rounded.",
              "", "| setting | parameters | FLOPs at length 128 |", "| --- | --- | --- |"]
    lines += [f"| {r['setting']} | {r['params']:,} | {r['flops_128'] / 1e6:.1f}M |" for r in costs]
    lines += ["", PAPER, ""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    plot(parts, out + ".png")


def plot(parts, png):
    try:
        import logging
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    if not parts:
        return
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4), squeeze=False)
    for ax, (name, part) in zip(axes[0], parts):
        if name == "translation":
            score, ylabel, title = (lambda r: r["bleu"]), "BLEU4 (test, beam 5)", "Multi30k DE->EN"
        else:
            metric = part["teacher"]["metric"]
            heads = int(part["rows"][0]["m"].split("/")[0])
            score, ylabel = (lambda r, metric=metric: r["scores"][metric]), f"dev {METRIC_NAMES[metric]}"
            title = f"GLUE {name} (MiniLM-L6 teacher {part['teacher']['run']}; m = {heads}/{heads}: unpruned)"
        main = ("teacher", "teacher-ce", "pruned", "ghost")
        for variant, marker in zip(main, ("*", "P", "o", "s")):
            rows = sorted((r for r in part["rows"] if r["variant"] == variant), key=lambda r: r["encoder_flops_128"])
            if rows:
                ax.plot([r["encoder_flops_128"] / 1e6 for r in rows], [score(r) for r in rows], marker=marker, ls="-",
                        label=LABELS[variant])
            for r in rows:
                ax.annotate(f"m={r['m']}", (r["encoder_flops_128"] / 1e6, score(r)), textcoords="offset points",
                            xytext=(4, -10 if variant == "pruned" else 4), fontsize=8)
        for r in part["rows"]:
            if r["variant"] not in main:  # ablations: single points
                ax.plot([r["encoder_flops_128"] / 1e6], [score(r)], marker="x", ls="", color="grey")
                ax.annotate(f"{r['variant']} m={r['m']}", (r["encoder_flops_128"] / 1e6, score(r)),
                            textcoords="offset points", xytext=(4, -4), fontsize=7, color="grey")
        ax.set_xlabel("encoder FLOPs at length 128 (M)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def load_existing(path):
    """The JSON beside the table as {"version": 2, "translation", "glue": {task: part}, "bert_base_ghost_costs"};
    a JSON of the translation-only layout (its rows at the top) is its translation part."""
    if not os.path.isfile(path):
        return {"version": 2, "translation": None, "glue": {}}
    data = json.load(open(path))
    if data.get("version") == 2:
        return data
    return {"version": 2, "translation": data, "glue": {},
            "bert_base_ghost_costs": data.get("bert_base_ghost_costs")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(TEACHER_DIR, "data-bin"))
    parser.add_argument("--teacher", default=os.path.join(TEACHER_DIR, "teacher.pt"))
    parser.add_argument("--work", default=os.path.join(ROOT, "work", "ghost"))
    parser.add_argument("--out", default=None, help="the table's path without extension (default results/ghostbert; "
                        "with --quick: ghostbert in the quick work folder)")
    parser.add_argument("--widths", default=None, help="width multipliers m, comma-separated (default: translation "
                        "2/4,1/4; GLUE 12/12,6/12,3/12,1/12, the paper's Table 3 and its unpruned row)")
    parser.add_argument("--variants", default="pruned,ghost", help="variants trained at every m: " + ", ".join(VARIANTS))
    parser.add_argument("--extra", default="",
                        help="further m:variant runs, comma-separated (e.g. 1/4:ghost-no-softmax,4/4:ghost)")
    parser.add_argument("--distill-updates", type=int, default=200)
    parser.add_argument("--finetune-updates", type=int, default=60)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--glue-task", default="", help="GLUE tasks to benchmark instead of translation, comma-"
                        "separated (any task preprocess/prepare_glue.py handles, with a teacher in --glue-work)")
    parser.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                        help="scripts/glue_teachers.sh's work folder: TASK/checkpoints/checkpoint_best.pt and "
                             "data-bin/TASK.wordpiece")
    parser.add_argument("--glue-distill-updates", type=int, default=240,
                        help="distillation updates (Table 8: 3 epochs at batch 32, 1 for MNLI/QQP; 240 = 3 RTE epochs)")
    parser.add_argument("--glue-finetune-updates", type=int, default=240,
                        help="fine-tuning updates (Table 8: 3 epochs at batch 32; 240 = 3 RTE epochs)")
    parser.add_argument("--glue-lr", type=float, default=None,
                        help="both stages' peak lr (Table 8: 2e-5 for BERT-base; default: the teacher's own lr)")
    parser.add_argument("--glue-batch-size", type=int, default=32, help="sentences per batch (Table 8: 32)")
    parser.add_argument("--glue-validations", type=int, default=4,
                        help="dev evaluations during fine-tuning; the best checkpoint is the model")
    parser.add_argument("--glue-importance-subset", default="valid", choices=["valid", "train"],
                        help="data of the importance pass (DynaBERT, which the paper follows: the dev set)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-batch", type=int, default=16)
    parser.add_argument("--control-only", action="store_true",
                        help="train and score only the control row (the teacher given the fine-tuning stage)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the table from OUT.json")
    parser.add_argument("--train-only", action="store_true",
                        help="train and score, measure nothing (e.g. one process per --widths in parallel; a later "
                             "run without it finds everything trained and measures)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 3 importance batches, 5+5 updates (GLUE: 5+6, 2 validations)")
    args = parser.parse_args(argv)
    if args.quick:
        args.distill_updates = args.finetune_updates = args.glue_distill_updates = 5
        args.glue_finetune_updates, args.glue_validations = 6, 2
        args.runs, args.repeats = 1, 1
        args.work = args.work + "_quick"
        args.out = args.out or os.path.join(args.work, "ghostbert")
    args.out = args.out or os.path.join(ROOT, "results", "ghostbert")
    sys.path.insert(0, ROOT)
    data = load_existing(args.out + ".json")
    if args.report_only:
        if not os.path.isfile(args.out + ".json"):
            sys.exit(f"bench_ghost: --report-only: no {args.out}.json to write the table from")
        write_report(data, args.out)
        return
    if args.control_only:
        train_control(args)
        return
    tasks = [t for t in args.glue_task.split(",") if t]
    widths = args.widths or ("12/12,6/12,3/12,1/12" if tasks else "2/4,1/4")
    runs = [(m, v) for m in widths.split(",") for v in args.variants.split(",")]
    runs += [tuple(spec.split(":")) for spec in args.extra.split(",") if spec]
    unknown = [v for _, v in runs if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    header = {"command": "python scripts/bench_ghost.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seed": args.seed, "threads": args.threads,
              "runs": args.runs, "repeats": args.repeats, "time_batch": args.time_batch}
    if tasks:
        for task in tasks:
            part = glue_part(args, task, runs, header)
            if part:
                data["glue"][task] = part
        if args.train_only:
            return
    else:
        data["translation"] = translation_part(args, runs, header)
        if data["translation"] is None:
            return
    data["bert_base_ghost_costs"] = ghost_costs_at_bert_base()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    write_report(data, args.out)
    log(f"wrote {args.out}.md")


def translation_part(args, runs, header):
    rows = []
    for m, variant in runs:
        log(f"m = {m}, {variant}")
        rows.append(train_variant(args, m, variant))
    if args.train_only:
        return None
    teacher_bleu = bleu_of(args.teacher, args, os.path.join(args.work, "teacher", "generate.log"))
    rows.insert(0, {"m": "4/4", "variant": "teacher", "final": args.teacher, "bleu": teacher_bleu})
    rows.insert(1, train_control(args))
    log("measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args, args.data, "test")):
        row.update(cost)
    return dict(header, teacher=os.path.relpath(args.teacher, ROOT), distill_updates=args.distill_updates,
                finetune_updates=args.finetune_updates, lr=args.lr, load=round(load, 2),
                rows=[{k: (os.path.relpath(v, ROOT) if k in ("init", "final") else v) for k, v in r.items()}
                      for r in rows])


if __name__ == "__main__":
    main()
