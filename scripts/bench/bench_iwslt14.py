#!/usr/bin/env python
"""The tooling on the PET paper's own benchmark: score a teacher and its PET student on the real
IWSLT'14 DE->EN test set (6,750 sentences: dev2010, tst2010-2012, TEDX.dev2012), beam 5.

    python scripts/bench/bench_iwslt14.py                  # -> work/results/iwslt14.md (+ its raw measurement, iwslt14.json)
    python scripts/bench/bench_iwslt14.py --quick          # a few updates, 100 test sentences (smoke test)

The seed runs of the committed table (one teacher, a PET student per seed, each seed resumable):

    python scripts/bench/bench_iwslt14.py --seeds 1,2,3 --out results/iwslt14.md

The 160k-pair IWSLT'14 training set cannot be brought onto this machine; ``../shared`` holds
fairseq's prepared valid and test files and the BPE codes learned on the full training set (``--iwslt-dir``;
they do not ship with the package: without them the run stops at once, naming the path). So this
is a *pipeline* benchmark, not a headline number: a teacher of the Multi30k reference teacher's shape
(3+3 layers, width 256, FFN 1024, 4 heads, shared embeddings) is trained on the 7,283 valid pairs
(every 23rd held out for validation, as prepare-iwslt14.sh holds out train), its PET student is
trained exactly as in ``bench_translation.py`` (warm-up then word-level KD, same widths, same
updates, the same selection protocol: validated ``--validations`` times in its KD stage, the last
checkpoint scored; one student per seed of ``--seeds``, in ``--work``/seed<k>/), and both are scored on the full standard test set with fairseq's IWSLT'14 protocol:
tokenised lowercased BLEU4 of the BPE-removed output against the tokenised reference text (given
as ``--tokenized-reference``, so reference words outside this small dictionary are not ``<unk>``).
With the full training set (``scripts/recipes/train_teacher_iwslt14.sh`` on a GPU, then
``scripts/recipes/pet.sh`` with its GPU variables) the same measurement command gives the paper's Table 7 setting.

Resumable: finished stages (``DONE``) are not retrained; a measurement of the same checkpoints is
not repeated. Each model's hypotheses of the test set are kept in the protocol's form (BPE removed,
tokenised, lowercased like the reference; ``hypotheses/test.txt`` in test-set order) and PET is compared
with the teacher by the cluster test of common/significance.py: test sentences as clusters of all seeds' outputs (BLEU on the tokenised text).
``--device cuda`` with ``--fp16`` or ``--bf16`` trains and decodes on the GPU (benchlib.add_device_args; default
the CPU in float32).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import translation_students as students
from benchlib import (ROOT, SHARED, add_device_args, add_seed_arguments, bleu_comparison, check_device, default_out,
                      Device, format_seeds, generate_hypotheses, invocation, missing_shared, seed_dir, seed_summary,
                      seeds_of, significance_lines, validation_plan, write_json, write_text)
from benchlib import run as run_logged

IWSLT = os.path.join(SHARED, "data", "iwslt14.de-en")  # fairseq's prepared files; they do not ship
IWSLT_FILES = ("bpe/valid.de", "bpe/valid.en", "bpe/test.de", "bpe/test.en", "tok/test.en")

# the Multi30k reference teacher's shape and recipe (checkpoints/multi30k.de-en/README.md)
TEACHER = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "3", "--decoder-layers", "3",
           "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
           "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
           "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "7e-4",
           "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "500", "--warmup-init-lr", "1e-7",
           "--dropout", "0.3", "--weight-decay", "1e-4", "--criterion", "label_smoothed_cross_entropy",
           "--label-smoothing", "0.1", "--max-tokens", "2048"]
HOLD_OUT_EVERY = 23  # prepare-iwslt14.sh: awk '{if (NR%23 == 0) print $0}' -> valid


# the test set's decoding (fairseq's IWSLT evaluation bounds, examples/translation: max_len_a 1.2, max_len_b 10)
DECODING = ["--max-len-a", "1.2", "--max-len-b", "10"]


def check_iwslt(iwslt):
    """Every IWSLT'14 file the benchmark reads, or a stop naming the first missing one (before anything runs)."""
    for name in IWSLT_FILES:
        if not os.path.isfile(os.path.join(iwslt, name)):
            raise SystemExit(missing_shared(os.path.join(iwslt, name), "fairseq's prepared IWSLT'14 DE-EN",
                                            "--iwslt-dir"))


def prepare(work, iwslt=IWSLT):
    """Split the shared BPE'd valid set into train and valid, binarise with the test set."""
    data = os.path.join(work, "data-bin")
    if os.path.isfile(os.path.join(data, "DONE")):
        return data
    check_iwslt(iwslt)
    from preprocess.textio import fairseq_preprocess, read_lines, write_lines

    text = os.path.join(work, "text")
    os.makedirs(text, exist_ok=True)
    for lang in ("de", "en"):
        lines = read_lines(os.path.join(iwslt, "bpe", f"valid.{lang}"))
        write_lines(os.path.join(text, f"train.{lang}"), [l for i, l in enumerate(lines, 1) if i % HOLD_OUT_EVERY])
        write_lines(os.path.join(text, f"valid.{lang}"), [l for i, l in enumerate(lines, 1) if not i % HOLD_OUT_EVERY])
    fairseq_preprocess(data, "de", "en", os.path.join(text, "train"), os.path.join(text, "valid"),
                       os.path.join(iwslt, "bpe", "test"), joined_dictionary=True)
    open(os.path.join(data, "DONE"), "w").close()
    return data


def train_teacher(work, data, updates, threads, extra, device=None):
    """Train (or continue, when --teacher-updates grew) the teacher; fairseq resumes from checkpoint_last.pt,
    and inverse_sqrt does not depend on --max-update, so a continued run equals a longer one."""
    save_dir = os.path.join(work, "teacher")
    last = os.path.join(save_dir, "checkpoint_last.pt")
    done = os.path.join(save_dir, "DONE")
    if os.path.isfile(done):
        with open(done) as f:
            previous = json.load(f)
        if previous["updates"] >= updates:
            return last
        started_before = previous["seconds"]
        # a continued teacher: say how each part ran
        threads_record = threads if str(previous["threads"]) == str(threads) else f"{previous['threads']} then {threads}"
    else:
        started_before, threads_record = 0.0, threads
    os.makedirs(save_dir, exist_ok=True)
    cmd = [*Device(device).train(), data, "--user-dir", os.path.join(ROOT, "user_dir"), *TEACHER,
           "--max-update", str(updates), "--max-epoch", "1000", "--seed", "1", *Device(device).train_flags(),
           "--save-dir", save_dir,
           "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50", *extra]
    started = time.time()
    run_logged(cmd, os.path.join(save_dir, "train.log"), threads)
    import torch

    # fairseq's own training time, summed over resumed parts (an interrupted part is not lost)
    seconds = torch.load(last, map_location="cpu", weights_only=False)["extra_state"].get("previous_training_time")
    if seconds is None:
        seconds = started_before + time.time() - started
    with open(done, "w") as f:
        json.dump({"updates": updates, "seconds": seconds, "threads": threads_record}, f)
    return last


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=os.path.join(ROOT, "work", "bench-iwslt14"),
                   help="folder for data, runs and logs (default: work/bench-iwslt14)")
    p.add_argument("--teacher-updates", type=int, default=800,
                   help="teacher training updates on the 7k valid pairs (default 800, ~9 epochs)")
    p.add_argument("--updates", type=int, default=800, help="PET student updates, all stages (default 800, as "
                                                            "bench_translation.py)")
    p.add_argument("--warmup-updates", type=int, default=200, help="of which the simplified-task warm-up (default 200)")
    add_seed_arguments(p, default="1")
    p.add_argument("--validations", type=int, default=3,
                   help="validations of each student in its KD stage, at the same points as bench_translation.py's "
                        "(default 3); the last checkpoint is scored")
    p.add_argument("--threads", type=int, default=2, help="torch threads for training (default 2)")
    add_device_args(p)
    p.add_argument("--iwslt-dir", default=IWSLT,
                   help="fairseq's prepared IWSLT'14 DE-EN: bpe/{valid,test}.{de,en} and tok/test.en (default: "
                        "data/iwslt14.de-en in FAIRSEQ_COMPRESS_SHARED, ../shared; it does not ship)")
    p.add_argument("--measure-runs", type=int, default=1, help="timed generation runs per model (default 1)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only the first N test sentences")
    p.add_argument("--quick", action="store_true", help="smoke mode: 20 + 6 updates, 100 test sentences, into --work/quick")
    p.add_argument("--out", default=None, help="summary Markdown (default: work/results/iwslt14.md; --quick: in --work)")
    return p


def main(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    command = invocation("bench_iwslt14.py", argv)
    seeds = seeds_of(parser, args)
    check_device(parser, args)
    device = Device(args)
    extra = []
    if args.quick:
        args.work = os.path.join(args.work, "quick")
        args.teacher_updates, args.updates, args.warmup_updates, args.validations = 20, 6, 3, 1
        args.max_sentences = args.max_sentences or 100
        extra = ["--max-tokens", "512"]
    plan = validation_plan(args.updates, args.updates - args.warmup_updates, args.validations)
    check_iwslt(args.iwslt_dir)
    os.makedirs(args.work, exist_ok=True)
    data = prepare(args.work, args.iwslt_dir)
    teacher = train_teacher(args.work, data, args.teacher_updates, args.threads, extra, device)
    print("[bench-iwslt14] teacher trained", file=sys.stderr, flush=True)
    pet = students.methods(128, 96, 96, 6)["pet"]
    budget = f"pet-t{args.teacher_updates}-u{args.updates}-w{args.warmup_updates}"
    runs, hyps = {}, {}
    for seed in seeds:
        run_dir = os.path.join(seed_dir(args.work, seed), budget)
        runs[seed] = students.run_stages(run_dir, data, teacher, pet[2], pet[3], seed, args.updates,
                                         args.warmup_updates, args.threads, 200, extra, plan, device)
        hyps[seed] = generate_hypotheses(data, runs[seed]["last"], os.path.join(run_dir, "hypotheses", "test.txt"),
                                         args.threads, DECODING, args.max_sentences, lang=None, device=device)
        print(f"[bench-iwslt14] PET student seed {seed} trained", file=sys.stderr, flush=True)
    teacher_hyps = generate_hypotheses(data, teacher, os.path.join(args.work, "teacher", "hypotheses", "test.txt"),
                                       args.threads, DECODING, args.max_sentences, lang=None, device=device)

    out = args.out or (os.path.join(args.work, "iwslt14.md") if args.quick else default_out("iwslt14.md"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # the raw measurement is kept beside the table, named after it (iwslt14.json)
    measure_md, measure_json = os.path.join(args.work, "measure.md"), os.path.splitext(out)[0] + ".json"
    names = ["teacher"] + [f"pet-s{seed}" for seed in seeds]
    cmd = [sys.executable, "-m", "user_dir.tools.measure", data, "--path", teacher, *[runs[s]["last"] for s in seeds],
           "--names", *names, "--tokenized-reference", os.path.join(args.iwslt_dir, "tok", "test.en"), "--beam", "5",
           "--batch-size", "128", *DECODING, "--runs", str(args.measure_runs),
           "--threads", str(args.threads), "--out", measure_md, "--json", measure_json, *device.measure()]
    if args.max_sentences:
        cmd += ["--max-sentences", str(args.max_sentences)]
    if students.measured_already(measure_json, cmd):
        print(f"[bench-iwslt14] {measure_json} already measures these checkpoints", file=sys.stderr)
    else:
        subprocess.check_call(cmd, cwd=ROOT)
    with open(measure_json) as f:
        measured = json.load(f)
    rows = {r["name"]: r for r in measured["rows"]}
    with open(os.path.join(args.work, "teacher", "DONE")) as f:
        teacher_run = json.load(f)
    n_train = sum(1 for _ in open(os.path.join(args.work, "text", "train.en")))
    n_valid = sum(1 for _ in open(os.path.join(args.work, "text", "valid.en")))
    references = os.path.join(args.iwslt_dir, "tok", "test.en")
    # the protocol's BLEU: tokenised text on both sides, no further tokenisation
    comparison = bleu_comparison("pet vs teacher", "pet", "teacher", [hyps[s] for s in seeds],
                                 [teacher_hyps] * len(seeds), references, tokenize="none")
    measured.update(bench_command=command, runs={f"pet-s{s}": dict(runs[s], hypotheses=hyps[s]) for s in seeds},
                    teacher_hypotheses=teacher_hyps, references=references, comparisons=[comparison],
                    settings=dict(teacher_updates=args.teacher_updates, teacher_seconds=teacher_run["seconds"],
                                  teacher_threads=teacher_run["threads"], train_pairs=n_train, valid_pairs=n_valid,
                                  updates=args.updates, warmup_updates=args.warmup_updates,
                                  max_sentences=args.max_sentences, seeds=seeds, validations=args.validations,
                                  plan=list(plan)))
    write_json(measure_json, measured)
    with open(measure_md) as f:
        table = f.read()
    t = rows["teacher"]
    pet_rows = [rows[f"pet-s{s}"] for s in seeds]

    def over_seeds(key, digits=2):
        return format_seeds(seed_summary({s: r[key] for s, r in zip(seeds, pet_rows)}), digits)

    drop = seed_summary({s: t["bleu_tok"] - r["bleu_tok"] for s, r in zip(seeds, pet_rows)})
    minutes = seed_summary({s: runs[s]["seconds"] / 60 for s in seeds})
    summary = "\n".join([
        "# IWSLT'14 DE->EN test set: the pipeline on the paper's own benchmark", "",
        f"Test: the standard IWSLT'14 DE->EN test set of fairseq's prepare-iwslt14.sh ({t['sentences']:,} sentences"
        f"{'' if not args.max_sentences else ', the first ' + str(args.max_sentences)}), beam 5, max length "
        f"1.2 x source + 10, BLEU (tok) = BLEU4 of the tokenised, lowercased, BPE-removed output against the "
        f"tokenised reference text (the protocol of the paper's Table 7).", "",
        f"**Not a headline number.** The 160k-pair training set is not available on this machine: the teacher "
        f"here is the Multi30k reference teacher's shape trained for {args.teacher_updates} updates "
        f"({teacher_run['seconds'] / 60:.0f} min, {teacher_run['threads']} threads, seed 1) on {n_train:,} pairs of "
        f"the IWSLT'14 *valid* set ({n_valid:,} held out for validation), joined dictionary of those pairs. "
        f"Its PET student (encoder/decoder widths 128/96, 4+4 logical layers from 2+2) trains as in "
        f"`scripts/bench/bench_translation.py`: {args.warmup_updates} warm-up updates, then word-level KD to "
        f"{args.updates}, one student per seed ({', '.join(map(str, seeds))}). "
        f"{students_protocol(args, plan)} The paper's numbers (full training set, 6+6-layer 512-wide teacher): "
        f"teacher {students.PAPER_TEACHER_BLEU}, PET {students.PAPER['pet'][1]} BLEU at {students.PAPER['pet'][0]}% "
        f"of the non-embedding parameters.", "",
        "| model | seeds | BLEU (tok): mean +- std [min, max] (each seed) | non-emb params | compression | sent/s | "
        "speed-up | training time |", "|---|---|---|---|---|---|---|---|",
        f"| teacher | 1 | {t['bleu_tok']:.2f} | {t['non_embedding_params']:,} | 100.00% | {t['sentences_per_s']:.1f} | "
        f"1.00x | {teacher_run['seconds'] / 60:.0f} min |",
        f"| pet | {len(seeds)} | {over_seeds('bleu_tok')} | {pet_rows[0]['non_embedding_params']:,} | "
        f"{pet_rows[0]['compression_rate']:.2f}% | {over_seeds('sentences_per_s', 1)} | "
        f"{over_seeds('speedup')}x | {format_seeds(minutes, 1)} min |",
        "", f"BLEU drop of PET: {format_seeds(drop)}.", "",
        *significance_lines([comparison], "PET (A) against its teacher (B), on the protocol's tokenised BLEU"),
        "Command (trains and measures only what is missing):", "```", command, "```",
        f"Logs: `{os.path.relpath(args.work, ROOT)}/teacher/train.log`, "
        f"`{os.path.relpath(args.work, ROOT)}/seed<k>/pet-*/<stage>/train.log`. Raw measurement (every row "
        f"unrounded, the commands and settings, each run's hypotheses file): `{os.path.basename(measure_json)}`.", "",
        "## The measurement command's full table", "", table])
    write_text(out, summary)
    print(summary)
    print(f"[bench-iwslt14] wrote {out}", file=sys.stderr)


def students_protocol(args, plan):
    _, points = plan
    times = "once" if len(points) == 1 else f"{len(points)} times"
    return (f"Selection: every student validated {times}, at update(s) {', '.join(map(str, points))} of its "
            f"{args.updates}; the last checkpoint is scored." if points else
            "Selection: no validation; the last checkpoint is scored.")


if __name__ == "__main__":
    main()
