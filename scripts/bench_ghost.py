#!/usr/bin/env python
"""The GhostBERT benchmark on translation: the encoder of the reference Multi30k DE->EN teacher
(../shared/teachers, 4 heads) pruned to width multiplier m, "pruned only" against GhostBERT with
the identical procedure (Table 3 / Table 10's comparison), written to results/ghostbert.md
(+ .json of the raw numbers, + a PNG of BLEU against encoder FLOPs).

    nice -n 10 python scripts/bench_ghost.py                     # m = 2/4 and 1/4 (resumable)
    python scripts/bench_ghost.py --report-only                  # the table again from the work folder
    python scripts/bench_ghost.py --quick                        # a smoke test of every stage

Per m and variant (``--ghost-positions none`` = pruned only; ``o,ffn2`` = GhostBERT):
1. ``python -m user_dir.tools.ghost_prune`` -- importance on the valid set, rewiring, slicing;
2. ``fairseq-train --criterion ghost_distill --teacher-path TEACHER --finetune-from-model init.pt``
   (embedding + post-MHA + post-FFN MSE, eq 6), ``--distill-updates`` updates;
3. ``fairseq-train --criterion label_smoothed_cross_entropy --finetune-from-model`` the distilled
   checkpoint, ``--finetune-updates`` updates;
4. ``fairseq-generate`` on test, beam 5 (BLEU4 as fairseq reports it), for the initial pruned
   checkpoint (no training) and the final one.
Every stage is bounded by updates and skipped when its output exists; fairseq-train resumes from
its own checkpoint_last.pt.

Cost, per model: parameters (total, encoder, ghost modules), encoder FLOPs on one sequence of 128
tokens counted by PyTorch's FlopCounterMode (Appendix A.3's protocol: batch 1, length 128, no
embedding lookup; the DWConv ghost modules, which run as shifted multiply-adds the counter does not
see, added analytically: 2 n d k per module), and the encoder's forward time on ``--time-batch`` sequences of 128 real test
tokens, every model timed against the teacher alternately in each of ``--runs`` runs (speed-up =
median over runs of median(teacher) / median(model)).

Our choices for a CPU budget (the paper's Table 8 is for BERT on GLUE): Adam, lr 5e-4 with linear
decay to 0 and no warm-up (Table 8: linear decay, no warm-up), gradient clipping 1, dropout 0.1,
weight decay 0 (Table 8), ``--max-tokens 2048`` batches; the same for both variants.
"""
import argparse
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


def measure_costs(paths, args):
    """Parameters, FLOPs at length 128 and alternating encoder timings of ``paths`` (first: teacher)."""
    import torch
    from fairseq import checkpoint_utils
    from torch.utils.flop_counter import FlopCounterMode

    import user_dir  # noqa: F401
    from user_dir.common.counting import count_parameters
    from user_dir.common.structured_pruning import transformer_encoder
    from user_dir.ghost.ghost_module import flops_outside_torch_counter
    from user_dir.tools.encoder_cost import real_batch

    torch.set_num_threads(args.threads)
    models, task = [], None
    for path in paths:
        loaded, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": args.data})
        models.append(loaded[0].eval())
    tokens = real_batch(task, "test", 128, args.time_batch)
    one = tokens[:1]
    costs = []
    for model in models:
        encoder = transformer_encoder(model)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
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


def write_report(result, out):
    rows = result["rows"]
    teacher = rows[0]
    lines = [
        "# GhostBERT on translation: the Multi30k DE->EN teacher's encoder pruned, with and without ghost modules",
        "",
        f"Made by `{result['command']}` on {result['machine']} ({result['date']}); seed {result['seed']}. "
        f"Raw numbers: `{os.path.basename(out)}.json`; plot: `{os.path.basename(out)}.png`.",
        "",
        f"Teacher: `{result['teacher']}` (3+3 layers, d = 256, 4 heads, FFN 1024). Width multiplier m keeps "
        "M = floor(4 m) heads and 1024 M / 4 FFN neurons in every encoder layer, chosen by first-order "
        "importance on the valid set (DynaBERT); the decoder is the teacher's. Both variants get the identical "
        f"procedure: {result['distill_updates']} updates of hidden-state distillation from the teacher "
        f"(eq 6), then {result['finetune_updates']} updates of label-smoothed cross-entropy "
        f"(Adam, lr {result['lr']} decaying linearly to 0, dropout 0.1, clip 1, 2,048-token batches). "
        "No data augmentation (not available offline). The control row is the unpruned teacher given the "
        "fine-tuning stage alone (the teacher stopped on a time limit, still improving: extra training by "
        "itself moves its BLEU). BLEU4: fairseq-generate on test_2016_flickr, beam 5.",
        "",
        "| model | m | params | encoder-layer params | ghost params | encoder FLOPs (len 128) | encoder speed-up "
        "[min-max] | BLEU, pruned, untrained | BLEU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        name = LABELS[row["variant"]]
        flops_pct = 100.0 * row["encoder_flops_128"] / teacher["encoder_flops_128"]
        untrained = f"{row['bleu_init']:.2f}" if "bleu_init" in row else ""
        lines.append(
            f"| {name} | {row['m']} | {row['params']:,} | {row['encoder_params']:,} | {row['ghost_params']:,} | "
            f"{row['encoder_flops_128'] / 1e6:.1f}M ({flops_pct:.1f}%) | {row['speedup']:.2f}x "
            f"[{row['speedup_range'][0]:.2f}-{row['speedup_range'][1]:.2f}] | {untrained} | {row['bleu']:.2f} |")
    by = {(r["m"], r["variant"]): r for r in rows}
    diffs = [f"m = {m}: {by[(m, 'ghost')]['bleu'] - by[(m, 'pruned')]['bleu']:+.2f} BLEU "
             f"({by[(m, 'ghost')]['ghost_params']:,} ghost parameters, "
             f"{100.0 * by[(m, 'ghost')]['ghost_params'] / by[(m, 'ghost')]['params']:.3f}% of the model)"
             for m in dict.fromkeys(r["m"] for r in rows) if (m, "ghost") in by and (m, "pruned") in by]
    if diffs:
        lines += ["", "GhostBERT minus pruned only, same procedure: " + "; ".join(diffs) + "."]
    lines += ["", "What each ghost-module setting adds to BERT-base (12 layers, d = 768, after O and after FFN2 unless "
              "the row says otherwise; our modules' counts; the paper: 55.3K parameters and 14.2M FLOPs for the "
              "default; Table 5: Conv1D_F +1M / +1.8G over DWConv at m = 3/12; Table 6: after QK +13M / +3.4G, "
              "after V +7M / +1.6G over after O at m = 1/12, rounded):", "",
              "| setting | parameters | FLOPs at length 128 |", "| --- | --- | --- |"]
    lines += [f"| {r['setting']} | {r['params']:,} | {r['flops_128'] / 1e6:.1f}M |" for r in result["bert_base_ghost_costs"]]
    lines += ["", f"Encoder speed: forward of {result['time_batch']} sequences x 128 real test tokens, "
              f"{result['runs']} runs of {result['repeats']} alternating teacher/model forwards, "
              f"{result['threads']} thread(s), on a machine shared with other jobs (load average "
              f"{result['load']} at the start of the measurement).", "", PAPER, ""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    plot(result, out + ".png")


def plot(result, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, marker in (("teacher", "*"), ("teacher-ce", "P"), ("pruned", "o"), ("ghost", "s")):
        rows = sorted((r for r in result["rows"] if r["variant"] == variant), key=lambda r: r["encoder_flops_128"])
        ax.plot([r["encoder_flops_128"] / 1e6 for r in rows], [r["bleu"] for r in rows], marker=marker, ls="-",
                label=LABELS[variant])
        for r in rows:
            ax.annotate(f"m={r['m']}", (r["encoder_flops_128"] / 1e6, r["bleu"]), textcoords="offset points",
                        xytext=(4, -10 if variant == "pruned" else 4), fontsize=8)
    for r in result["rows"]:
        if r["variant"] not in ("teacher", "teacher-ce", "pruned", "ghost"):  # ablations: single points
            ax.plot([r["encoder_flops_128"] / 1e6], [r["bleu"]], marker="x", ls="", color="grey")
            ax.annotate(f"{r['variant']} m={r['m']}", (r["encoder_flops_128"] / 1e6, r["bleu"]),
                        textcoords="offset points", xytext=(4, -4), fontsize=7, color="grey")
    ax.set_xlabel("encoder FLOPs at length 128 (M)")
    ax.set_ylabel("BLEU4 (test, beam 5)")
    ax.set_title("GhostBERT vs pruned only, Multi30k DE->EN")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(TEACHER_DIR, "data-bin"))
    parser.add_argument("--teacher", default=os.path.join(TEACHER_DIR, "teacher.pt"))
    parser.add_argument("--work", default=os.path.join(ROOT, "work", "ghost"))
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "ghostbert"))
    parser.add_argument("--widths", default="2/4,1/4", help="width multipliers m, comma-separated")
    parser.add_argument("--variants", default="pruned,ghost", help="variants trained at every m: " + ", ".join(VARIANTS))
    parser.add_argument("--extra", default="",
                        help="further m:variant runs, comma-separated (e.g. 1/4:ghost-no-softmax,4/4:ghost)")
    parser.add_argument("--distill-updates", type=int, default=200)
    parser.add_argument("--finetune-updates", type=int, default=60)
    parser.add_argument("--lr", type=float, default=5e-4)
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
    parser.add_argument("--quick", action="store_true", help="a smoke test: 3 importance batches, 5+5 updates")
    args = parser.parse_args(argv)
    if args.quick:
        args.distill_updates = args.finetune_updates = 5
        args.runs, args.repeats = 1, 1
        args.work, args.out = args.work + "_quick", os.path.join(args.work + "_quick", "ghostbert")
    if args.report_only:
        with open(args.out + ".json") as f:
            write_report(json.load(f), args.out)
        return
    if args.control_only:
        train_control(args)
        return
    runs = [(m, v) for m in args.widths.split(",") for v in args.variants.split(",")]
    runs += [tuple(spec.split(":")) for spec in args.extra.split(",") if spec]
    unknown = [v for _, v in runs if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    rows = []
    for m, variant in runs:
        log(f"m = {m}, {variant}")
        rows.append(train_variant(args, m, variant))
    if args.train_only:
        return
    teacher_bleu = bleu_of(args.teacher, args, os.path.join(args.work, "teacher", "generate.log"))
    rows.insert(0, {"m": "4/4", "variant": "teacher", "final": args.teacher, "bleu": teacher_bleu})
    rows.insert(1, train_control(args))
    log("measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args)):
        row.update(cost)
    result = {"command": "python scripts/bench_ghost.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seed": args.seed,
              "teacher": os.path.relpath(args.teacher, ROOT), "distill_updates": args.distill_updates,
              "finetune_updates": args.finetune_updates, "lr": args.lr, "threads": args.threads, "runs": args.runs,
              "repeats": args.repeats, "time_batch": args.time_batch, "load": round(load, 2),
              "bert_base_ghost_costs": ghost_costs_at_bert_base(),
              "rows": [{k: (os.path.relpath(v, ROOT) if k in ("init", "final") else v) for k, v in r.items()}
                       for r in rows]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    write_report(result, args.out)
    log(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
