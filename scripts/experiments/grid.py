#!/usr/bin/env python
"""One runner for every grid: plan it, run it (locally, on a lent accelerator, on Slurm), file each finished cell.

    python scripts/experiments/grid.py plan grids/pet.toml
    python scripts/experiments/grid.py run grids/pet.toml --jobs 2 --threads 1 [--only pet,word-kd] [--seeds 1]
    python scripts/experiments/grid.py run grids/pet.toml --executor slurm --partition gpu --device-flags=--fp16
    python scripts/experiments/grid.py run grids/pet.toml --executor device --budget 540 --pack $OUT/grid.tar.gz
    python scripts/experiments/grid.py unpack grid.tar.gz                # here: carry a device call's state back in

A grid (grids/*.toml): inputs (TEACHER, DATA and the command preparing DATA), seeds, shared variables and cells, each
a recipe of scripts/recipes/ with its variables. A cell at one seed runs ``VARS... SEED=s bash scripts/recipes/RECIPE
WORK`` in work/grid/CELL-sSEED-KEY (run again, it resumes); its WORK/result.json is filed in the store (store.py). The
key: the sha256 of the commands the recipe prints (DRY_RUN=1) and of the teacher; a cell whose key is filed is done;
a new key's cell starts from the stages an earlier key's folder of it finished with the same commands (reuse_stages).
``plan``: each cell's state and estimated time on a CPU core and a GPU from measured rates. Executors: ``local``,
``slurm`` (a submitit array), ``device`` (cells until ``--budget`` s, work folders packed into ``--pack``, which
``unpack`` carries back in). ``--commit`` commits each cell's record (git)."""
import argparse
import concurrent.futures
import fcntl
import functools
import glob
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import store as store_lib  # noqa: E402
from record import data_fingerprint, sha256_of  # noqa: E402

RECIPES = os.path.join(ROOT, "scripts", "recipes")
RATES = os.path.join(ROOT, "grids", "rates.toml")


def rooted(path):
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


class Cell:
    """One recipe at one seed: its variables, work folder and key."""

    def __init__(self, grid, name, recipe, variables, seed):
        self.grid, self.name, self.recipe, self.seed = grid, name, recipe, seed
        self.label = f"{name}-s{seed}"
        self.variables = dict({k: str(v) for k, v in variables.items()}, SEED=str(seed))

    def environment(self, threads=None, device_flags=None):
        env = {**os.environ, **self.grid.inputs, **self.variables}
        if device_flags is not None:
            env["DEVICE_FLAGS"] = device_flags
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        return dict(env, PYTHON=env.get("PYTHON", sys.executable),
                    PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))

    def command(self, work):
        return ["bash", os.path.join(RECIPES, self.recipe), work]

    def commands(self, work=None):
        """The cell's commands as its recipe prints them (DRY_RUN=1) for the work folder WORK (a scratch one by
        default), written WORK, the checkout ROOT."""
        placeholder = work or os.path.join(self.grid.scratch, "dry", self.label)
        proc = subprocess.run(self.command(placeholder), env=dict(self.environment(), DRY_RUN="1"), capture_output=True,
                              text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"grid: cell {self.label}: the recipe's dry run failed:\n{proc.stderr[-2000:]}")
        return [line.replace(placeholder, "WORK").replace(ROOT, "ROOT")
                for line in proc.stdout.splitlines() if line and not line.startswith(("===", "---"))]

    @functools.cached_property
    def key(self):
        """sha256 of the commands the recipe prints for this cell and of the teacher."""
        digest = hashlib.sha256("\n".join(self.commands()).encode())
        digest.update(self.grid.teacher_sha.encode())
        return digest.hexdigest()

    @property
    def work(self):
        return self.grid.work_of(self.label, self.key)


class Grid:
    def __init__(self, path, work=None, store=None):
        with open(path, "rb") as f:
            spec = tomllib.load(f)
        self.path, self.spec = path, spec
        self.name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]
        inputs = spec.get("inputs", {})
        self.inputs = {k: rooted(str(v)) if k in ("TEACHER", "DATA") else str(v) for k, v in inputs.items()
                       if k != "prepare"}
        self.prepare = inputs.get("prepare")
        self.teacher = self.inputs.get("TEACHER", os.path.join(ROOT, "checkpoints", "multi30k.de-en", "teacher.pt"))
        self.inputs["TEACHER"] = self.teacher
        made = {rooted(p["creates"]) for p in spec.get("prepare", [])}
        if not os.path.exists(self.teacher) and self.teacher not in made:
            raise SystemExit(f"grid {path}: inputs.TEACHER = {self.teacher}: no such checkpoint (and no [[prepare]] "
                             "entry creates it)")
        self.work = os.path.abspath(work or os.path.join(ROOT, "work", "grid"))
        self.scratch = os.path.join(self.work, ".scratch")
        self.store = store_lib.Store(store or os.path.join(ROOT, "results", "store"))
        self.cells = []
        for entry in spec.get("cell", []):
            if missing := [f"'{field}'" for field in ("name", "recipe") if field not in entry]:
                raise SystemExit(f"grid {path}: a [[cell]] has no {' or '.join(missing)}")
            if not os.path.exists(os.path.join(RECIPES, entry["recipe"])):
                raise SystemExit(f"grid {path}: cell {entry['name']}: no recipe scripts/recipes/{entry['recipe']}")
            variables = dict(spec.get("variables", {}), **entry.get("variables", {}))
            for seed in entry.get("seeds", spec.get("seeds", [1])):
                self.cells.append(Cell(self, entry["name"], entry["recipe"], variables, seed))
        if not self.cells:
            raise SystemExit(f"grid {path}: no [[cell]]")

    @functools.cached_property
    def teacher_sha(self):
        if not os.path.exists(self.teacher):
            raise SystemExit(f"grid {self.path}: the teacher {self.teacher} is not made yet: run the grid's "
                             "preparation first (plan and run make it)")
        return sha256_of(self.teacher, teacher=True)

    def select(self, only=None, seeds=None):
        cells = self.cells
        if only:
            names = set(only.split(","))
            if unknown := names - {c.name for c in cells}:
                raise SystemExit(f"--only {only}: no cell {', '.join(sorted(unknown))} in {self.path}")
            cells = [c for c in cells if c.name in names]
        return [c for c in cells if not seeds or c.seed in {int(s) for s in seeds.split(",")}]

    def prepare_data(self):
        """Make the grid's inputs that are missing: DATA by inputs.prepare, then each [[prepare]] entry's
        'creates' path by its 'command' ({DATA}, {TEACHER} and {ROOT} filled in), e.g. a teacher-output cache."""
        data = self.inputs.get("DATA")
        steps = [(data, self.prepare)] if data and self.prepare else []
        steps += [(rooted(p["creates"]), p["command"]) for p in self.spec.get("prepare", [])]
        for path, command in steps:
            if os.path.exists(path):
                continue
            for name, value in (("DATA", data or ""), ("TEACHER", self.teacher), ("ROOT", ROOT)):
                command = command.replace("{" + name + "}", shlex.quote(value))
            print(f"grid: preparing {path}: {command}", flush=True)
            subprocess.run(command, shell=True, check=True, cwd=ROOT,
                           env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]))

    def data_fingerprint(self):
        return data_fingerprint(data) if (data := self.inputs.get("DATA")) and os.path.exists(data) else None

    def work_of(self, label, key):
        """The work folder of the cell LABEL (name-sSEED) whose key is KEY."""
        return os.path.join(self.work, f"{label}-{key[:10]}")

    def current_records(self, name):
        """The store's records of the cell NAME made with the grid's teacher and data now (data not made here: any),
        in filing order; a record of another teacher or data is stale, never rendered as current."""
        fingerprint = self.data_fingerprint()
        return [r for r in self.store.find(grid=self.name, cell=name) if r["teacher"]["sha256"] == self.teacher_sha
                and (fingerprint is None or r["data"]["fingerprint"] == fingerprint)]

    def file(self, cell):
        """The store's record of CELL, filed from the WORK/result.json its recipe wrote."""
        with open(os.path.join(cell.work, "result.json")) as f:
            return self.store.add(cell.key, self.name, cell.name, cell.seed, json.load(f), cell.work)

    def state(self, cell):
        record = self.store.get(cell.key)
        if record is not None:
            current = self.data_fingerprint()
            return "stale" if current and record["data"]["fingerprint"] != current else "done"
        if alive(os.path.join(cell.work, ".running")):
            return "running"
        if os.path.isdir(cell.work):
            return "started"
        return "stale" if self.store.find(cell=cell.name, seed=cell.seed) else "to do"


def alive(marker):
    """Whether a grid process runs the cell: it holds MARKER's lock, which the kernel frees when it dies."""
    try:
        with open(marker) as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: no process holds it
        return False
    except OSError as error:  # held, or no marker
        return isinstance(error, BlockingIOError)


# a cell's budget: each stage's epochs (updates of an epoch of the grid's data: rates.toml's [data]) or updates
STAGES = ("WARMUP_", "KD_", "DISTILL_", "FINETUNE_", "COMPRESS_", "")
BUDGET_VARIABLES = tuple(f"{stage}{unit}" for stage in STAGES for unit in ("UPDATES", "EPOCHS"))
# the recipes whose students stop by patience at an epoch cap unless given updates (common.sh, student_training)
PATIENCE_RECIPES = ("pet.sh", "competitors.sh")


def budget(cell, data):
    """(updates, bound) the cell trains, from its variables and DATA's entry in rates.toml's [data]; bound: a
    patience-stopped cell's epoch cap; (None, False) for the recipe's default budget or an unmeasured epoch."""
    v = cell.variables
    per_epoch = data.get("updates_per_epoch") or (
        -(-int(data["train_examples"]) // int(v.get("BATCH", 32))) if "train_examples" in data else None)
    warmup = []
    if cell.recipe == "pet.sh" and not (v.get("WARMUP_EPOCHS") or v.get("WARMUP_UPDATES")):
        warmup = [3 * per_epoch] if per_epoch else [None]  # pet.sh's 3 warm-up epochs, the paper's
    if cell.recipe in PATIENCE_RECIPES and not (v.get("UPDATES") or v.get("KD_UPDATES")):
        stages, bound = [int(v.get("MAX_EPOCHS", 60)) * per_epoch if per_epoch else None], True
        v = {k: x for k, x in v.items() if k.startswith("WARMUP_")}
    else:
        stages, bound = [], False
    for stage in STAGES:
        if v.get(f"{stage}EPOCHS"):
            stages.append(int(v[f"{stage}EPOCHS"]) * per_epoch if per_epoch else None)
        elif v.get(f"{stage}UPDATES"):
            stages.append(int(v[f"{stage}UPDATES"]))
    stages += warmup
    return (None, False) if not stages or None in stages else (sum(stages), bound)


def training_rate(records):
    """Updates per second of wall time over the training stages of RECORDS (None without any)."""
    updates = sum(t.get("updates") or 0 for r in records for t in r.get("training", {}).values())
    wall = sum(c["wall_s"] for r in records for c in r["commands"] if c["stage"] in r.get("training", {}))
    return updates / wall if updates and wall else None


def estimate(grid, cell, device):
    """(seconds, bound) for CELL on DEVICE ('cpu' or 'gpu'): the mean wall of the store's records of the cell (else of
    its recipe and variables); else its updates (its records' elsewhere, else its budget) at the training rate of the
    store's records of its recipe, data and STUDENT_FLAGS (else grids/rates.toml's). (None, False): nothing measured."""
    records = [r for r in grid.store.records() if r["machine"].get("device", "cpu") == device]
    variables = {k: v for k, v in cell.variables.items() if k != "SEED"}
    same_cell = [r for r in records if r.get("cell") == cell.name and r.get("grid") == grid.name]
    # a record made at another budget says nothing of this cell's (a fixed one of a patience-stopped one, say)
    same_vars = [r for r in records if r["recipe"] == cell.recipe and
                 all(r["variables"].get(k, "") == v for k, v in variables.items() if k in r["variables"]) and
                 all(r["variables"].get(k, "") == variables.get(k, "") for k in BUDGET_VARIABLES)]
    for pool in (same_cell, same_vars):
        if pool:
            return sum(r["wall_s"] for r in pool) / len(pool), False
    if variables.get("SMOKE") == "1":
        return None, False
    with open(RATES, "rb") as f:
        rates = tomllib.load(f)
    data = os.path.basename(grid.inputs.get("DATA", ""))
    rate = training_rate([r for r in records if (r["recipe"], os.path.basename(r["data"].get("path") or ""),
                          r["variables"].get("STUDENT_FLAGS", "")) == (cell.recipe, data, variables.get("STUDENT_FLAGS", ""))])
    if rate is None:
        rate = next((r.get("updates_per_s") or r["examples_per_s"] / int(variables.get("BATCH", 32))
                     for r in rates.get("rate", []) if r["device"] == device and
                     all((cell.recipe if k == "recipe" else data if k == "data" else variables.get(k, "")) == v
                         for k, v in r["match"].items())), None)
    if rate is None:
        return None, False
    elsewhere = grid.store.find(grid=grid.name, cell=cell.name)
    if elsewhere:
        return sum(r["updates"] for r in elsewhere) / len(elsewhere) / rate, False
    updates, bound = budget(cell, rates.get("data", {}).get(data, {}))
    return (None, False) if updates is None else (updates / rate, bound)


def gpu_over_cpu():
    """(the smallest GPU / CPU core training rate ratio grids/rates.toml measured for one recipe, that recipe's match):
    what a cell with no GPU rate of its own has its CPU estimate divided by."""
    with open(RATES, "rb") as f:
        rates = tomllib.load(f).get("rate", [])
    pairs = [(g["updates_per_s"] / c["updates_per_s"], g["match"]) for g in rates for c in rates
             if g["device"] == "gpu" and c["device"] == "cpu" and g["match"] == c["match"]
             and g.get("updates_per_s") and c.get("updates_per_s")]
    return min(pairs, key=lambda pair: pair[0], default=(None, None))


def hours(estimated, scaled=False):
    seconds, bound = estimated
    return "?" if seconds is None else ("<= " if bound else "") + ("~" if scaled else "") + f"{seconds / 3600:.2f} h"


def plan(grid, cells):
    counts = {}
    ready = all(map(os.path.exists, (grid.teacher, grid.inputs.get("DATA") or ROOT)))  # a key reads both (raw refs)
    teacher = grid.teacher_sha[:12] if os.path.exists(grid.teacher) else "made by the grid's preparation when it runs"
    lines = [f"grid {grid.name} ({os.path.relpath(grid.path, ROOT)}): {len(cells)} cells; teacher "
             f"{os.path.relpath(grid.teacher, ROOT)} ({teacher}); store {os.path.relpath(grid.store.root, ROOT)}",
             f"{'cell':<28} {'state':<8} {'CPU core':>11} {'GPU':>11}  key         work"]
    totals, unknown, scaled = {"cpu": 0.0, "gpu": 0.0}, {"cpu": 0, "gpu": 0}, 0
    ratio, measured_on = gpu_over_cpu()
    for cell in cells:
        filed = not ready and os.path.exists(grid.teacher) and any(  # asked only when no key can be computed
            r["teacher"]["sha256"] == grid.teacher_sha for r in grid.store.find(grid=grid.name, cell=cell.name,
                                                                                seed=cell.seed))
        state = grid.state(cell) if ready else "filed" if filed else "to do"  # filed: of this teacher, data not made
        counts[state] = counts.get(state, 0) + 1
        est = {d: estimate(grid, cell, d) for d in ("cpu", "gpu")}
        scale = est["gpu"][0] is None and est["cpu"][0] is not None and ratio is not None
        if scale:
            est["gpu"] = (est["cpu"][0] / ratio, est["cpu"][1])
            scaled += state != "done"
        if state not in ("done", "filed"):
            for d, (seconds, _) in est.items():
                unknown[d] += seconds is None
                totals[d] += seconds or 0
        key, work = (cell.key[:10], os.path.relpath(cell.work, ROOT)) if ready else ("-" * 10, "-")
        lines.append(f"{cell.label:<28} {state:<8} {hours(est['cpu']):>11} {hours(est['gpu'], scale):>11}  {key}  "
                     f"{work}")
    left = ", ".join(f"{d.upper()} {totals[d] / 3600:.1f} h" + (f" + {unknown[d]} cells unmeasured" if unknown[d] else "")
                     + (f" ({scaled} cells scaled)" if d == "gpu" and scaled else "") for d in ("cpu", "gpu"))
    lines.append("(<= : a bound at the epoch cap of a cell stopped by patience; rates from the store's records, else "
                 "grids/rates.toml's measured ones)")
    if "filed" in counts:
        lines.append("(filed: the store holds a record of the cell and seed with this teacher; its key, and so whether "
                     "it is current, is known once the grid's preparation has made the data: grid.py run makes it)")
    if scaled:
        lines.append(f"(~ : no GPU rate measured for the cell's recipe: its CPU estimate / {ratio:.1f}, the smallest "
                     f"GPU/CPU rate ratio grids/rates.toml measured ({', '.join(f'{k} {v}' for k, v in measured_on.items())}"
                     "); small students gain least from a GPU, so it overstates a larger model's GPU time)")
    lines.append("states: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; left to run: {left}")
    print("\n".join(lines))


def run_cell(grid_path, work_root, store_root, label, threads=None, device_flags=None, commit=False, log=print):
    """Run one cell to its record (the local executor's job, and each submitit job's body): rerunning the recipe
    resumes it; returns the record (None when another process runs the cell), or raises with the log's tail."""
    grid = Grid(grid_path, work_root, store_root)
    (cell,) = [c for c in grid.cells if c.label == label]
    existing = grid.store.get(cell.key)
    if existing is not None:
        return existing
    if not os.path.isdir(cell.work):
        reuse_stages(grid, cell, log)
    os.makedirs(cell.work, exist_ok=True)
    marker = open(os.path.join(cell.work, ".running"), "a")  # locked while the cell runs: taking it is atomic
    try:
        fcntl.flock(marker, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another grid process runs it (two runs of one grid share the cells left between them)
        log(f"grid: {cell.label} is running in another process; skipped")
        return marker.close()
    except OSError as error:  # a file system without locks (e.g. Lustre mounted without flock): no guard, said
        log(f"grid: {cell.label}: {error} locking {marker.name}; run, but not guarded against another run of it")
    marker.truncate(0)
    print(os.getpid(), file=marker, flush=True)  # for a reader without the lock (ps, a shell's kill -0)
    logfile = os.path.join(cell.work, "grid.log")
    started = time.time()
    log(f"grid: {cell.label} started ({os.path.relpath(cell.work, ROOT)})")
    try:
        with open(logfile, "a") as out:
            proc = subprocess.run(cell.command(cell.work), env=cell.environment(threads, device_flags), cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            with open(logfile) as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"cell {cell.label} failed (exit {proc.returncode}); its log {logfile}:\n{tail}")
        record = grid.file(cell)
    finally:
        os.remove(marker.name)
        marker.close()
    log(f"grid: {cell.label} done in {(time.time() - started) / 60:.1f} min: "
        + ", ".join(f"{k} {v:.2f}" for k, v in record["metrics"].items()))
    if commit:
        commit_landed(grid, f"store: {grid.name} {cell.label} ({cell.key[:10]})")
    return record


def reuse_stages(grid, cell, log):
    """Start CELL's new folder from the newest earlier folder of its label (another key: the recipe or a variable
    changed): its finished stages in the order they finished, while this cell runs each with the same command (the
    recipe's dry run in the new folder, so a command reading an earlier stage's output is spelt out), each with what
    the run made up to its end; a changed last stage (another scoring subset) then does not train again."""
    olds = [d for d in glob.glob(os.path.join(grid.work, f"{cell.label}-*")) if d != cell.work]
    if not olds:
        return
    old, since, kept = max(olds, key=os.path.getmtime), 0.0, []
    os.makedirs(cell.work)
    for done in sorted(glob.glob(os.path.join(old, "*", "DONE")), key=os.path.getmtime):
        with open(done) as f:
            if f.read().strip() not in cell.commands(cell.work):
                break
        for entry in os.scandir(old):
            if entry.name not in (".running", "grid.log", "result.json") and since < entry.stat().st_mtime <= \
                    os.path.getmtime(done):
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry.path, os.path.join(cell.work, entry.name))
        since = os.path.getmtime(done)
        kept.append(os.path.basename(os.path.dirname(done)))
    if kept:
        log(f"grid: {cell.label} starts from {os.path.relpath(old, ROOT)}'s finished stages: {', '.join(kept)}")


def commit_landed(grid, message):
    """Commit the store's new records, then the pages they change: every rendered block (scripts/experiments/render.py)
    and results/README.md, those files alone (a user's other changes stay uncommitted), one committer at a time."""
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "--show-toplevel"], capture_output=True).returncode != 0:
        return  # not a git checkout (Store.commit does the same): the records are filed, nothing to commit
    with open(os.path.join(grid.store.root, ".commit.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        grid.store.commit(message)
        import render

        try:
            pages = sorted({stale.split(": ")[0] for stale in render.render_pages()})
        except (SystemExit, Exception) as error:  # a page that cannot render keeps its old text (the cell is filed);
            print(f"grid: pages not re-rendered: {error}", file=sys.stderr, flush=True)  # the store is committed
            return
        index = os.path.join(ROOT, "results", "README.md")
        with open(index) as f:
            before = f.read()
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "maint", "results_index.py")], cwd=ROOT,
                       capture_output=True)
        with open(index) as f:
            pages += ["results/README.md"] if f.read() != before else []
        if pages:
            subprocess.run(["git", "-C", ROOT, "add", "--", *pages], check=True)
            subprocess.run(["git", "-C", ROOT, "commit", "-q", "-m", f"render: {message}", "--", *pages], check=False)


def run_local(grid, cells, args):
    failures = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_cell, grid.path, grid.work, grid.store.root, c.label, args.threads,
                               args.device_flags, args.commit): c for c in cells}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except Exception as error:  # one failed cell does not stop the others
                failures.append(str(error))
                print(f"grid: {error}", file=sys.stderr, flush=True)
    return failures


def run_slurm(grid, cells, args):
    import submitit

    folder = os.path.join(grid.work, "submitit")
    executor = submitit.AutoExecutor(folder=folder, cluster=args.cluster)
    params = {"timeout_min": args.timeout_min, "cpus_per_task": args.threads or 1, "name": f"grid-{grid.name}"}
    if args.cluster != "local":
        params.update(slurm_partition=args.partition, gpus_per_node=args.gpus, slurm_array_parallelism=args.jobs)
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    jobs = []
    with executor.batch():  # one array job
        for cell in cells:
            command = [sys.executable, os.path.abspath(__file__), "cell", grid.path, cell.label, "--work", grid.work,
                       "--store", grid.store.root]
            command += ["--threads", str(args.threads)] if args.threads else []
            command += [f"--device-flags={args.device_flags}"] if args.device_flags is not None else []
            jobs.append(executor.submit(submitit.helpers.CommandFunction(command, cwd=ROOT, verbose=False)))
    print(f"grid: {len(cells)} jobs submitted ({jobs[0].job_id.split('_')[0] if jobs else '-'}); logs in {folder}",
          flush=True)
    failures = []
    for cell, job in zip(cells, jobs):
        try:
            job.result()
        except Exception as error:
            failures.append(f"{cell.label}: {error}")
    if args.commit:
        commit_landed(grid, f"store: {grid.name} ({len(cells) - len(failures)} cells from Slurm)")
    return failures


def device_setup(grid):
    """On a bare lent machine (one whose Python does not import fairseq): scripts/maint/device_setup.sh's packages
    from the carried wheels on PYTHONPATH, and fairseq's commands as 'python -m' shims on PATH."""
    if subprocess.run([sys.executable, "-c", "import fairseq"], capture_output=True).returncode == 0:
        return
    print("grid: fairseq does not import: setting up from the carried wheels (scripts/maint/device_setup.sh)", flush=True)
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "maint", "device_setup.sh")], cwd=ROOT,
                   check=True, env=dict(os.environ, PYTHON=sys.executable, WORK="work/device"))
    site = [ROOT, os.path.join(ROOT, "work", "device", "site"), os.environ.get("PYTHONPATH")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, site))
    shims = os.path.join(grid.scratch, "bin")
    os.makedirs(shims, exist_ok=True)
    for command in ("train", "generate", "preprocess"):
        path = os.path.join(shims, f"fairseq-{command}")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec "{sys.executable}" -m fairseq_cli.{command} "$@"\n')
        os.chmod(path, 0o755)
    os.environ["PATH"] = shims + os.pathsep + os.environ["PATH"]


def run_device(grid, cells, args):
    """Cells until the budget, the state packed periodically and at the end (the accelerator's executor)."""
    if not args.pack:
        raise SystemExit("--executor device: --pack PATH (e.g. $OUT/grid.tar.gz) is where the state goes")
    device_setup(grid)
    deadline = time.time() + args.budget
    stop, packing = threading.Event(), threading.Lock()

    def pack():
        """The started cells' work folders and the store into one archive, written atomically (one packer at a time)."""
        with packing:
            with tarfile.open(args.pack + ".tmp", "w:gz") as tar:
                for cell in cells:
                    if os.path.isdir(cell.work):
                        tar.add(cell.work, arcname=os.path.join("work", os.path.basename(cell.work)),
                                filter=lambda info: None if info.name.endswith(".running") else info)
                if os.path.isdir(grid.store.root):
                    tar.add(grid.store.root, arcname="store")
            os.replace(args.pack + ".tmp", args.pack)

    def packer():
        while not stop.wait(args.pack_every):
            pack()

    def one(cell):
        if grid.store.get(cell.key) is not None or time.time() > deadline - args.margin:
            return
        os.makedirs(cell.work, exist_ok=True)
        with open(os.path.join(cell.work, "grid.log"), "a") as out:
            proc = subprocess.Popen(cell.command(cell.work), env=cell.environment(args.threads, args.device_flags),
                                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=max(1, deadline - args.margin - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
                print(f"grid: {cell.label} stopped at the budget; it resumes from its checkpoint", flush=True)
                return
        if proc.returncode == 0:
            grid.file(cell)
            print(f"grid: {cell.label} done", flush=True)
        else:
            print(f"grid: {cell.label} failed (exit {proc.returncode}); see {cell.work}/grid.log", flush=True)

    threading.Thread(target=packer, daemon=True).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(one, cells))
    finally:
        stop.set()
        pack()
    left = [c.label for c in cells if grid.store.get(c.key) is None]
    print(f"grid: packed {args.pack}; " + (f"left: {', '.join(left)} (run again to resume)" if left else "every cell done"))
    return []


def unpack(grid, archive):
    """A device call's pack into work/grid and the store: started cells resume from their checkpoints here or in the
    next call; finished ones are filed (records already in this store are kept, never duplicated)."""
    with tempfile.TemporaryDirectory(dir=grid.work if os.path.isdir(grid.work) else None) as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        os.makedirs(grid.work, exist_ok=True)
        for name in sorted(os.listdir(os.path.join(tmp, "work"))) if os.path.isdir(os.path.join(tmp, "work")) else []:
            dest = os.path.join(grid.work, name)
            subprocess.run(["cp", "-a", os.path.join(tmp, "work", name) + "/.", dest + "/"] if os.path.isdir(dest)
                           else ["cp", "-a", os.path.join(tmp, "work", name), dest], check=True)
        carried = store_lib.Store(os.path.join(tmp, "store"))
        added = grid.store.merge(carried) if os.path.isdir(carried.root) else 0
    print(f"grid: unpacked {archive}: {added} new records")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("plan", "run", "unpack", "cell"))
    p.add_argument("grid", help="a grid file (grids/*.toml)")
    p.add_argument("archive", nargs="?", help="unpack: the pack a device call left; cell: the cell's label (a Slurm "
                                              "job's body)")
    p.add_argument("--only", help="cells by name, comma-separated")
    p.add_argument("--seeds", help="seeds, comma-separated (default: the grid's)")
    p.add_argument("--work", default=None, help="work folders' root (default work/grid)")
    p.add_argument("--store", default=None, help="the store (default results/store)")
    p.add_argument("--executor", choices=("local", "slurm", "device"), default="local")
    p.add_argument("--jobs", type=int, default=1, help="cells at a time (default 1)")
    p.add_argument("--threads", type=int, default=None, help="threads per cell (OMP_NUM_THREADS)")
    p.add_argument("--device-flags", default=None, help="the recipes' DEVICE_FLAGS (default theirs: --cpu)")
    p.add_argument("--commit", action="store_true", help="git-commit the store as each cell lands")
    p.add_argument("--cluster", default=None, help="slurm: submitit's cluster (default: auto; 'local' for tests)")
    p.add_argument("--partition", default=None, help="slurm: the partition")
    p.add_argument("--gpus", type=int, default=None, help="slurm: GPUs per job")
    p.add_argument("--timeout-min", type=int, default=24 * 60, help="slurm: a job's time limit (default 1 day)")
    p.add_argument("--budget", type=float, default=540, help="device: seconds this call may run cells (default 540)")
    p.add_argument("--margin", type=float, default=30, help="device: seconds kept to stop cells and pack")
    p.add_argument("--pack", default=None, help="device: the archive the state goes to")
    p.add_argument("--pack-every", type=float, default=60, help="device: seconds between packs (default 60)")
    args = p.parse_args(argv)
    grid = Grid(args.grid, args.work, args.store)
    if args.action == "unpack":
        if not args.archive:
            p.error("unpack ARCHIVE")
        return unpack(grid, args.archive)
    if args.action == "cell":
        return run_cell(args.grid, grid.work, grid.store.root, args.archive, args.threads, args.device_flags)
    cells = grid.select(args.only, args.seeds)
    if args.action == "plan":  # plans only: making the inputs (data, teachers, caches) is the run's first step
        return plan(grid, cells)
    grid.prepare_data()
    states = {c.label: grid.state(c) for c in cells}
    todo = [c for c in cells if states[c.label] not in ("done", "running")]
    elsewhere = [label for label, state in states.items() if state == "running"]
    print(f"grid: {len(todo)} of {len(cells)} cells to run ({args.executor})"
          + (f"; running in another process: {', '.join(elsewhere)}" if elsewhere else ""), flush=True)
    failures = {"local": run_local, "slurm": run_slurm, "device": run_device}[args.executor](grid, todo, args)
    if failures:
        raise SystemExit(f"grid: {len(failures)} cells failed")


if __name__ == "__main__":
    main()
