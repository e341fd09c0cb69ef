"""What every benchmark driver in scripts/ shares: one way to run a command (threads, environment, log),
resumable stages, the teacher's digest, fairseq's training time, seeds and their folders, the selection
protocol, per-example outputs, the significance rows and the report (Markdown + JSON + PNG).

A driver imports it as a module (``python scripts/bench_x.py`` puts scripts/ on ``sys.path``)::

    from benchlib import ROOT, run, stage, parse_seeds, seed_dir, default_out, ...

Conventions every driver follows (issue 32):

* Outputs: under ``work/`` by default (:func:`default_out`); ``results/`` only when ``--out results/...``
  is given, so a user's run never overwrites the committed tables.
* Seeds: ``--seeds 1,2,3`` (:func:`add_seed_arguments`); each seed trains in its own folder
  ``WORK/seed<k>/...`` (:func:`seed_dir`), so a run of more seeds resumes the seeds already trained.
* Stages: a stage is done when its ``DONE`` marker exists and is never rerun; its ``settings.json`` holds
  the commands that made it, and a stage asked again with other commands stops instead of mixing them
  (:func:`stage`).
* Selection: every variant of a comparison trains the same total updates and is validated the same
  number of times at the same update points of its whole budget, two-stage variants counted over both
  stages (:func:`validation_plan`, :func:`selection_flags`); the primary score is the last checkpoint's,
  best-of-N beside it; each table says so once (:func:`protocol_text`).
* Tables: the mean, the spread (sample std and min-max) and every seed's value (:func:`format_seeds`); each
  comparison a table makes gets a row with the difference, its 95% interval and p
  (:func:`bleu_comparison`, :func:`glue_comparison`, :func:`significance_lines`), from per-seed per-example
  outputs (detokenised hypotheses in test-set order, or GLUE dev predictions as JSON lists).
"""
import concurrent.futures
import contextlib
import functools
import gzip
import hashlib
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
from record import sha256_of  # noqa: E402,F401  (one definition: the records' file hashes)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# data that does not ship with the package (GLUE TSVs, IWSLT'14, the original teacher file): beside the checkout
SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
WORK = os.path.join(ROOT, "work")  # what a run writes, unless told otherwise (git ignores it)
# what ships: the reference Multi30k DE->EN teacher (the original's weights, bit for bit), its BPE codes and
# dictionary (checkpoints/multi30k.de-en/README.md), and the Multi30k text (preprocess/data)
SHIPPED_TEACHER_DIR = os.path.join(ROOT, "checkpoints", "multi30k.de-en")
SHIPPED_TEACHER = os.path.join(SHIPPED_TEACHER_DIR, "teacher.pt")
MULTI30K_TEXT = os.path.join(ROOT, "preprocess", "data", "multi30k.de-en")
MULTI30K_DATA = os.path.join(WORK, "data-bin", "multi30k.de-en")  # the teacher's data-bin, built on demand
if ROOT not in sys.path:  # the package (user_dir, preprocess) for the steps drivers run in-process
    sys.path.insert(0, ROOT)


# ---- what ships, what is built on demand, what must be brought --------------------------------------------
def missing_shared(path, what, flag=None):
    """The message of a run that needs data that does not ship: the missing path, what it is, and how to point
    at it (FAIRSEQ_COMPRESS_SHARED, or the driver's own flag)."""
    how = f"give {flag} or " if flag else ""
    return (f"{path}: missing -- {what} does not ship with the package; {how}set FAIRSEQ_COMPRESS_SHARED to the "
            f"folder that holds it (now {SHARED})")


def shared_path(*parts, what, flag=None):
    """``SHARED/<parts>`` when it exists; otherwise the run stops at once with :func:`missing_shared`."""
    path = os.path.join(SHARED, *parts)
    if not os.path.exists(path):
        sys.exit(missing_shared(path, what, flag))
    return path


def add_teacher_arguments(parser, role="the teacher", scope=""):
    """``--teacher`` (default: the shipped reference teacher) and ``--data`` (default None: :func:`multi30k_data_bin`,
    resolved when a run needs it) of a driver on the Multi30k DE->EN teacher; ``scope`` prefixes their help."""
    parser.add_argument("--teacher", default=SHIPPED_TEACHER,
                        help=f"{scope}{role} (default: the reference Multi30k DE->EN teacher, shipped in "
                             "checkpoints/multi30k.de-en)")
    parser.add_argument("--data", default=None,
                        help=f"{scope}its data-bin (default: built once from the embedded Multi30k with the shipped "
                             "teacher's codes and dictionary, work/data-bin/multi30k.de-en)")


def multi30k_data_bin(dest=MULTI30K_DATA):
    """The shipped teacher's data-bin (byte-identical to the one it was trained on): the embedded Multi30k
    through ``preprocess.prepare_multi30k`` with the teacher's BPE codes and dictionary, built once at ``dest``
    (about 20 s; a lock makes parallel drivers wait for the first). Returns ``dest``."""
    import fcntl

    if not os.path.isfile(os.path.join(dest, "DONE")):
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        with open(dest + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.isfile(os.path.join(dest, "DONE")):
                run([sys.executable, "-m", "preprocess.prepare_multi30k", "--dest", dest, "--raw-dir", MULTI30K_TEXT,
                     "--bpe-codes", os.path.join(SHIPPED_TEACHER_DIR, "code"),
                     "--srcdict", os.path.join(SHIPPED_TEACHER_DIR, "dict.de.txt")], dest + ".log", 2)
                open(os.path.join(dest, "DONE"), "w").close()
    return dest


# ---- device and precision -----------------------------------------------------------------------------------
DEVICES = ("cpu", "cuda")


def add_device_args(parser):
    """``--device {cpu,cuda}`` (default cpu: every committed command unchanged) and ``--fp16`` / ``--bf16``: the
    one device option set of every benchmark driver (issue 45); :func:`check_device` refuses what cannot run."""
    group = parser.add_argument_group("device and precision")
    group.add_argument("--device", choices=DEVICES, default="cpu",
                       help="where fairseq and the tools run (default cpu; cuda: the current GPU, several runs of "
                            "--jobs sharing it)")
    precision = group.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true",
                           help="train and decode in float16 with loss scaling (fairseq's --fp16; --device cuda only)")
    precision.add_argument("--bf16", action="store_true",
                           help="train and decode in bfloat16 (fairseq's --bf16, trained through fc-train-bf16: stock "
                                "fairseq-train --bf16 implies --tpu)")


def check_device(parser, args):
    """Refuse, naming the flags, a device and precision fairseq cannot run: --fp16 on the CPU (fairseq's float16
    optimizer needs CUDA kernels)."""
    if args.device == "cpu" and args.fp16:
        parser.error("--fp16 needs --device cuda (fairseq has no float16 training on the CPU; --bf16 runs there)")


class Device:
    """The flags a device and precision (:func:`add_device_args`) turn into: ``Device(args)`` (a Device, or any object
    with ``device``/``fp16``/``bf16``; missing ones: the CPU in float32)."""

    def __init__(self, args=None):
        if isinstance(args, Device):
            self.kind, self.precision = args.kind, args.precision
            return
        self.kind = str(getattr(args, "device", "cpu") or "cpu").split(":")[0]  # cuda:1 is a CUDA device
        self.precision = "fp16" if getattr(args, "fp16", False) else "bf16" if getattr(args, "bf16", False) else "fp32"
        if self.kind not in DEVICES:
            raise ValueError(f"--device {self.kind}: expected one of {', '.join(DEVICES)}")

    def fairseq(self):
        """fairseq-train/-generate/-validate's flags: --cpu on the CPU, --fp16 or --bf16 for the precision."""
        return (["--cpu"] if self.kind == "cpu" else []) + ([f"--{self.precision}"] if self.precision != "fp32" else [])

    def train(self):
        """The fairseq-train command of a run, its flags not included: ``python -m fairseq_cli.train``, or
        fc-train-bf16's module under --bf16."""
        module = "user_dir.tools.train_bf16" if self.precision == "bf16" else "fairseq_cli.train"
        return [sys.executable, "-m", module]

    def train_flags(self):
        """:meth:`fairseq` for fairseq-train: on CUDA one process on the current device (fairseq otherwise spawns
        one per visible GPU), so the runs of --jobs share one GPU."""
        return self.fairseq() + (["--distributed-world-size", "1"] if self.kind == "cuda" else [])

    def tool(self):
        """The plug-in's tools that take a device (ghost_prune, seq_kd_data): --cpu or nothing (no precision)."""
        return ["--cpu"] if self.kind == "cpu" else []

    def measure(self):
        """fc-measure's flags: --cpu, or --fp16 (it has no bfloat16: a bf16 run is measured in float32)."""
        return self.tool() + (["--fp16"] if self.precision == "fp16" else [])

    def __repr__(self):
        return f"{self.kind}/{self.precision}"


# ---- logging and running commands --------------------------------------------------------------------
def logger(name):
    """``log(msg)`` printing ``[name HH:MM:SS] msg``."""
    def log(msg):
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    return log


def environment(threads):
    """The one environment every command of a benchmark runs in: ``threads`` OpenMP/MKL threads (torch's
    intra-op threads), the checkout on PYTHONPATH (user_dir, preprocess), and no switch that disables
    torch's weights-only loading (a user's shell does not have it; the checkpoints must load without it)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def command_line(cmd):
    return " ".join(shlex.quote(str(c)) for c in cmd)


class _Quiet:
    """Commands of one driver run at once (its ``--jobs``), except a timed one, which runs alone: it waits until
    the others end, and none starts until it ends (a readers-writer lock, the timed command the writer)."""

    def __init__(self):
        self._cond, self._running, self._alone = threading.Condition(), 0, 0

    @contextlib.contextmanager
    def hold(self, alone):
        with self._cond:
            if alone:
                self._alone += 1
                self._cond.wait_for(lambda: self._running == 0)
                self._running = -1
            else:
                self._cond.wait_for(lambda: self._running >= 0 and not self._alone)
                self._running += 1
        try:
            yield
        finally:
            with self._cond:
                if alone:
                    self._alone -= 1
                    self._running = 0
                else:
                    self._running -= 1
                self._cond.notify_all()


_QUIET = _Quiet()


def run(cmd, logfile, threads, alone=False):
    """Run ``cmd`` from the checkout in :func:`environment`, its output appended to ``logfile`` after a
    ``$ command`` line; a failure stops the benchmark naming the log. ``alone``: a timing (a speed measurement),
    run with no other command of this process running (:class:`_Quiet`)."""
    os.makedirs(os.path.dirname(os.path.abspath(logfile)), exist_ok=True)
    with open(logfile, "a") as f, _QUIET.hold(alone):
        f.write(f"$ {command_line(cmd)}\n")
        f.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=environment(threads),
                              cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0]) or 'benchmark'}: command failed ({proc.returncode}); see {logfile}")


def run_jobs(function, items, jobs):
    """``function(item)`` for every item, ``jobs`` at a time (threads, each running its commands as processes),
    in the order given; returns the results in that order (the first failure raised)."""
    if jobs <= 1:
        return [function(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(function, items))


def invocation(script, argv):
    """The command line that made a table: ``python scripts/bench/<script> <args>``."""
    args = sys.argv[1:] if argv is None else argv
    return f"python scripts/bench/{script}" + ("" if not args else " " + command_line(args))


# ---- resumable stages ----------------------------------------------------------------------------------
def settings_of(directory, cmds):
    """What a stage's folder was made by, independent of where the checkout lies: its commands with the
    interpreter left out, the folder itself written DIR and the checkout written '.'."""
    return [[str(c).replace(directory, "DIR").replace(ROOT, ".") for c in cmd[1:]] for cmd in cmds]


def check_settings(directory, cmds):
    """A folder holds the outputs of one configuration only: ``settings.json`` records the commands that
    made it, and a stage asked again with other settings (another budget, selection or kind) stops naming
    the folder instead of reusing or overwriting what another table was made from."""
    path, settings = os.path.join(directory, "settings.json"), settings_of(directory, cmds)
    if os.path.exists(path):
        with open(path) as f:
            recorded = json.load(f)
        if recorded != settings:
            diff = sorted({" ".join(a) for a in recorded} ^ {" ".join(b) for b in settings})
            sys.exit(f"{directory} was made by other commands than this run's (differing: {diff}); give this "
                     f"configuration its own --out/--work, or delete {directory}")
        return
    if is_done(directory):
        sys.exit(f"{directory} is finished but records no settings.json: its configuration is unknown; delete "
                 f"{directory} to train it again")
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        json.dump(settings, f, indent=1)


def is_done(directory):
    return os.path.exists(os.path.join(directory, "DONE"))


def stage(directory, cmds, threads, logfile=None):
    """Run ``cmds`` once: a ``DONE`` file marks the stage finished (a finished stage is never rerun; an
    interrupted fairseq-train resumes from its checkpoint_last.pt); ``settings.json`` what it was made by.
    Returns True when it ran now."""
    check_settings(directory, cmds)
    if is_done(directory):
        return False
    for cmd in cmds:
        run(cmd, logfile or os.path.join(directory, "log.txt"), threads)
    with open(os.path.join(directory, "DONE"), "w") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return True


# ---- the teacher's digest and fairseq's training time -------------------------------------------------
def fc_flags(path):
    """The fairseq-train architecture flags of a checkpoint or a tool's side file, as ``fc-flags
    --with-regularisation PATH`` prints them (user_dir/tools/checkpoint_flags.py: the one way every tool,
    recipe and driver hands a model's flags on). The stored dropout is kept so a driver's commands, and the
    runs resumed under them, are those of the side files it used to read; each driver sets its own
    dropout after these flags."""
    from user_dir.tools.checkpoint_flags import FlagsError, checkpoint_flags
    try:
        return checkpoint_flags(path, with_regularisation=True)
    except FlagsError as e:
        sys.exit(f"fc-flags: {e}")


def fairseq_train_seconds(log):
    """fairseq's own training wall time, summed over the parts of a resumed run ("done training in N
    seconds"); 0 when not found."""
    if not os.path.isfile(log):
        return 0.0
    with open(log) as f:
        return sum(float(x) for x in re.findall(r"done training in ([0-9.]+) seconds", f.read()))


# ---- seeds -------------------------------------------------------------------------------------------------
def parse_seeds(values):
    """``["1,2,3"]`` or ``["1", "2", "3"]`` (or an int) -> [1, 2, 3]: distinct positive integers, in order."""
    if isinstance(values, int):
        values = [str(values)]
    seeds = []
    for value in values:
        for part in str(value).split(","):
            if not part.strip():
                continue
            if not part.strip().isdigit() or int(part) < 1:
                raise ValueError(f"--seeds: {part!r} is not a positive integer (give e.g. --seeds 1,2,3)")
            seeds.append(int(part))
    if not seeds:
        raise ValueError("--seeds: no seed given (give e.g. --seeds 1,2,3)")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: {seeds} repeats a seed")
    return seeds


def add_seed_arguments(parser, default="1"):
    """``--seeds 1,2,3`` (or ``1 2 3``), and ``--seed N`` kept as the one-seed spelling of earlier commands."""
    parser.add_argument("--seeds", nargs="+", default=None,
                        help=f"seeds, comma-separated (e.g. --seeds 1,2,3; default {default}); each trains in its own "
                             "folder WORK/seed<k>/, so adding seeds later resumes the ones already trained")
    parser.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds N)")
    parser.set_defaults(_seeds_default=default)


def seeds_of(parser, args):
    """The seeds of parsed ``args`` (see :func:`add_seed_arguments`), errors naming the flag."""
    if args.seed is not None and args.seeds is not None:
        parser.error("give --seeds or --seed, not both")
    try:
        return parse_seeds([str(args.seed)] if args.seed is not None else (args.seeds or [args._seeds_default]))
    except ValueError as e:
        parser.error(str(e))


def seed_dir(work, seed):
    """Seed ``seed``'s own folder under a benchmark's work folder."""
    return os.path.join(work, f"seed{seed}")


def rel(path):
    """A path as the JSON keeps it: relative to the checkout when inside it."""
    real = os.path.abspath(path)
    return os.path.relpath(real, ROOT) if real.startswith(ROOT + os.sep) else real


def default_out(name):
    """Where a driver writes its table unless ``--out`` is given: under work/, never over results/."""
    return os.path.join(WORK, "results", name)


# ---- mean, spread, every seed -------------------------------------------------------------------------
def seed_summary(values):
    """{seed: value} -> dict(mean, std (sample; 0 for one seed), min, max, n, values {seed: value})."""
    values = {int(s): float(v) for s, v in values.items()}
    xs = list(values.values())
    return {"mean": statistics.mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "min": min(xs),
            "max": max(xs), "n": len(xs), "values": {str(s): v for s, v in values.items()}}


def format_seeds(summary, digits=2):
    """'mean +- std [min, max] (s1 x, s2 y, ...)'; one seed: 'x (s1)'."""
    each = ", ".join(f"s{s} {v:.{digits}f}" for s, v in summary["values"].items())
    if summary["n"] == 1:
        return f"{summary['mean']:.{digits}f} ({each.split(' ')[0]})"
    return (f"{summary['mean']:.{digits}f} +- {summary['std']:.{digits}f} "
            f"[{summary['min']:.{digits}f}, {summary['max']:.{digits}f}] ({each})")


def is_summary(x):
    return isinstance(x, dict) and "mean" in x and "values" in x


def num(x):
    """A number, or the mean of a :func:`seed_summary`."""
    return x["mean"] if is_summary(x) else x


def fmt(x, digits=2):
    """A number as the tables show it: a plain number (one run, as tables before seeds) or a summary's
    mean, spread and every seed (:func:`format_seeds`)."""
    return format_seeds(x, digits) if is_summary(x) else f"{x:.{digits}f}"


def aggregate(by_seed):
    """Per-seed records ({seed: record}, records of one shape) -> one record whose floats are
    :func:`seed_summary` s over the seeds; dicts are aggregated key by key (keys every seed has), and
    what does not vary as a number (an int all seeds share, text, a list) is the first seed's."""
    seeds = list(by_seed)
    first = by_seed[seeds[0]]
    if isinstance(first, dict) and not is_summary(first):
        return {k: aggregate({s: by_seed[s][k] for s in seeds}) for k in first if all(k in by_seed[s] for s in seeds)}
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    if isinstance(first, int) and all(by_seed[s] == first for s in seeds):
        return first
    return seed_summary(by_seed)


def difference(a, b):
    """a - b seed by seed (summaries over the same seeds, or a plain number on either side) as a summary;
    two plain numbers: their difference."""
    if not is_summary(a) and not is_summary(b):
        return a - b
    seeds = list((a if is_summary(a) else b)["values"])
    value = lambda x, s: x["values"][s] if is_summary(x) else x  # noqa: E731
    return seed_summary({s: value(a, s) - value(b, s) for s in seeds})


def over_seeds(by_seed):
    """One row from its seeds' rows ({seed: row}): numbers as summaries over the seeds (:func:`aggregate`), what
    does not vary the first seed's, and every seed's per-example outputs (``hypotheses`` / ``predictions``:
    {seed: path})."""
    row = aggregate(by_seed)
    for key in ("hypotheses", "predictions"):
        if key in row:
            row[key] = {str(s): rel(r[key]) for s, r in by_seed.items()}
    return row


def minutes_text(seconds, missing="-"):
    """A training time as the tables show it: '12 min', or a summary's mean '12 min per seed'; ``missing``
    for None."""
    if seconds is None:
        return missing
    return f"{num(seconds) / 60:.0f} min" + (" per seed" if is_summary(seconds) else "")


def seeds_text(seeds):
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


# ---- the selection protocol ----------------------------------------------------------------------------
def validation_plan(total, window, n, flags="--validations"):
    """The N update points at which every variant of a comparison is validated: the last N multiples of
    ``window / n`` up to ``total``, all inside the last ``window`` updates (the last stage of the variant
    whose last stage is shortest), so a two-stage variant and a one-stage one are validated at the same
    points of their whole budgets. Returns ``(interval, points)``; ``n = 0``: no validation, ``(0, [])``."""
    if n == 0:
        return 0, []
    if n < 0 or window < n or window % n:
        sys.exit(f"{flags} {n}: the validated window of {window} updates must split into {n} equal intervals")
    interval = window // n
    if total % interval:
        sys.exit(f"{flags} {n}: every {interval} updates does not end at the last update ({total}); choose "
                 "budgets that the interval divides")
    return interval, [total - k * interval for k in reversed(range(n))]


def selection_flags(plan, stage_start, stage_updates, best_metric=None, maximize=False):
    """fairseq-train flags of one stage (it starts after ``stage_start`` updates of the variant's budget)
    under ``plan`` (:func:`validation_plan`): validated and saved exactly at the plan's points that fall in
    this stage (none at epoch ends), ``checkpoint_best.pt`` the best of them, ``checkpoint_last.pt`` the last
    update; a stage holding no point is not validated."""
    interval, points = plan
    local = [p - stage_start for p in points if stage_start < p <= stage_start + stage_updates]
    if not local:
        return ["--disable-validation"]
    if len(local) != len(points) or stage_start % interval:
        sys.exit(f"the validation points {points} do not all fall on this stage's multiples of {interval} (updates "
                 f"{stage_start + 1}-{stage_start + stage_updates}): give the stages budgets the interval divides")
    flags = ["--validate-interval-updates", str(interval), "--save-interval-updates", str(interval),
             "--validate-after-updates", str(local[0]), "--validate-interval", "1000000", "--keep-interval-updates", "1"]
    if best_metric:
        flags += ["--best-checkpoint-metric", best_metric] + (["--maximize-best-checkpoint-metric"] if maximize else [])
    return flags


def validation_updates(log):
    """The update counts at which a fairseq-train log validated (``valid on 'valid' subset ... num_updates N``),
    in order, a resumed run's repeats once."""
    if not os.path.isfile(log):
        return []
    with open(log) as f:
        found = re.findall(r"valid on 'valid' subset .*?\| num_updates (\d+)", f.read())
    return list(dict.fromkeys(int(n) for n in found))


def protocol_text(total, plan, best_by, lr):
    """The one sentence a table's header says about selection (the same for every variant of it)."""
    _, points = plan
    if not points:
        return (f"Selection protocol, the same for every variant: {total} updates in all, no validation; the score "
                f"is the last checkpoint's. Learning rate: {lr}.")
    if len(points) == 1:
        return (f"Selection protocol, the same for every variant: {total} updates in all (a two-stage variant's "
                f"stages together), validated once, at update {total}; the score is the last checkpoint's. "
                f"Learning rate: {lr}.")
    return (f"Selection protocol, the same for every variant: {total} updates in all (a two-stage variant's "
            f"stages together), validated {len(points)} times, at updates {', '.join(map(str, points))} of the "
            f"whole budget; the primary score is the last checkpoint's (update {total}), best-of-{len(points)} (the "
            f"checkpoint with the best {best_by} of those validations) beside it. Learning rate: {lr}.")


# ---- per-example outputs --------------------------------------------------------------------------------
def read_lines(path):
    """Lines of a text file (``.gz`` read as gzip), without their newlines."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_lines(path, lines):
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def hypotheses_from_generate(log, out, lang="en", max_sentences=None):
    """fairseq-generate's best hypothesis of every sentence (its ``D-<id>`` lines: BPE removed) in the order
    of the test set, Moses-detokenised as user_dir.tools.measure scores sacreBLEU (``lang=None``: kept
    tokenised, for a tokenised reference), written one a line to ``out``; ``max_sentences``: ids below N
    only (measure's ``--max-sentences``)."""
    by_id = {}
    with open(log, encoding="utf-8") as f:
        for line in f:
            if line.startswith("D-"):
                sid, _, text = line.rstrip("\n").split("\t", 2)
                by_id[int(sid[2:])] = text
    ids = sorted(i for i in by_id if max_sentences is None or i < max_sentences)
    if not ids or ids != list(range(len(ids))):
        sys.exit(f"{log}: its hypotheses do not cover the test set's sentences 0..{len(ids) - 1} (ids {ids[:5]}...)")
    if lang is None:
        write_lines(out, [by_id[i] for i in ids])
    else:
        from sacremoses import MosesDetokenizer

        detok = MosesDetokenizer(lang=lang)
        write_lines(out, [detok.detokenize(by_id[i].split()) for i in ids])
    return out


def generate_hypotheses(data, checkpoint, out, threads, extra=(), max_sentences=None, lang="en", device=None):
    """Translate the test set with ``checkpoint`` (stock fairseq-generate, beam 5, batches of 128 sentences,
    BPE removed, as user_dir.tools.measure decodes) on ``device`` (:class:`Device`'s argument; default the CPU)
    and keep the detokenised hypotheses at ``out`` (skipped when ``out`` exists). Returns ``out``."""
    if not os.path.isfile(out):
        log = out + ".generate.log"
        if os.path.exists(log):
            os.remove(log)
        run([sys.executable, "-m", "fairseq_cli.generate", data, "--user-dir", "user_dir", "--path", checkpoint,
             "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", *Device(device).fairseq(),
             *extra],
            log, threads)
        hypotheses_from_generate(log, out, lang, max_sentences)
    return out


def fairseq_bleu(log):
    """The tokenised BLEU4 fairseq-generate reports last in ``log``."""
    with open(log) as f:
        scores = re.findall(r"BLEU4 = ([0-9.]+)", f.read())
    if not scores:
        sys.exit(f"{log}: no BLEU4 line (did fairseq-generate finish?)")
    return float(scores[-1])


def multi30k_references(dest):
    """The Multi30k test_2016_flickr English references as the reference teacher's test set holds them
    (lowercased, untokenised: the teacher's README), from the embedded copy, written to ``dest`` once; returns
    ``dest``."""
    if not os.path.isfile(dest):
        source = os.path.join(MULTI30K_TEXT, "test_2016_flickr.en.gz")
        write_lines(dest, [line.lower() for line in read_lines(source)])
    return dest


def sacrebleu_of(hypotheses, references):
    """sacreBLEU (13a) of a hypotheses file against a references file (the first as many lines)."""
    import sacrebleu

    hyps = read_lines(hypotheses)
    return sacrebleu.corpus_bleu(hyps, [read_lines(references)[:len(hyps)]]).score


def write_predictions(path, predictions, labels_path):
    """GLUE dev predictions of one model as a JSON list (in dev-set order), with the gold labels' file."""
    write_json(path, {"predictions": list(predictions), "labels": os.path.abspath(labels_path)})


def read_predictions(path):
    with open(path) as f:
        return json.load(f)["predictions"]


# ---- significance: each comparison a table makes ----------------------------------------------------------
def bleu_comparison(label, a, b, hyps_a, hyps_b, references, tokenize="13a", margin=None):
    """The cluster test of A vs B (user_dir/common/significance.py: test sentences resampled and swapped as
    clusters of all seeds' outputs): ``hyps_a`` / ``hyps_b`` are the seeds' hypotheses files (same seed order;
    one model's file repeated for a model without seeds), ``references`` the references file;
    ``tokenize="none"`` for tokenised text on both sides. The row keeps the outputs themselves (``outputs``,
    xz-packed: a table re-rendered or re-tested never needs the work folder)."""
    from user_dir.common.significance import pack, paired_bleu, verdict

    refs = read_lines(references)
    ha, hb = [read_lines(p) for p in hyps_a], [read_lines(p) for p in hyps_b]
    refs = refs[:len(ha[0])]
    result = paired_bleu(ha, hb, refs, tokenize=tokenize, margin=margin)
    return dict(result, label=label, a_name=a, b_name=b, verdict=verdict(result),
                metric="sacreBLEU" if tokenize != "none" else "BLEU (tok)", tokenize=tokenize,
                outputs=pack({"a": ha, "b": hb, "references": refs}))


def glue_comparison(label, a, b, preds_a, preds_b, labels, metric, margin=None):
    """The cluster test of metric(A) - metric(B) (dev examples as clusters of all seeds' predictions):
    ``preds_a`` / ``preds_b`` the seeds' prediction files (same seed order), ``labels`` the gold labels; the
    predictions kept in the row (``outputs``, packed)."""
    from user_dir.common.significance import pack, paired_glue, verdict

    pa, pb = [read_predictions(p) for p in preds_a], [read_predictions(p) for p in preds_b]
    result = paired_glue(pa, pb, list(labels), metric, margin=margin)
    return dict(result, label=label, a_name=a, b_name=b, metric=metric, verdict=verdict(result),
                outputs=pack({"a": pa, "b": pb, "labels": list(labels)}))


SIGNIFICANCE_NOTE = ("Significance (user_dir/common/significance.py): A and B paired seed by seed; each test example "
                     "is one cluster of its k seeds' outputs, so it counts once however many seeds ran. A and B: "
                     "the metric pooled over the seeds (corpus BLEU over all seeds' hypotheses; the GLUE metric "
                     "over all seeds' predictions); 95% interval: a bootstrap over examples (one draw for every "
                     "seed of both systems); p: a two-sided paired sign-flip test over examples (A's and B's "
                     "outputs of an example swapped on every seed), (1 + hits) / (1 + resamples); per seed: each "
                     "seed's own A - B. A verdict needs the interval, p < 0.05 and every seed's sign to agree.")


def format_per_seed(c):
    """'+0.31, -0.12, +0.40 (mean +0.20 +- 0.28)': each seed's A - B, their mean and sample std."""
    if not c.get("per_seed"):
        return "-"
    return (", ".join(f"{d:+.2f}" for d in c["per_seed"]) +
            f" (mean {c['per_seed_mean']:+.2f} +- {c['per_seed_std']:.2f})")


def significance_lines(comparisons, title="Comparisons"):
    """A Markdown table: one row per comparison with both scores, A - B, its 95% interval, p and each seed's
    A - B. A row of an older table (a (seed, example) test, before issue 44) is marked as such."""
    if not comparisons:
        return []
    note = SIGNIFICANCE_NOTE
    if any("per_seed" not in c for c in comparisons):
        note += (" Rows marked as an older test were measured before it (issue 44): their seeds' outputs were "
                 "concatenated and resampled as independent (seed, example) units, so their intervals are up to "
                 "sqrt(k) too narrow and their BLEU p is sacreBLEU's one-sided count; rerun the table to re-test them.")
    lines = [f"{title} ({note})", "",
             "| comparison (A vs B) | metric | seeds | A | B | A - B | 95% interval | p | per-seed A - B | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in comparisons:
        cell = format_per_seed(c) if "per_seed" in c else "- (an older (seed, example) test: intervals too narrow)"
        lines.append(f"| {c['label']} | {c['metric']} | {c['seeds']} | {c['a']:.2f} | {c['b']:.2f} | {c['diff']:+.2f} | "
                     f"[{c['low']:+.2f}, {c['high']:+.2f}] | {c['p']:.3g} | {cell} | {c['verdict']} |")
    return lines + [""]


# ---- the report: provenance, Markdown, JSON, PNG ---------------------------------------------------------
def machine():
    """CPU model, cores, torch and Python (user_dir.tools.measure's description) and the 1-minute load."""
    from user_dir.tools.measure import machine_description

    return f"{machine_description()}; load average {os.getloadavg()[0]:.2f}"


def provenance(script, argv, threads, seeds):
    """Who made a table: the command line, machine (CPU model, cores, load), threads, seeds and date."""
    return {"command": invocation(script, argv), "machine": machine(), "threads": threads,
            "seeds": list(seeds), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "platform": platform.platform()}


def provenance_text(p):
    return (f"Made by `{p['command']}` on {p['date']}; {p['machine']}; {p['threads']} thread(s) per run; "
            f"{seeds_text(p['seeds'])}.")


def load_parts(path, upgrade, fresh=False):
    """The JSON beside a table whose parts are measured by separate runs, ``{"version": 2, "translation": part,
    "glue": {task: part}, ...}`` (a run of one part keeps the others): empty where there is none (or ``fresh``),
    and a JSON of an older layout as ``upgrade(data)`` makes it."""
    if fresh or not os.path.isfile(path):
        return {"version": 2, "translation": None, "glue": {}}
    with open(path) as f:
        data = json.load(f)
    return data if data.get("version") == 2 else upgrade(data)


def write_text(path, text):
    """Write a whole file (a temporary file renamed): a reader never sees half a table."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_json(path, data):
    write_text(path, json.dumps(data, indent=1))


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (with a note) where matplotlib is not installed."""
    try:
        import logging

        import matplotlib
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
        return None
    return plt


def plot_panels(png, panels, command=None, shape=None, figsize=None, dpi=120, title=None, sharex=False, plt=None):
    """The one plot of every driver: a metric against a cost, one panel (axes) per entry of ``panels``, written
    to ``png`` with ``command`` (the command line that made it) in the PNG's Description metadata. A driver says
    only what is its own, the series and their labels::

        panel = {"series": [series, ...], "xlabel": ..., "ylabel": ..., "title": ..., "title_size": points,
                 "xscale"/"yscale": "log", "hlines": [{"y": 1.1, **line style}], "vlines": [{"x": ..., ...}],
                 "grid": True, "legend": {legend kwargs} (absent or None: no legend)}
        series = {"x": [...], "y": [...], "kind": "plot" (default) | "step" | "errorbar", "style": "o-",
                  "notes": [a label per point], "note_offset": (dx, dy) points or one per point (absent: at the
                  point), "note_y": [a label height per point, in data units: labels moved apart],
                  "note_style": {annotate kwargs}, **matplotlib kwargs (label, marker, ls, color, yerr, ...)}

    ``shape`` (rows, columns): default one row; ``figsize``: default 6 x 4 inches a panel; ``title``: above all.
    ``plt``: pyplot when the caller has it (:func:`write_report`'s ``plot``). Returns ``png``, or None where
    matplotlib is missing or there is no panel."""
    if not panels:
        return None
    plt = plt or pyplot()
    if plt is None:
        return None
    from matplotlib.transforms import offset_copy

    rows, cols = shape or (1, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=figsize or (6 * cols, 4 * rows), squeeze=False, sharex=sharex)
    for ax, panel in zip(axes.flat, panels):
        for s in panel.get("series", []):
            s = dict(s)
            x, y, kind, style = s.pop("x"), s.pop("y"), s.pop("kind", "plot"), s.pop("style", None)
            notes, offset, note_y = s.pop("notes", None), s.pop("note_offset", None), s.pop("note_y", None)
            note_style = s.pop("note_style", {})
            draw = getattr(ax, kind)
            draw(x, y, *([style] if style else []), **s)
            for i, note in enumerate(notes or []):
                at = offset[i] if isinstance(offset, list) else offset
                if note_y is not None:  # the label at its own height, ``at`` points to the right of its point
                    ax.annotate(note, (x[i], y[i]), xytext=(x[i], note_y[i]), va="center", **note_style,
                                textcoords=offset_copy(ax.transData, fig=fig, x=at[0], y=at[1], units="points"))
                elif at is not None:
                    ax.annotate(note, (x[i], y[i]), textcoords="offset points", xytext=at, **note_style)
                else:
                    ax.annotate(note, (x[i], y[i]), **note_style)
        for line in panel.get("hlines", []):
            line = dict(line)
            ax.axhline(line.pop("y"), **line)
        for line in panel.get("vlines", []):
            line = dict(line)
            ax.axvline(line.pop("x"), **line)
        for axis in ("x", "y"):
            if panel.get(f"{axis}scale"):
                getattr(ax, f"set_{axis}scale")(panel[f"{axis}scale"])
            if panel.get(f"{axis}label"):
                getattr(ax, f"set_{axis}label")(panel[f"{axis}label"])
        if panel.get("title"):
            ax.set_title(panel["title"], **({"fontsize": panel["title_size"]} if panel.get("title_size") else {}))
        if panel.get("grid"):
            ax.grid(alpha=0.3)
        if panel.get("legend") is not None:
            ax.legend(**panel["legend"])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=dpi, metadata={"Description": command} if command else None)
    plt.close(fig)
    return png


def write_report(md_path, text, json_path=None, data=None, plot=None, png_path=None):
    """The report's three files: Markdown ``text`` at ``md_path``, ``data`` as JSON at ``json_path``, and
    ``plot(plt, png_path)`` drawn with matplotlib when given. Returns the paths written."""
    written = []
    if json_path is not None:
        write_json(json_path, data)
        written.append(json_path)
    write_text(md_path, text)
    written.append(md_path)
    if plot is not None:
        plt = pyplot()
        if plt is not None and plot(plt, png_path) is not False:
            written.append(png_path)
    return written
