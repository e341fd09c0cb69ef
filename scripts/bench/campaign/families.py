"""The claim families of issue 45 at the papers' budgets: what each trains (one benchmark driver call per table),
for how many updates, and how long that takes on the lent GPU.

Budgets (the same rule for every variant of a table: the paper's epochs, counted in updates of the batch the
driver uses, each variant validated at the same points):

* pet -- PET Tables 7 and 9 on Multi30k: the shipped PET recipe's 3 + 20 epochs (scripts/recipes/pet.sh,
  results/pet_multi30k.md) are 5,658 updates at --max-tokens 2048 (246 per epoch; the first 738 are PET's
  warm-up), for PET, PET without warm-up, word-KD, Patient-KD, CAN and sequence-level KD students of PET's
  size; one validation per KD epoch (20); lr warm-up 500 updates as the recipe.
* ghost -- GhostBERT Tables 1/3 with Table 8's epochs: 3 of distillation and 3 of fine-tuning (MNLI, QQP: 1 of
  distillation), batch 32, at m = 12/12, 3/12 and 1/12, ghost modules against pruned only.
* apc -- APC Tables 2/3: APC-50-ff compression only (the paper's 100 steps, section 4.3) then the 'Finalized'
  strategy for the paper's epochs (MNLI 1, SST-2 8, MRPC 163, RTE 240: scripts/recipes/apc_glue_gpu.sh) against
  neuron pruning of the same size with the same updates, and the teacher; translation: every FFN at half
  (1024 -> 128) against neuron pruning + fine-tuning and a word-KD student, each PET's full 5,658 updates.
* variator -- Variator Table 1: plugins of k = 2, 4, 8 (bottleneck 64) against the backbone, the paper's BERT
  budgets (24k pre-training, 26k adaptation updates), validated every 1k updates.

Throughput, for planning (``estimate``): measured on the lent H200 (issue 45), six Multi30k students of PET's size
at once in fp16 at --max-tokens 2048 ran 11-13 updates/s each (PET) and 15 (a plain 2+2 student), the GPU 99%
busy: we plan with 12. The MiniLM-L6 GLUE students have not been timed on a GPU: we assume 8 updates/s each, four
at once (batch 32 x 128 tokens), and the first GLUE call's logs replace that assumption (fairseq's ``ups``).
"""
import math
import os

MT_UPDATES, MT_WARMUP, MT_KD_EPOCHS = 5658, 738, 20   # PET's 3 + 20 epochs of Multi30k at --max-tokens 2048
PET_METHODS = ("pet", "pet-nowarmup", "word-kd", "patient-kd", "can", "seq-kd")
GLUE_TASKS = ("SST-2", "MRPC", "RTE")        # the tasks with data here (../shared/data/glue); others by --tasks
GLUE_BATCH = 32                               # GhostBERT Table 8, APC section 4.3
GHOST_WIDTHS = "12/12,3/12,1/12"
APC_FINALIZED_EPOCHS = {"MNLI": 1, "SST-2": 8, "MRPC": 163, "RTE": 240}  # APC Table 3 (recipes/apc_glue_gpu.sh)
APC_COMPRESS_UPDATES = 100                   # APC section 4.3
VARIATOR_PRETRAIN, VARIATOR_ADAPT = 24000, 26000   # Variator's BERT run (scripts/recipes/variator_glue_gpu.sh)

# planning rates: (updates/s of one run, runs at once)
MT_RATE, MT_CONCURRENCY = 12.0, 6
GLUE_RATE, GLUE_CONCURRENCY = 8.0, 4
CALL_SECONDS = 540        # what one device command may use (10 minutes less start-up and packing)
SETUP_SECONDS = 90        # gpu_check.sh --setup-only from carried wheels: 76 s measured
FAMILIES = ("pet", "ghost", "apc", "variator")


def glue_train_examples(glue_dir, task):
    """Training examples of a GLUE task: the rows of its train.tsv (CoLA's has no header)."""
    path = os.path.join(glue_dir, task, "train.tsv")
    if not os.path.isfile(path):
        raise SystemExit(f"--glue-dir {glue_dir}: no {task}/train.tsv (the GLUE TSVs)")
    with open(path, encoding="utf-8", errors="replace") as f:
        rows = sum(1 for _ in f)
    return rows if task == "CoLA" else rows - 1


def epochs_to_updates(glue_dir, task, epochs, batch=GLUE_BATCH):
    return math.ceil(glue_train_examples(glue_dir, task) / batch) * epochs


def driver_flags(help_text, device, precision, jobs):
    """The device, precision and concurrency flags a driver takes (read off its --help): a driver that does not
    know --device runs on the CPU only, so asking it for CUDA stops here."""
    flags = []
    if "--device" in help_text:
        flags += ["--device", device]
    elif device != "cpu":
        raise SystemExit("this driver has no --device option yet: it runs on the CPU only")
    if precision != "fp32":
        if f"--{precision}" not in help_text:
            raise SystemExit(f"this driver has no --{precision} option")
        flags.append(f"--{precision}")
    if jobs and "--jobs" in help_text:
        flags += ["--jobs", str(jobs)]
    return flags


def jobs_of(family, work, glue_work, glue_dir, seeds, scale, tasks):
    """The driver calls of a family: a list of dicts (name: the table's name under results/claims, driver, args,
    updates: training updates the call runs in all, concurrency: runs at once). ``scale`` tiny: the drivers'
    --quick settings (a pipeline check on a CPU, numbers meaningless)."""
    seeds_arg = ["--seeds", ",".join(map(str, seeds))]
    n = len(seeds)
    out = os.path.join(work, "results")
    tiny = scale == "tiny"
    if family == "pet":
        methods = ("pet", "word-kd") if tiny else PET_METHODS
        args = ["--methods", *methods, "--teacher", "checkpoints/multi30k.de-en/teacher.pt",
                "--work", os.path.join(work, "bench-translation"), *seeds_arg]
        args += (["--quick"] if tiny else ["--updates", str(MT_UPDATES), "--warmup-updates", str(MT_WARMUP),
                                          "--validations", str(MT_KD_EPOCHS), "--lr-warmup", "500"])
        return [dict(name="pet_gpu", driver="bench_translation.py", args=args + ["--out", os.path.join(out, "pet_gpu")],
                     updates=len(methods) * n * MT_UPDATES, concurrency=len(methods), rate=MT_RATE)]
    if family == "ghost":
        calls = []
        for task in tasks:
            d = 1 if task in ("MNLI", "QQP") else 3
            distill = 6 if tiny else epochs_to_updates(glue_dir, task, d)
            finetune = 6 if tiny else epochs_to_updates(glue_dir, task, 3)
            name = f"ghostbert_{task.lower().replace('-', '')}_gpu"
            args = ["--glue-task", task, "--glue-work", glue_work, "--widths", GHOST_WIDTHS, "--variants",
                    "pruned,ghost", "--glue-distill-updates", str(distill), "--glue-finetune-updates", str(finetune),
                    "--work", os.path.join(work, f"ghost-{task}"), *seeds_arg, *(["--quick"] if tiny else []),
                    "--out", os.path.join(out, name)]
            calls.append(dict(name=name, driver="bench_ghost.py", args=args, updates=6 * n * (distill + finetune),
                              concurrency=GLUE_CONCURRENCY, rate=GLUE_RATE))
        return calls
    if family == "apc":
        calls = []
        for task in tasks:
            finetune = 6 if tiny else epochs_to_updates(glue_dir, task, APC_FINALIZED_EPOCHS.get(task, 3))
            compress = 6 if tiny else APC_COMPRESS_UPDATES
            name = f"apc_{task.lower().replace('-', '')}_gpu"
            args = ["--glue-task", task, "--glue-work", glue_work, "--compress-updates", str(compress),
                    "--finetune-updates", str(finetune), "--work", os.path.join(work, f"apc-{task}"), *seeds_arg,
                    *(["--quick"] if tiny else []), "--out", os.path.join(out, name)]
            calls.append(dict(name=name, driver="bench_apc_glue.py", args=args, updates=2 * n * (compress + finetune),
                              concurrency=GLUE_CONCURRENCY, rate=GLUE_RATE))
        mt = 6 if tiny else MT_UPDATES
        calls.append(dict(name="apc_mt_gpu", driver="bench_apc.py", args=[
            "--parts", "sizes", "word-kd", "--sizes", "128", "--updates", str(mt), "--kd-updates", str(mt),
            "--teacher", "checkpoints/multi30k.de-en/teacher.pt", "--work", os.path.join(work, "apc-mt"), *seeds_arg,
            "--out", os.path.join(out, "apc_mt_gpu")], updates=3 * n * mt, concurrency=3, rate=MT_RATE))
        return calls
    if family == "variator":
        pre, adapt = ("6", "6") if tiny else (str(VARIATOR_PRETRAIN), str(VARIATOR_ADAPT))
        args = ["--parts", "glue", "--tasks", *tasks, "--ratios", "2", "4", "8", "--bottleneck", "64",
                "--glue-pretrain-updates", pre, "--glue-updates", adapt,
                "--glue-validations", "2" if tiny else str(VARIATOR_ADAPT // 1000), "--no-ablations", "--glue-work",
                glue_work, "--work", os.path.join(work, "bench-variator"), "--fresh", *seeds_arg,
                *(["--quick"] if tiny else []), "--out", os.path.join(out, "variator_glue_gpu.md")]
        return [dict(name="variator_glue_gpu", driver="bench_variator.py", args=args,
                     updates=3 * n * (int(pre) + len(tasks) * int(adapt)), concurrency=GLUE_CONCURRENCY,
                     rate=GLUE_RATE)]
    raise SystemExit(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")


def estimate(job):
    """Device seconds of one driver call at the planning rates: its updates spread over its runs at once."""
    return job["updates"] / (job["rate"] * job["concurrency"])


SESSION_SECONDS = 15 * 60 - 120   # a lent session's device time less its machine's start


def plan_text(family, jobs, seeds, needs_glue):
    """The family's device minutes per seed and what that means on the lent machine: it goes back bare between
    sessions, so a session runs whole seeds (set-up and, for GLUE, the teachers again each time)."""
    lines = [f"family {family}, seeds {','.join(map(str, seeds))}:"]
    overhead = SETUP_SECONDS + (6 * 60 if needs_glue else 0)   # GLUE: MiniLM teachers on the tasks (assumed)
    work = 0.0
    for job in jobs:
        s = estimate(job)
        work += s
        lines.append(f"  {job['name']}: {job['updates']:,} updates, {job['concurrency']} at once at "
                     f"{job['rate']:g} updates/s each -> about {s / 60:.1f} device minutes")
    per_seed = work / len(seeds)
    fit = int((SESSION_SECONDS - overhead) // per_seed) if per_seed else len(seeds)
    lines.append(f"  in all about {(work + overhead) / 60:.0f} device minutes ({per_seed / 60:.1f} per seed, "
                 f"{overhead / 60:.1f} of set-up{' and teachers' if needs_glue else ''} per session): "
                 f"{math.ceil((work + overhead) / CALL_SECONDS)} command(s) of {CALL_SECONDS} s on one machine")
    if fit >= 1:
        sessions = math.ceil(len(seeds) / fit)
        lines.append(f"  lent sessions of 15 device minutes: {sessions}, {min(fit, len(seeds))} seed(s) each "
                     f"(run --seeds K per session, then ingest the archives together)")
    else:
        lines.append("  one seed does not fit a lent session of 15 device minutes: run it on a machine of your own "
                     "(--budget 0), or one task at a time (--tasks) where a task fits")
    return "\n".join(lines)
