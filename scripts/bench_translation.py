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
else running), and the summary -- mean +- std over seeds -- is written to ``--out``.
"""
import argparse
import concurrent.futures
import json
import os
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


def pet_arch(enc, dec, *extra):
    return ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", str(enc), "--decoder-embed-dim", str(dec),
            "--share-decoder-input-output-embed", *extra]


# method -> (description, arch flags, stages); a stage is (name, criterion flags, share of the budget).
# A stage after the first starts from the previous stage's last checkpoint (--finetune-from-model).
def methods(enc, dec):
    pet = pet_arch(enc, dec)
    return {
        "pet": ("PET: shared pairs (1,3),(2,4), enc Q<->K, dec Qself=Qed; warm-up then word KD",
                pet, [("warmup", WARMUP, "warmup"), ("kd", KD, "rest")]),
        "pet-nowarmup": ("PET without the simplified-task warm-up (Table 9), word KD for the whole budget",
                         pet, [("kd", KD, "all")]),
    }


def run_stages(run_dir, data, teacher, arch, stages, seed, updates, warmup_updates, threads, lr_warmup, extra):
    """Train one (method, seed) run; returns the path of its final checkpoint."""
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    previous = None
    for name, criterion, share in stages:
        save_dir = os.path.join(run_dir, name)
        n = {"warmup": warmup_updates, "rest": updates - warmup_updates, "all": updates}[share]
        if not os.path.exists(os.path.join(save_dir, "DONE")):
            cmd = (["fairseq-train", data, "--user-dir", os.path.join(ROOT, "user_dir"), *arch, *criterion, *OPTIM,
                    "--warmup-updates", str(min(lr_warmup, max(1, n // 2))), "--teacher-path", teacher,
                    "--max-update", str(n), "--max-epoch", "1000", "--seed", str(seed), "--cpu",
                    "--save-dir", save_dir, "--no-epoch-checkpoints", "--log-format", "simple",
                    "--log-interval", "50", *extra])
            if previous:
                cmd += ["--finetune-from-model", previous]
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


def summarise(rows, grid, args, command):
    """Mean +- std over seeds per method, plus the Table 9 comparison when both PET variants ran."""
    by_method = {}
    for row in rows:
        if row["name"] == "teacher":
            continue
        method = row["name"].rsplit("-s", 1)[0]
        by_method.setdefault(method, []).append(row)
    teacher = next(r for r in rows if r["name"] == "teacher")

    def mean_std(values):
        return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)

    lines = [f"# Translation benchmark: compressing the Multi30k DE->EN teacher", "",
             f"Teacher: `{os.path.relpath(args.teacher, ROOT)}`. Test set: test_2016_flickr (1,000 sentences), "
             f"beam 5, batch 128. Every student trains for {args.updates} updates (PET: {args.warmup_updates} "
             f"of them on the warm-up task), seeds {' '.join(map(str, args.seeds))}; BLEU is mean +- std over "
             f"seeds, speed the mean over seeds of each model's median of {args.measure_runs} runs. "
             f"Compression = non-embedding parameters in % of the teacher's.", "",
             "| method | seeds | BLEU (tok) | sacreBLEU | non-emb params | compression | weights MB | sent/s | speed-up |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| teacher | - | {teacher['bleu_tok']:.2f} | {teacher['sacrebleu']:.2f} | "
             f"{teacher['non_embedding_params']:,} | 100.00% | {teacher['weights_mb']:.1f} | "
             f"{teacher['sentences_per_s']:.1f} | 1.00x |"]
    stats = {}
    for method, runs in by_method.items():
        tok, sacre = mean_std([r["bleu_tok"] for r in runs]), mean_std([r["sacrebleu"] for r in runs])
        speed = statistics.mean(r["sentences_per_s"] for r in runs)
        stats[method] = tok
        lines.append(f"| {method} | {len(runs)} | {tok[0]:.2f} +- {tok[1]:.2f} | {sacre[0]:.2f} +- {sacre[1]:.2f} | "
                     f"{runs[0]['non_embedding_params']:,} | {runs[0]['compression_rate']:.2f}% | "
                     f"{runs[0]['weights_mb']:.1f} | {speed:.1f} | {speed / teacher['sentences_per_s']:.2f}x |")
    lines += ["", "Methods:", ""]
    for method in by_method:
        lines.append(f"- `{method}`: {grid[method][0]}")
    if "pet" in stats and "pet-nowarmup" in stats:
        t = teacher["bleu_tok"]
        lines += ["", "## Warm-up versus no warm-up at an equal budget (PET Table 9)", "",
                  "| | BLEU (tok) | BLEU reduction vs teacher | paper's BLEU reduction (IWSLT'14 EN->DE, teacher 34.63) |",
                  "|---|---|---|---|",
                  f"| with warm-up | {stats['pet'][0]:.2f} +- {stats['pet'][1]:.2f} | {t - stats['pet'][0]:.2f} | 0.27 |",
                  f"| without warm-up | {stats['pet-nowarmup'][0]:.2f} +- {stats['pet-nowarmup'][1]:.2f} | "
                  f"{t - stats['pet-nowarmup'][0]:.2f} | 0.58 |"]
    lines += ["", "Per run:", "", "| run | BLEU (tok) | sacreBLEU | sent/s |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['name']} | {row['bleu_tok']:.2f} | {row['sacrebleu']:.2f} | {row['sentences_per_s']:.1f} |")
    lines += ["", f"Machine: {args.machine}.", f"Date: {time.strftime('%Y-%m-%d')}.",
              "", "Command (reruns only what is missing):", "```", command, "```",
              f"Training logs: `{os.path.relpath(args.work, ROOT)}/<method>-s<seed>/<stage>/train.log`; the full "
              f"measurement table: `{os.path.relpath(args.work, ROOT)}/measure.md`.", ""]
    return "\n".join(lines)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-translation"),
                   help="folder for data, runs and logs (default: work/bench-translation)")
    p.add_argument("--teacher", default=None,
                   help="teacher checkpoint (default: the reference teacher in ../shared/teachers/multi30k.de-en)")
    p.add_argument("--methods", nargs="+", default=None, help="methods to run (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds per method (default: 1 2 3)")
    p.add_argument("--updates", type=int, default=800, help="training updates per run, all stages (default 800)")
    p.add_argument("--warmup-updates", type=int, default=200,
                   help="of which PET's simplified-task warm-up (default 200; the paper: 3 of its epochs)")
    p.add_argument("--lr-warmup", type=int, default=200, help="inverse_sqrt lr warm-up updates per stage (default 200)")
    p.add_argument("--enc-dim", type=int, default=128, help="student encoder width (default 128: <10%% of the teacher)")
    p.add_argument("--dec-dim", type=int, default=96, help="student decoder width (default 96)")
    p.add_argument("--jobs", type=int, default=2, help="runs trained at once (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training run (default 1)")
    p.add_argument("--measure-runs", type=int, default=5, help="timed generation runs per model (default 5)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only the first N test sentences")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: 1 seed, 6 updates, 50 test sentences, 1 timed run, into --work/quick")
    p.add_argument("--out", default=None, help="summary Markdown (default: results/translation.md; --quick: in --work)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
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
    grid = methods(args.enc_dim, args.dec_dim)
    chosen = args.methods or list(grid)
    unknown = [m for m in chosen if m not in grid]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; known: {list(grid)}")
    sys.path.insert(0, ROOT)
    from user_dir.tools.measure import machine_description
    args.machine = machine_description()

    data = os.path.join(args.work, "data-bin")
    subprocess.check_call([sys.executable, "-m", "preprocess.prepare_multi30k", "--src", "de", "--tgt", "en",
                           "--dest", data], cwd=ROOT)
    runs = [(m, s) for m in chosen for s in args.seeds]
    budget = f"u{args.updates}-w{args.warmup_updates}-e{args.enc_dim}-d{args.dec_dim}"
    checkpoints = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_stages, os.path.join(args.work, budget, f"{m}-s{s}"), data, args.teacher,
                               grid[m][1], grid[m][2], s, args.updates, args.warmup_updates, args.threads,
                               args.lr_warmup, extra): (m, s) for m, s in runs}
        for future in concurrent.futures.as_completed(futures):
            m, s = futures[future]
            checkpoints[f"{m}-s{s}"] = future.result()
            print(f"[bench] trained {m} seed {s}", file=sys.stderr, flush=True)

    names = ["teacher"] + [f"{m}-s{s}" for m, s in runs]
    measure_json = os.path.join(args.work, "measure.json")
    cmd = [sys.executable, "-m", "user_dir.tools.measure", data, "--path", args.teacher,
           *[checkpoints[n] for n in names[1:]], "--names", *names,
           "--raw-reference", os.path.join(data, "text", "test.raw.en"), "--beam", "5", "--batch-size", "128",
           "--runs", str(args.measure_runs), "--out", os.path.join(args.work, "measure.md"), "--json", measure_json]
    if args.max_sentences:
        cmd += ["--max-sentences", str(args.max_sentences)]
    subprocess.check_call(cmd, cwd=ROOT)
    with open(measure_json) as f:
        rows = json.load(f)["rows"]
    summary = summarise(rows, grid, args, command)
    out = args.out or (os.path.join(args.work, "translation.md") if args.quick
                       else os.path.join(ROOT, "results", "translation.md"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(summary)
    print(summary)
    print(f"[bench] wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
