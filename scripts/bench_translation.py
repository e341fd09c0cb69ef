#!/usr/bin/env python
"""The translation benchmark: compress the Multi30k DE->EN teacher with every method at one
training budget, several seeds, and measure all models side by side in one run.

    python scripts/bench_translation.py                      # the full grid -> results/translation.md
    python scripts/bench_translation.py --methods pet pet-nowarmup --seeds 1 2 3
    python scripts/bench_translation.py --quick              # the whole grid in minutes (CI, smoke test)

Every method trains for the same number of updates (``--updates``); PET spends ``--warmup-updates``
of them on the simplified task (paper: 3 epochs) and the rest on word-level KD, so "warm-up versus
no warm-up" (PET Table 9) compares at an equal budget. Runs are resumable: a finished stage
(``DONE`` file) is never retrained, an interrupted one resumes from its ``checkpoint_last.pt``
(fairseq's own resume). Runs execute ``--jobs`` at a time, each with ``--threads`` torch threads
(on 2 cores, two 1-thread runs finish sooner than one 2-thread run). After training, the teacher
and every student go through ``user_dir.tools.measure`` in one run (speed measured with nothing
else running), and the summary -- mean +- std over seeds -- is written to ``--out``, the raw
measurement (every row unrounded, the commands, machine, date and load) beside it as ``--out``'s
name with ``.json``: one JSON per table, so parts of a grid measured separately never overwrite
each other's, and ``--render TABLE.json`` writes a table again from it without training or measuring.
"""
import argparse
import concurrent.futures
import json
import logging
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
REFERENCE_TEACHER = os.path.join(SHARED, "teachers", "multi30k.de-en", "teacher.pt")

# Optimisation shared by every student: the teacher's recipe (Adam, inverse_sqrt) with the lr
# warm-up shortened to fit CPU-scale budgets, and dropout 0.1 for students of ~0.5M non-embedding
# parameters (the teacher's 0.3 is for 5.5M).
OPTIM = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
         "--warmup-init-lr", "1e-7", "--weight-decay", "1e-4", "--dropout", "0.1", "--max-tokens", "2048"]
KD = ["--criterion", "kd", "--label-smoothing", "0.1", "--kd-alpha", "0.5", "--kd-temperature", "1"]
WARMUP = ["--criterion", "pet_warmup"]


CE = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
PKD = ["--criterion", "patient_kd", "--label-smoothing", "0.1", "--kd-alpha", "0.5", "--kd-temperature", "1"]


def pet_arch(enc, dec, *extra):
    return ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", str(enc), "--decoder-embed-dim", str(dec),
            "--share-decoder-input-output-embed", *extra]


def plain_arch(enc, dec):
    """PET's student without sharing: its 2+2 physical layers as a stock Transformer (same widths,
    FFN 2x, 4 heads), so the non-embedding size differs from PET's only by the decoder queries
    PET shares (+1 point of compression at the default widths)."""
    return ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2",
            "--encoder-embed-dim", str(enc), "--decoder-embed-dim", str(dec), "--encoder-ffn-embed-dim", str(2 * enc),
            "--decoder-ffn-embed-dim", str(2 * dec), "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-decoder-input-output-embed"]


def can_arch(dim, enc_layers):
    """CAN's deep encoder (enc_layers) and one compressed-attention decoder layer, all at one width."""
    return ["--arch", "can_transformer_iwslt", "--encoder-layers", str(enc_layers), "--decoder-layers", "1",
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim), "--encoder-ffn-embed-dim", str(2 * dim),
            "--decoder-ffn-embed-dim", str(2 * dim), "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-decoder-input-output-embed"]


# method -> (group, description, arch flags, stages); a stage is (name, criterion flags, share of
# the budget). A stage after the first starts from the previous stage's last checkpoint
# (--finetune-from-model). Group "main" runs with every seed, "ablation" (PET Tables 2-4, 8, 10)
# with the first seed only, when --ablations is given; "extra" (seq-kd) only when --methods names it
# (it first decodes the training set with the teacher: ~15 minutes on 2 CPU cores).
def methods(enc, dec, can_dim, can_layers):
    pet = pet_arch(enc, dec)
    grid = {
        "pet": ("main", "PET: shared pairs (1,3),(2,4), enc Q<->K, dec Qself=Qed; warm-up then word KD",
                pet, [("warmup", WARMUP, "warmup"), ("kd", KD, "rest")]),
        "pet-nowarmup": ("main", "PET without the simplified-task warm-up (Table 9), word KD for the whole budget",
                         pet, [("kd", KD, "all")]),
        "word-kd": ("main", "word-level KD into a plain 2+2-layer Transformer of PET's widths",
                    plain_arch(enc, dec), [("kd", KD, "all")]),
        "patient-kd": ("main", "Patient-KD (KD + beta * normalised hidden-state MSE, skip layer map) into the "
                               "same plain student", plain_arch(enc, dec), [("kd", PKD, "all")]),
        "can": ("main", f"CAN: {can_layers}-layer encoder, 1 compressed-attention decoder layer, width {can_dim}, "
                        "word KD", can_arch(can_dim, can_layers), [("kd", KD, "all")]),
    }
    grid["seq-kd"] = ("extra", "sequence-level KD (Kim & Rush 2016): the plain student trained with label-smoothed "
                               "CE on the teacher's beam-5 outputs of the training set (user_dir/tools/seq_kd_data.py)",
                      plain_arch(enc, dec), [("ce", CE, "all")])
    pet_stages = [("warmup", WARMUP, "warmup"), ("kd", KD, "rest")]
    for pairing in ("adjacent", "mirrored"):
        grid[f"pet-layers-{pairing}"] = ("ablation", f"PET, layer pairing {pairing} (Table 2)",
                                         pet_arch(enc, dec, "--layer-pairing", pairing), pet_stages)
    # Table 2's "No pair": the 4+4-layer student without layer- or matrix-wise pairs (PET's encoder
    # Q<->K pairs matrices across a layer pair, so it cannot stay): twice PET's layer parameters
    grid["pet-layers-none"] = ("ablation", "PET's 4+4 student with no sharing at all (Table 2, No pair)",
                               pet_arch(enc, dec, "--layer-pairing", "none", "--encoder-matrix-pairs", "none",
                                        "--decoder-matrix-pairs", "none"), pet_stages)
    for pairs in ("kv", "vq", "none"):
        grid[f"pet-enc-{pairs}"] = ("ablation", f"PET, encoder matrix pairs {pairs} (Table 3)",
                                    pet_arch(enc, dec, "--encoder-matrix-pairs", pairs), pet_stages)
    # swap-qk-all trades the encoder-decoder attention's q (dec x dec) and k (dec x enc) projections: it
    # exists only for equal widths (ours are 128/96 to stay under 10% of the teacher)
    for pairs in ("qself-kself", "kv-self-ed") + (("swap-qk-all",) if enc == dec else ()) + ("none",):
        grid[f"pet-dec-{pairs}"] = ("ablation", f"PET, decoder matrix pairs {pairs} (Tables 4, 8)",
                                    pet_arch(enc, dec, "--decoder-matrix-pairs", pairs), pet_stages)
    for mapping in ("output-layer", "projection"):
        grid[f"pet-warmup-{mapping}"] = ("ablation", f"PET, naive warm-up mapping: {mapping} (Table 10)", pet,
                                         [("warmup", WARMUP + ["--warmup-mapping", mapping], "warmup"),
                                          ("kd", KD, "rest")])
    return grid


# criteria that train on the data alone: they take no --teacher-path
TEACHER_FREE = {"label_smoothed_cross_entropy"}


def stage_updates(share, updates, warmup_updates):
    return {"warmup": warmup_updates, "rest": updates - warmup_updates, "all": updates}[share]


def train_command(data, teacher, arch, criterion, n, seed, lr_warmup, save_dir, previous, extra):
    """The fairseq-train arguments (after ``fairseq-train``) of one stage of ``n`` updates."""
    name = criterion[criterion.index("--criterion") + 1]
    args = [data, "--user-dir", os.path.join(ROOT, "user_dir"), *arch, *criterion, *OPTIM,
            "--warmup-updates", str(min(lr_warmup, max(1, n // 2))),
            *([] if name in TEACHER_FREE else ["--teacher-path", teacher]),
            "--max-update", str(n), "--max-epoch", "1000", "--seed", str(seed), "--cpu",
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50", *extra]
    return args + (["--finetune-from-model", previous] if previous else [])


def run_stages(run_dir, data, teacher, arch, stages, seed, updates, warmup_updates, threads, lr_warmup, extra):
    """Train one (method, seed) run; returns the path of its final checkpoint."""
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    previous = None
    for name, criterion, share in stages:
        save_dir = os.path.join(run_dir, name)
        n = stage_updates(share, updates, warmup_updates)
        if not os.path.exists(os.path.join(save_dir, "DONE")):
            cmd = [sys.executable, "-m", "fairseq_cli.train",
                   *train_command(data, teacher, arch, criterion, n, seed, lr_warmup, save_dir, previous, extra)]
            os.makedirs(save_dir, exist_ok=True)
            with open(os.path.join(save_dir, "train.log"), "a") as log:
                log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(shlex.quote(c) for c in cmd)}\n")
                log.flush()
                started = time.time()
                rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            if rc != 0:
                raise RuntimeError(f"{save_dir}: fairseq-train failed (exit {rc}); see {save_dir}/train.log")
            with open(os.path.join(save_dir, "DONE"), "w") as f:
                json.dump({"updates": n, "seconds": time.time() - started, "threads": threads}, f)
        previous = os.path.join(save_dir, "checkpoint_last.pt")
    return previous


# the paper's IWSLT'14 DE->EN numbers (PET Tables 7-10), shown beside ours
PAPER_TEACHER_BLEU = "34.63"
PAPER = {"pet": ("9.51", "34.36 +- 0.14"), "patient-kd": ("9.88", "33.24 +- 0.23"), "can": ("9.52", "31.15 +- 0.39"),
         "pet-nowarmup": ("", "34.05"), "pet-dec-qself-kself": ("", "30.94"), "pet-dec-kv-self-ed": ("", "33.98"),
         "pet-warmup-output-layer": ("", "30.89"), "pet-warmup-projection": ("", "33.97")}
# Tables 2 and 3 are greedy steps on 4-layer models, no KD or warm-up named (Table 2: layer-wise pairs only, no
# matrix pairs; Table 3: encoder matrix pairs on top of (1,3),(2,4)); our ablations change one choice of
# the full PET at a time (Table 8's design), so these numbers show the paper's order, not its setting
PAPER_ABLATION = {"pet": "T2: 34.57, T3: 34.62, T8: 34.36", "pet-layers-none": "T2: 34.24",
                  "pet-layers-adjacent": "T2: 34.40", "pet-layers-mirrored": "T2: 33.83",
                  "pet-enc-none": "T3: 34.57", "pet-enc-kv": "T3: 34.35", "pet-enc-vq": "T3: 34.51",
                  "pet-dec-qself-kself": "T8: 30.94", "pet-dec-kv-self-ed": "T8: 33.98",
                  # no decoder pairs is Table 3's Q<->K row; Table 4's text gives PET's Qself=Qed 34.51 beside it
                  "pet-dec-none": "T3: 34.62 (PET: 34.51, T4 text)",
                  "pet-warmup-output-layer": "T10: 30.89", "pet-warmup-projection": "T10: 33.97"}


def method_of(run):
    """The method of a run named ``<method>-s<seed>``."""
    return run.rsplit("-s", 1)[0]


def summarise(rows, grid, args, command):
    """Mean +- std over seeds per method, the paper's numbers beside, Table 9, ablations, per run."""
    by_method = {}
    for row in rows:
        if row["name"] != "teacher":
            by_method.setdefault(method_of(row["name"]), []).append(row)
    teacher = next(r for r in rows if r["name"] == "teacher")

    def mean_std(values):
        return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)

    def shown(values):  # "mean +- std", or the single value of a one-seed method (no spread to show)
        m, sd = mean_std(values)
        return f"{m:.2f} +- {sd:.2f}" if len(values) > 1 else f"{m:.2f}"

    work = os.path.relpath(args.work, ROOT)
    lines = ["# Translation benchmark: compressing the Multi30k DE->EN teacher", "",
             f"Teacher: `{os.path.relpath(args.teacher, ROOT)}` (3+3 layers, width 256). Test set: test_2016_flickr "
             f"({teacher['sentences']:,} sentences), beam 5, batch 128 sentences. Every student trains for "
             f"{args.updates} updates from scratch (PET: the first {args.warmup_updates} on the simplified "
             f"warm-up task) and is scored at its last update. BLEU is the mean +- sample std over seeds; "
             f"sent/s the mean over seeds of each model's median of {args.measure_runs} timed runs, all models "
             f"measured in turn in one run (comparable within this table; the machine line gives the load the "
             f"measurement ran under). Compression = non-embedding parameters "
             f"in % of the teacher's. The paper's column: IWSLT'14 DE->EN, Transformer teacher {PAPER_TEACHER_BLEU} BLEU "
             f"(PET Table 7) -- a different scale, for orientation only.", ""]
    stats = {}

    def table(group):
        paper_header = "paper: BLEU (table)" if group == "ablation" else "paper: compression, BLEU"
        out = ["| method | seeds | BLEU (tok) | sacreBLEU | non-emb params | compression | weights MB | sent/s | "
               f"speed-up | {paper_header} |", "|---|---|---|---|---|---|---|---|---|---|"]
        if group == "main":
            out.append(f"| teacher | - | {teacher['bleu_tok']:.2f} | {teacher['sacrebleu']:.2f} | "
                       f"{teacher['non_embedding_params']:,} | 100.00% | {teacher['weights_mb']:.1f} | "
                       f"{teacher['sentences_per_s']:.1f} | 1.00x | 100%, {PAPER_TEACHER_BLEU} |")
        for method, runs in by_method.items():
            # the ablation table starts with PET itself (its first seed): what every ablation changes
            reference = group == "ablation" and method == "pet"
            if (grid[method][0] == "ablation") != (group == "ablation") and not reference:
                continue
            if reference:
                runs = runs[:1]
            tok = mean_std([r["bleu_tok"] for r in runs])
            speed = statistics.mean(r["sentences_per_s"] for r in runs)
            if not reference:
                stats[method] = dict(bleu=tok, speed=speed, compression=runs[0]["compression_rate"])
            paper = PAPER.get(method)
            paper = f"{paper[0] + '%, ' if paper[0] else ''}{paper[1]}" if paper else ""
            if group == "ablation":
                paper = PAPER_ABLATION.get(method, "")
            out.append(f"| {method} | {len(runs)} | {shown([r['bleu_tok'] for r in runs])} | "
                       f"{shown([r['sacrebleu'] for r in runs])} | "
                       f"{runs[0]['non_embedding_params']:,} | {runs[0]['compression_rate']:.2f}% | "
                       f"{runs[0]['weights_mb']:.1f} | {speed:.1f} | {speed / teacher['sentences_per_s']:.2f}x | "
                       f"{paper} |")
        return out

    lines += table("main")
    lines += warmup_table(teacher, stats)
    if any(grid[m][0] == "ablation" for m in by_method):
        lines += ["", f"## PET ablations (one seed; PET Tables 2, 3, 4/8, 10)", "",
                  "Each ablation changes one choice of the full PET and keeps the rest (the design of the paper's "
                  "Table 8); the first row is PET itself at the same seed. The paper's Tables 2 and 3 were instead "
                  "greedy steps on 4-layer models (its text names no KD or warm-up for them; Table 2's rows "
                  "share layers only, with no matrix pairs), so its column gives the order the paper found, not numbers for this setting. "
                  "`pet-layers-none` is Table 2's No pair: the 4+4-layer student with no sharing, twice PET's "
                  "layer parameters.", ""] + table("ablation")
    lines += ["", "Methods:", ""] + [f"- `{m}`: {grid[m][1]}" for m in by_method]
    lines += ["", "Per run:", "", "| run | BLEU (tok) | sacreBLEU | sent/s |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['bleu_tok']:.2f} | {r['sacrebleu']:.2f} | {r['sentences_per_s']:.1f} |" for r in rows]
    cores = os.cpu_count()
    load = (f"1-minute load average when the measurement ended: {args.load_after_measure:.1f} (the measurement "
            f"runs torch's default threads, keeping up to {cores} cores busy itself: well above {cores}, the timings "
            "shared the CPU with other jobs)" if args.load_after_measure is not None
            else "load during the measurement not recorded")
    lines += ["", f"Machine: {args.machine}; {load}.",
              f"Date of the measurement: {getattr(args, 'date', None) or time.strftime('%Y-%m-%d')}.", ""]
    if command:
        lines += ["Command (trains and measures only what is missing):", "```", command, "```"]
    else:  # a table rendered from a raw measurement that did not record the benchmark's command
        lines += ["Command that trained and measured: not recorded with the raw measurement; the measurement's own "
                  "command:", "```", args.measure_command, "```"]
    lines += [f"Training logs: `{work}/<budget>/<method>-s<seed>/<stage>/train.log` (budget: "
              f"`u<updates>-w<warm-up>-e<enc>-d<dec>`); the measurement command's own table: "
              f"`{os.path.relpath(args.measure_md, ROOT) if getattr(args, 'measure_md', None) else work + '/<budget>/measure.md'}`."]
    if getattr(args, "raw_json", None):
        lines += ["", f"Raw measurement (every row unrounded, with the measurement's command): `{args.raw_json}`."]
    if getattr(args, "rendered_by", None):
        lines += ["This table was written from it, training and measuring nothing, by:", "```", args.rendered_by, "```"]
    return "\n".join(lines + [""]), stats, teacher


def warmup_table(teacher, stats):
    """PET Table 9 at an equal budget: PET's and its no-warm-up twin's BLEU drop from the teacher
    (mean, std over seeds in ``stats[m]["bleu"]``); no lines unless both were run."""
    if "pet" not in stats or "pet-nowarmup" not in stats:
        return []
    t, w, n = teacher["bleu_tok"], stats["pet"]["bleu"], stats["pet-nowarmup"]["bleu"]
    return ["", "## Warm-up versus no warm-up at an equal budget (PET Table 9)", "",
            "| | BLEU (tok) | BLEU reduction vs teacher | paper's BLEU reduction |", "|---|---|---|---|",
            f"| with warm-up | {w[0]:.2f} +- {w[1]:.2f} | {t - w[0]:.2f} | 0.27 |",
            f"| without warm-up | {n[0]:.2f} +- {n[1]:.2f} | {t - n[0]:.2f} | 0.58 |"]


def dodged(stats, key, gap):
    """Label heights for the plot: each method's BLEU, moved apart (in BLEU units) so that labels of
    points with nearly the same x are at least ``gap`` apart; points far apart in x keep their BLEU."""
    heights = {m: st["bleu"][0] for m, st in stats.items()}
    xs = [st[key] for st in stats.values()]
    near = 0.1 * ((max(xs) - min(xs)) or 1.0)
    placed = []
    for method in sorted(heights, key=heights.get):
        clash = True
        while clash:  # move up past every placed label nearby, until none is within the gap
            clash = [o for o in placed if abs(stats[o][key] - stats[method][key]) < near
                     and abs(heights[method] - heights[o]) < 0.99 * gap]
            if clash:
                heights[method] = max(heights[o] for o in clash) + gap
        placed.append(method)
    return heights


def plot(stats, teacher, out_prefix, speed_label="sentences / s (beam 5, CPU)"):
    """PET Fig 5 at our scale: BLEU vs compression rate, and BLEU vs sentences/s, one point per method
    (``stats[m]["speed"]`` in the unit ``speed_label`` names, the teacher's in ``teacher["sentences_per_s"]``)."""
    try:
        import matplotlib
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.transforms import offset_copy
    except ImportError:
        print("[bench] matplotlib is not installed: no plots (pip install -e '.[plot]')", file=sys.stderr)
        return []
    written = []
    for key, label, fname in (("compression", "non-embedding parameters, % of the teacher", "bleu_vs_compression"),
                              ("speed", speed_label, "bleu_vs_speed")):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ys = [st["bleu"][0] for st in stats.values()] + [teacher["bleu_tok"]]
        label_y = dodged(stats, key, gap=0.045 * (max(ys) - min(ys) or 1.0))
        for method, st in stats.items():
            x = st[key]
            ax.errorbar([x], [st["bleu"][0]], yerr=[st["bleu"][1]], fmt="o", capsize=3)
            # the label 5 points right of its point, at its dodged height (data units)
            ax.annotate(method, (x, st["bleu"][0]), xytext=(x, label_y[method]), fontsize=7, va="center",
                        textcoords=offset_copy(ax.transData, fig=fig, x=5, y=0, units="points"))
        if key == "speed":
            ax.axhline(teacher["bleu_tok"], ls="--", c="grey", lw=0.8)
            ax.plot([teacher["sentences_per_s"]], [teacher["bleu_tok"]], "k*", ms=10)
            ax.annotate("teacher", (teacher["sentences_per_s"], teacher["bleu_tok"]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7)
        else:
            ax.axhline(teacher["bleu_tok"], ls="--", c="grey", lw=0.8, label="teacher")
            ax.legend(fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("BLEU (test_2016_flickr)")
        ax.set_title("Multi30k DE->EN, " + ("size" if key == "compression" else "speed") + " (cf. PET Fig 5)", fontsize=9)
        fig.tight_layout()
        path = f"{out_prefix}_{fname}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-translation"),
                   help="folder for data, runs and logs (default: work/bench-translation)")
    p.add_argument("--teacher", default=None,
                   help="teacher checkpoint (default: the reference teacher in ../shared/teachers/multi30k.de-en)")
    p.add_argument("--methods", nargs="+", default=None,
                   help="methods to run with every seed (default: pet pet-nowarmup word-kd patient-kd can)")
    p.add_argument("--ablations", nargs="*", default=None,
                   help="PET ablations to run with the first seed: none given = all of them (default: none run)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds per method (default: 1 2 3)")
    p.add_argument("--updates", type=int, default=800, help="training updates per run, all stages (default 800)")
    p.add_argument("--warmup-updates", type=int, default=200,
                   help="of which PET's simplified-task warm-up (default 200; the paper: 3 of its epochs)")
    p.add_argument("--lr-warmup", type=int, default=200, help="inverse_sqrt lr warm-up updates per stage (default 200)")
    p.add_argument("--enc-dim", type=int, default=128, help="student encoder width (default 128: <10%% of the teacher)")
    p.add_argument("--dec-dim", type=int, default=96, help="student decoder width (default 96)")
    p.add_argument("--can-dim", type=int, default=96,
                   help="CAN's width (default 96: with 6+1 layers, within 1 point of PET's compression, not below it)")
    p.add_argument("--can-encoder-layers", type=int, default=6, help="CAN's deep encoder (default 6, twice the teacher's)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training run (default 1)")
    p.add_argument("--measure-runs", type=int, default=5, help="timed generation runs per model (default 5)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only the first N test sentences")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: 1 seed, 6 updates, 50 test sentences, 1 timed run, into --work/quick")
    p.add_argument("--out", default=None, help="summary Markdown (default: results/translation.md; --quick: in --work); "
                                               "the raw measurement is kept beside it, named after it (.json)")
    p.add_argument("--render", default=None, metavar="TABLE.json",
                   help="write the table (and plots) of a kept raw measurement again, training and measuring nothing "
                        "(--out defaults to the JSON's name with .md)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    if args.render:
        return render(args, argv if argv is not None else sys.argv[1:])
    command = "python scripts/bench_translation.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    extra = []
    if args.quick:
        args.work = os.path.join(args.work, "quick")
        args.seeds, args.updates, args.warmup_updates, args.measure_runs = args.seeds[:1], 6, 3, 1
        args.max_sentences = args.max_sentences or 50
        extra = ["--max-tokens", "512"]
    args.teacher = os.path.abspath(args.teacher or REFERENCE_TEACHER)
    if not os.path.isfile(args.teacher):
        raise SystemExit(f"--teacher {args.teacher}: no such checkpoint (train one with "
                         "scripts/train_teacher_multi30k.sh and pass its checkpoint_best.pt)")
    if not 0 < args.warmup_updates < args.updates:
        raise SystemExit(f"--warmup-updates {args.warmup_updates}: must lie strictly between 0 and --updates {args.updates}")
    grid = methods(args.enc_dim, args.dec_dim, args.can_dim, args.can_encoder_layers)
    chosen = args.methods or [m for m, spec in grid.items() if spec[0] == "main"]
    ablations = [] if args.ablations is None else (args.ablations or [m for m, v in grid.items() if v[0] == "ablation"])
    unknown = [m for m in chosen + ablations if m not in grid]
    if unknown:
        raise SystemExit(f"--methods/--ablations: unknown {unknown}; known: {list(grid)}")
    sys.path.insert(0, ROOT)
    from user_dir.tools.measure import machine_description
    args.machine = machine_description()

    data = os.path.join(args.work, "data-bin")
    subprocess.check_call([sys.executable, "-m", "preprocess.prepare_multi30k", "--src", "de", "--tgt", "en",
                           "--dest", data], cwd=ROOT)
    data_for = {m: data for m in grid}
    if "seq-kd" in chosen:
        data_for["seq-kd"] = os.path.join(args.work, "data-bin-seqkd")
        if not os.path.isfile(os.path.join(data_for["seq-kd"], "DONE")):
            subprocess.check_call([sys.executable, "-m", "user_dir.tools.seq_kd_data", data, "--path", args.teacher,
                                   "--dest", data_for["seq-kd"], "--cpu"], cwd=ROOT)
            open(os.path.join(data_for["seq-kd"], "DONE"), "w").close()
    runs = [(m, s) for m in chosen for s in args.seeds] + [(m, args.seeds[0]) for m in ablations if m not in chosen]
    budget = f"u{args.updates}-w{args.warmup_updates}-e{args.enc_dim}-d{args.dec_dim}"
    checkpoints = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        # CAN's widths are not in the budget's name: keep them in its run folder, so runs of other widths never mix
        run_name = {"can": f"can-{args.can_dim}x{args.can_encoder_layers}"}
        futures = {pool.submit(run_stages, os.path.join(args.work, budget, f"{run_name.get(m, m)}-s{s}"), data_for[m],
                               args.teacher, grid[m][2], grid[m][3], s, args.updates, args.warmup_updates, args.threads,
                               args.lr_warmup, extra): (m, s)
                   # seed-major: an interrupted grid has every method at its first seed before any at its second
                   for m, s in sorted(runs, key=lambda run: args.seeds.index(run[1]))}
        for future in concurrent.futures.as_completed(futures):
            m, s = futures[future]
            checkpoints[f"{m}-s{s}"] = future.result()
            print(f"[bench] trained {m} seed {s}", file=sys.stderr, flush=True)

    names = ["teacher"] + [f"{m}-s{s}" for m, s in runs]
    out = args.out or (os.path.join(args.work, "translation.md") if args.quick
                       else os.path.join(ROOT, "results", "translation.md"))
    # the raw measurement is kept beside its table, named after it (results/<table>.json): parts of a grid
    # measured separately never overwrite each other's, and --render rewrites a table from it
    table_json = os.path.splitext(out)[0] + ".json"
    measure_md = os.path.join(args.work, budget, os.path.basename(os.path.splitext(out)[0]) + ".measure.md")
    cmd = [sys.executable, "-m", "user_dir.tools.measure", data, "--path", args.teacher,
           *[checkpoints[n] for n in names[1:]], "--names", *names,
           "--raw-reference", os.path.join(data, "text", "test.raw.en"), "--beam", "5", "--batch-size", "128",
           "--runs", str(args.measure_runs), "--out", measure_md, "--json", table_json]
    if args.max_sentences:
        cmd += ["--max-sentences", str(args.max_sentences)]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if measured_already(table_json, cmd):
        print(f"[bench] {table_json} already measures these checkpoints: not measuring again", file=sys.stderr)
        with open(table_json) as f:
            measured = json.load(f)
    else:
        subprocess.check_call(cmd, cwd=ROOT)
        with open(table_json) as f:
            measured = json.load(f)
        measured["load_after_measure"] = os.getloadavg()[0]  # kept with the timings it qualifies
    measured.update(bench_command=command, settings=dict(
        teacher=args.teacher, work=args.work, updates=args.updates, warmup_updates=args.warmup_updates,
        enc_dim=args.enc_dim, dec_dim=args.dec_dim, can_dim=args.can_dim, can_encoder_layers=args.can_encoder_layers,
        measure_runs=args.measure_runs, measure_md=measure_md))
    with open(table_json, "w") as f:
        json.dump(measured, f, indent=1)
    write_table(measured, out, grid, args, command)


def write_table(measured, out, grid, args, command):
    """The summary table and its plots at ``out``, from a raw measurement (``out``'s JSON)."""
    args.load_after_measure = measured.get("load_after_measure")
    args.date = measured.get("date") or "not recorded in the raw measurement"
    args.measure_command, args.machine = measured["command"], measured["machine"]
    args.measure_md = (measured.get("settings") or {}).get("measure_md") or getattr(args, "measure_md", None)
    args.raw_json = os.path.basename(os.path.splitext(out)[0]) + ".json"
    unknown = sorted({method_of(r["name"]) for r in measured["rows"] if r["name"] != "teacher"} - set(grid))
    if unknown:
        raise SystemExit(f"{args.raw_json}: runs of unknown methods {unknown}")
    summary, stats, teacher = summarise(measured["rows"], grid, args, command)
    plots = plot(stats, teacher, os.path.splitext(out)[0])
    if plots:
        summary += "\nPlots (cf. PET Fig 5): " + ", ".join(f"`{os.path.basename(p)}`" for p in plots) + "\n"
    with open(out, "w") as f:
        f.write(summary)
    print(summary)
    print(f"[bench] wrote {out}", file=sys.stderr)


BUDGET_DIR = re.compile(r"^u(\d+)-w(\d+)-e(\d+)-d(\d+)$")


def settings_of(measured, path):
    """The benchmark settings of a raw measurement: as recorded (``settings``), or, for a measurement
    kept before they were recorded, read off its measurement command (checkpoints under
    ``<work>/u<updates>-w<warm-up>-e<enc>-d<dec>/``, ``--runs``, ``--out``)."""
    if "settings" in measured:
        return measured["settings"]
    argv = shlex.split(measured["command"])

    def value(flag):
        if flag not in argv:
            raise SystemExit(f"{path}: its measurement command has no {flag}: not a benchmark measurement")
        return argv[argv.index(flag) + 1]

    students = [r["path"] for r in measured["rows"] if r["name"] != "teacher"]
    budgets = {os.path.dirname(os.path.dirname(os.path.dirname(p))) for p in students}
    if len(budgets) != 1 or not BUDGET_DIR.match(os.path.basename(next(iter(budgets)))):
        raise SystemExit(f"{path}: its checkpoints are not under one <work>/u<updates>-w<warm-up>-e<enc>-d<dec>/ "
                         f"folder ({sorted(budgets)}): cannot tell the training budget")
    budget = next(iter(budgets))
    updates, warmup, enc, dec = map(int, BUDGET_DIR.match(os.path.basename(budget)).groups())
    can = [re.search(r"/can-(\d+)x(\d+)-s\d+/", p) for p in students]
    can = next((m.groups() for m in can if m), (96, 6))
    teacher = next(r["path"] for r in measured["rows"] if r["name"] == "teacher")
    return dict(teacher=teacher, work=os.path.dirname(budget), updates=updates, warmup_updates=warmup, enc_dim=enc,
                dec_dim=dec, can_dim=int(can[0]), can_encoder_layers=int(can[1]), measure_runs=int(value("--runs")),
                measure_md=value("--out"))


def render(args, argv):
    """--render: the table of a kept raw measurement, training and measuring nothing."""
    if not os.path.isfile(args.render):
        raise SystemExit(f"--render {args.render}: no such file")
    with open(args.render) as f:
        measured = json.load(f)
    if not measured.get("rows") or not any(r["name"] == "teacher" for r in measured["rows"]):
        raise SystemExit(f"--render {args.render}: no measured rows with a teacher (is it a benchmark table's JSON?)")
    settings = settings_of(measured, args.render)
    for key, value in settings.items():
        setattr(args, key, value)
    out = args.out or os.path.splitext(args.render)[0] + ".md"
    if os.path.splitext(os.path.abspath(out))[0] != os.path.splitext(os.path.abspath(args.render))[0]:
        raise SystemExit(f"--out {out}: a table is named after its raw measurement ({args.render})")
    args.rendered_by = "python scripts/bench_translation.py " + " ".join(shlex.quote(a) for a in argv)
    grid = methods(args.enc_dim, args.dec_dim, args.can_dim, args.can_encoder_layers)
    write_table(measured, out, grid, args, measured.get("bench_command"))


def measured_already(measure_json, cmd):
    """True when measure_json came from the same models (same names and checkpoints, none newer)."""
    if not os.path.isfile(measure_json):
        return False
    with open(measure_json) as f:
        rows = json.load(f)["rows"]
    def values(flag):  # the arguments of a multi-valued flag: up to the next flag
        start = cmd.index(flag) + 1
        end = next((i for i in range(start, len(cmd)) if str(cmd[i]).startswith("--")), len(cmd))
        return cmd[start:end]

    paths, names = values("--path"), values("--names")
    same = [r["name"] for r in rows] == names and \
        [os.path.realpath(r["path"]) for r in rows] == [os.path.realpath(p) for p in paths]
    return same and all(os.path.getmtime(p) < os.path.getmtime(measure_json) for p in paths)


if __name__ == "__main__":
    main()
