#!/usr/bin/env python
"""The APC benchmark on the reference Multi30k DE->EN teacher (shipped in checkpoints/multi30k.de-en; its data-bin
built once from the embedded Multi30k by benchlib.multi30k_data_bin):
feed-forward compression (APC paper eq. 12) of every encoder and decoder FFN, 1024 -> cmp^f.

    python scripts/bench/bench_apc.py                 # -> work/results/apc.md, apc.json, apc_bleu_vs_params.png
    python scripts/bench/bench_apc.py --parts inits   # only the initialisation comparison at --compare-size
    python scripts/bench/bench_apc.py --parts embed word-kd   # embedding compression; word-KD students of --sizes

The seed runs of the committed tables (each seed trains in --work/seed<k>/, resumable; the whole test set:
the hypotheses of the paired tests are decoded for all of it anyway):

    python scripts/bench/bench_apc.py --parts sizes inits --all-params --seeds 1,2,3 --out results/apc
    python scripts/bench/bench_apc.py --parts sizes embed word-kd searched --sizes 128 --attn-dims 128 \\
        --embed-sizes 192,128,112 --kd-updates 300,2000 --updates 300 --work work/bench-apc-300 --seeds 1,2,3 \\
        --out results/apc_300_updates

Stages, each a stock command (``--user-dir user_dir``), skipped when its output exists (resumable):
1. ``python -m user_dir.apc.tools.init`` for every initialisation at ``--compare-size`` and the paper's
   best (neuron-pruning, Table 1) at every ``--sizes``: reconstruction error (eq. 4) on 5,000 sampled
   validation activations per layer.
2. ``fairseq-train --arch apc_transformer ... --finetune-from-model init.pt`` for ``--updates`` updates:
   only U, D, B, b_U, b_D train (Table 3 "Compr. only"), CE loss (the paper's choice, section 4.3),
   Adam at the paper's step size 1e-4 with linear decay to 0 (section 4.3); 30 updates by default
   (the paper trains 100 steps; 30 fit the grid into a shared 2-core CPU's time), validated ``--validations``
   times at the same update points (every variant alike).
   At ``--compare-size`` every initialisation, and with ``--all-params`` also Table 3's "All Params"
   (``--apc-train-original``) with neuron-pruning init.
3. ``python -m user_dir.apc.tools.finalize``: a stock ``transformer`` checkpoint with FFN width cmp^f.
4. Neuron pruning (the paper's Table 2 row): the neuron-pruning init finalized (exactly the pruned
   network, Algorithm 1) then fine-tuned as a stock ``transformer`` with all parameters trainable, the
   same updates, loss and optimizer. Table 3's "Finalized" strategy (``--parts inits``) is different: the
   APC model of stage 2 (compression updates) folded, then fine-tuned the same way for ``--updates`` more.
5. ``fc-measure`` (user_dir.tools.measure) on the teacher and every finalized model in one run: BLEU
   (beam 5) on test_2016_flickr, non-embedding parameters, sentences/s -- of the last checkpoint, the
   primary score; the best-of-N checkpoint (validation loss) is scored beside it (sacreBLEU of
   fairseq-generate's output). Every model's hypotheses are kept detokenised (``hypotheses/``, test-set
   order) for the paired tests: APC against neuron pruning (+FT) and against the word-KD student of its size
   (the cluster test of common/significance.py: test sentences as clusters of all seeds' outputs).
Seeds (``--seeds 1,2,3``): every stage per seed in ``--work``/seed<k>/; tables give the mean, spread and
every seed.

``--max-sentences N`` measures on the test sentences with id below N (the committed tables: 500, to fit
the measurement into a shared 2-core machine's time). Runs of one work folder are shared between
processes (other ``--parts``, or ``--seeds 3`` beside ``--seeds 1,2,3``): at every training and measurement a
``.running`` marker makes the second wait for the first, then reuse what it made.

Our choices: dropout 0.1 in fine-tuning (the teacher trained with 0.3; the paper does not say),
max 2,048 tokens per batch, one thread per run. ``--device cuda`` with ``--fp16`` or ``--bf16`` runs every
command on the GPU (benchlib.add_device_args; default: the CPU in float32); ``--jobs N`` trains N seeds at once.
"""
import argparse
import contextlib
import json
import os
import re
import sys
import time

from benchlib import (ROOT, add_device_args, add_seed_arguments, add_teacher_arguments, aggregate, bleu_comparison,
                      check_device, default_out, Device, fc_flags, fmt, generate_hypotheses, invocation, logger,
                      machine, multi30k_data_bin, multi30k_references, num, plot_panels, protocol_text, run_jobs,
                      sacrebleu_of, seed_dir, seeds_of, seeds_text, selection_flags, significance_lines, stage,
                      validation_plan, write_json, write_text)
from benchlib import run as run_logged

INITS = ("random", "reconstructive-random", "reconstructive-svd", "neuron-pruning", "kmeans")
PY = sys.executable


log = logger("bench_apc")


def run_shown(cmd, logfile, threads, alone=False):
    log("$ " + " ".join(str(c) for c in cmd))
    run_logged(cmd, logfile, threads, alone)


def apc_train_flags(args):
    return ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", str(args.lr),
            "--lr-scheduler", "polynomial_decay", "--total-num-update", str(args.updates), "--end-learning-rate", "0",
            "--max-update", str(args.updates), "--max-tokens", "2048", "--dropout", "0.1",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0",
            "--seed", str(args.seed), *Device(args).train_flags(), "--num-workers", "0", "--no-epoch-checkpoints",
            *selection_flags(args.plan, 0, args.updates, "loss"),
            "--log-format", "simple", "--log-interval", "10", "--no-progress-bar"]


def init_stage(args, work, init, size, attn=None, embed=None):
    """apc_init with every FFN at cmp^f ``size``, every attention at cmp^a ``attn``, every block at cmp^e
    ``embed`` (``None``: that compression is not applied); returns the checkpoint and apc_init's report (its
    reconstruction errors; the architecture flags are the checkpoint's, :func:`benchlib.fc_flags`)."""
    name = f"init_{init}" + (f"_{size}" if size else "") + (f"_attn{attn}" if attn else "")
    out = os.path.join(work, name + (f"_embed{embed}" if embed else "") + ".pt")
    dims = [("--encoder-ffn-dims", size), ("--decoder-ffn-dims", size), ("--encoder-attn-dims", attn),
            ("--decoder-attn-dims", attn), ("--cross-attn-dims", attn), ("--encoder-embed-dims", embed),
            ("--decoder-embed-dims", embed)]
    if not os.path.exists(out):
        run_shown([PY, "-m", "user_dir.apc.tools.init", args.teacher, "--data", args.data,
                   *[x for flag, value in dims if value for x in (flag, value)], "--init", init, "--seed", args.seed,
                   "--out", out], os.path.join(work, "log.txt"), args.threads)
    with open(os.path.splitext(out)[0] + ".json") as f:
        return out, json.load(f)


def finalize(args, work, src, out):
    if not os.path.exists(out):
        run_shown([PY, "-m", "user_dir.apc.tools.finalize", src, "--out", out], os.path.join(work, "log.txt"),
                  args.threads)
    return out


def train(args, work, name, init_ckpt, flags, recipe=None):
    """fairseq-train ``flags`` + ``recipe`` (default: :func:`apc_train_flags`) from ``init_ckpt`` (None: from
    scratch)."""
    save_dir = os.path.join(work, name)
    last = os.path.join(save_dir, "checkpoint_last.pt")
    done = os.path.join(save_dir, "DONE")
    start = ["--finetune-from-model", init_ckpt] if init_ckpt else []
    cmd = [*Device(args).train(), args.data, "--user-dir", "user_dir", *flags,
           *(recipe if recipe is not None else apc_train_flags(args)), *start, "--save-dir", save_dir]
    with claimed(save_dir, lambda: os.path.exists(done)):
        if not os.path.exists(done):
            os.makedirs(save_dir, exist_ok=True)
            log("$ " + " ".join(str(c) for c in cmd))
        stage(save_dir, [cmd], args.threads, logfile=save_dir + ".log")
    return last


@contextlib.contextmanager
def claimed(path, finished, poll=30):
    """Run the block as the one bench process working on ``path``: another process sharing the work folder (the
    other --parts, or a run of other --seeds) that holds ``path.running`` is waited for until it ends, then the
    block runs (it skips what ``finished()`` says that process made). Without it two processes measuring one seed
    wrote the same hypothesis files at once."""
    running = path + ".running"
    while not finished() and os.path.exists(running) and _alive(int(open(running).read() or 0)):
        time.sleep(poll)
    os.makedirs(os.path.dirname(running) or ".", exist_ok=True)
    with open(running, "w") as f:
        f.write(str(os.getpid()))
    try:
        yield
    finally:
        if os.path.exists(running) and open(running).read() == str(os.getpid()):
            os.remove(running)


def best_of(last, validations):
    """The best-of-N checkpoint beside a run's last one (None when N < 2: it is the last)."""
    return os.path.join(os.path.dirname(last), "checkpoint_best.pt") if validations > 1 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return pid > 0
    except OSError:
        return False


def stock_flags(apc_flags, size):
    """The init's fairseq flags for the finalized (stock transformer) model of FFN width ``size``: every APC
    flag dropped."""
    out, skip = [], False
    for i, f in enumerate(apc_flags):
        if skip:
            skip = False
            continue
        if f.startswith("--apc-"):
            skip = f not in ("--apc-train-original", "--apc-finalized")  # the others carry a value
            continue
        if f == "apc_transformer":
            f = "transformer"
        elif i > 0 and apc_flags[i - 1] in ("--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"):
            f = str(size)
        out.append(f)
    return out


def control_run(args, work, apc_flags):
    """The control row: the teacher itself trained with the same updates, loss and optimizer (all parameters),
    which separates what the extra training does from what the compression does."""
    last = train(args, work, "teacher-ft", args.teacher, stock_flags(apc_flags, 1024))
    return (f"teacher + {args.updates} updates", last, "control: the uncompressed teacher fine-tuned (all "
            "parameters) with the same updates, loss and optimizer")


def best_searched(folder: str) -> dict:
    """The sizes of the lowest-valid-loss trained candidate of an apc_search study folder (its trials' DONE
    files), e.g. ``{"encoder_ffn": "0:128,1:128,2:128", ...}``."""
    trials = os.path.join(folder, "trials")
    done = [json.load(open(os.path.join(trials, t, "DONE"))) for t in sorted(os.listdir(trials))
            if os.path.exists(os.path.join(trials, t, "DONE"))]
    if not done:
        raise SystemExit(f"--search-out {folder}: no trained candidate (run python -m user_dir.apc.tools.search first)")
    return min(done, key=lambda d: d["valid_loss"])["dims"]


def word_kd_flags(args, updates: int):
    """Word-level KD (Hinton et al.; the package's `kd` criterion, alpha 0.5, T = 1, as the translation benchmark's
    word-kd students) from scratch for ``updates`` updates: the teacher's recipe (Adam, inverse_sqrt, lr 1e-3) with
    a warm-up of min(400, updates / 2) updates."""
    return ["--criterion", "kd", "--teacher-path", args.teacher, "--label-smoothing", "0.1", "--kd-alpha", "0.5",
            "--kd-temperature", "1", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(min(400, updates // 2)), "--warmup-init-lr", "1e-7",
            "--weight-decay", "1e-4", "--dropout", "0.1", "--max-tokens", "2048", "--max-update", str(updates),
            "--max-epoch", "1000", "--seed", str(args.seed), *Device(args).train_flags(), "--num-workers", "0",
            "--no-epoch-checkpoints",
            *selection_flags(validation_plan(updates, updates, args.kd_validations, "--kd-validations"), 0, updates,
                             "loss"), "--log-format", "simple", "--log-interval", "50", "--no-progress-bar"]


def measure_models(args, work, tag, models):
    """fc-measure on the teacher and ``models`` [(name, checkpoint, best-of-N checkpoint or None)] in one run;
    cached by the names. Every model's hypotheses kept (its measured checkpoint, the primary score) and its
    best-of-N checkpoint's sacreBLEU: ``{"measure": fc-measure's JSON, "outputs": {name: {...}}}``."""
    tag = tag + (f"_first{args.max_sentences}" if args.max_sentences else "")
    out_json = os.path.join(work, f"measure_{tag}.json")
    names = ["teacher"] + [m[0] for m in models]
    references = multi30k_references(os.path.join(args.work, "test.raw.en"))
    outputs = {}
    with claimed(os.path.join(work, f"measure_{tag}"), lambda: False):
        if not (os.path.exists(out_json) and [r["name"] for r in json.load(open(out_json))["rows"]] == names):
            run_shown([PY, "-m", "user_dir.tools.measure", args.data, "--path", args.teacher, *[m[1] for m in models],
                       "--names", *names, "--runs", args.runs, *Device(args).measure(), "--threads", args.threads,
                       *(["--max-sentences", args.max_sentences] if args.max_sentences else []),
                       "--out", os.path.join(work, f"measure_{tag}.md"), "--json", out_json],
                      os.path.join(work, "log.txt"), args.threads,
                      alone=True)  # timed: nothing else of this run at the same time (--jobs)
        for name, checkpoint, best in models:
            slug = os.path.join(work, "hypotheses", re.sub(r"[^A-Za-z0-9_.-]+", "_", name))
            outputs[name] = {"hypotheses": generate_hypotheses(args.data, checkpoint, slug + ".last.txt",
                                                               args.threads, max_sentences=args.max_sentences,
                                                               device=args)}
            if best:
                hyps = generate_hypotheses(args.data, best, slug + ".best.txt", args.threads,
                                           max_sentences=args.max_sentences, device=args)
                outputs[name]["sacrebleu_best"] = sacrebleu_of(hyps, references)
    return {"measure": json.load(open(out_json)), "outputs": outputs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_teacher_arguments(p)
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-apc"))
    p.add_argument("--sizes", default="256,128,64", help="cmp^f values (the teacher's FFN width is 1024)")
    p.add_argument("--all-params", action="store_true",
                   help="also Table 3's 'All Params' strategy (--apc-train-original) at --compare-size")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="measure on the test sentences with id below N only (default: all 1,000)")
    p.add_argument("--attn-dims", default=None,
                   help="also, at every --sizes, APC with every attention compressed to this cmp^a (eqs 5-11; the "
                        "teacher's width is 256); default: FFN compression only")
    p.add_argument("--compare-size", default="256", help="cmp^f of the initialisation and strategy comparison")
    p.add_argument("--updates", type=int, default=30,
                   help="fine-tuning updates per run (paper: 100 steps; default 30 so the grid fits ~1.5 h on a "
                        "shared 2-core CPU)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (paper: 1e-4, linear decay)")
    add_seed_arguments(p, default="1")
    p.add_argument("--validations", type=int, default=3,
                   help="validations of every APC / pruning / control run at the same update points (default 3: "
                        "every 10 of 30 updates); the last checkpoint is the primary score, the best-of-N beside it")
    p.add_argument("--kd-validations", type=int, default=4,
                   help="validations of every word-KD student (default 4: they train --kd-updates each)")
    p.add_argument("--threads", type=int, default=1)
    add_device_args(p)
    p.add_argument("--jobs", type=int, default=1, help="seeds trained at once (default 1; the measurement of each "
                   "seed's models waits until no seed trains)")
    p.add_argument("--runs", type=int, default=1, help="timed runs of fc-measure (median)")
    p.add_argument("--embed-sizes", default="192,128",
                   help="cmp^e values of --parts embed (every encoder and decoder block; the teacher's width is 256)")
    p.add_argument("--kd-updates", default="300,2000",
                   help="comma-separated updates of the word-KD students of --parts word-kd, trained from scratch "
                        "(default 300,2000: APC's budget and a longer one)")
    p.add_argument("--search-out", default=os.path.join(ROOT, "work", "apc-search-multi30k"),
                   help="--parts searched: the apc_search study folder whose best sizes are trained and measured")
    p.add_argument("--search-init", default="reconstructive-svd", help="--parts searched: apc_init's --init (default: "
                   "the one results/apc_search_multi30k.md searched with)")
    p.add_argument("--parts", nargs="+", default=["sizes", "inits"],
                   choices=["sizes", "inits", "embed", "word-kd", "searched"],
                   help="sizes: APC vs neuron pruning at every --sizes; inits: the initialisation and strategy "
                        "comparison at --compare-size; embed: embedding compression at every --embed-sizes vs "
                        "hidden-dimension pruning; word-kd: a word-KD student of every --sizes' size; searched: "
                        "the best sizes of --search-out")
    p.add_argument("--out", default=default_out("apc"), help="results prefix (.md/.json/.png; default work/results/apc, "
                   "the committed one: results/apc)")
    p.add_argument("--report-only", action="store_true", help="rewrite OUT.md and the plot from OUT.json")
    args = p.parse_args(argv)
    args.seeds = seeds_of(p, args)
    check_device(p, args)
    if args.report_only:
        write_apc_report(args, json.load(open(args.out + ".json")))
        return
    args.data = args.data or multi30k_data_bin()
    args.plan = validation_plan(args.updates, args.updates, args.validations)
    for n in (int(x) for x in args.kd_updates.split(",")) if "word-kd" in args.parts else ():
        validation_plan(n, n, args.kd_validations, "--kd-validations")  # checked before anything trains
    command = invocation("bench_apc.py", argv)
    by_seed = dict(zip(args.seeds, run_jobs(lambda seed: run_seed(argparse.Namespace(**dict(vars(args), seed=seed)),
                                                                  command), args.seeds, args.jobs)))
    result = {"command": command, "updates": args.updates, "lr": args.lr, "seeds": args.seeds,
              "teacher": args.teacher, "validations": args.validations, "plan": list(args.plan),
              "kd_validations": args.kd_validations, "machine": machine(), "threads": args.threads,
              "device": repr(Device(args)),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for part in by_seed[args.seeds[0]]:
        result[part] = part_over_seeds({seed: parts[part] for seed, parts in by_seed.items()})
    result["references"] = multi30k_references(os.path.join(args.work, "test.raw.en"))  # of every hypotheses file
    result["comparisons"] = comparisons(result, args.seeds, result["references"])
    write_apc_report(args, result)


def part_over_seeds(by_seed):
    """One part from its seeds' parts: each model's measured row with its numbers as summaries over the seeds,
    every seed's hypotheses, the best-of-N sacreBLEU as a summary, every seed's measurement."""
    first = next(iter(by_seed.values()))
    names = [r["name"] for r in first["measure"]["rows"]]
    rows = [aggregate({seed: next(r for r in part["measure"]["rows"] if r["name"] == name)
                       for seed, part in by_seed.items()}) for name in names]
    outputs = {name: {"hypotheses": {str(seed): part["outputs"][name]["hypotheses"] for seed, part in by_seed.items()}}
               for name in first["outputs"]}
    for name in outputs:
        if "sacrebleu_best" in first["outputs"][name]:
            outputs[name]["sacrebleu_best"] = aggregate({seed: part["outputs"][name]["sacrebleu_best"]
                                                         for seed, part in by_seed.items()})
    part = {k: v for k, v in first.items() if k not in ("measure", "outputs")}
    return dict(part, measure=dict(first["measure"], rows=rows), outputs=outputs,
                per_seed={str(seed): p["measure"] for seed, p in by_seed.items()})


def comparisons(result, seeds, references):
    """The paired tests of the claims the tables make: APC against neuron pruning + FT at every size (and
    embedding compression against hidden-dimension pruning), and against the word-KD students of its size."""
    hyps = {name: o["hypotheses"] for part in ("sizes", "embed", "word-kd", "inits") if part in result
            for name, o in result[part]["outputs"].items()}
    pairs = [(f"APC {size}", f"pruning+FT {size}") for size in
             (n.split(" ")[1] for n in hyps if re.fullmatch(r"APC \d+", n))]
    pairs += [(f"APC embed {e}", f"hidden pruning+FT {e}") for e in
              (n.split(" ")[2] for n in hyps if re.fullmatch(r"APC embed \d+", n))]
    pairs += [(f"APC {n.split(' ')[2].rstrip(',')}", n) for n in hyps if n.startswith("word-KD student")]
    pairs += [("neuron-pruning, Finalized", "neuron pruning + FT")]  # Table 3's Finalized against Table 2's baseline
    return [bleu_comparison(f"{a} vs {b}", a, b, [hyps[a][str(s)] for s in seeds], [hyps[b][str(s)] for s in seeds],
                            references)
            for a, b in pairs if a in hyps and b in hyps]


def run_seed(args, command):
    """Every stage of ``args.parts`` with seed ``args.seed``, in the seed's own folder: {part: record}."""
    work = os.path.join(seed_dir(args.work, args.seed), f"u{args.updates}_lr{args.lr:g}")
    os.makedirs(work, exist_ok=True)
    result = {"command": command}
    if "sizes" in args.parts:
        models, meta = [], {}
        for size in args.sizes.split(","):
            ckpt, _ = init_stage(args, work, "neuron-pruning", size)
            pruned = finalize(args, work, ckpt, os.path.join(work, f"pruned_{size}.pt"))
            last = train(args, work, f"apc-np_{size}", ckpt, fc_flags(ckpt))
            apc = finalize(args, work, last, os.path.join(work, f"apc-np_{size}_final.pt"))
            ft = train(args, work, f"pruning-ft_{size}", pruned, stock_flags(fc_flags(ckpt), size))
            models += [(f"APC {size}", apc, best_of(last, args.validations)), (f"pruning+FT {size}", ft, best_of(ft, args.validations)),
                       (f"pruned {size}", pruned, None)]
            if args.attn_dims:
                ckpt_a, _ = init_stage(args, work, "neuron-pruning", size, args.attn_dims)
                last_a = train(args, work, f"apc-np_{size}_attn{args.attn_dims}", ckpt_a, fc_flags(ckpt_a))
                name = f"APC {size} + attention {args.attn_dims}"
                models.append((name, finalize(args, work, last_a,
                                              os.path.join(work, f"apc-np_{size}_attn{args.attn_dims}_final.pt")),
                               best_of(last_a, args.validations)))
                meta[name] = {"cmp_f": int(size), "what": f"APC, neuron-pruning init, compression only, and every "
                              f"attention (encoder, decoder, cross) at cmp^a = {args.attn_dims} (neuron-pruning "
                              "init of the attention dimensions too, D^Q / D^K placed as eq. 11; finalized as "
                              "apc_transformer --apc-finalized)"}
            meta.update({f"APC {size}": {"cmp_f": int(size), "what": "APC, neuron-pruning init, compression only"},
                         f"pruning+FT {size}": {"cmp_f": int(size), "what": "neuron pruning, then all parameters "
                                                "fine-tuned (= APC 'Finalized')"},
                         f"pruned {size}": {"cmp_f": int(size), "what": "neuron pruning, no training"}})
        name, control, what = control_run(args, work, fc_flags(ckpt))
        models.append((name, control, best_of(control, args.validations)))
        meta[name] = {"cmp_f": 1024, "what": what}
        result["sizes"] = {**measure_models(args, work, "sizes", models), "meta": meta, "updates": args.updates,
                           "command": result["command"]}
    if "inits" in args.parts:
        size = args.compare_size
        models, recon = [], {}
        for init in sorted(INITS, key=lambda i: i == "neuron-pruning"):  # its run is shared with --parts sizes
            ckpt, info = init_stage(args, work, init, size)
            recon[init] = info["reconstruction_error_valid"]
            name = "apc-np" if init == "neuron-pruning" else f"apc-{init}"
            last = train(args, work, f"{name}_{size}", ckpt, fc_flags(ckpt))
            models.append((f"{init} + {args.updates} updates",
                           finalize(args, work, last, os.path.join(work, f"{name}_{size}_final.pt")),
                           best_of(last, args.validations)))
        ckpt, _ = init_stage(args, work, "neuron-pruning", size)
        if args.all_params:
            last = train(args, work, f"apc-np-all-params_{size}", ckpt, fc_flags(ckpt) + ["--apc-train-original"])
            models.append(("neuron-pruning, All Params",
                           finalize(args, work, last, os.path.join(work, f"apc-np-all_{size}_final.pt")),
                           best_of(last, args.validations)))
        # Table 3's Finalized strategy: the APC model trained above (Compr. only, neuron-pruning init) folded into
        # the dense model, then all its parameters fine-tuned as a stock transformer, --updates more updates
        folded = os.path.join(work, f"apc-np_{size}_final.pt")
        fin = train(args, work, f"apc-np-finalized-ft_{size}", folded, stock_flags(fc_flags(ckpt), size))
        models.append(("neuron-pruning, Finalized", fin, best_of(fin, args.validations)))
        # neuron pruning (Table 2's baseline): the untrained init folded (= the pruned network), then fine-tuned
        pruned = finalize(args, work, ckpt, os.path.join(work, f"pruned_{size}.pt"))
        ft = train(args, work, f"pruning-ft_{size}", pruned, stock_flags(fc_flags(ckpt), size))
        models.append(("neuron pruning + FT", ft, best_of(ft, args.validations)))
        result["inits"] = {"cmp_f": int(size), "reconstruction_error_valid": recon, "updates": args.updates,
                           "finalized_strategy": "compression stage, fold, fine-tune (Table 3)",
                           "command": result["command"], **measure_models(args, work, "inits", models)}
    if "embed" in args.parts:
        models, meta = [], {}
        for e in args.embed_sizes.split(","):
            ckpt, _ = init_stage(args, work, "reconstructive-svd", None, embed=e)
            last = train(args, work, f"apc-svd_embed{e}", ckpt, fc_flags(ckpt))
            models.append((f"APC embed {e}", finalize(args, work, last, os.path.join(work, f"apc-svd_embed{e}_final.pt")),
                           best_of(last, args.validations)))
            meta[f"APC embed {e}"] = {"cmp_e": int(e), "what": "APC embedding compression, reconstructive-SVD init, "
                                      "compression only"}
            ckpt, _ = init_stage(args, work, "neuron-pruning", None, embed=e)
            pruned = finalize(args, work, ckpt, os.path.join(work, f"hidden-pruned_embed{e}.pt"))
            ft = train(args, work, f"hidden-pruning-ft_embed{e}", pruned, fc_flags(ckpt) + ["--apc-finalized"])
            models.append((f"hidden pruning+FT {e}", ft, best_of(ft, args.validations)))
            meta[f"hidden pruning+FT {e}"] = {"cmp_e": int(e), "what": "hidden-dimension pruning (the neuron-pruning "
                                              "init of embedding compression, finalized), all parameters fine-tuned"}
        name, control, what = control_run(args, work, fc_flags(ckpt))
        models.append((name, control, best_of(control, args.validations)))
        meta[name] = {"cmp_e": 256, "what": what}
        result["embed"] = {**measure_models(args, work, "embed", models), "meta": meta, "updates": args.updates,
                           "command": result["command"]}
    if "searched" in args.parts:
        dims = best_searched(args.search_out)
        flags = [x for k, v in sorted(dims.items()) for x in (f"--{k.replace('_', '-')}-dims", v)]
        flags += ["--cross-attn-dims", dims["decoder_attn"]] if "decoder_attn" in dims else []  # as the search ties them
        init = os.path.join(work, "init_searched.pt")
        if not os.path.exists(init):
            run_shown([PY, "-m", "user_dir.apc.tools.init", args.teacher, "--data", args.data, *flags, "--init",
                       args.search_init, "--seed", args.seed, "--out", init],
                       os.path.join(work, "log.txt"), args.threads)
        last = train(args, work, "apc-searched", init, fc_flags(init))
        spec = "; ".join(f"{k} {v}" for k, v in sorted(dims.items()))
        name, control, what = control_run(args, work, fc_flags(init))
        models = [("APC, searched sizes", finalize(args, work, last, os.path.join(work, "apc-searched_final.pt")),
                   best_of(last, args.validations)), (name, control, best_of(control, args.validations))]
        meta = {"APC, searched sizes": {"sizes": spec, "what": f"the best candidate of the Optuna search in "
                                        f"`{os.path.relpath(args.search_out, ROOT)}`, {args.search_init} init, "
                                        "compression only"},
                name: {"sizes": "the teacher's", "what": what}}
        result["searched"] = {**measure_models(args, work, "searched", models), "meta": meta,
                              "updates": args.updates, "command": result["command"]}
    if "word-kd" in args.parts:
        models, meta = [], {}
        for size in args.sizes.split(","):
            ckpt, _ = init_stage(args, work, "neuron-pruning", size)
            for n in (int(x) for x in args.kd_updates.split(",")):
                name = f"word-KD student {size}, {n} updates"
                last = train(args, work, f"word-kd_{size}_u{n}", None, stock_flags(fc_flags(ckpt), size),
                             recipe=word_kd_flags(args, n))
                models.append((name, last, best_of(last, args.kd_validations)))
                meta[name] = {"cmp_f": int(size), "what": f"stock transformer of FFN width {size} (the teacher's other "
                              f"sizes) trained from scratch with word-level KD, {n} updates"}
        result["word-kd"] = {**measure_models(args, work, "word-kd", models), "meta": meta,
                             "kd_updates": args.kd_updates, "command": result["command"]}
    return {part: record for part, record in result.items() if part != "command"}


def _fmt(x, nd=2):
    """A number, or over seeds its mean, spread and every seed (benchlib.fmt)."""
    return fmt(x, nd)


def model_table(rows, meta, size: str, teacher_size: int, outputs=None) -> list:
    """Markdown rows of fc-measure ``rows``, each with its ``meta`` entry (the size ``size``, e.g. ``cmp_f``);
    with ``outputs`` (a part made with seeds), each model's best-of-N sacreBLEU beside."""
    best = outputs is not None
    lines = [f"| model | {size.replace('_', '^')} | what | BLEU (tok) | sacreBLEU | non-emb. params | % of teacher | "
             "sent/s |" + (" best-of-N sacreBLEU |" if best else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if best else "")]
    for r in rows:
        m = meta.get(r["name"], {size: teacher_size, "what": "the teacher"})
        cell = (outputs or {}).get(r["name"], {}).get("sacrebleu_best")
        lines.append(f"| {r['name']} | {m[size]} | {m['what']} | {_fmt(r['bleu_tok'])} | {_fmt(r['sacrebleu'])} | "
                     f"{r['non_embedding_params']:,} | {num(r['compression_rate']):.1f} | {num(r['sentences_per_s']):.1f} |"
                     + (f" {_fmt(cell) if cell is not None else '-'} |" if best else ""))
    return lines + [""]


def write_apc_report(args, result):
    from user_dir.tools.measure import machine_description
    old = {}
    if os.path.exists(args.out + ".json"):
        old = json.load(open(args.out + ".json"))
    for part in ("sizes", "inits", "embed", "word-kd", "searched"):  # parts not run now keep their earlier record
        if part not in result and part in old:
            result[part] = old[part]
    new = "seeds" in result  # made with seeds: means, spreads and every seed; best-of-N beside; paired tests
    seeds = (f"{seeds_text(result['seeds'])} (each BLEU: mean +- sample std [min, max] over the seeds, then every "
             "seed's value; sent/s: the mean)" if new else f"Seed {result['seed']}")
    lines = ["# APC on the reference Multi30k DE->EN teacher", "",
             "Commands: " + "; ".join(f"`{result[p]['command']}` ({p})"
                                      for p in ("sizes", "inits", "embed", "word-kd", "searched") if p in result)
             + f". {seeds}; fine-tuning: Adam lr {result['lr']:g} with linear decay to 0 over the run's "
             "updates, CE loss, max 2,048 tokens, dropout 0.1, "
             + (f"{result['threads']} thread(s) per run; run on {result['date']}." if new else "one thread."),
             *([protocol_text(result["updates"], tuple(result["plan"]), "validation loss",
                              f"Adam {result['lr']:g} decaying linearly to 0 over the run, the same for every APC, "
                              f"pruning and control run (the word-KD students: their own recipe, validated "
                              f"{result['kd_validations']} times at equal intervals)")] if new else []),
             f"Machine: {result.get('machine') or machine_description()}. Teacher: `{os.path.relpath(result['teacher'], ROOT)}` "
             "(3+3 layers, width 256, FFN 1024). BLEU: tokenised BLEU4 as fairseq-generate's, beam 5, "
             "test_2016_flickr (the number of sentences is given per table), every model finalized (a stock `transformer` "
             "checkpoint unless its row says otherwise). "
             "Sentences/s: `fc-measure`, batch 128, one run, on a machine shared with other jobs "
             "(speeds are indicative only).", ""]
    if "sizes" in result:
        rows = result["sizes"]["measure"]["rows"]
        meta = result["sizes"]["meta"]
        lines += [f"## APC vs neuron pruning at several cmp^f (1024 -> cmp^f in all 6 FFNs), "
                  f"{result['sizes']['updates']} updates", "", f"BLEU on {rows[0]['sentences']} test sentences.", "",
                  *model_table(rows, meta, "cmp_f", 1024, result["sizes"].get("outputs"))]
    if "inits" in result:
        inits = result["inits"]
        lines += [f"## Initialisations (Table 1 / Table 5 analogue) and fine-tuning strategies (Table 3), cmp^f = "
                  f"{inits['cmp_f']}, {inits['updates']} updates", "",
                  f"BLEU on {inits['measure']['rows'][0]['sentences']} test sentences. "
                  "Reconstruction error (eq. 4): mean over 5,000 sampled *validation* token positions of "
                  "||sigma(XW+b) - X~||_2, averaged over the 6 compressed FFNs (U fitted on training activations).", "",
                  "| initialisation | reconstruction error | BLEU after fine-tuning |",
                  "| --- | --- | --- |"]
        by_name = {r["name"]: r for r in inits["measure"]["rows"]}
        for init in INITS:
            err = inits["reconstruction_error_valid"][init]
            mean = sum(err.values()) / len(err)
            lines.append(f"| {init} | {_fmt(mean, 3)} | "
                         f"{_fmt(by_name[init + ' + ' + str(inits['updates']) + ' updates']['bleu_tok'])} |")
        lines += ["", "| strategy (neuron-pruning init) | BLEU (tok) |", "| --- | --- |",
                  f"| Compr. only (U, D, B, b_U, b_D train) | "
                  f"{_fmt(by_name['neuron-pruning + ' + str(inits['updates']) + ' updates']['bleu_tok'])} |",
                  f"| Finalized (Compr. only, folded, then the dense model's parameters, {inits['updates']} + "
                  f"{inits['updates']} updates) | "
                  + (_fmt(by_name['neuron-pruning, Finalized']['bleu_tok'])
                     if inits.get("finalized_strategy") else "not run: this record predates the strategy") + " |",
                  *([f"| neuron pruning + FT (the untrained init folded, then all parameters; Table 2's baseline) | "
                     f"{_fmt(by_name['neuron pruning + FT']['bleu_tok'])} |"]
                    if "neuron pruning + FT" in by_name else []),
                  *([f"| All Params (--apc-train-original) | {_fmt(by_name['neuron-pruning, All Params']['bleu_tok'])} |"]
                    if "neuron-pruning, All Params" in by_name else []),
                  "", f"Teacher: {_fmt(by_name['teacher']['bleu_tok'])} BLEU.", ""]
    if "embed" in result:
        rows, meta = result["embed"]["measure"]["rows"], result["embed"]["meta"]
        lines += [f"## Embedding compression (section 3.2, Appendix A): every encoder and decoder block at width cmp^e, "
                  f"{result['embed']['updates']} updates", "",
                  f"BLEU on {rows[0]['sentences']} test sentences. One run of blocks per side (J_b omitted between "
                  "blocks of one size): D^PS before the first block, U^PS after the last. Finalized models stay "
                  "`apc_transformer --apc-finalized` (no stock architecture has per-block widths).", "",
                  *model_table(rows, meta, "cmp_e", 256, result["embed"].get("outputs"))]
    if "word-kd" in result:
        rows, meta = result["word-kd"]["measure"]["rows"], result["word-kd"]["meta"]
        lines += [f"## Word-KD students of APC's sizes, from scratch ({result['word-kd']['kd_updates']} updates)", "",
                  f"BLEU on {rows[0]['sentences']} test sentences. The same architecture as the finalized APC / "
                  "pruned model of that cmp^f, trained from random initialisation with word-level KD (`--criterion "
                  "kd`, alpha 0.5, T = 1, label smoothing 0.1) from the same teacher; Adam lr 1e-3, inverse_sqrt, "
                  "min(400, updates / 2) warm-up updates, dropout 0.1, max 2,048 tokens.", "",
                  *model_table(rows, meta, "cmp_f", 1024, result["word-kd"].get("outputs"))]
    if "searched" in result:
        rows, meta = result["searched"]["measure"]["rows"], result["searched"]["meta"]
        lines += [f"## The Optuna search's best sizes (section 4.1), {result['searched']['updates']} updates", "",
                  f"BLEU on {rows[0]['sentences']} test sentences. Finalized as `apc_transformer --apc-finalized` "
                  "(per-layer widths).", "", *model_table(rows, meta, "sizes", "the teacher's", result["searched"].get("outputs"))]
    if result.get("comparisons"):
        lines += ["## Paired comparisons", ""] + significance_lines(result["comparisons"], "APC (A) against neuron "
                                                                    "pruning + FT or a word-KD student of its size (B)")
    write_json(args.out + ".json", result)  # whole files only: two --parts may finish together
    write_text(args.out + ".md", "\n".join(lines))
    plot_apc(args, result)
    print("\n".join(lines))


def plot_apc(args, result):
    """BLEU against non-embedding parameters of every measured model of every part (one teacher point: each part
    measures the same checkpoint)."""
    series = {}  # label -> {(params, BLEU)}
    for part in ("sizes", "embed", "word-kd", "searched"):
        for r in result.get(part, {}).get("measure", {}).get("rows", []):
            name = r["name"]
            label = ("teacher" if name == "teacher" else "teacher + same updates (control)" if name.startswith("teacher")
                     else "APC FFN + attention" if "attention" in name else "APC embedding" if name.startswith("APC embed")
                     else "hidden-dim. pruning + FT" if name.startswith("hidden") else "word-KD student (from scratch)"
                     if name.startswith("word-KD") else "APC, searched sizes" if "searched" in name
                     else name.split(" ")[0].replace("APC", "APC FFN"))
            series.setdefault(label, set()).add((r["non_embedding_params"] / 1e6, num(r["bleu_tok"])))
    if not series:
        return
    sentences = next(iter(result[p]["measure"]["rows"][0]["sentences"] for p in ("sizes", "embed", "word-kd")
                          if p in result))
    markers = iter("*PoshxvD^<>")
    lines = [dict(x=[p for p, _ in pts], y=[b for _, b in pts], marker=next(markers, "o"),
                  linestyle="-" if len(pts) > 1 else "none", label=label)
             for label, pts in ((label, sorted(pts)) for label, pts in series.items())]
    plot_panels(args.out + "_bleu_vs_params.png", [dict(
        series=lines, xlabel="non-embedding parameters (M)", ylabel=f"BLEU (tok), {sentences} test sentences",
        title=f"APC on the Multi30k teacher, {result['updates']} updates", legend=dict(fontsize=7))],
        command=result.get("command"), figsize=(7, 4.5))


if __name__ == "__main__":
    main()
