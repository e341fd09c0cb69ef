"""The translation benchmark's students and what several scripts share about them: the student grid (PET,
its ablations and competitors: word-KD, Patient-KD, CAN, seq-KD) with each method's training stages and
fairseq-train command, the resumable stage runner, the PET paper's numbers, PET Table 9's lines and the
BLEU plots (PET Fig 5). Used by bench_translation.py, bench_iwslt14.py, merge_translation_tables.py and
pet_report.py (each imports it as a module; no script loads another script).
"""
import json
import os

from benchlib import (ROOT, SHIPPED_TEACHER, Device, fairseq_train_seconds, plot_panels, selection_flags, stage,
                      validation_updates)

REFERENCE_TEACHER = SHIPPED_TEACHER  # the reference teacher as it ships (checkpoints/multi30k.de-en)

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
                               "CE on the teacher's beam-5 outputs of the training set (user_dir/baselines/tools/seq_kd_data.py)",
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


def train_command(data, teacher, arch, criterion, n, seed, lr_warmup, save_dir, previous, extra, selection=(),
                  device=None):
    """The fairseq-train arguments (after ``fairseq-train``) of one stage of ``n`` updates; ``selection``: its
    validation flags (benchlib.selection_flags); ``device``: benchlib.Device's argument (default the CPU)."""
    name = criterion[criterion.index("--criterion") + 1]
    args = [data, "--user-dir", os.path.join(ROOT, "user_dir"), *arch, *criterion, *OPTIM,
            "--warmup-updates", str(min(lr_warmup, max(1, n // 2))),
            *([] if name in TEACHER_FREE else ["--teacher-path", teacher]),
            "--max-update", str(n), "--max-epoch", "1000", "--seed", str(seed), *Device(device).train_flags(),
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50",
            *selection, *extra]
    return args + (["--finetune-from-model", previous] if previous else [])


def run_stages(run_dir, data, teacher, arch, stages, seed, updates, warmup_updates, threads, lr_warmup, extra,
               plan=(0, []), device=None):
    """Train one (method, seed) run, each stage a resumable benchlib stage (``DONE``, ``settings.json``, its
    fairseq log ``train.log``), validated at ``plan``'s points of the whole budget (benchlib.validation_plan).
    Returns {"last", "best" (None without validation), "seconds" (fairseq's training time), "validations"
    (the update counts of the whole budget at which it was validated)}; ``device``: benchlib.Device's argument."""
    previous, start, seconds, validations, best = None, 0, 0.0, [], None
    for name, criterion, share in stages:
        save_dir = os.path.join(run_dir, name)
        n = stage_updates(share, updates, warmup_updates)
        selection = selection_flags(plan, start, n, best_metric="loss")
        cmd = [*Device(device).train(),
               *train_command(data, teacher, arch, criterion, n, seed, lr_warmup, save_dir, previous, extra, selection,
                              device)]
        log = os.path.join(save_dir, "train.log")
        stage(save_dir, [cmd], threads, logfile=log)
        seconds += fairseq_train_seconds(log)
        validations += [start + u for u in validation_updates(log)]
        if "--disable-validation" not in selection:
            best = os.path.join(save_dir, "checkpoint_best.pt")
        previous, start = os.path.join(save_dir, "checkpoint_last.pt"), start + n
    return {"last": previous, "best": best, "seconds": seconds, "validations": validations}


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


def plot_students(stats, teacher, out_prefix, speed_label="sentences / s (beam 5, CPU)", command=None):
    """PET Fig 5 at our scale: BLEU vs compression rate, and BLEU vs sentences/s, one point per method
    (``stats[m]["speed"]`` in the unit ``speed_label`` names, the teacher's in ``teacher["sentences_per_s"]``);
    returns the PNGs written."""
    written = []
    for key, label, fname in (("compression", "non-embedding parameters, % of the teacher", "bleu_vs_compression"),
                              ("speed", speed_label, "bleu_vs_speed")):
        ys = [st["bleu"][0] for st in stats.values()] + [teacher["bleu_tok"]]
        label_y = dodged(stats, key, gap=0.045 * (max(ys) - min(ys) or 1.0))
        # each label 5 points right of its point, at its dodged height (data units)
        points = [dict(x=[st[key]], y=[st["bleu"][0]], yerr=[st["bleu"][1]], kind="errorbar", fmt="o", capsize=3,
                       notes=[method], note_y=[label_y[method]], note_offset=(5, 0), note_style=dict(fontsize=7))
                  for method, st in stats.items()]
        panel = dict(series=points, xlabel=label, ylabel="BLEU (test_2016_flickr)", title_size=9,
                     title="Multi30k DE->EN, " + ("size" if key == "compression" else "speed") + " (cf. PET Fig 5)")
        if key == "speed":
            panel["hlines"] = [dict(y=teacher["bleu_tok"], ls="--", c="grey", lw=0.8)]
            points.append(dict(x=[teacher["sentences_per_s"]], y=[teacher["bleu_tok"]], style="k*", ms=10,
                               notes=["teacher"], note_offset=(4, -10), note_style=dict(fontsize=7)))
        else:
            panel["hlines"] = [dict(y=teacher["bleu_tok"], ls="--", c="grey", lw=0.8, label="teacher")]
            panel["legend"] = dict(fontsize=7)
        path = plot_panels(f"{out_prefix}_{fname}.png", [panel], command=command, figsize=(5.5, 4))
        if path is None:
            return []
        written.append(path)
    return written



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

