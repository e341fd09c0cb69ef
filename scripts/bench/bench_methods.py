#!/usr/bin/env python
"""Which method should I use? One teacher compressed with every method, each model deployed in the runtimes that
can run it, everything measured in one run: quality against measured speed and size, the Pareto fronts, and a
recommendation read off them (issue 47).

    python scripts/bench/bench_methods.py                          # the default ladder on the shipped Multi30k teacher
    python scripts/bench/bench_methods.py --methods pet:128x96 variator:4 apc:256 pet:128x96+apc:128 --updates 600
    python scripts/bench/bench_methods.py --smoke --methods pet:64x64 word-kd:64x64 --ct2 int8   # a pipeline check

A method is ``NAME:SETTING`` (a chain: ``pet:128x96+apc:128``, APC on the PET student):

* ``pet:ENCxDEC``      PET student of those widths (scripts/recipes/pet.sh: warm-up on the simplified task, then
                       word-level KD; a fifth of the budget warms up)
* ``word-kd:ENCxDEC``  a plain 2+2-layer Transformer of those widths trained by word-level KD
                       (translation_students.py's word-KD student and command)
* ``variator:K``       a Variator plugin of ratio K on the frozen teacher (scripts/recipes/variator.sh)
* ``ghost:M``          GhostBERT at width multiplier M, e.g. 2/4 (scripts/recipes/ghostbert.sh: prune, distil with
                       three quarters of the budget (GLUE: half), fine-tune with the rest)
* ``pruned:M``         GhostBERT's pruned-only model at M (the same recipe, VARIANT=pruned: no ghost modules)
* ``apc:F``            APC with every FFN compressed to F, finalized to a dense model (scripts/recipes/apc.sh; GLUE:
                       half the budget compresses, the finalized model is fine-tuned with the rest, Table 3's
                       'Finalized')

Every method trains ``--updates`` updates in all (resumable: each recipe skips its finished stages; a stage asked
again with other settings stops); ``--jobs N`` trains N methods at once (the measurements still run one at a time).
Deployment: the fairseq model of every method; CTranslate2 (``--ct2 float32 int8``; fc-export, then fc-ct2 convert)
for what is a stock Transformer after training (PET via fc-export, word-KD, APC finalized, their chains, the
teacher). What cannot run there is refused before anything trains, naming the method and the reason
(``variator:4@ct2-int8``, ``ghost:2/4+apc:128``). Measurement (fc-measure, user_dir/tools/measure.py, every model in
a fresh process, in turn within each run): sacreBLEU on the whole test set (or ``--max-sentences``) at beam 5,
parameters, weights on disk, throughput at ``--batch-size`` and peak memory; then latency at batch 1 on the first
``--latency-sentences`` sentences; ``--threads`` threads per engine.

GLUE (``--glue-task TASK --glue-work DIR``: the teacher DIR/TASK/checkpoints/checkpoint_best.pt and its data
DIR/data-bin/TASK.wordpiece, as scripts/recipes/glue_teachers.sh leaves them). The methods are ``variator:K``,
``ghost:M``, ``pruned:M`` and ``apc:F`` (the same recipes with GLUE_TASK set; M of the teacher's heads, e.g. 3/12;
F below the teacher's FFN size); the default ladder is ``variator:2,4,8``, ``pruned:3/12,6/12,9/12``,
``ghost:3/12,6/12,9/12`` and ``apc:128,384,768`` (MiniLM-L6's FFN is 1536), ``--updates`` 480. Deployment: the
fairseq model of every method, and ONNX Runtime (``--onnx fp32 int8``: fc-export-onnx, user_dir/deploy/export_onnx.py,
its int8 model ONNX Runtime's dynamic quantization, written even where it loses more than the export's bound:
that loss is what this table measures) for the teacher and every model but Variator's (its plugins are no module
of the exported graph: ``variator:4@onnx-int8`` is refused, and so are CTranslate2 for a classifier, the
translation-only methods and chains). Measurement (this script's worker, ``user_dir.deploy.export_onnx``'s
session for ONNX Runtime and export_hf's loader for fairseq, every model in a fresh process, in turn): the task's
metric on the whole dev set (user_dir/common/glue_metrics.py; every runtime reads the same token ids, the exported
tokenizer's encoding of the raw dev text, as scripts/bench/bench_deploy_glue.py), parameters (an ONNX row: those of
the fairseq model it was exported from), the weights on disk (fairseq: the state dict as torch.save writes it,
Variator's plugins included; ONNX: the model file), throughput at ``--batch-size`` (32) on the first
``--speed-examples`` dev examples in padded batches, latency at batch 1 over the first ``--latency-sentences``,
the median of ``--runs`` passes, ``--threads`` intra-op threads, and the worker's peak resident set. A CPU
measurement; ``--device cuda`` trains there.

    python scripts/bench/bench_methods.py --glue-task RTE --glue-work work/glue --jobs 2 --out results/methods_glue_rte
    python scripts/bench/bench_methods.py --glue-task RTE --methods pruned:6/12 apc:384 ghost:6/12@onnx-fp32 --onnx int8

Device: ``--device cuda`` trains and measures the fairseq rows on the GPU (``--fp16`` there only with ``--ct2`` given no
type: fc-measure runs CTranslate2 rows, on the CPU, in their converted type). A GLUE teacher given as ``--teacher``
is refused (``--glue-task``).

Outputs (``--out PREFIX``, default work/results/methods, work/results/methods_glue for GLUE): PREFIX.md (the table,
the fronts, the recommendation and the command behind every point), PREFIX.json, PREFIX.png (quality against
throughput, latency and size, the fronts drawn, the teacher marked).
"""
import argparse
import hashlib
import json
import os
import shlex
import sys
from fractions import Fraction

from benchlib import (ROOT, SHIPPED_TEACHER, Device, add_device_args, add_teacher_arguments, check_device, command_line,
                      default_out, logger, multi30k_data_bin, provenance, provenance_text, run, run_jobs, stage,
                      write_report)
from translation_students import KD, plain_arch, train_command

RECIPES = os.path.join(ROOT, "scripts", "recipes")
log = logger("methods")

# ---- what a method is, what it runs in, what composes -------------------------------------------------------------
METHODS = ("pet", "word-kd", "variator", "ghost", "pruned", "apc")
GLUE_METHODS = ("variator", "ghost", "pruned", "apc")
STOCK_AFTER_TRAINING = {"pet", "word-kd", "apc"}  # a stock Transformer after fc-export / apc_finalize
DEFAULT_LADDER = ["pet:96x64", "pet:128x96", "pet:192x144", "word-kd:128x96", "word-kd:192x144", "variator:2",
                  "variator:4", "variator:8", "ghost:1/4", "ghost:2/4", "ghost:3/4", "apc:128", "apc:256", "apc:512",
                  "pet:128x96+apc:128"]
GLUE_LADDER = ["variator:2", "variator:4", "variator:8", "pruned:3/12", "pruned:6/12", "pruned:9/12", "ghost:3/12",
               "ghost:6/12", "ghost:9/12", "apc:128", "apc:384", "apc:768"]
NOT_IN_CT2 = {
    "variator": "Variator's plugins (the k-vector merge and its adapter around each encoder FFN) are no stock module: "
                "CTranslate2 would run the backbone alone (fc-export refuses them too); it runs in fairseq, plugged",
    "ghost": "GhostBERT's ghost modules (depthwise convolutions after O and FFN2) and its M of N_H heads of width "
             "d/N_H have no CTranslate2 counterpart (fc-export refuses them); it runs in fairseq",
    "pruned": "GhostBERT's pruned model keeps M of N_H heads of width d/N_H, which no CTranslate2 (or stock fairseq) "
              "attention has (fc-export refuses it); it runs in fairseq",
}
NOT_IN_ONNX = {
    "variator": "Variator's plugins (the k-vector merge and its adapter around each encoder FFN) are attached to the "
                "loaded model, no module of the graph fc-export-onnx traces (it refuses Variator models); it runs in "
                "fairseq, plugged",
}
TRANSLATION_ONLY = {
    "pet": "PET shares the parameters of an encoder-decoder Transformer's layers (sequence-level, a translation "
           "recipe)",
    "word-kd": "word-level KD trains a translation student on the teacher's next-token distributions",
}
CT2_ON_GLUE = ("CTranslate2 runs encoder-decoder and decoder-only generators, no sentence classifier: a GLUE model "
               "deploys to ONNX Runtime (@onnx-fp32, @onnx-int8)")
ONNX_ON_TRANSLATION = ("fc-export-onnx exports sentence-prediction classifiers (GLUE); a translation model deploys to "
                       "CTranslate2 (@ct2-float32, @ct2-int8)")
RUNTIMES = ("fairseq", "ct2-float32", "ct2-int8")
GLUE_RUNTIMES = ("fairseq", "onnx-fp32", "onnx-int8")


class Refused(ValueError):
    """A method, setting or combination that cannot be built or deployed, with the reason."""


def parse_setting(method, setting, spec):
    """The checked setting of one method (``spec`` names it in errors)."""
    try:
        if method in ("pet", "word-kd"):
            enc, dec = (int(x) for x in setting.split("x"))
            if enc < 8 or dec < 8 or enc % 4 or dec % 4:
                raise ValueError
            return enc, dec
        if method in ("variator", "apc"):
            value = int(setting)
            if value < 1:
                raise ValueError
            return value
        if method in ("ghost", "pruned"):
            m = Fraction(setting)
            if not 0 < m <= 1:
                raise ValueError
            return setting
    except (ValueError, ZeroDivisionError):
        pass
    what = {"pet": "ENCxDEC widths, multiples of 4 (4 heads), e.g. pet:128x96",
            "word-kd": "ENCxDEC widths, multiples of 4 (4 heads), e.g. word-kd:128x96",
            "variator": "the ratio k, an integer >= 1, e.g. variator:4", "apc": "the FFN size, e.g. apc:256",
            "ghost": "the width multiplier m in (0, 1], e.g. ghost:2/4",
            "pruned": "the width multiplier m in (0, 1], e.g. pruned:2/4"}[method]
    raise Refused(f"--methods {spec}: {setting!r} is not a {method} setting ({what})")


def parse_spec(spec, ct2_types, onnx_types=None):
    """``pet:128x96+apc:128@ct2-int8`` -> dict(name, steps [(method, setting)], runtimes); what cannot be built or
    deployed raises :class:`Refused` naming the method and why. ``onnx_types`` given (a list): a GLUE teacher's
    methods, deployed in fairseq and ONNX Runtime of those types."""
    glue = onnx_types is not None
    body, _, runtime = spec.partition("@")
    steps, parts = [], body.split("+")
    for part in parts:
        method, sep, setting = part.partition(":")
        if method not in METHODS:
            raise Refused(f"--methods {spec}: unknown method {method!r} (one of "
                          f"{', '.join(GLUE_METHODS if glue else METHODS)})")
        if glue and method in TRANSLATION_ONLY:
            raise Refused(f"--methods {spec}: {method} is a translation method, refused on GLUE: "
                          f"{TRANSLATION_ONLY[method]}; the GLUE methods: {', '.join(GLUE_METHODS)}")
        if not sep:
            raise Refused(f"--methods {spec}: {method} needs a setting ({method}:SETTING)")
        steps.append((method, parse_setting(method, setting, spec)))
    if len(steps) > 2:
        raise Refused(f"--methods {spec}: at most two methods chain (a student, then APC on it)")
    if len(steps) == 2:
        (first, _), (second, _) = steps
        if first not in ("pet", "word-kd") or second != "apc":
            reason = {
                "variator": "Variator's plugins sit on a frozen backbone and are trained against it: compress first, "
                            "then train plugins on the result is a separate backbone; chained here they are not",
                "ghost": "GhostBERT's ghost modules are no stock Transformer layer: APC and CTranslate2 cannot take "
                         "its output",
                "pruned": "GhostBERT's pruned model keeps M of N_H heads of width d/N_H: APC's init "
                          "(user_dir/apc/tools/init.py) compresses a stock transformer or hf_bert",
                "apc": "APC compresses a trained model: it comes last (pet:ENCxDEC+apc:F)",
            }.get(first, f"{second} after {first} does not compose: the chains are a PET or word-KD student, then APC "
                         "(pet:ENCxDEC+apc:F)")
            raise Refused(f"--methods {spec}: refused: {reason}")
    last = steps[-1][0]
    if runtime:
        if runtime not in RUNTIMES + GLUE_RUNTIMES:
            raise Refused(f"--methods {spec}: unknown runtime {runtime!r} (one of "
                          f"{', '.join(GLUE_RUNTIMES if glue else RUNTIMES)})")
        if runtime.startswith("ct2-") and (glue or last in NOT_IN_CT2):
            reasons = ([NOT_IN_CT2[last]] if last in NOT_IN_CT2 else []) + ([CT2_ON_GLUE] if glue else [])
            raise Refused(f"--methods {spec}: {last} cannot run in CTranslate2: {'; '.join(reasons)}")
        if runtime.startswith("onnx-") and not glue:
            raise Refused(f"--methods {spec}: {last} cannot run in ONNX Runtime here: {ONNX_ON_TRANSLATION}")
        if runtime.startswith("onnx-") and last in NOT_IN_ONNX:
            raise Refused(f"--methods {spec}: {last} cannot run in ONNX Runtime: {NOT_IN_ONNX[last]}")
        runtimes = [runtime]
    elif glue:
        runtimes = ["fairseq"] + ([f"onnx-{t}" for t in onnx_types] if last not in NOT_IN_ONNX else [])
    else:
        runtimes = ["fairseq"] + ([f"ct2-{t}" for t in ct2_types] if last in STOCK_AFTER_TRAINING else [])
    return {"name": body, "steps": steps, "parts": parts, "runtimes": runtimes}


def slug(name):
    return name.replace(":", "-").replace("/", "_")


def shown(cmd):
    """A command as the report shows it: this interpreter written python, the checkout's paths relative."""
    return command_line(cmd).replace(sys.executable, "python").replace(ROOT + "/", "")


# ---- the Pareto fronts and the recommendation (pure) ---------------------------------------------------------------
def pareto_front(points, x_larger_is_better=True):
    """Indices of the points ``[(x, quality), ...]`` that no other point dominates (at least as good on both axes and
    better on one; quality: larger is better, x: larger or smaller by ``x_larger_is_better``). Equal points are
    both on the front. Sorted by x, best x last."""
    sign = 1 if x_larger_is_better else -1

    def dominates(a, b):
        return sign * a[0] >= sign * b[0] and a[1] >= b[1] and (sign * a[0] > sign * b[0] or a[1] > b[1])

    front = [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(front, key=lambda i: sign * points[i][0])


def recommend(rows, reference, speedups=(2, 3, 5), losses=(0.5, 1, 2), size_ratios=(2, 4, 8)):
    """One line per quality loss and axis, read off the measured rows: the largest speed-up target (throughput over
    ``reference``) that some row within that loss of the reference's quality meets, and the best-quality such row
    (ties: the faster, then the smaller); then the next target, which none meets, with the fastest row within the
    loss. The same for size (the weights at most 1/R of the reference's). Each row: dict(name, runtime, quality,
    speedup, size_mb)."""
    ref = next(r for r in rows if r["name"] == reference["name"] and r["runtime"] == reference["runtime"])

    def described(r):
        return f"{r['name']} in {r['runtime']} ({r['quality']:.2f}, {r['speedup']:.2f}x, {r['size_mb']:.1f} MB)"

    lines = []
    for axis, targets in (("speed", speedups), ("size", size_ratios)):
        goal = (lambda t: f">= {t}x the teacher's throughput") if axis == "speed" else (
            lambda t: f"<= 1/{t} of the teacher's size")
        meets = (lambda r, t: r["speedup"] >= t) if axis == "speed" else (
            lambda r, t: r["size_mb"] * t <= ref["size_mb"])
        for loss in losses:
            within = [r for r in rows if r["quality"] >= ref["quality"] - loss - 1e-9 and r is not ref]
            met, missed = None, None
            for target in targets:
                chosen = [r for r in within if meets(r, target)]
                if not chosen:
                    missed = target
                    break
                met = (target, max(chosen, key=lambda r: (r["quality"], r["speedup"], -r["size_mb"])))
            line = f"at <= {loss:g} point(s) of quality lost: "
            if met:
                line += f"for {goal(met[0])}, {described(met[1])}"
            if missed is not None:
                near = (max(within, key=lambda r: r["speedup"]) if axis == "speed"
                        else min(within, key=lambda r: r["size_mb"])) if within else None
                line += ("; " if met else "") + f"none measured reaches {goal(missed)}" + (
                    f" (the {'fastest' if axis == 'speed' else 'smallest'}: {described(near)})" if near else "")
            lines.append(line)
    return lines


# ---- the run -------------------------------------------------------------------------------------------------------
def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_teacher_arguments(p, "the translation teacher every method compresses")
    p.add_argument("--methods", nargs="+", default=None,
                   help="METHOD:SETTING[+apc:F][@RUNTIME] ... (default: the ladder " + " ".join(DEFAULT_LADDER) +
                        "; GLUE: " + " ".join(GLUE_LADDER) + ")")
    p.add_argument("--ct2", nargs="*", default=["float32", "int8"], choices=["float32", "int8"],
                   help="CTranslate2 weight types every stock-Transformer model (and the teacher) is deployed in "
                        "(default float32 int8; none: fairseq only)")
    glue = p.add_argument_group("GLUE (a sentence-prediction teacher instead of translation)")
    glue.add_argument("--glue-task", default=None,
                      help="compress the GLUE teacher of this task (RTE, MRPC, SST-2, ...) instead of a translation "
                           "teacher")
    glue.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                      help="scripts/recipes/glue_teachers.sh's work folder(s), comma-separated: the first holding "
                           "TASK/checkpoints/checkpoint_best.pt gives the teacher, its data-bin/TASK.wordpiece the "
                           "data (default work/glue)")
    glue.add_argument("--onnx", nargs="*", default=["fp32", "int8"], choices=["fp32", "int8"],
                      help="ONNX Runtime types every exportable GLUE model (and the teacher) is deployed in (default "
                           "fp32 int8; none: fairseq only)")
    glue.add_argument("--speed-examples", type=int, default=256,
                      help="GLUE: dev examples of the throughput passes (default 256; the score uses all)")
    p.add_argument("--updates", type=int, default=None,
                   help="training updates of every method (default 400: a CPU budget, the recipes' own defaults are "
                        "300-400; GLUE 480, the recipes' 240 + 240)")
    p.add_argument("--seed", type=int, default=1, help="training seed of every method (default 1)")
    p.add_argument("--threads", type=int, default=1, help="threads of every training and of every engine measured "
                                                         "(torch threads / CTranslate2 intra_threads / ONNX Runtime "
                                                         "intra_op_num_threads; default 1)")
    p.add_argument("--jobs", type=int, default=1, help="methods trained (and models exported) at once (default 1); "
                                                      "the measurements run one at a time")
    add_device_args(p)  # the recipes train and the fairseq rows are measured there; CTranslate2 runs on the CPU
    p.add_argument("--batch-size", type=int, default=None, help="sentences per batch of the throughput measurement "
                                                               "(default 64, the recipes' measurement batch; GLUE 32)")
    p.add_argument("--latency-sentences", type=int, default=100,
                   help="sentences run one at a time for the batch-1 latency (default 100)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5, as the papers)")
    p.add_argument("--runs", type=int, default=2, help="timed runs per model, the median reported (default 2)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only test ids below N (default: all; "
                                                                   "translation only)")
    p.add_argument("--smoke", action="store_true",
                   help="a pipeline check: the recipes' SMOKE=1 budgets (2-3 updates), 3 word-KD updates, one run, "
                        "20 test sentences decoded to at most 1.2 x their length + 10 tokens (GLUE: the whole dev "
                        "set, 32 examples timed) and 5 for latency unless given; the numbers mean nothing")
    p.add_argument("--work", default=None, help="trained and converted models (default work/methods, "
                                                "work/methods-smoke with --smoke; GLUE: work/methods-glue-TASK)")
    p.add_argument("--out", default=None, help="output prefix: PREFIX.md, .json, .png (default "
                                               "work/results/methods, GLUE work/results/methods_glue; "
                                               "results/methods_NAME for the committed ones)")
    p.add_argument("--glue-worker", default=None, help=argparse.SUPPRESS)  # one GLUE measurement (a spec JSON)
    return p


class Driver:
    def __init__(self, args, specs, glue=None):
        self.args, self.specs, self.glue = args, specs, glue  # glue: glue_bench.glue_setup's dict of a GLUE teacher
        self.work = os.path.abspath(args.work)
        self.device = Device(args)
        self.commands = {}  # model name -> the commands that made it (recipe, export, conversion)

    def recipe(self, name, script, env, budget, workdir):
        """One recipe run as a resumable stage; its own stages resume inside it. ``budget``: the variables that set
        its updates (and, for PET, its own check measurement: 100 sentences, this driver measures the whole test set),
        left out under --smoke (the recipe's SMOKE=1 sets its own)."""
        env = dict(env, **({} if self.args.smoke else budget))
        env = dict(env, TEACHER=env.get("TEACHER", self.args.teacher), DATA=self.data, SEED=str(self.args.seed),
                   DEVICE_FLAGS=" ".join(self.device.fairseq()), RUNS="1", SMOKE="1" if self.args.smoke else "0",
                   **({"GLUE_TASK": self.args.glue_task} if self.glue else {}))
        cmd = ["env", *[f"{k}={v}" for k, v in sorted(env.items())], "bash", os.path.join(RECIPES, script), workdir]
        log(f"{name}: {script} -> {workdir}")
        stage(os.path.join(workdir, "bench"), [cmd], self.args.threads, logfile=os.path.join(workdir, "bench.log"))
        self.commands.setdefault(name, []).append(cmd)

    def prepare_data(self):
        if self.glue:
            self.data = os.path.abspath(self.glue["data"])
        elif self.args.data:
            self.data = os.path.abspath(self.args.data)
        elif os.path.realpath(self.args.teacher) == os.path.realpath(SHIPPED_TEACHER):
            self.data = multi30k_data_bin()
            with open(self.data + ".log") as f:  # its command, as benchlib.run logged it
                self.commands["data"] = [shlex.split(line[2:]) for line in f if line.startswith("$ ")][:1]
        else:
            sys.exit(f"--data: the data-bin {self.args.teacher} was trained on (only the shipped teacher's is built "
                     "here)")

    def train(self, name, steps, teacher=None):
        """Train the last step of ``steps`` (its predecessors already trained); returns its fairseq checkpoint."""
        method, setting = steps[-1]
        a, n = self.args, self.args.updates
        workdir = os.path.join(self.work, "train", slug(name))
        env = {"TEACHER": teacher} if teacher else {}
        if method == "pet":
            warmup = n // 5
            self.recipe(name, "pet.sh", dict(env, ENC_DIM=setting[0], DEC_DIM=setting[1]),
                        {"WARMUP_UPDATES": warmup, "KD_UPDATES": n - warmup, "MEASURE_EXTRA": "--max-sentences 100"},
                        workdir)
            return os.path.join(workdir, "kd", "checkpoint_best.pt")
        if method == "variator":
            self.recipe(name, "variator.sh", dict(env, K=setting), {"UPDATES": n}, workdir)
            # GLUE: the exported plugin, run on the teacher (glue_predict's --variator-plugins)
            return os.path.join(workdir, f"plugin-k{setting}.pt") if self.glue else \
                os.path.join(workdir, "plugin", "checkpoint_last.pt")
        if method in ("ghost", "pruned"):
            distill = n // 2 if self.glue else 3 * n // 4  # GLUE: the recipe's (and Table 8's) equal halves
            variant = {"VARIANT": "pruned"} if method == "pruned" else {}  # the recipe's default: ghost
            self.recipe(name, "ghostbert.sh", dict(env, WIDTH=setting, **variant),
                        {"DISTILL_UPDATES": distill, "FINETUNE_UPDATES": n - distill}, workdir)
            return os.path.join(workdir, "finetune", "checkpoint_best.pt")
        if method == "apc" and self.glue:  # compression, finalize, then Table 3's 'Finalized' fine-tuning
            self.recipe(name, "apc.sh", dict(env, ENCODER_FFN_DIMS=setting),
                        {"COMPRESS_UPDATES": n // 2, "FINETUNE_UPDATES": n - n // 2}, workdir)
            return os.path.join(workdir, "finalize", "apc.pt") if a.smoke else \
                os.path.join(workdir, "finetune", "checkpoint_last.pt")
        if method == "apc":
            self.recipe(name, "apc.sh", dict(env, ENCODER_FFN_DIMS=setting, DECODER_FFN_DIMS=setting),
                        {"COMPRESS_UPDATES": n}, workdir)
            return os.path.join(workdir, "finalize", "apc.pt")
        # word-kd: the translation benchmark's word-KD student and command
        updates, extra = (3, ["--max-valid-steps", "2"]) if a.smoke else (n, [])
        cmd = [*self.device.train(),
               *train_command(self.data, teacher or a.teacher, plain_arch(*setting), KD, updates, a.seed, 500, workdir,
                              None, ["--num-workers", "0", *extra], device=self.device)]
        log(f"{name}: word-KD -> {workdir}")
        stage(workdir, [cmd], a.threads, logfile=os.path.join(workdir, "train.log"))
        self.commands.setdefault(name, []).append(cmd)
        return os.path.join(workdir, "checkpoint_best.pt")

    def stock(self, name, checkpoint, method):
        """A stock fairseq Transformer of ``checkpoint`` (PET via fc-export; the others are one already)."""
        if method != "pet":
            return checkpoint
        out = os.path.join(self.work, "deploy", slug(name), "plain.pt")
        cmd = [sys.executable, "-m", "user_dir.deploy.export", checkpoint, "--out", out]
        stage(os.path.dirname(out) + "/export", [cmd], self.args.threads)
        self.commands.setdefault(name, []).append(cmd)
        return out

    def ct2(self, name, stock_checkpoint, quantization):
        out = os.path.join(self.work, "deploy", slug(name), f"ct2-{quantization}")
        cmd = [sys.executable, "-m", "user_dir.deploy.ct2_engine", "convert", stock_checkpoint, "--data", self.data,
               "--out", out, "--quantization", quantization]
        stage(out + ".stage", [cmd], self.args.threads)
        return out, cmd

    def onnx(self, name, checkpoint, int8):
        """fc-export-onnx of ``checkpoint``: DIR/model.onnx (+ model.int8.onnx); the int8 model written whatever it
        loses (--int8-warn-only: its loss is what the table measures)."""
        out = os.path.join(self.work, "deploy", slug(name), "onnx" if int8 else "onnx-fp32-only")
        cmd = [sys.executable, "-m", "user_dir.deploy.export_onnx", checkpoint, "--out", out, "--data", self.data,
               *(["--int8-warn-only"] if int8 else ["--no-int8"])]
        stage(out + ".stage", [cmd], self.args.threads)
        return out, cmd

    def deploy(self, name, checkpoint, stock_checkpoint, runtimes):
        """{runtime: (path, [commands])} of one model in its non-fairseq runtimes."""
        out = {}
        if any(r.startswith("onnx-") for r in runtimes):
            folder, cmd = self.onnx(name, checkpoint, "onnx-int8" in runtimes)
            for r in runtimes:
                if r.startswith("onnx-"):
                    out[r] = (os.path.join(folder, "model.int8.onnx" if r == "onnx-int8" else "model.onnx"), [cmd])
        for r in runtimes:
            if r.startswith("ct2-"):
                path, cmd = self.ct2(name, stock_checkpoint, r[len("ct2-"):])
                out[r] = (path, [cmd])
        return out

    def build(self):
        """Every point: dict(name, method, runtime, path, commands; GLUE Variator: backbone and ratio). Training
        depth by depth (a chain's APC needs its student), then the conversions, ``--jobs`` at a time each."""
        a = self.args
        trained, stocked = {}, {}
        for depth in range(max(len(s["steps"]) for s in self.specs)):
            todo = {}
            for spec in self.specs:
                name = "+".join(spec["parts"][:depth + 1])
                if len(spec["steps"]) > depth and name not in trained:
                    todo[name] = (spec["steps"][:depth + 1], stocked.get("+".join(spec["parts"][:depth])))

            def train(item):
                name, (steps, teacher) = item
                checkpoint = self.train(name, steps, teacher)
                return checkpoint, self.stock(name, checkpoint, steps[-1][0])
            for name, (checkpoint, stock) in zip(todo, run_jobs(train, list(todo.items()), a.jobs)):
                trained[name], stocked[name] = checkpoint, stock
        teacher_runtimes = ["fairseq"] + ([f"onnx-{t}" for t in a.onnx] if self.glue else [f"ct2-{t}" for t in a.ct2])
        models = [("teacher", "teacher", a.teacher, a.teacher, teacher_runtimes)]
        models += [(s["name"], "+".join(m for m, _ in s["steps"]), trained[s["name"]], stocked[s["name"]],
                    s["runtimes"]) for s in self.specs]
        deployed = run_jobs(lambda m: self.deploy(m[0], m[2], m[3], m[4]), models, a.jobs)
        points = []
        for (name, method, checkpoint, _, runtimes), converted in zip(models, deployed):
            for runtime in runtimes:
                point = {"name": name, "method": method, "runtime": runtime, "path": checkpoint}
                if runtime != "fairseq":
                    point["path"], point["extra_commands"] = converted[runtime]
                elif self.glue and method == "variator":
                    point.update(backbone=a.teacher, ratio=dict(self.specs_by_name()[name]["steps"])["variator"])
                points.append(point)
        for p in points:  # every step of the chain, then this point's own conversion
            steps = [k for k in self.commands if p["name"] == k or p["name"].startswith(k + "+")]
            chain = [c for key in steps for c in self.commands[key]]
            p["commands"] = [shown(c) for c in chain + p.pop("extra_commands", [])]
        return points

    def specs_by_name(self):
        return {s["name"]: s for s in self.specs}

    def measure(self, points, batch_size, max_sentences, label):
        """fc-measure over every point in one call (a stage: a run with the same points reuses it)."""
        a = self.args
        names = [f"{p['name']}@{p['runtime']}" for p in points]
        paths = [p["path"] for p in points]
        digest = hashlib.sha1("\n".join(names + paths).encode()).hexdigest()[:10]
        out = os.path.join(self.work, "measure", f"{label}-{digest}")
        raw = os.path.join(self.data, "text", "test.raw.en")
        cmd = [sys.executable, "-m", "user_dir.tools.measure", self.data, "--path", *paths, "--names", *names,
               "--beam", str(a.beam), "--batch-size", str(batch_size), "--runs", str(a.runs), "--threads",
               str(a.threads), *self.device.measure(), *(["--raw-reference", raw] if os.path.isfile(raw) else []),
               *(["--max-sentences", str(max_sentences)] if max_sentences else []),
               *(["--max-len-a", "1.2", "--max-len-b", "10"] if a.smoke else []),  # the recipes' SMOKE=1 bound
               "--out", os.path.join(out, "table.md"), "--json", os.path.join(out, "table.json")]
        log(f"measure ({label}): {len(points)} models, batch {batch_size}")
        stage(out, [cmd], a.threads)
        import json
        with open(os.path.join(out, "table.json")) as f:
            rows = {r["name"]: r for r in json.load(f)["rows"]}
        return [rows[n] for n in names], shown(cmd)


    def glue_inputs(self):
        """The dev set as every runtime reads it (bench_deploy_glue.dev_inputs: the exported tokenizer's encoding of
        the raw dev text, its gold labels, the map to the fairseq dictionary), kept as one file for the workers."""
        out = os.path.join(self.work, "measure", "dev_inputs.pt")
        if not os.path.isfile(out):
            import torch

            from bench_deploy_glue import dev_inputs
            from user_dir.deploy.export_hf import hf_tokenizer, prepared_settings
            tokenizer = os.path.join(self.work, "measure", "tokenizer")
            hf_tokenizer(prepared_settings(self.data)).save_pretrained(tokenizer)
            examples, labels, differ, to_fairseq, pad_id = dev_inputs(self.data, tokenizer, self.args.glue_task)
            if differ:
                sys.exit(f"{self.data}: the exported tokenizer's ids differ from prepare_glue.py's on {differ} dev "
                         "examples; the runtimes would not read the same input")
            torch.save({"examples": examples, "labels": labels, "to_fairseq": to_fairseq, "pad_id": pad_id},
                       out + ".tmp")
            os.replace(out + ".tmp", out)
        return out

    def measure_glue(self, points):
        """Every point in a fresh worker process of its own (:func:`glue_worker`), in turn; a stage each (a run with
        the same point, model file and settings reuses it)."""
        a = self.args
        inputs = self.glue_inputs()
        results = []
        for p in points:
            spec = {"data": self.data, "task": a.glue_task, "runtime": p["runtime"], "model": p["path"],
                    "backbone": p.get("backbone"), "ratio": p.get("ratio"), "inputs": inputs, "threads": a.threads,
                    "batch_size": a.batch_size, "speed_examples": a.speed_examples,
                    "latency_examples": a.latency_sentences, "runs": a.runs,
                    "stamp": os.path.getmtime(p["path"])}
            digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
            out = os.path.join(self.work, "measure", f"{slug(p['name'])}@{p['runtime']}-{digest}")
            spec.update(out=os.path.join(out, "result.json"), predictions=os.path.join(out, "predictions.json"))
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "spec.json"), "w") as f:
                json.dump(spec, f, indent=1)
            log(f"measure: {p['name']} in {p['runtime']}")
            stage(out, [[sys.executable, os.path.abspath(__file__), "--glue-worker", os.path.join(out, "spec.json")]],
                  a.threads)
            with open(spec["out"]) as f:
                results.append(json.load(f))
        return results


def glue_worker(spec_path):
    """One GLUE model in one runtime, in this (fresh) process: the task's metric on every dev example (padded
    batches of ``batch_size``), then the median over ``runs`` passes of the throughput on the first
    ``speed_examples`` and of the batch-1 latency on the first ``latency_examples``; parameters (fairseq), the
    weights' bytes, and the process's peak resident set."""
    import resource
    import statistics
    import time

    import torch

    from bench_deploy_glue import batches
    from user_dir.common.glue_metrics import TASK_METRICS, glue_score

    with open(spec_path) as f:
        s = json.load(f)
    torch.set_num_threads(s["threads"])
    inputs = torch.load(s["inputs"])
    examples, labels, pad_id = inputs["examples"], inputs["labels"], inputs["pad_id"]
    params = None
    if s["runtime"] == "fairseq":
        from user_dir.common.counting import count_parameters, state_dict_bytes
        from user_dir.deploy.export_hf import HEAD, load_classifier
        model, _, task, _ = load_classifier(s["backbone"] or s["model"], s["data"])
        if s["backbone"]:  # Variator: the plugin on its frozen backbone
            from user_dir.variator.plugged_encoder import attach_plugin_files
            attach_plugin_files(model, s["model"]).use(s["ratio"])
        to_fairseq, pad = inputs["to_fairseq"], task.source_dictionary.pad()
        params, size = count_parameters(model).total, state_dict_bytes(model)

        def forward(batch):
            src = to_fairseq[batch["input_ids"]].masked_fill(batch["attention_mask"].eq(0), pad)
            with torch.no_grad():
                return model(src, features_only=True, classification_head_name=HEAD)[0]
    else:
        from user_dir.deploy.export_onnx import run_session, session
        sess, size = session(s["model"], s["threads"]), os.path.getsize(s["model"])

        def forward(batch):
            return run_session(sess, batch["input_ids"], batch["attention_mask"])

    logits = torch.cat([forward(b) for b in batches(examples, s["batch_size"], pad_id)]).float()
    preds = logits.view(-1).tolist() if logits.size(-1) == 1 else logits.argmax(-1).tolist()
    score = glue_score(s["task"], preds, labels)
    with open(s["predictions"], "w") as f:
        json.dump({"predictions": preds, "labels": labels}, f)

    def timed(chosen):
        forward(chosen[0])  # warm-up
        seconds = []
        for _ in range(s["runs"]):
            start = time.perf_counter()
            for b in chosen:
                forward(b)
            seconds.append(time.perf_counter() - start)
        return sum(b["input_ids"].size(0) for b in chosen) / statistics.median(seconds)

    throughput = timed(batches(examples[: s["speed_examples"]], s["batch_size"], pad_id))
    single = timed(batches(examples[: s["latency_examples"]], 1, pad_id))
    result = {"score": score, "quality": score[TASK_METRICS[s["task"]][0]], "examples": len(labels), "params": params,
              "weights_mb": size / 2 ** 20, "sentences_per_s": throughput, "latency_sentences_per_s": single,
              "speed_examples": min(len(examples), s["speed_examples"]),
              "latency_examples": min(len(examples), s["latency_examples"]),
              "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open(s["out"], "w") as f:
        json.dump(result, f, indent=1)


def table_rows(points, throughput, latency):
    """One row per point from the two measurements; CTranslate2 rows take their parameters from the fairseq model
    they were converted from."""
    params = {p["name"]: t["params"] for p, t in zip(points, throughput) if t["params"] is not None}
    nonemb = {p["name"]: t["non_embedding_params"] for p, t in zip(points, throughput) if t["params"] is not None}
    teacher = throughput[0]
    rows = []
    for p, t, l in zip(points, throughput, latency):
        rows.append({
            "name": p["name"], "method": p["method"], "runtime": p["runtime"], "path": os.path.relpath(p["path"], ROOT),
            "quality": t["sacrebleu"], "bleu_tok": t["bleu_tok"], "params": params.get(p["name"]),
            "non_embedding_params": nonemb.get(p["name"]), "size_mb": t["weights_mb"],
            "sentences_per_s": t["sentences_per_s"], "speedup": t["sentences_per_s"] / teacher["sentences_per_s"],
            "latency_ms": 1000.0 / l["sentences_per_s"],
            "latency_speedup": latency[0]["sentences_per_s"] and l["sentences_per_s"] / latency[0]["sentences_per_s"],
            "peak_memory_mb": t["peak_memory_mb"], "sentences": t["sentences"], "commands": p["commands"]})
    return mark_fronts(rows)


def glue_table_rows(points, results):
    """One row per point from the GLUE workers' results; ONNX rows take their parameters from the fairseq model
    they were exported from; speed-ups against the teacher in fairseq (the first point)."""
    params = {p["name"]: r["params"] for p, r in zip(points, results) if r["params"] is not None}
    teacher = results[0]
    rows = []
    for p, r in zip(points, results):
        rows.append({
            "name": p["name"], "method": p["method"], "runtime": p["runtime"], "path": os.path.relpath(p["path"], ROOT),
            "quality": r["quality"], "scores": r["score"], "params": params.get(p["name"]), "size_mb": r["weights_mb"],
            "sentences_per_s": r["sentences_per_s"], "speedup": r["sentences_per_s"] / teacher["sentences_per_s"],
            "latency_ms": 1000.0 / r["latency_sentences_per_s"],
            "latency_speedup": r["latency_sentences_per_s"] / teacher["latency_sentences_per_s"],
            "peak_memory_mb": r["peak_memory_mb"], "sentences": r["examples"], "commands": p["commands"]})
    return mark_fronts(rows)


def mark_fronts(rows):
    """Each row's place on the Pareto fronts of quality against throughput, batch-1 latency and size."""
    for key, axis, larger in (("front_speed", "speedup", True), ("front_latency", "latency_speedup", True),
                              ("front_size", "size_mb", False)):
        front = set(pareto_front([(r[axis], r["quality"]) for r in rows], larger))
        for i, r in enumerate(rows):
            r[key] = i in front
    return rows


def choosing_text(settings):
    """What chose the GLUE teacher and each method's model, and on which examples."""
    held = (settings.get("selection") or {}).get("source") == "train"
    on = ("'valid', a slice of train held out at preparation (preprocess/prepare_glue.py --select-fraction): the dev "
          "set only reports" if held else "the dev set itself (data prepared before the held-out split): choosing and "
          "reporting share it")
    return (f"Choosing is done on {on}: the teacher's learning rate and checkpoint (glue_teachers.sh), GhostBERT's "
            "importance, and the checkpoint each recipe keeps (GhostBERT and pruned: the best of the fine-tuning's "
            "validations; Variator: the best of its training's; APC: its fine-tuning's last checkpoint).")


def report_text(rows, recommendations, prov, settings, measure_cmds):
    t = rows[0]
    glue = settings.get("glue_task")
    budget = "the recipes' SMOKE=1 budgets" if settings['smoke'] else f"{settings['updates']} updates"
    fronts = ("Speed-ups are against the teacher in fairseq. F: on the Pareto front of quality against throughput (s), "
              "batch-1 latency (l), size (z).")
    if glue:
        metric = settings["metric"]
        lines = [f"# Which method? Quality against measured speed and size ({glue}: {settings['teacher']})", "",
                 provenance_text(prov), "",
                 f"Every method trained {budget}, seed {settings['seed']}; quality is the {glue} dev {metric} "
                 f"on all {t['sentences']} dev examples (user_dir/common/glue_metrics.py; every runtime reads the "
                 "exported tokenizer's ids of the raw dev text); throughput in sentences/s of the model's forward at "
                 f"batch {settings['batch_size']} on the first {settings['speed_examples']} dev examples (padded "
                 f"batches; median of {settings['runs']} pass(es)), latency in ms per example at batch 1 over the "
                 f"first {settings['latency_sentences']}, {settings['threads']} intra-op thread(s) per engine, on the "
                 "CPU, every model in a fresh process; size: the weights on disk (fairseq: the state dict as "
                 "torch.save writes it, a Variator row's plugins included; ONNX: the model file); peak memory: the "
                 "measuring process's peak resident set. Parameters: the fairseq model's, each shared tensor once "
                 "(an ONNX row: those of the model it was exported from). " + choosing_text(settings) + " " + fronts,
                 "", f"| model | runtime | {metric} | all scores | params | size MB | sent/s | speed-up | latency ms | "
                 "latency speed-up | peak MB | F |", "|" + "---|" * 12]
    else:
        lines = [f"# Which method? Quality against measured speed and size ({settings['teacher']})", "",
                 provenance_text(prov), "",
                 f"Every method trained {budget}, seed {settings['seed']}; quality is "
                 f"sacreBLEU on {t['sentences']} test sentences (beam {settings['beam']}); "
                 f"throughput in sentences/s at batch {settings['batch_size']} (median of {settings['runs']} run(s)), "
                 f"latency in ms per sentence at batch 1 over {settings['latency_sentences']} sentences, "
                 f"{settings['threads']} thread(s) per engine; size: the weights on disk (the state dict as torch.save "
                 "writes it; CTranslate2: model.bin); peak memory: the measuring process's peak resident set. "
                 "Parameters: the trained fairseq model's, each shared tensor once (a CTranslate2 row: those of the "
                 "model it was converted from; PET's export stores every logical layer, so its size is that of the "
                 "unshared model). " + fronts, "",
                 "| model | runtime | sacreBLEU | BLEU (tok) | params | size MB | sent/s | speed-up | latency ms | "
                 "latency speed-up | peak MB | F |", "|" + "---|" * 12]
    for r in rows:
        front = "".join(c for c, k in (("s", "front_speed"), ("l", "front_latency"), ("z", "front_size")) if r[k])
        second = (" / ".join(f"{k} {v:.2f}" for k, v in r["scores"].items() if isinstance(v, (int, float)))
                  if glue else f"{r['bleu_tok']:.2f}")
        lines.append(f"| {r['name']} | {r['runtime']} | {r['quality']:.2f} | {second} | "
                     f"{'-' if r['params'] is None else format(r['params'], ',')} | {r['size_mb']:.1f} | "
                     f"{r['sentences_per_s']:.1f} | {r['speedup']:.2f}x | {r['latency_ms']:.1f} | "
                     f"{r['latency_speedup']:.2f}x | {r['peak_memory_mb']:.0f} | {front} |")
    lines += ["", "## Recommendation (read off the measured rows against the teacher in fairseq)", ""]
    lines += [f"- {line}" for line in recommendations]
    lines += ["", "## What does not compose", ""]
    if glue:
        lines += [f"- {m} in ONNX Runtime: refused: {why}." for m, why in NOT_IN_ONNX.items()]
        lines += [f"- any model in CTranslate2: refused: {CT2_ON_GLUE}."]
        lines += [f"- {m} on GLUE: refused: {why}." for m, why in TRANSLATION_ONLY.items()]
        lines += ["- chains of training methods: refused on GLUE (APC's init compresses a stock hf_bert, GhostBERT's "
                  "models are none; Variator's plugins are trained on a frozen backbone); what stacks is a pruned-only "
                  "or APC-finalized model exported and quantized: its onnx-int8 row.",
                  "", "## How every point was made", "",
                  "The measurements (every model in a fresh worker of this script, in turn): the command at the top.",
                  "", f"The teacher and data: `{settings['teacher']}`, `{settings['data']}` (scripts/recipes/"
                  "glue_teachers.sh).", ""]
    else:
        lines += [f"- {m} in CTranslate2: refused: {why}." for m, why in NOT_IN_CT2.items()]
        lines += [f"- any model in ONNX Runtime: refused: {ONNX_ON_TRANSLATION}.",
                  "- chains: a PET or word-KD student then APC (`pet:ENCxDEC+apc:F`); any other is refused with its "
                  "reason.",
                  "", "## How every point was made", "",
                  "The measurements (every model in one call each):", ""]
        lines += [f"    {c}" for c in measure_cmds]
        lines += ["", "The data:" if settings["data_commands"] else f"The data: `{settings['data']}` (given).", ""]
        lines += [f"    {c}" for c in settings["data_commands"]]
    lines += ["", "Each model's commands, in order (its training, its conversion):", ""]
    for r in rows:
        commands = r["commands"] or ["(as given)"]
        lines += [f"- {r['name']} ({r['runtime']}):", ""] + [f"      {c}" for c in commands] + [""]
    return "\n".join(lines) + "\n"


def plot(rows, ylabel="sacreBLEU"):
    markers = {"fairseq": "o", "ct2-float32": "s", "ct2-int8": "D", "onnx-fp32": "s", "onnx-int8": "D"}
    markers = {k: v for k, v in markers.items() if any(r["runtime"] == k for r in rows)}

    def draw(plt, png):
        fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
        methods = sorted({r["method"] for r in rows})
        colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
        for ax, (axis, front, label) in zip(axes, (
                ("speedup", "front_speed", "throughput speed-up over the fairseq teacher (batch, log)"),
                ("latency_speedup", "front_latency", "batch-1 latency speed-up over the fairseq teacher (log)"),
                ("size_mb", "front_size", "weights on disk, MB (log)"))):
            for r in rows:
                ax.scatter(r[axis], r["quality"], color=colors[r["method"]], marker=markers[r["runtime"]],
                           s=110 if r["method"] == "teacher" else 45, edgecolors="black" if r[front] else "none",
                           zorder=3)
                ax.annotate(f"{r['name']}@{r['runtime'].replace('fairseq', 'fs')}", (r[axis], r["quality"]),
                            fontsize=6, xytext=(3, 3), textcoords="offset points")
            on = sorted((r for r in rows if r[front]), key=lambda r: r[axis])
            ax.step([r[axis] for r in on], [r["quality"] for r in on], where="post" if axis == "size_mb" else "pre",
                    color="gray", linestyle="--", zorder=1, label="Pareto front")
            ax.axhline(rows[0]["quality"], color="black", linewidth=0.5)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
            ax.set_xlabel(label)
            ax.set_ylabel(ylabel)
        handles = [plt.Line2D([], [], color=colors[m], marker="o", linestyle="", label=m) for m in methods]
        handles += [plt.Line2D([], [], color="gray", marker=mk, linestyle="", label=rt) for rt, mk in markers.items()]
        handles.append(plt.Line2D([], [], color="gray", linestyle="--", label="Pareto front (points ringed)"))
        axes[0].legend(handles=handles, fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)
    return draw


def glue_teacher(parser, args):
    """glue_bench's setup of ``--glue-task``'s teacher (the first ``--glue-work`` folder holding it), with its FFN
    size."""
    from glue_bench import first_glue_setup
    setup = first_glue_setup(args.glue_work, args.glue_task)
    if setup is None:
        parser.error(f"--glue-task {args.glue_task}: no teacher at TASK/checkpoints/checkpoint_best.pt in --glue-work "
                     f"{args.glue_work}; train it first: TASKS={args.glue_task} bash scripts/recipes/glue_teachers.sh")
    from fairseq import checkpoint_utils
    model = checkpoint_utils.load_checkpoint_to_cpu(setup["teacher"])["cfg"]["model"]
    setup["ffn"] = model["encoder_ffn_embed_dim"] if isinstance(model, dict) else model.encoder_ffn_embed_dim
    return setup


def check_glue_settings(specs, setup):
    """Settings the GLUE teacher cannot take, refused before anything trains."""
    for spec in specs:
        for method, setting in spec["steps"]:
            if method in ("ghost", "pruned") and int(Fraction(setting) * setup["heads"]) < 1:
                raise Refused(f"--methods {spec['name']}: m = {setting} keeps floor({setup['heads']} m) = 0 of the "
                              f"teacher's {setup['heads']} heads (at least 1/{setup['heads']})")
            if method == "apc" and setting >= setup["ffn"]:
                raise Refused(f"--methods {spec['name']}: APC compresses the teacher's FFN of {setup['ffn']} to a "
                              f"smaller size (apc:{setting} is not)")


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.glue_worker:
        return glue_worker(args.glue_worker)
    check_device(parser, args)
    if args.bf16:
        parser.error("--bf16: the recipes train with stock fairseq-train, which cannot (fc-train-bf16 can); use --fp16 "
                     "on a GPU")
    glue = bool(args.glue_task)
    args.methods = args.methods or (GLUE_LADDER if glue else DEFAULT_LADDER)
    try:
        specs = [parse_spec(s, args.ct2, args.onnx if glue else None) for s in args.methods]
    except Refused as e:
        parser.error(str(e))
    if not glue and args.fp16 and (args.ct2 or any(r != "fairseq" for s in specs for r in s["runtimes"])):
        parser.error("--fp16 with CTranslate2 rows: fc-measure runs them in their converted type and refuses --fp16 "
                     "beside them; give --ct2 with no type and no @ct2-* method (fairseq rows only), or leave "
                     "--fp16 out")
    if len({s["name"] for s in specs}) != len(specs):
        parser.error(f"--methods: {args.methods} repeats a method")
    args.updates = args.updates or (480 if glue else 400)
    if args.updates < 5:
        parser.error(f"--updates {args.updates}: at least 5 (PET warms up on a fifth; --smoke for a pipeline check)")
    setup = None
    if glue:
        if args.max_sentences:
            parser.error("--max-sentences: translation only (a GLUE model is scored on its whole dev set)")
        setup = glue_teacher(parser, args)
        try:
            check_glue_settings(specs, setup)
        except Refused as e:
            parser.error(str(e))
        args.teacher, args.data = setup["teacher"], setup["data"]
        args.batch_size = args.batch_size or 32
    else:
        if not os.path.isfile(args.teacher):
            parser.error(f"--teacher {args.teacher}: no such checkpoint")
        from user_dir.tools.checkpoint_flags import FlagsError, task_flags
        try:
            task = task_flags(args.teacher)[1]
        except FlagsError as e:
            parser.error(f"--teacher: {e}")
        if task != "translation":
            parser.error(f"--teacher {args.teacher} was trained with --task {task}: --teacher is a translation "
                         "teacher; a GLUE teacher is compressed with --glue-task TASK --glue-work DIR (its "
                         "glue_teachers.sh folder)")
        args.batch_size = args.batch_size or 64
    if args.smoke:
        args.runs = 1
        args.max_sentences = None if glue else args.max_sentences or 20
        args.latency_sentences = min(args.latency_sentences, 5)
        args.speed_examples = min(args.speed_examples, 32)
    default_work = f"methods-glue-{args.glue_task}" if glue else "methods"
    args.work = args.work or os.path.join(ROOT, "work", default_work + ("-smoke" if args.smoke else ""))
    out = args.out or default_out("methods_glue" if glue else "methods")
    # the recipes call fairseq-train and $PYTHON: this interpreter's environment
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHON"] = sys.executable

    driver = Driver(args, specs, setup)
    driver.prepare_data()
    points = driver.build()
    if glue:
        rows = glue_table_rows(points, driver.measure_glue(points))
        measure_cmds, latency_n = [], min(args.latency_sentences, rows[0]["sentences"])
    else:
        throughput, cmd_t = driver.measure(points, args.batch_size, args.max_sentences, "throughput")
        latency_n = min(args.latency_sentences, args.max_sentences or args.latency_sentences)
        latency, cmd_l = driver.measure(points, 1, latency_n, "latency")
        rows = table_rows(points, throughput, latency)
        measure_cmds = [cmd_t, cmd_l]
    recommendations = recommend(rows, rows[0])
    prov = provenance("bench_methods.py", argv, args.threads, [args.seed])
    settings = {k: getattr(args, k) for k in ("teacher", "data", "updates", "seed", "threads", "device", "batch_size",
                                             "latency_sentences", "beam", "runs", "max_sentences", "smoke", "ct2",
                                             "glue_task", "onnx", "jobs")}
    settings.update(teacher=os.path.relpath(os.path.realpath(args.teacher), ROOT),
                    data=os.path.relpath(driver.data, ROOT),
                    methods=[s["name"] for s in specs], latency_sentences=latency_n,
                    data_commands=[shown(c) for c in driver.commands.get("data", [])])
    if glue:
        settings.update(metric=setup["metric"], speed_examples=min(args.speed_examples, rows[0]["sentences"]),
                        selection=setup["selection"])
    data = {"provenance": prov, "settings": settings, "rows": rows, "recommendations": recommendations,
            "measure_commands": measure_cmds,
            "refused": ({"not_in_onnx": NOT_IN_ONNX, "ct2": CT2_ON_GLUE, "translation_only": TRANSLATION_ONLY}
                        if glue else {"not_in_ct2": NOT_IN_CT2, "onnx": ONNX_ON_TRANSLATION})}
    ylabel = f"{args.glue_task} dev {setup['metric']}" if glue else "sacreBLEU"
    written = write_report(out + ".md", report_text(rows, recommendations, prov, settings, measure_cmds),
                           out + ".json", data, plot(rows, ylabel), out + ".png")
    for line in recommendations:
        print(line)
    log("wrote " + ", ".join(os.path.relpath(p, ROOT) for p in written))
    return rows


if __name__ == "__main__":
    main()
