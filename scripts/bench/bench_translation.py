#!/usr/bin/env python
"""The translation benchmark: compress the Multi30k DE->EN teacher with every method at one
training budget, several seeds, and measure all models side by side in one run.

    python scripts/bench/bench_translation.py                      # the full grid, seeds 1,2,3 -> work/results/translation.md
    python scripts/bench/bench_translation.py --methods pet pet-nowarmup --seeds 1,2,3
    python scripts/bench/bench_translation.py --quick              # the whole grid in minutes (CI, smoke test)
    python scripts/bench/bench_translation.py --device cuda --fp16 --jobs 6   # on a GPU: six students at once on it

The seed runs of the committed table (PET against its competitors, 3 seeds, each seed's runs resumable):

    python scripts/bench/bench_translation.py --seeds 1,2,3 --jobs 2 --threads 1 --out results/translation.md

Every method trains for the same number of updates (``--updates``); PET spends ``--warmup-updates``
of them on the simplified task (paper: 3 epochs) and the rest on word-level KD, so "warm-up versus
no warm-up" (PET Table 9) compares at an equal budget. Selection (the same for every method): each
run is validated ``--validations`` times at the same update points of its whole budget (PET's two stages
counted together: the points fall in its KD stage), the primary BLEU is the last checkpoint's and the
best-of-N checkpoint (lowest validation loss) is scored beside it. Runs are resumable: every seed
trains in its own folder (``--work``/seed<k>/), a finished stage (``DONE`` file) is never retrained,
an interrupted one resumes from its ``checkpoint_last.pt`` (fairseq's own resume). Runs execute
``--jobs`` at a time, each with ``--threads`` torch threads (on 2 cores, two 1-thread runs finish
sooner than one 2-thread run), on ``--device`` (cpu, the default, or cuda: every run a process of its own on
the current GPU) in float32, ``--fp16`` or ``--bf16`` (benchlib.add_device_args). The teacher is the one that
ships (checkpoints/multi30k.de-en), its data-bin built once from the embedded Multi30k
(benchlib.multi30k_data_bin). After training, the teacher and every student go through
``user_dir.tools.measure`` in one run (speed measured with nothing else running); every run's
hypotheses of the test set are kept as detokenised text (``<run>/hypotheses/test.{last,best}.txt``,
in test-set order; references: ``work/data-bin/multi30k.de-en/text/test.raw.en``) and each method is compared
with PET by
the cluster test of common/significance.py: test sentences as clusters of all seeds' outputs. The summary -- mean, spread and every
seed -- is written to ``--out`` (default under work/results/), the raw measurement (every row
unrounded, the commands, machine, date and load) beside it as ``--out``'s name with ``.json``: one
JSON per table, so parts of a grid measured separately never overwrite each other's, and ``--render
TABLE.json`` writes a table again from it without training or measuring.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import time

from benchlib import (ROOT, add_device_args, add_seed_arguments, bleu_comparison, check_device, default_out, Device,
                      format_seeds, generate_hypotheses, invocation, multi30k_data_bin, protocol_text, sacrebleu_of,
                      seed_dir, seed_summary, seeds_of, significance_lines, validation_plan, write_json)
from translation_students import (PAPER, PAPER_ABLATION, PAPER_TEACHER_BLEU, REFERENCE_TEACHER, measured_already,
                                  method_of, methods, plot_students, run_stages, warmup_table)


def seed_of(run):
    """The seed of a run named ``<method>-s<seed>``."""
    return int(run.rsplit("-s", 1)[1])


def lr_text(args):
    return (f"Adam, lr 1e-3, inverse_sqrt with a warm-up of min({args.lr_warmup}, stage updates / 2) updates from "
            "1e-7 at the start of each stage (PET's warm-up and KD stages each start one), the same for every method")


def summarise(rows, grid, args, command):
    """Mean +- std over seeds per method, the paper's numbers beside, Table 9, ablations, per run."""
    by_method = {}
    for row in rows:
        if row["name"] != "teacher":
            by_method.setdefault(method_of(row["name"]), []).append(row)
    teacher = next(r for r in rows if r["name"] == "teacher")

    details = getattr(args, "runs", None) or {}

    def summary(runs, key):
        return seed_summary({seed_of(r["name"]): r[key] for r in runs})

    def shown(runs, key):  # mean +- std [min, max] (every seed), or the single value of a one-seed method
        return format_seeds(summary(runs, key))

    def best_of_n(runs):  # sacreBLEU of each seed's best-of-N checkpoint, where it was scored
        best = {seed_of(r["name"]): details[r["name"]]["sacrebleu_best"] for r in runs
                if details.get(r["name"], {}).get("sacrebleu_best") is not None}
        return format_seeds(seed_summary(best)) if len(best) == len(runs) else "-"

    work = os.path.relpath(args.work, ROOT)
    plan = getattr(args, "plan", None)
    selection = (protocol_text(args.updates, plan, "validation loss", lr_text(args)) if plan
                 else "Every student is scored at its last update.")
    lines = ["# Translation benchmark: compressing the Multi30k DE->EN teacher", "",
             f"Teacher: `{os.path.relpath(args.teacher, ROOT)}` (3+3 layers, width 256). Test set: test_2016_flickr "
             f"({teacher['sentences']:,} sentences), beam 5, batch 128 sentences. Every student trains for "
             f"{args.updates} updates from scratch (PET: the first {args.warmup_updates} on the simplified "
             f"warm-up task). {selection} BLEU: the mean +- sample std [min, max] over seeds, then every seed's value; "
             f"sent/s the mean over seeds of each model's median of {args.measure_runs} timed runs, all models "
             f"measured in turn in one run (comparable within this table; the machine line gives the load the "
             f"measurement ran under). Compression = non-embedding parameters "
             f"in % of the teacher's. The paper's column: IWSLT'14 DE->EN, Transformer teacher {PAPER_TEACHER_BLEU} BLEU "
             f"(PET Table 7) -- a different scale, for orientation only.", ""]
    stats = {}

    def table(group):
        paper_header = "paper: BLEU (table)" if group == "ablation" else "paper: compression, BLEU"
        out = ["| method | seeds | BLEU (tok) | sacreBLEU | non-emb params | compression | weights MB | sent/s | "
               f"speed-up | {paper_header} | best-of-N sacreBLEU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        if group == "main":
            out.append(f"| teacher | - | {teacher['bleu_tok']:.2f} | {teacher['sacrebleu']:.2f} | "
                       f"{teacher['non_embedding_params']:,} | 100.00% | {teacher['weights_mb']:.1f} | "
                       f"{teacher['sentences_per_s']:.1f} | 1.00x | 100%, {PAPER_TEACHER_BLEU} | - |")
        for method, runs in by_method.items():
            # the ablation table starts with PET itself (its first seed): what every ablation changes
            reference = group == "ablation" and method == "pet"
            if (grid[method][0] == "ablation") != (group == "ablation") and not reference:
                continue
            if reference:
                runs = runs[:1]
            tok = summary(runs, "bleu_tok")
            speed = summary(runs, "sentences_per_s")["mean"]
            if not reference:
                stats[method] = dict(bleu=(tok["mean"], tok["std"]), speed=speed, compression=runs[0]["compression_rate"])
            paper = PAPER.get(method)
            paper = f"{paper[0] + '%, ' if paper[0] else ''}{paper[1]}" if paper else ""
            if group == "ablation":
                paper = PAPER_ABLATION.get(method, "")
            out.append(f"| {method} | {len(runs)} | {shown(runs, 'bleu_tok')} | {shown(runs, 'sacrebleu')} | "
                       f"{runs[0]['non_embedding_params']:,} | {runs[0]['compression_rate']:.2f}% | "
                       f"{runs[0]['weights_mb']:.1f} | {speed:.1f} | {speed / teacher['sentences_per_s']:.2f}x | "
                       f"{paper} | {best_of_n(runs)} |")
        return out

    lines += table("main")
    lines += warmup_table(teacher, stats)
    comparisons = getattr(args, "comparisons", None) or []
    if comparisons:
        lines += ["", "## PET against each method, paired over seeds and test sentences", ""]
        lines += significance_lines(comparisons, "PET (A) against each method (B), last checkpoints")[:-1]
    if any(grid[m][0] == "ablation" for m in by_method):
        lines += ["", "## PET ablations (one seed; PET Tables 2, 3, 4/8, 10)", "",
                  "Each ablation changes one choice of the full PET and keeps the rest (the design of the paper's "
                  "Table 8); the first row is PET itself at the same seed. The paper's Tables 2 and 3 were instead "
                  "greedy steps on 4-layer models (its text names no KD or warm-up for them; Table 2's rows "
                  "share layers only, with no matrix pairs), so its column gives the order the paper found, not numbers for this setting. "
                  "`pet-layers-none` is Table 2's No pair: the 4+4-layer student with no sharing, twice PET's "
                  "layer parameters.", ""] + table("ablation")
    lines += ["", "Methods:", ""] + [f"- `{m}`: {grid[m][1]}" for m in by_method]
    lines += ["", "Per run:", "", "| run | BLEU (tok) | sacreBLEU | sent/s | best-of-N sacreBLEU | validated at | "
              "training time |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        d = details.get(r["name"], {})
        best = f"{d['sacrebleu_best']:.2f}" if d.get("sacrebleu_best") is not None else "-"
        when = ", ".join(map(str, d.get("validations", []))) or "-"
        minutes = f"{d['seconds'] / 60:.1f} min" if d.get("seconds") else "-"
        lines.append(f"| {r['name']} | {r['bleu_tok']:.2f} | {r['sacrebleu']:.2f} | {r['sentences_per_s']:.1f} | {best} | "
                     f"{when} | {minutes} |")
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
    layout = "seed<seed>/<budget>/<method>" if details else "<budget>/<method>-s<seed>"
    lines += [f"Training logs: `{work}/{layout}/<stage>/train.log` (budget: "
              f"`u<updates>-w<warm-up>-e<enc>-d<dec>`); the measurement command's own table: "
              f"`{os.path.relpath(args.measure_md, ROOT) if getattr(args, 'measure_md', None) else work + '/<budget>/measure.md'}`."]
    if getattr(args, "raw_json", None):
        lines += ["", f"Raw measurement (every row unrounded, with the measurement's command): `{args.raw_json}`."]
    if getattr(args, "rendered_by", None):
        lines += ["This table was written from it, training and measuring nothing, by:", "```", args.rendered_by, "```"]
    return "\n".join(lines + [""]), stats, teacher



def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-translation"),
                   help="folder for data, runs and logs (default: work/bench-translation)")
    p.add_argument("--teacher", default=REFERENCE_TEACHER,
                   help="teacher checkpoint (default: the reference teacher, shipped in checkpoints/multi30k.de-en)")
    p.add_argument("--methods", nargs="+", default=None,
                   help="methods to run with every seed (default: pet pet-nowarmup word-kd patient-kd can)")
    p.add_argument("--ablations", nargs="*", default=None,
                   help="PET ablations to run with the first seed: none given = all of them (default: none run)")
    add_seed_arguments(p, default="1,2,3")
    p.add_argument("--validations", type=int, default=3,
                   help="validations of every run, at the same update points of its whole budget, all in the last "
                        "--updates minus --warmup-updates updates (default 3: updates 400, 600, 800); the primary score "
                        "is the last checkpoint's, the best of these beside it")
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
    add_device_args(p)
    p.add_argument("--measure-runs", type=int, default=5, help="timed generation runs per model (default 5)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only the first N test sentences")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: seed 1 (unless --seeds), 6 updates, 1 validation, 50 test sentences, 1 timed run, "
                        "into --work/quick")
    p.add_argument("--out", default=None, help="summary Markdown (default: work/results/translation.md; --quick: in --work); "
                                               "the raw measurement is kept beside it, named after it (.json)")
    p.add_argument("--render", default=None, metavar="TABLE.json",
                   help="write the table (and plots) of a kept raw measurement again, training and measuring nothing "
                        "(--out defaults to the JSON's name with .md)")
    return p


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    if args.render:
        return render_from_json(args, argv if argv is not None else sys.argv[1:])
    command = invocation("bench_translation.py", argv)
    explicit_seeds = args.seeds is not None or args.seed is not None
    args.seeds = seeds_of(parser, args)
    check_device(parser, args)
    device = Device(args)
    extra, generate_extra = [], []
    if args.quick:
        args.work = os.path.join(args.work, "quick")
        args.seeds = args.seeds if explicit_seeds else [1]
        args.updates, args.warmup_updates, args.measure_runs, args.validations = 6, 3, 1, 1
        args.max_sentences = args.max_sentences or 50
        extra, generate_extra = ["--max-tokens", "512"], ["--max-len-b", "10"]
    args.teacher = os.path.abspath(args.teacher)
    if not os.path.isfile(args.teacher):
        raise SystemExit(f"--teacher {args.teacher}: no such checkpoint (train one with "
                         "scripts/recipes/train_teacher_multi30k.sh and pass its checkpoint_best.pt)")
    if not 0 < args.warmup_updates < args.updates:
        raise SystemExit(f"--warmup-updates {args.warmup_updates}: must lie strictly between 0 and --updates {args.updates}")
    # every method is validated at the same points, inside the shortest last stage of the grid (PET's KD stage)
    args.plan = validation_plan(args.updates, args.updates - args.warmup_updates, args.validations)
    grid = methods(args.enc_dim, args.dec_dim, args.can_dim, args.can_encoder_layers)
    chosen = args.methods or [m for m, spec in grid.items() if spec[0] == "main"]
    ablations = [] if args.ablations is None else (args.ablations or [m for m, v in grid.items() if v[0] == "ablation"])
    unknown = [m for m in chosen + ablations if m not in grid]
    if unknown:
        raise SystemExit(f"--methods/--ablations: unknown {unknown}; known: {list(grid)}")
    from user_dir.tools.measure import machine_description
    args.machine = machine_description()

    data = multi30k_data_bin()
    references = os.path.join(data, "text", "test.raw.en")
    data_for = {m: data for m in grid}
    if "seq-kd" in chosen:
        data_for["seq-kd"] = os.path.join(args.work, "data-bin-seqkd")
        if not os.path.isfile(os.path.join(data_for["seq-kd"], "DONE")):
            subprocess.check_call([sys.executable, "-m", "user_dir.baselines.tools.seq_kd_data", data, "--path", args.teacher,
                                   "--dest", data_for["seq-kd"], *device.tool()], cwd=ROOT)
            open(os.path.join(data_for["seq-kd"], "DONE"), "w").close()
    runs = [(m, s) for m in chosen for s in args.seeds] + [(m, args.seeds[0]) for m in ablations if m not in chosen]
    budget = f"u{args.updates}-w{args.warmup_updates}-e{args.enc_dim}-d{args.dec_dim}"
    # CAN's widths are not in the budget's name: keep them in its run folder, so runs of other widths never mix
    run_name = {"can": f"can-{args.can_dim}x{args.can_encoder_layers}"}

    def train_and_decode(m, s):
        run_dir = os.path.join(seed_dir(args.work, s), budget, run_name.get(m, m))
        trained = run_stages(run_dir, data_for[m], args.teacher, grid[m][2], grid[m][3], s, args.updates,
                             args.warmup_updates, args.threads, args.lr_warmup, extra, args.plan, device)
        hyps = os.path.join(run_dir, "hypotheses")
        trained["hypotheses_last"] = generate_hypotheses(data, trained["last"], os.path.join(hyps, "test.last.txt"),
                                                         args.threads, generate_extra, args.max_sentences,
                                                         device=device)
        if trained["best"] and len(args.plan[1]) > 1:  # best-of-1 is the last checkpoint
            trained["hypotheses_best"] = generate_hypotheses(data, trained["best"], os.path.join(hyps, "test.best.txt"),
                                                             args.threads, generate_extra, args.max_sentences,
                                                             device=device)
        for which in ("last", "best"):
            path = trained.get(f"hypotheses_{which}")
            trained[f"sacrebleu_{which}"] = sacrebleu_of(path, references) if path else None
        return dict(trained, method=m, seed=s)

    details = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(train_and_decode, m, s): (m, s)
                   # seed-major: an interrupted grid has every method at its first seed before any at its second
                   for m, s in sorted(runs, key=lambda run: args.seeds.index(run[1]))}
        for future in concurrent.futures.as_completed(futures):
            m, s = futures[future]
            details[f"{m}-s{s}"] = future.result()
            print(f"[bench] trained {m} seed {s}", file=sys.stderr, flush=True)

    names = ["teacher"] + [f"{m}-s{s}" for m, s in runs]
    out = args.out or (os.path.join(args.work, "translation.md") if args.quick else default_out("translation.md"))
    out = out if out.endswith(".md") else out + ".md"  # --out results/x names the table x.md and its x.json
    # the raw measurement is kept beside its table, named after it (<table>.json): parts of a grid measured
    # separately never overwrite each other's, and --render rewrites a table from it
    table_json = os.path.splitext(out)[0] + ".json"
    measure_md = os.path.join(args.work, budget, os.path.basename(os.path.splitext(out)[0]) + ".measure.md")
    cmd = [sys.executable, "-m", "user_dir.tools.measure", data, "--path", args.teacher,
           *[details[n]["last"] for n in names[1:]], "--names", *names,
           "--raw-reference", references, "--beam", "5", "--batch-size", "128",
           "--runs", str(args.measure_runs), "--out", measure_md, "--json", table_json, *device.measure()]
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
    comparisons = []
    if "pet" in chosen:
        pet = [details[f"pet-s{s}"]["hypotheses_last"] for s in args.seeds]
        for m in chosen:
            if m != "pet":
                comparisons.append(bleu_comparison(f"pet vs {m}", "pet", m, pet,
                                                   [details[f"{m}-s{s}"]["hypotheses_last"] for s in args.seeds],
                                                   references))
    measured.update(bench_command=command, runs=details, comparisons=comparisons, references=references,
                    settings=dict(teacher=args.teacher, work=args.work, updates=args.updates,
                                  warmup_updates=args.warmup_updates, enc_dim=args.enc_dim, dec_dim=args.dec_dim,
                                  can_dim=args.can_dim, can_encoder_layers=args.can_encoder_layers,
                                  measure_runs=args.measure_runs, measure_md=measure_md, seeds=args.seeds,
                                  validations=args.validations, plan=list(args.plan), lr_warmup=args.lr_warmup,
                                  threads=args.threads, device=str(device)))
    write_json(table_json, measured)
    write_table(measured, out, grid, args, command)


def write_table(measured, out, grid, args, command):
    """The summary table and its plots at ``out``, from a raw measurement (``out``'s JSON)."""
    args.load_after_measure = measured.get("load_after_measure")
    args.date = measured.get("date") or "not recorded in the raw measurement"
    args.measure_command, args.machine = measured["command"], measured["machine"]
    args.measure_md = (measured.get("settings") or {}).get("measure_md") or getattr(args, "measure_md", None)
    args.raw_json = os.path.basename(os.path.splitext(out)[0]) + ".json"
    args.runs, args.comparisons = measured.get("runs"), measured.get("comparisons")
    plan = (measured.get("settings") or {}).get("plan")
    args.plan = (plan[0], plan[1]) if plan else None
    if plan:
        args.lr_warmup = measured["settings"]["lr_warmup"]
    unknown = sorted({method_of(r["name"]) for r in measured["rows"] if r["name"] != "teacher"} - set(grid))
    if unknown:
        raise SystemExit(f"{args.raw_json}: runs of unknown methods {unknown}")
    summary, stats, teacher = summarise(measured["rows"], grid, args, command)
    plots = plot_students(stats, teacher, os.path.splitext(out)[0], command=command)
    if plots:
        summary += "\nPlots (cf. PET Fig 5): " + ", ".join(f"`{os.path.basename(p)}`" for p in plots) + "\n"
    with open(out, "w") as f:
        f.write(summary)
    print(summary)
    print(f"[bench] wrote {out}", file=sys.stderr)


BUDGET_DIR = re.compile(r"^u(\d+)-w(\d+)-e(\d+)-d(\d+)$")


def measurement_settings(measured, path):
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


def render_from_json(args, argv):
    """--render: the table of a kept raw measurement, training and measuring nothing."""
    if not os.path.isfile(args.render):
        raise SystemExit(f"--render {args.render}: no such file")
    with open(args.render) as f:
        measured = json.load(f)
    if not measured.get("rows") or not any(r["name"] == "teacher" for r in measured["rows"]):
        raise SystemExit(f"--render {args.render}: no measured rows with a teacher (is it a benchmark table's JSON?)")
    settings = measurement_settings(measured, args.render)
    for key, value in settings.items():
        setattr(args, key, value)
    out = args.out or os.path.splitext(args.render)[0] + ".md"
    if os.path.splitext(os.path.abspath(out))[0] != os.path.splitext(os.path.abspath(args.render))[0]:
        raise SystemExit(f"--out {out}: a table is named after its raw measurement ({args.render})")
    args.rendered_by = invocation("bench_translation.py", argv)
    grid = methods(args.enc_dim, args.dec_dim, args.can_dim, args.can_encoder_layers)
    write_table(measured, out, grid, args, measured.get("bench_command"))



if __name__ == "__main__":
    main()
