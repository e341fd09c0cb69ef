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
                       three quarters of the budget, fine-tune with the rest)
* ``apc:F``            APC with every FFN compressed to F, finalized to a dense model (scripts/recipes/apc.sh)

Every method trains ``--updates`` updates in all (resumable: each recipe skips its finished stages; a stage asked
again with other settings stops). Deployment: the fairseq model of every method; CTranslate2 (``--ct2 float32
int8``; fc-export, then fc-ct2 convert) for what is a stock Transformer after training (PET via fc-export, word-KD,
APC finalized, their chains, the teacher). What cannot run there is refused before anything trains, naming the
method and the reason (``variator:4@ct2-int8``, ``ghost:2/4+apc:128``). Measurement (fc-measure,
user_dir/tools/measure.py, every model in a fresh process, in turn within each run): sacreBLEU on the whole test set
(or ``--max-sentences``) at beam 5, parameters, weights on disk, throughput at ``--batch-size`` and peak memory;
then latency at batch 1 on the first ``--latency-sentences`` sentences; ``--threads`` threads per engine.

Device: ``--device cuda`` trains and measures the fairseq rows on the GPU (``--fp16`` there only with ``--ct2`` given no
type: fc-measure runs CTranslate2 rows, on the CPU, in their converted type). Only translation teachers so far; a
GLUE teacher is refused (its ONNX Runtime rows are not built here yet).

Outputs (``--out PREFIX``, default work/results/methods): PREFIX.md (the table, the fronts, the recommendation and
the command behind every point), PREFIX.json, PREFIX.png (quality against throughput, latency and size, the fronts
drawn, the teacher marked).
"""
import argparse
import hashlib
import os
import shlex
import sys
from fractions import Fraction

from benchlib import (ROOT, SHIPPED_TEACHER, Device, add_device_args, add_teacher_arguments, check_device, command_line,
                      default_out, logger, multi30k_data_bin, provenance, provenance_text, stage, write_report)
from translation_students import KD, plain_arch, train_command

RECIPES = os.path.join(ROOT, "scripts", "recipes")
log = logger("methods")

# ---- what a method is, what it runs in, what composes -------------------------------------------------------------
METHODS = ("pet", "word-kd", "variator", "ghost", "apc")
STOCK_AFTER_TRAINING = {"pet", "word-kd", "apc"}  # a stock Transformer after fc-export / apc_finalize
DEFAULT_LADDER = ["pet:96x64", "pet:128x96", "pet:192x144", "word-kd:128x96", "word-kd:192x144", "variator:2",
                  "variator:4", "variator:8", "ghost:1/4", "ghost:2/4", "ghost:3/4", "apc:128", "apc:256", "apc:512",
                  "pet:128x96+apc:128"]
NOT_IN_CT2 = {
    "variator": "Variator's plugins (the k-vector merge and its adapter around each encoder FFN) are no stock module: "
                "CTranslate2 would run the backbone alone (fc-export refuses them too); it runs in fairseq, plugged",
    "ghost": "GhostBERT's ghost modules (depthwise convolutions after O and FFN2) and its M of N_H heads of width "
             "d/N_H have no CTranslate2 counterpart (fc-export refuses them); it runs in fairseq",
}
RUNTIMES = ("fairseq", "ct2-float32", "ct2-int8")


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
        if method == "ghost":
            m = Fraction(setting)
            if not 0 < m <= 1:
                raise ValueError
            return setting
    except (ValueError, ZeroDivisionError):
        pass
    what = {"pet": "ENCxDEC widths, multiples of 4 (4 heads), e.g. pet:128x96",
            "word-kd": "ENCxDEC widths, multiples of 4 (4 heads), e.g. word-kd:128x96",
            "variator": "the ratio k, an integer >= 1, e.g. variator:4", "apc": "the FFN size, e.g. apc:256",
            "ghost": "the width multiplier m in (0, 1], e.g. ghost:2/4"}[method]
    raise Refused(f"--methods {spec}: {setting!r} is not a {method} setting ({what})")


def parse_spec(spec, ct2_types):
    """``pet:128x96+apc:128@ct2-int8`` -> dict(name, steps [(method, setting)], runtimes); what cannot be built or
    deployed raises :class:`Refused` naming the method and why."""
    body, _, runtime = spec.partition("@")
    steps, parts = [], body.split("+")
    for part in parts:
        method, sep, setting = part.partition(":")
        if method not in METHODS:
            raise Refused(f"--methods {spec}: unknown method {method!r} (one of {', '.join(METHODS)})")
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
                "apc": "APC compresses a trained model: it comes last (pet:ENCxDEC+apc:F)",
            }.get(first, f"{second} after {first} does not compose: the chains are a PET or word-KD student, then APC "
                         "(pet:ENCxDEC+apc:F)")
            raise Refused(f"--methods {spec}: refused: {reason}")
    last = steps[-1][0]
    if runtime:
        if runtime not in RUNTIMES:
            raise Refused(f"--methods {spec}: unknown runtime {runtime!r} (one of {', '.join(RUNTIMES)})")
        if runtime != "fairseq" and last in NOT_IN_CT2:
            raise Refused(f"--methods {spec}: {last} cannot run in CTranslate2: {NOT_IN_CT2[last]}")
        runtimes = [runtime]
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
    p.add_argument("--methods", nargs="+", default=DEFAULT_LADDER,
                   help="METHOD:SETTING[+apc:F][@RUNTIME] ... (default: the ladder " + " ".join(DEFAULT_LADDER) + ")")
    p.add_argument("--ct2", nargs="*", default=["float32", "int8"], choices=["float32", "int8"],
                   help="CTranslate2 weight types every stock-Transformer model (and the teacher) is deployed in "
                        "(default float32 int8; none: fairseq only)")
    p.add_argument("--updates", type=int, default=400,
                   help="training updates of every method (default 400: a CPU budget; the recipes' own defaults are "
                        "300-400)")
    p.add_argument("--seed", type=int, default=1, help="training seed of every method (default 1)")
    p.add_argument("--threads", type=int, default=1, help="threads of every training and of every engine measured "
                                                         "(torch threads / CTranslate2 intra_threads; default 1)")
    add_device_args(p)  # the recipes train and the fairseq rows are measured there; CTranslate2 runs on the CPU
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch of the throughput measurement "
                                                             "(default 64, the recipes' measurement batch)")
    p.add_argument("--latency-sentences", type=int, default=100,
                   help="sentences translated one at a time for the batch-1 latency (default 100)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5, as the papers)")
    p.add_argument("--runs", type=int, default=2, help="timed runs per model, the median reported (default 2)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only test ids below N (default: all)")
    p.add_argument("--smoke", action="store_true",
                   help="a pipeline check: the recipes' SMOKE=1 budgets (2-3 updates), 3 word-KD updates, one run, "
                        "20 test sentences and 5 for latency unless given; the numbers mean nothing")
    p.add_argument("--work", default=None, help="trained and converted models (default work/methods, "
                                                "work/methods-smoke with --smoke)")
    p.add_argument("--out", default=None, help="output prefix: PREFIX.md, .json, .png (default "
                                               "work/results/methods; results/methods_NAME for the committed ones)")
    return p


class Driver:
    def __init__(self, args, specs):
        self.args, self.specs = args, specs
        self.work = os.path.abspath(args.work)
        self.device = Device(args)
        self.commands = {}  # model name -> the commands that made it (recipe, export, conversion)

    def recipe(self, name, script, env, budget, workdir):
        """One recipe run as a resumable stage; its own stages resume inside it. ``budget``: the variables that set
        its updates (and, for PET, its own check measurement: 100 sentences, this driver measures the whole test set),
        left out under --smoke (the recipe's SMOKE=1 sets its own)."""
        env = dict(env, **({} if self.args.smoke else budget))
        env = dict(env, TEACHER=env.get("TEACHER", self.args.teacher), DATA=self.data, SEED=str(self.args.seed),
                   DEVICE_FLAGS=" ".join(self.device.fairseq()), RUNS="1", SMOKE="1" if self.args.smoke else "0")
        cmd = ["env", *[f"{k}={v}" for k, v in sorted(env.items())], "bash", os.path.join(RECIPES, script), workdir]
        log(f"{name}: {script} -> {workdir}")
        stage(os.path.join(workdir, "bench"), [cmd], self.args.threads, logfile=os.path.join(workdir, "bench.log"))
        self.commands.setdefault(name, []).append(cmd)

    def prepare_data(self):
        if self.args.data:
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
            return os.path.join(workdir, "plugin", "checkpoint_last.pt")
        if method == "ghost":
            distill = 3 * n // 4
            self.recipe(name, "ghostbert.sh", dict(env, WIDTH=setting),
                        {"DISTILL_UPDATES": distill, "FINETUNE_UPDATES": n - distill}, workdir)
            return os.path.join(workdir, "finetune", "checkpoint_best.pt")
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

    def build(self):
        """Every point: dict(name, method, setting, runtime, path, commands)."""
        a = self.args
        points = [{"name": "teacher", "method": "teacher", "runtime": "fairseq", "path": a.teacher}]
        for quantization in a.ct2:
            path, cmd = self.ct2("teacher", a.teacher, quantization)
            points.append({"name": "teacher", "method": "teacher", "runtime": f"ct2-{quantization}", "path": path,
                           "extra_commands": [cmd]})
        trained = {}
        for spec in self.specs:
            teacher, checkpoint = None, None
            for i in range(len(spec["steps"])):
                name = "+".join(spec["parts"][:i + 1])
                if name not in trained:
                    trained[name] = self.train(name, spec["steps"][:i + 1], teacher)
                checkpoint = trained[name]
                teacher = self.stock(name, checkpoint, spec["steps"][i][0])
            for runtime in spec["runtimes"]:
                point = {"name": spec["name"], "method": "+".join(m for m, _ in spec["steps"]), "runtime": runtime}
                if runtime == "fairseq":
                    point["path"] = checkpoint
                else:
                    point["path"], cmd = self.ct2(spec["name"], teacher, runtime[len("ct2-"):])
                    point["extra_commands"] = [cmd]
                points.append(point)
        for p in points:  # every step of the chain, then this point's own conversion
            steps = [k for k in self.commands if p["name"] == k or p["name"].startswith(k + "+")]
            chain = [c for key in steps for c in self.commands[key]]
            p["commands"] = [shown(c) for c in chain + p.pop("extra_commands", [])]
        return points

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
               "--out", os.path.join(out, "table.md"), "--json", os.path.join(out, "table.json")]
        log(f"measure ({label}): {len(points)} models, batch {batch_size}")
        stage(out, [cmd], a.threads)
        import json
        with open(os.path.join(out, "table.json")) as f:
            rows = {r["name"]: r for r in json.load(f)["rows"]}
        return [rows[n] for n in names], shown(cmd)


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
    for key, axis, larger in (("front_speed", "speedup", True), ("front_latency", "latency_speedup", True),
                              ("front_size", "size_mb", False)):
        front = set(pareto_front([(r[axis], r["quality"]) for r in rows], larger))
        for i, r in enumerate(rows):
            r[key] = i in front
    return rows


def report_text(rows, recommendations, prov, settings, measure_cmds):
    t = rows[0]
    lines = [f"# Which method? Quality against measured speed and size ({settings['teacher']})", "",
             provenance_text(prov), "",
             f"Every method trained {'the recipes SMOKE=1 budgets' if settings['smoke'] else settings['updates']} "
             f"updates, seed {settings['seed']}; quality is "
             f"sacreBLEU on {t['sentences']} test sentences (beam {settings['beam']}); "
             f"throughput in sentences/s at batch {settings['batch_size']} (median of {settings['runs']} run(s)), "
             f"latency in ms per sentence at batch 1 over {settings['latency_sentences']} sentences, "
             f"{settings['threads']} thread(s) per engine; size: the weights on disk (the state dict as torch.save "
             "writes it; CTranslate2: model.bin); peak memory: the measuring process's peak resident set. "
             "Parameters: the trained fairseq model's, each shared tensor once (a CTranslate2 row: those of the model "
             "it was converted from; PET's export stores every logical layer, so its size is that of the unshared "
             "model). Speed-ups are against the teacher in fairseq. F: on the Pareto front of quality against "
             "throughput (s), batch-1 latency (l), size (z).", "",
             "| model | runtime | sacreBLEU | BLEU (tok) | params | size MB | sent/s | speed-up | latency ms | "
             "latency speed-up | peak MB | F |", "|" + "---|" * 12]
    for r in rows:
        front = "".join(c for c, k in (("s", "front_speed"), ("l", "front_latency"), ("z", "front_size")) if r[k])
        lines.append(f"| {r['name']} | {r['runtime']} | {r['quality']:.2f} | {r['bleu_tok']:.2f} | "
                     f"{'-' if r['params'] is None else format(r['params'], ',')} | {r['size_mb']:.1f} | "
                     f"{r['sentences_per_s']:.1f} | {r['speedup']:.2f}x | {r['latency_ms']:.1f} | "
                     f"{r['latency_speedup']:.2f}x | {r['peak_memory_mb']:.0f} | {front} |")
    lines += ["", "## Recommendation (read off the measured rows against the teacher in fairseq)", ""]
    lines += [f"- {line}" for line in recommendations]
    lines += ["", "## What does not compose", ""]
    lines += [f"- {m} in CTranslate2: refused: {why}." for m, why in NOT_IN_CT2.items()]
    lines += ["- chains: a PET or word-KD student then APC (`pet:ENCxDEC+apc:F`); any other is refused with its "
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


def plot(rows):
    markers = {"fairseq": "o", "ct2-float32": "s", "ct2-int8": "D"}

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
            ax.set_ylabel("sacreBLEU")
        handles = [plt.Line2D([], [], color=colors[m], marker="o", linestyle="", label=m) for m in methods]
        handles += [plt.Line2D([], [], color="gray", marker=mk, linestyle="", label=rt) for rt, mk in markers.items()]
        handles.append(plt.Line2D([], [], color="gray", linestyle="--", label="Pareto front (points ringed)"))
        axes[0].legend(handles=handles, fontsize=7, loc="best")
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)
    return draw


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    check_device(parser, args)
    if args.bf16:
        parser.error("--bf16: the recipes train with stock fairseq-train, which cannot (fc-train-bf16 can); use --fp16 "
                     "on a GPU")
    try:
        specs = [parse_spec(s, args.ct2) for s in args.methods]
    except Refused as e:
        parser.error(str(e))
    if args.fp16 and (args.ct2 or any(r != "fairseq" for s in specs for r in s["runtimes"])):
        parser.error("--fp16 with CTranslate2 rows: fc-measure runs them in their converted type and refuses --fp16 "
                     "beside them; give --ct2 with no type and no @ct2-* method (fairseq rows only), or leave "
                     "--fp16 out")
    if len({s["name"] for s in specs}) != len(specs):
        parser.error(f"--methods: {args.methods} repeats a method")
    if not os.path.isfile(args.teacher):
        parser.error(f"--teacher {args.teacher}: no such checkpoint")
    from user_dir.tools.checkpoint_flags import FlagsError, task_flags
    try:
        task = task_flags(args.teacher)[1]
    except FlagsError as e:
        parser.error(f"--teacher: {e}")
    if task != "translation":
        parser.error(f"--teacher {args.teacher} was trained with --task {task}: this driver compresses a teacher of "
                     "--task translation (a GLUE teacher's comparison, with ONNX Runtime rows, is not built here yet; "
                     "scripts/bench/bench_deploy_glue.py measures GLUE exports)")
    if args.updates < 5:
        parser.error(f"--updates {args.updates}: at least 5 (PET warms up on a fifth; --smoke for a pipeline check)")
    if args.smoke:
        args.runs = 1
        args.max_sentences = args.max_sentences or 20
        args.latency_sentences = min(args.latency_sentences, 5)
    args.work = args.work or os.path.join(ROOT, "work", "methods-smoke" if args.smoke else "methods")
    out = args.out or default_out("methods")
    # the recipes call fairseq-train and $PYTHON: this interpreter's environment
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    os.environ["PYTHON"] = sys.executable

    driver = Driver(args, specs)
    driver.prepare_data()
    points = driver.build()
    throughput, cmd_t = driver.measure(points, args.batch_size, args.max_sentences, "throughput")
    latency_n = min(args.latency_sentences, args.max_sentences or args.latency_sentences)
    latency, cmd_l = driver.measure(points, 1, latency_n, "latency")
    rows = table_rows(points, throughput, latency)
    recommendations = recommend(rows, rows[0])
    prov = provenance("bench_methods.py", argv, args.threads, [args.seed])
    settings = {k: getattr(args, k) for k in ("teacher", "data", "updates", "seed", "threads", "device", "batch_size",
                                             "latency_sentences", "beam", "runs", "max_sentences", "smoke", "ct2")}
    settings.update(teacher=os.path.relpath(os.path.realpath(args.teacher), ROOT),
                    data=os.path.relpath(driver.data, ROOT),
                    methods=[s["name"] for s in specs], latency_sentences=latency_n,
                    data_commands=[shown(c) for c in driver.commands.get("data", [])])
    data = {"provenance": prov, "settings": settings, "rows": rows, "recommendations": recommendations,
            "measure_commands": [cmd_t, cmd_l], "not_in_ct2": NOT_IN_CT2}
    written = write_report(out + ".md", report_text(rows, recommendations, prov, settings, [cmd_t, cmd_l]),
                           out + ".json", data, plot(rows), out + ".png")
    for line in recommendations:
        print(line)
    log("wrote " + ", ".join(os.path.relpath(p, ROOT) for p in written))
    return rows


if __name__ == "__main__":
    main()
