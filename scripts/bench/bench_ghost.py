#!/usr/bin/env python
"""The GhostBERT benchmark: encoders pruned to width multiplier m, "pruned only" against GhostBERT with
the identical procedure (Table 3 / Table 10's comparison), on translation (the encoder of the reference
Multi30k DE->EN teacher shipped in checkpoints/, 4 heads) and on GLUE (the MiniLM-L6 teachers of
scripts/recipes/glue_teachers.sh, 12 heads), written to work/results/ghostbert.md (``--out``; + .json of the raw
numbers, + a PNG of score against encoder FLOPs).

    nice -n 10 python scripts/bench/bench_ghost.py                     # translation: m = 2/4 and 1/4 (resumable)
    nice -n 10 python scripts/bench/bench_ghost.py --glue-task RTE --widths 12/12,6/12,3/12,1/12 --variants pruned,ghost
    python scripts/bench/bench_ghost.py --report-only                  # the table again from the JSON
    python scripts/bench/bench_ghost.py --quick [--glue-task RTE]      # a smoke test of every stage

The seed runs of the committed table (each seed trains in --work/seed<k>/, resumable; --train-only runs of
one seed each may go in parallel, then the same command without --train-only measures and writes):

    nice -n 10 python scripts/bench/bench_ghost.py --variants pruned,ghost,ghost-zero-init --extra 1/4:ghost-no-softmax \\
        --seeds 1,2,3 --out results/ghostbert
    nice -n 10 python scripts/bench/bench_ghost.py --glue-task RTE,MRPC --widths 12/12,6/12,3/12,1/12 \\
        --variants pruned,ghost,ghost-zero-init --seeds 1,2,3 --out results/ghostbert
    nice -n 10 python scripts/bench/bench_ghost.py --glue-task SST-2 --widths 12/12,3/12 --variants pruned,ghost,ghost-zero-init \\
        --seeds 1,2,3 --out results/ghostbert

The JSON keeps one part per GLUE task and the translation part: a run measures its own part (the
translation part, or each task of ``--glue-task``) and keeps every other part.

Translation, per m and variant (``--ghost-positions none`` = pruned only; ``o,ffn2`` = GhostBERT):
1. ``python -m user_dir.ghost.tools.prune`` -- importance on the valid set, rewiring, slicing;
2. ``fairseq-train --criterion ghost_distill --teacher-path TEACHER --finetune-from-model init.pt``
   (embedding + post-MHA + post-FFN MSE, eq 6), ``--distill-updates`` updates;
3. ``fairseq-train --criterion label_smoothed_cross_entropy --finetune-from-model`` the distilled
   checkpoint, ``--finetune-updates`` updates, validated ``--validations`` times at the same points;
4. ``fairseq-generate`` on test, beam 5 (BLEU4 as fairseq reports it), for the initial pruned
   checkpoint (no training), the last checkpoint (the primary number) and the best-of-N (lowest
   validation loss) beside it; the hypotheses are kept detokenised (``hypotheses/*.txt``) for the paired
   test of GhostBERT against pruned only (the cluster test of common/significance.py: test sentences as clusters of all seeds' outputs).
Every stage is bounded by updates and skipped when done (benchlib's stages: DONE + settings.json);
fairseq-train resumes from its own checkpoint_last.pt.

GLUE (``--glue-task TASK[,TASK...]``, any task preprocess/prepare_glue.py handles; the teacher is
``--glue-work``/TASK/checkpoints/checkpoint_best.pt, its data ``--glue-work``/data-bin/TASK.wordpiece, as
scripts/recipes/glue_teachers.sh leaves them), per m (default 12/12, 6/12, 3/12, 1/12) and variant:
1. ``ghost_prune`` with the importance on the held-out selection set (``--glue-importance-subset valid``: a
   slice of train held out at preparation, preprocess/prepare_glue.py --select-fraction; DynaBERT, which the
   paper follows, computes it on the development set, which here only reports; ``train`` is the alternative);
2. ``fairseq-train --task sentence_prediction --criterion ghost_distill`` (eq 6, Table 8's lambdas 0, 1, 1),
   ``--glue-distill-updates`` updates, the last checkpoint kept;
3. ``fairseq-train --criterion glue_sentence_prediction --glue-task TASK`` (cross-entropy, the teachers'
   criterion; MSE with --regression-target for STS-B, read from the teacher), ``--glue-finetune-updates``
   updates, validated ``--glue-validations`` times at the same update points for every variant: the last
   checkpoint is the primary score, the checkpoint with the best held-out ('valid') metric of those validations
   (the paper: "the model with the best development set performance") beside it;
4. dev scores with ``user_dir.tools.glue_predict``'s predictions and ``user_dir.common.glue_metrics``
   (the teachers' scoring), for the untrained pruned checkpoint, the last and the best; the predictions
   are kept as JSON lists (``*.predictions.json``, the gold labels' file named inside) for the paired test
   of GhostBERT against pruned only (the cluster test of common/significance.py: dev examples as clusters of all seeds' outputs).
m = 12/12 with ghost modules is the paper's unpruned "+ghost" row (Table 1, GhostBERT m = 12/12); m = 12/12
pruned only is the teacher given the same two stages (the control). Work folder: ``--work``/seed<k>/glue/TASK/
<teacher run>-<first 8 hex digits of the teacher checkpoint's SHA-256> of each seed's folder, so a retrained teacher never
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

Device: ``--device cuda`` with ``--fp16`` or ``--bf16`` trains, prunes and decodes on the GPU (benchlib.add_device_args;
default the CPU in float32), ``--jobs N`` trains N (seed, m, variant) runs at once; the encoder costs are timed
afterwards, in this process on the CPU, nothing else running.
"""
import argparse
import os
import sys

from benchlib import (ROOT, add_device_args, add_seed_arguments, add_teacher_arguments, bleu_comparison, check_device,
                      default_out, Device, difference, fairseq_bleu, fairseq_train_seconds, fc_flags, fmt,
                      generate_hypotheses, glue_comparison, is_summary, load_parts, logger, minutes_text,
                      multi30k_data_bin, multi30k_references, num, over_seeds, plot_panels, protocol_text, provenance,
                      rel, run_jobs, seed_dir, seeds_of, seeds_text, selection_flags, sha256_of, significance_lines,
                      stage, validation_plan, validation_updates, write_json, write_report)
from glue_bench import (REPORT_SUBSET, chosen_on, glue_scores, glue_setup, glue_train_flags, measure_costs, predictions_path,
                        read_labels, teacher_record)

# what each variant passes to ghost_prune (and so to its architecture); the name labels the table row
VARIANTS = {"pruned": ["--ghost-positions", "none"], "ghost": ["--ghost-positions", "o,ffn2"],
            "ghost-no-softmax": ["--ghost-no-softmax"], "ghost-no-relu": ["--ghost-no-relu"],
            "ghost-k5": ["--ghost-kernel-size", "5"], "ghost-conv2d": ["--ghost-conv", "conv2d"],
            "ghost-conv1d_s": ["--ghost-conv", "conv1d_s"], "ghost-conv1d_f": ["--ghost-conv", "conv1d_f"],
            "ghost-o": ["--ghost-positions", "o"], "ghost-ffn2": ["--ghost-positions", "ffn2"],
            "ghost-ffn1": ["--ghost-positions", "ffn1"], "ghost-qk": ["--ghost-positions", "qk"],
            "ghost-v": ["--ghost-positions", "v"],
            "ghost-zero-init": ["--ghost-positions", "o,ffn2", "--ghost-zero-init"]}
LABELS = {"teacher": "teacher", "teacher-ce": "teacher + the fine-tuning stage (control)", "pruned": "pruned only", "ghost": "GhostBERT",
          "ghost-no-softmax": "GhostBERT - softmax (Table 4)", "ghost-no-relu": "GhostBERT - ReLU (Table 4)",
          "ghost-k5": "GhostBERT, kernel 5 (Table 9)", "ghost-conv2d": "GhostBERT, Conv2D (Table 5)",
          "ghost-conv1d_s": "GhostBERT, Conv1D_S (Table 5)", "ghost-conv1d_f": "GhostBERT, Conv1D_F (Table 5)",
          "ghost-qk": "GhostBERT, after QK only (Conv2D; V, O unpruned; Table 6)",
          "ghost-v": "GhostBERT, after V only (O unpruned; Table 6)", "ghost-o": "GhostBERT, after O only (Table 6)",
          "ghost-ffn2": "GhostBERT, after FFN2 only (Table 6)", "ghost-ffn1": "GhostBERT, after FFN1 only (Table 6)",
          "ghost-zero-init": "GhostBERT, ghost branches starting at zero (--ghost-zero-init; the paper leaves it open)"}
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



log = logger("bench_ghost")
PY = sys.executable


def ghost_train_flags(args, updates, seed):
    return ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr), "--lr-scheduler",
            "polynomial_decay", "--total-num-update", str(updates), "--warmup-updates", "0", "--end-learning-rate",
            "0", "--clip-norm", "1", "--dropout", "0.1", "--weight-decay", "0", "--max-tokens", "2048",
            "--max-update", str(updates), "--log-format", "simple", "--log-interval", "50", "--no-epoch-checkpoints",
            "--num-workers", "0", *Device(args).train_flags(), "--seed", str(seed)]


def translation_plan(args):
    """Every translation variant: --distill-updates unvalidated, then --validations validations at the same
    points of the fine-tuning stage."""
    return validation_plan(args.distill_updates + args.finetune_updates, args.finetune_updates, args.validations,
                           "--validations")


def glue_plan(args):
    return validation_plan(args.glue_distill_updates + args.glue_finetune_updates, args.glue_finetune_updates,
                           args.glue_validations, "--glue-validations")


def translate(checkpoint, args, out):
    """BLEU4 of ``checkpoint`` on test (fairseq-generate, beam 5) and its detokenised hypotheses' file."""
    hyps = generate_hypotheses(args.data, checkpoint, out, args.threads, device=args)
    return fairseq_bleu(hyps + ".generate.log"), hyps


def finetune_result(directory, plan, stage_start, score):
    """The last (primary) and best-of-N checkpoints of a fine-tuning stage scored by ``score(path, which)``,
    and the update counts of the whole budget at which it was validated."""
    ckpt = os.path.join(directory, "checkpoints")
    result = {"last": score(os.path.join(ckpt, "checkpoint_last.pt"), "last"),
              "validations": [stage_start + u for u in validation_updates(os.path.join(directory, "log.txt"))]}
    if len(plan[1]) > 1:  # best-of-1 is the last checkpoint
        result["best"] = score(os.path.join(ckpt, "checkpoint_best.pt"), "best")
    return result


def train_variant(args, m, variant, seed):
    """ghost_prune, distillation, fine-tuning and test BLEU of one (m, variant) of translation, seed ``seed``."""
    work = os.path.join(seed_dir(args.work, seed), f"m{m.replace('/', 'of')}", variant)
    prune_dir, distill, final = (os.path.join(work, name) for name in ("prune", "distill", "finetune"))
    init = os.path.join(prune_dir, "init.pt")
    stage(prune_dir, [[PY, "-m", "user_dir.ghost.tools.prune", args.data, "--path", args.teacher, "--width-mult", m,
                       *VARIANTS[variant], "--out", init, *Device(args).tool(), "--subset", "valid",
                       "--seed", str(seed)]
                      + (["--max-batches", "3"] if args.quick else [])], args.threads)
    arch = fc_flags(init)
    common = [*Device(args).train(), args.data, "--user-dir", "user_dir", *arch]
    plan = translation_plan(args)
    stage(distill, [common + ghost_train_flags(args, args.distill_updates, seed)
                    + ["--criterion", "ghost_distill", "--teacher-path", args.teacher, "--finetune-from-model", init,
                       *selection_flags(plan, 0, args.distill_updates), "--save-dir",
                       os.path.join(distill, "checkpoints")]], args.threads)
    stage(final, [common + ghost_train_flags(args, args.finetune_updates, seed)
                  + ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--finetune-from-model",
                     os.path.join(distill, "checkpoints", "checkpoint_last.pt"),
                     *selection_flags(plan, args.distill_updates, args.finetune_updates, "loss"),
                     "--save-dir", os.path.join(final, "checkpoints")]], args.threads)
    hyps = os.path.join(work, "hypotheses")
    scored = finetune_result(final, plan, args.distill_updates,
                             lambda path, which: translate(path, args, os.path.join(hyps, f"test.{which}.txt")))
    bleu_init, _ = translate(init, args, os.path.join(hyps, "test.init.txt"))
    row = {"m": m, "variant": variant, "init": init, "final": os.path.join(final, "checkpoints", "checkpoint_last.pt"),
           "bleu_init": bleu_init, "bleu": scored["last"][0], "hypotheses": scored["last"][1],
           "validations": scored["validations"],
           "train_seconds": sum(fairseq_train_seconds(os.path.join(d, "log.txt")) for d in (distill, final))}
    if "best" in scored:
        row["bleu_best"] = scored["best"][0]
    return row


def train_control(args, seed):
    """The teacher itself given the fine-tuning stage (``--finetune-updates`` of label-smoothed CE, the same
    flags and validations): what the extra training alone does to this not fully trained teacher."""
    work = os.path.join(seed_dir(args.work, seed), "teacher_ce")
    arch = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "3",
            "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
            "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-all-embeddings"]  # the reference teacher's (its README)
    plan = validation_plan(args.finetune_updates, args.finetune_updates, args.validations, "--validations")
    final = os.path.join(work, "finetune")
    stage(final, [[*Device(args).train(), args.data, "--user-dir", "user_dir", *arch,
                   *ghost_train_flags(args, args.finetune_updates, seed), "--criterion", "label_smoothed_cross_entropy",
                   "--label-smoothing", "0.1", "--finetune-from-model", args.teacher,
                   *selection_flags(plan, 0, args.finetune_updates, "loss"),
                   "--save-dir", os.path.join(final, "checkpoints")]], args.threads)
    hyps = os.path.join(work, "hypotheses")
    scored = finetune_result(final, plan, 0,
                             lambda path, which: translate(path, args, os.path.join(hyps, f"test.{which}.txt")))
    row = {"m": "4/4", "variant": "teacher-ce", "final": os.path.join(final, "checkpoints", "checkpoint_last.pt"),
           "bleu": scored["last"][0], "hypotheses": scored["last"][1], "validations": scored["validations"],
           "train_seconds": fairseq_train_seconds(os.path.join(final, "log.txt"))}
    if "best" in scored:
        row["bleu_best"] = scored["best"][0]
    return row


# ---- GLUE ------------------------------------------------------------------------------------------
def glue_variant(args, setup, task, work, m, variant, lr, seed):
    """ghost_prune, distillation, fine-tuning and dev scores of one (m, variant) of GLUE ``task``."""
    data, teacher = setup["data"], setup["teacher"]
    work = os.path.join(work, f"m{m.replace('/', 'of')}", variant)
    prune_dir, distill, final = (os.path.join(work, name) for name in ("prune", "distill", "finetune"))
    init = os.path.join(prune_dir, "init.pt")
    stage(prune_dir, [[PY, "-m", "user_dir.ghost.tools.prune", data, "--path", teacher, "--width-mult", m,
                       *VARIANTS[variant], "--out", init, *Device(args).tool(), "--subset", args.glue_importance_subset,
                       "--batch-size", str(args.glue_batch_size), "--seed", str(seed)]
                      + (["--max-batches", "3"] if args.quick else [])], args.threads)
    arch = fc_flags(init)
    common = [*Device(args).train(), data, "--user-dir", "user_dir", *setup["task_flags"], *arch]
    plan = glue_plan(args)
    stage(distill, [common + glue_train_flags(args, args.glue_distill_updates, lr, seed)
                    + ["--criterion", "ghost_distill", "--teacher-path", teacher, "--finetune-from-model", init,
                       *selection_flags(plan, 0, args.glue_distill_updates),
                       "--save-dir", os.path.join(distill, "checkpoints")]], args.threads)
    stage(final, [common + glue_train_flags(args, args.glue_finetune_updates, lr, seed)
                  + ["--criterion", "glue_sentence_prediction", "--glue-task", task, "--finetune-from-model",
                     os.path.join(distill, "checkpoints", "checkpoint_last.pt"),
                     *selection_flags(plan, args.glue_distill_updates, args.glue_finetune_updates,
                                      setup["best_metric"], maximize=True),
                     "--save-dir", os.path.join(final, "checkpoints")]], args.threads)
    scored = finetune_result(final, plan, args.glue_distill_updates, lambda path, which: glue_scores(
        path, setup, task, os.path.join(final, f"dev_scores_{which}.json"), args.threads))
    row = {"m": m, "variant": variant, "init": init, "final": os.path.join(final, "checkpoints", "checkpoint_last.pt"),
           "scores_init": glue_scores(init, setup, task, os.path.join(prune_dir, "dev_scores.json"), args.threads),
           "scores": scored["last"], "predictions": predictions_path(os.path.join(final, "dev_scores_last.json")),
           "validations": scored["validations"],
           "train_seconds": sum(fairseq_train_seconds(os.path.join(d, "log.txt")) for d in (distill, final))}
    if "best" in scored:
        row["scores_best"] = scored["best"]
    return row


def glue_part(args, task, runs, header):
    """The GLUE part of ``task``: every (m, variant) of ``runs`` for every seed of ``args.seeds``, the teacher
    row, the costs and the paired comparisons."""
    setup = glue_setup(args, task)
    scores_dir = os.path.join(args.work, "glue", task)
    teacher_scores_file = os.path.join(scores_dir, f"teacher-{teacher_digest(setup)[:8]}.json")
    teacher_scores = glue_scores(setup["teacher"], setup, task, teacher_scores_file, args.threads)
    record = teacher_record(setup["teacher"], setup["metric"], teacher_scores[setup["metric"]])
    lr = args.glue_lr if args.glue_lr is not None else setup["teacher_lr"]
    by_run = {run: {} for run in runs}

    def train(job):
        seed, (m, variant) = job
        log(f"GLUE {task}, seed {seed}: m = {m}, {variant}")
        work = os.path.join(seed_dir(args.work, seed), "glue", task, f"{record['run']}-{record['sha256'][:8]}")
        return glue_variant(args, setup, task, work, m, variant, lr, seed)

    jobs = [(seed, run) for seed in args.seeds for run in runs]
    for (seed, run), row in zip(jobs, run_jobs(train, jobs, args.jobs)):
        by_run[run][seed] = row
    if args.train_only:
        return None
    rows = [{"m": f"{setup['heads']}/{setup['heads']}", "variant": "teacher", "final": setup["teacher"],
             "scores": teacher_scores, "predictions": rel(predictions_path(teacher_scores_file))}]
    rows += [over_seeds(by_run[run]) for run in runs]
    log(f"GLUE {task}: measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args, setup["data"], REPORT_SUBSET)):
        row.update(cost)
    comparisons = []
    for m, variant in runs:
        if variant != "pruned" and (m, "pruned") in by_run:
            a, b = by_run[(m, variant)], by_run[(m, "pruned")]
            comparisons.append(glue_comparison(
                f"{glue_label({'m': m, 'variant': variant}, setup['heads'])} vs pruned only, m = {m}", variant,
                "pruned", [a[s]["predictions"] for s in args.seeds], [b[s]["predictions"] for s in args.seeds],
                read_labels(a[args.seeds[0]]["predictions"]), setup["metric"]))
    return dict(header, load=round(load, 2), teacher=record, metric=setup["metric"], comparisons=comparisons,
                settings={"distill_updates": args.glue_distill_updates, "finetune_updates": args.glue_finetune_updates,
                          "lr": lr, "lr_source": "--glue-lr" if args.glue_lr is not None else "the teacher's",
                          "batch_size": args.glue_batch_size, "validations": args.glue_validations,
                          "plan": list(glue_plan(args)), "best_metric": setup["best_metric"],
                          "importance_subset": args.glue_importance_subset, "work": rel(args.work),
                          "selection": setup["selection"]},
                rows=[{k: (rel(v) if k in ("init", "final") else v) for k, v in r.items()} for r in rows])


def teacher_digest(setup):
    return sha256_of(setup["teacher"])



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



def made_by(p):
    """The part's provenance line (a part made before seeds names its one seed)."""
    if "seeds" in p:
        return (f"Made by `{p['command']}` on {p['machine']} ({p['date']}); {seeds_text(p['seeds'])}; "
                f"{p['threads']} thread(s) per run.")
    return f"Made by `{p['command']}` on {p['machine']} ({p['date']}); seed {p['seed']}."


def translation_section(t):
    rows = t["rows"]
    teacher = rows[0]
    new = "seeds" in t  # a part made with seeds: every score its mean, spread and seeds; best-of-N beside
    lines = [
        "## Translation: the Multi30k DE->EN teacher's encoder pruned, with and without ghost modules",
        "",
        made_by(t),
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
    ]
    if new:
        plan = tuple(t["plan"])
        lines += [protocol_text(t["distill_updates"] + t["finetune_updates"], plan, "validation loss",
                                f"{t['lr']} decaying linearly to 0 over each stage, no warm-up, the same for every "
                                "variant") + " The control row: its fine-tuning stage alone, validated as often. "
                  "Each BLEU: mean +- sample std [min, max] over the seeds, then every seed's value.", "",
                  "| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder speed-up "
                  "[min-max] | BLEU, pruned, untrained | BLEU (last checkpoint) | BLEU, best-of-N | training time |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    else:
        lines += ["| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder "
                  "speed-up [min-max] | BLEU, pruned, untrained | BLEU |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        untrained = fmt(row["bleu_init"]) if "bleu_init" in row else ""
        cells = f"| {LABELS[row['variant']]} | {row['m']} | {cost_cells(row, teacher)} | {untrained} | {fmt(row['bleu'])} |"
        if new:
            minutes = minutes_text(row.get("train_seconds") or None, missing="")
            cells += f" {fmt(row['bleu_best']) if 'bleu_best' in row else '-'} | {minutes} |"
        lines.append(cells)
    by = {(r["m"], r["variant"]): r for r in rows}
    diffs = [f"m = {m}: {fmt_diff(difference(by[(m, 'ghost')]['bleu'], by[(m, 'pruned')]['bleu']))} BLEU "
             f"({by[(m, 'ghost')]['ghost_params']:,} ghost parameters, "
             f"{100.0 * by[(m, 'ghost')]['ghost_params'] / by[(m, 'ghost')]['params']:.3f}% of the model)"
             for m in dict.fromkeys(r["m"] for r in rows) if (m, "ghost") in by and (m, "pruned") in by]
    if diffs:
        lines += ["", "GhostBERT minus pruned only, same procedure: " + "; ".join(diffs) + "."]
    lines += [""] + significance_lines(t.get("comparisons"), "Each variant (A) against pruned only (B), last "
                                       "checkpoints")
    lines += [timing_sentence(t, "test"), ""]
    return lines


def fmt_diff(x):
    """A difference: signed; over seeds, its mean and every seed's value."""
    if not is_summary(x):
        return f"{x:+.2f}"
    each = ", ".join(f"s{s} {v:+.2f}" for s, v in x["values"].items())
    return f"{x['mean']:+.2f} (std {x['std']:.2f}; {each})"


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


def score_text(scores, main=None):
    """Every metric of a scores dict; over seeds, ``main`` with its spread and seeds, the others' means."""
    return " / ".join(f"{METRIC_NAMES[k]} {fmt(v) if k == main or not is_summary(v) else format(num(v), '.2f')}"
                      for k, v in scores.items() if k in METRIC_NAMES)


def glue_label(row, heads):
    full = row["m"] == f"{heads}/{heads}"
    if full and row["variant"] == "pruned":
        return "teacher + the same distillation and fine-tuning (control)"
    if full and row["variant"] == "ghost":
        return "teacher + ghost modules (unpruned, Table 1's GhostBERT m = 12/12)"
    return LABELS[row["variant"]]


def importance_words(settings):
    """The importance pass's data in a report's words: 'valid' was the dev set before the held-out split."""
    subset = settings["importance_subset"]
    return ("held-out (valid)" if chosen_on(settings) == "held-out" else "dev (valid)") if subset == "valid" else subset


def glue_section(task, p):
    rows, s, teacher = p["rows"], p["settings"], p["teacher"]
    heads = int(rows[0]["m"].split("/")[0])
    metric = PAPER_METRIC.get(task, "accuracy")
    new = "seeds" in p
    if new:
        selection = protocol_text(s["distill_updates"] + s["finetune_updates"], tuple(s["plan"]),
                                  f"{chosen_on(s)} {s['best_metric']}", f"{s['lr']:g} ({s['lr_source']}) decaying linearly to 0 "
                                  "over each stage, no warm-up, the same for every variant")
        selection += " Each score: mean +- sample std [min, max] over the seeds, then every seed's value."
    else:
        selection = (f"the model is the fine-tuning checkpoint with the best dev {s.get('best_metric', teacher['metric'])} "
                     f"of {s['validations']} validations ('last': the last checkpoint).")
    lines = [f"## GLUE {task}: the MiniLM-L6 teacher pruned, with and without ghost modules (dev)", "",
             made_by(p), "",
             f"Teacher: `{teacher['checkpoint']}` (run {teacher['run']}, lr {teacher['lr']:g}, "
             f"{teacher.get('updates')} updates, dev {METRIC_NAMES[teacher['metric']]} {teacher['score']:.2f}; "
             f"sha256 {teacher['sha256'][:12]}). m keeps M = floor({heads} m) heads and M of {heads} FFN folds per "
             f"layer, chosen by first-order importance on the {importance_words(s)} set (DynaBERT: dev). Every "
             f"variant gets the identical procedure: {s['distill_updates']} updates of distillation (eq 6), then "
             f"{s['finetune_updates']} updates of cross-entropy (`glue_sentence_prediction`), Table 8's settings "
             f"(batch {s['batch_size']}, Adam (0.9, 0.999), lr {s['lr']:g} ({s['lr_source']}) decaying linearly to "
             "0 without warm-up, weight decay 0, clipping 1, dropout 0.1), no data augmentation"
             f"{'. ' if new else '; '}{selection} Scores: `user_dir.tools.glue_predict` "
             f"+ `user_dir.common.glue_metrics` on the {rows[0]['scores']['examples']} dev examples. Paper: BERT-base, "
             f"dev {METRIC_NAMES[metric]}, the table named.", "",
             "| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder speed-up "
             "[min-max] | dev, pruned, untrained | " + ("dev (last checkpoint) | dev, best-of-N" if new else "dev | dev, last")
             + " | training time | paper (BERT-base) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    key = teacher["metric"]
    for row in rows:
        paper = PAPER_GLUE.get((row["m"], row["variant"]))
        paper_cell = (f"{paper['scores'][task]:.1f} ({paper['source']})" if paper and task in paper["scores"] else "")
        init = score_text(row["scores_init"], key) if "scores_init" in row else ""
        other = row.get("scores_best" if new else "scores_last")
        other = score_text(other, key) if other else ""
        minutes = minutes_text(row.get("train_seconds") or None, missing="")
        lines.append(f"| {glue_label(row, heads)} | {row['m']} | {cost_cells(row, rows[0])} | {init} | "
                     f"{score_text(row['scores'], key)} | {other} | {minutes} | {paper_cell} |")
    by = {(r["m"], r["variant"]): r for r in rows}
    diffs = [f"m = {m}: {fmt_diff(difference(by[(m, 'ghost')]['scores'][key], by[(m, 'pruned')]['scores'][key]))} "
             f"({by[(m, 'ghost')]['ghost_params']:,} ghost parameters, "
             f"{100.0 * by[(m, 'ghost')]['ghost_params'] / by[(m, 'ghost')]['params']:.3f}% of the model)"
             for m in dict.fromkeys(r["m"] for r in rows) if (m, "ghost") in by and (m, "pruned") in by]
    if diffs:
        lines += ["", f"GhostBERT minus pruned only ({METRIC_NAMES[key]}), same procedure: " + "; ".join(diffs) + "."]
    # the second goal is relative to the teacher (at m = 3/12 within 2 points)
    gaps = [f"m = {r['m']}: {fmt_diff(difference(r['scores'][key], rows[0]['scores'][key]))}" for r in rows
            if r["variant"] == "ghost" and r["m"] != rows[0]["m"]]
    if gaps:
        lines += ["", f"GhostBERT minus the teacher ({METRIC_NAMES[key]}): " + "; ".join(gaps) + "."]
    lines += [""] + significance_lines(p.get("comparisons"), "Each variant (A) against pruned only (B), last "
                                       "checkpoints, dev " + METRIC_NAMES[key])
    lines += [timing_sentence(p, "dev"), ""]
    return lines


def write_ghost_report(data, out):
    parts = [("translation", data["translation"])] if data.get("translation") else []
    parts += sorted((data.get("glue") or {}).items())
    lines = ["# GhostBERT: pruned encoders with and without ghost modules", "",
             f"Made by `python scripts/bench/bench_ghost.py` (raw numbers: `{os.path.basename(out)}.json`; plot: "
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
    write_report(out + ".md", "\n".join(lines), plot=(lambda plt, png: plot_ghost(parts, png, plt)) if parts else None,
                 png_path=out + ".png")


def plot_ghost(parts, png, plt=None):
    """Score against encoder FLOPs, one panel per part (a mean over seeds where a part has seeds)."""
    panels, main = [], ("teacher", "teacher-ce", "pruned", "ghost")
    for name, part in parts:
        if name == "translation":
            score, ylabel, title = (lambda r: num(r["bleu"])), "BLEU4 (test, beam 5)", "Multi30k DE->EN"
        else:
            metric = part["teacher"]["metric"]
            heads = int(part["rows"][0]["m"].split("/")[0])
            score, ylabel = (lambda r, metric=metric: num(r["scores"][metric])), f"dev {METRIC_NAMES[metric]}"
            title = f"GLUE {name} (MiniLM-L6 teacher {part['teacher']['run']}; m = {heads}/{heads}: unpruned)"
        lines = []
        for variant, marker in zip(main, ("*", "P", "o", "s")):
            rows = sorted((r for r in part["rows"] if r["variant"] == variant), key=lambda r: r["encoder_flops_128"])
            if rows:
                lines.append(dict(x=[r["encoder_flops_128"] / 1e6 for r in rows], y=[score(r) for r in rows],
                                  marker=marker, ls="-", label=LABELS[variant], notes=[f"m={r['m']}" for r in rows],
                                  note_offset=(4, -10 if variant == "pruned" else 4), note_style=dict(fontsize=8)))
        lines += [dict(x=[r["encoder_flops_128"] / 1e6], y=[score(r)], marker="x", ls="", color="grey",
                       notes=[f"{r['variant']} m={r['m']}"], note_offset=(4, -4),
                       note_style=dict(fontsize=7, color="grey"))
                  for r in part["rows"] if r["variant"] not in main]  # ablations: single points
        panels.append(dict(series=lines, xlabel="encoder FLOPs at length 128 (M)", ylabel=ylabel, title=title,
                           legend=dict(fontsize=8)))
    command = " ; ".join(dict.fromkeys(part["command"] for _, part in parts if part.get("command")))
    return plot_panels(png, panels, command=command or None, figsize=(6 * len(panels), 4), plt=plt)


def translation_only(data):
    """A JSON of the translation-only layout (its rows at the top) as the record whose translation part it is
    (:func:`benchlib.load_parts`), BERT-base's ghost-module costs kept."""
    return {"version": 2, "translation": data, "glue": {},
            "bert_base_ghost_costs": data.get("bert_base_ghost_costs")}




def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_teacher_arguments(parser, scope="translation: ")
    parser.add_argument("--work", default=os.path.join(ROOT, "work", "ghost"))
    parser.add_argument("--out", default=None, help="the table's path without extension (default work/results/ghostbert; "
                        "with --quick: ghostbert in the quick work folder; the committed table: results/ghostbert)")
    parser.add_argument("--widths", default=None, help="width multipliers m, comma-separated (default: translation "
                        "2/4,1/4; GLUE 12/12,6/12,3/12,1/12, the paper's Table 3 and its unpruned row)")
    parser.add_argument("--variants", default="pruned,ghost", help="variants trained at every m: " + ", ".join(VARIANTS))
    parser.add_argument("--extra", default="",
                        help="further m:variant runs, comma-separated (e.g. 1/4:ghost-no-softmax,4/4:ghost)")
    parser.add_argument("--distill-updates", type=int, default=200)
    parser.add_argument("--finetune-updates", type=int, default=60)
    parser.add_argument("--validations", type=int, default=3,
                        help="translation: validations of every variant, at the same points of its fine-tuning stage "
                             "(default 3: every 20 of 60 updates); the last checkpoint is the primary score, the "
                             "best-of-N (validation loss) beside it")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--glue-task", default="", help="GLUE tasks to benchmark instead of translation, comma-"
                        "separated (any task preprocess/prepare_glue.py handles, with a teacher in --glue-work)")
    parser.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                        help="scripts/recipes/glue_teachers.sh's work folder: TASK/checkpoints/checkpoint_best.pt and "
                             "data-bin/TASK.wordpiece")
    parser.add_argument("--glue-distill-updates", type=int, default=240,
                        help="distillation updates (Table 8: 3 epochs at batch 32, 1 for MNLI/QQP; 240 = 3 RTE epochs)")
    parser.add_argument("--glue-finetune-updates", type=int, default=240,
                        help="fine-tuning updates (Table 8: 3 epochs at batch 32; 240 = 3 RTE epochs)")
    parser.add_argument("--glue-lr", type=float, default=None,
                        help="both stages' peak lr (Table 8: 2e-5 for BERT-base; default: the teacher's own lr)")
    parser.add_argument("--glue-batch-size", type=int, default=32, help="sentences per batch (Table 8: 32)")
    parser.add_argument("--glue-validations", type=int, default=4,
                        help="evaluations on the held-out selection set during fine-tuning, at the same update points for "
                             "every variant; the last checkpoint is the primary score, the best of them beside it")
    parser.add_argument("--glue-importance-subset", default="valid", choices=["valid", "train"],
                        help="data of the importance pass: valid, the held-out selection set (DynaBERT, which the paper "
                             "follows, used the dev set, which here only reports), or train")
    add_seed_arguments(parser, default="1")
    parser.add_argument("--threads", type=int, default=1)
    add_device_args(parser)
    parser.add_argument("--jobs", type=int, default=1, help="(seed, m, variant) runs trained at once (default 1)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-batch", type=int, default=16)
    parser.add_argument("--control-only", action="store_true",
                        help="train and score only the control row (the teacher given the fine-tuning stage)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the table from OUT.json")
    parser.add_argument("--train-only", action="store_true",
                        help="train and score, measure nothing (e.g. one process per --widths or per seed in parallel; "
                             "a later run without it finds everything trained and measures)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 3 importance batches, 5+5 updates, 1 validation (GLUE: 6+6, 2 validations)")
    args = parser.parse_args(argv)
    args.seeds = seeds_of(parser, args)
    check_device(parser, args)
    if args.quick:
        args.distill_updates = args.finetune_updates = 5
        args.glue_distill_updates = args.glue_finetune_updates = 6
        args.validations, args.glue_validations = 1, 2
        args.runs, args.repeats = 1, 1
        args.work = args.work + "_quick"
        args.out = args.out or os.path.join(args.work, "ghostbert")
    args.out = args.out or default_out("ghostbert")
    data = load_parts(args.out + ".json", translation_only)
    if args.report_only:
        if not os.path.isfile(args.out + ".json"):
            sys.exit(f"bench_ghost: --report-only: no {args.out}.json to write the table from")
        write_ghost_report(data, args.out)
        return
    tasks = [t for t in args.glue_task.split(",") if t]
    if not tasks or args.control_only:  # translation
        args.data = args.data or multi30k_data_bin()
    if args.control_only:
        for seed in args.seeds:
            train_control(args, seed)
        return
    widths = args.widths or ("12/12,6/12,3/12,1/12" if tasks else "2/4,1/4")
    runs = [(m, v) for m in widths.split(",") for v in args.variants.split(",")]
    runs += [tuple(spec.split(":")) for spec in args.extra.split(",") if spec]
    unknown = [v for _, v in runs if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    # the validation points are checked before anything trains
    glue_plan(args) if tasks else translation_plan(args)
    header = dict(provenance("bench_ghost.py", argv, args.threads, args.seeds), runs=args.runs, repeats=args.repeats,
                  time_batch=args.time_batch)
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
    write_json(args.out + ".json", data)
    write_ghost_report(data, args.out)
    log(f"wrote {args.out}.md")


def translation_part(args, runs, header):
    by_run = {run: {} for run in runs}

    def train(job):
        seed, (m, variant) = job
        log(f"seed {seed}: m = {m}, {variant}")
        return train_variant(args, m, variant, seed)

    jobs = [(seed, run) for seed in args.seeds for run in runs]
    for (seed, run), row in zip(jobs, run_jobs(train, jobs, args.jobs)):
        by_run[run][seed] = row
    if args.train_only:
        return None
    references = multi30k_references(os.path.join(args.work, "test.raw.en"))
    teacher_bleu, teacher_hyps = translate(args.teacher, args, os.path.join(args.work, "teacher", "test.txt"))
    rows = [{"m": "4/4", "variant": "teacher", "final": args.teacher, "bleu": teacher_bleu,
             "hypotheses": rel(teacher_hyps)},
            over_seeds({seed: train_control(args, seed) for seed in args.seeds})]
    rows += [over_seeds(by_run[run]) for run in runs]
    log("measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args, args.data, "test")):
        row.update(cost)
    comparisons = []
    for m, variant in runs:
        if variant != "pruned" and (m, "pruned") in by_run:
            a, b = by_run[(m, variant)], by_run[(m, "pruned")]
            comparisons.append(bleu_comparison(f"{LABELS[variant]} vs pruned only, m = {m}", variant, "pruned",
                                               [a[s]["hypotheses"] for s in args.seeds],
                                               [b[s]["hypotheses"] for s in args.seeds], references))
    return dict(header, teacher=rel(args.teacher), distill_updates=args.distill_updates,
                finetune_updates=args.finetune_updates, lr=args.lr, load=round(load, 2), plan=list(translation_plan(args)),
                validations=args.validations, references=rel(references), comparisons=comparisons,
                rows=[{k: (rel(v) if k in ("init", "final") else v) for k, v in r.items()} for r in rows])


if __name__ == "__main__":
    main()
