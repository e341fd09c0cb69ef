"""The experiment layer (scripts/experiments/): one PET cell run by the local executor files a complete record; the
same cell killed with kill -9, stopped at the lent accelerator's budget and packed (faked here on the CPU), and
resumed elsewhere by submitit's executor (its local executor) files the same record and outputs; plan shows states
and measured estimates; a stale record is shown as stale. The cell's work folder is also pet.sh's: rerun, it skips
every stage; with another setting, it is refused."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO

GRID = os.path.join(REPO, "scripts", "experiments", "grid.py")
sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
import store as store_lib  # noqa: E402

# what must agree between two runs of one cell (times, dates and paths may not)
SAME = ("key", "cell", "seed", "recipe", "metrics", "params", "updates", "epochs", "variables", "training")


def grid_file(tmp, data):
    path = tmp / "smoke.toml"
    path.write_text(f'''name = "smoke"
seeds = [1]
[inputs]
DATA = "{data}"
prepare = "python -m preprocess.prepare_multi30k --src de --tgt en --dest {{DATA}} --bpe-codes {{ROOT}}/checkpoints/multi30k.de-en/code --srcdict {{ROOT}}/checkpoints/multi30k.de-en/dict.de.txt --train-lines 600"
[variables]
SMOKE = 1
MEASURE_TEACHER = 0
RUNS = 1
[[cell]]
name = "pet"
recipe = "pet.sh"
''')
    return str(path)


def grid(*args, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    return subprocess.run([sys.executable, GRID, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=900, **kwargs)


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def only_record(store):
    records = store_lib.Store(store).records()
    assert len(records) == 1, records
    return records[0]


def same(a, b, store_a, store_b):
    for field in SAME:
        assert a[field] == b[field], field
    assert [c["command"] for c in a["commands"]] == [c["command"] for c in b["commands"]]
    assert store_lib.Store(store_a).outputs(a) == store_lib.Store(store_b).outputs(b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The PET cell run once, uninterrupted, by the local executor."""
    tmp = tmp_path_factory.mktemp("grid")
    path = grid_file(tmp, tmp / "data")
    store, work = str(tmp / "store"), str(tmp / "work")
    out = ok(grid("run", path, "--store", store, "--work", work, "--threads", "1"))
    assert "pet-s1 done" in out
    return {"grid": path, "store": store, "work": work, "tmp": tmp, "record": only_record(store)}


def test_a_local_run_files_a_complete_record(reference):
    record = reference["record"]
    assert record["recipe"] == "pet.sh" and record["seed"] == 1 and record["variables"]["SEED"] == "1"
    assert [c["stage"] for c in record["commands"]] == ["warmup", "kd", "measure"]
    assert all(c["wall_s"] > 0 and c["cpu_s"] > 0 for c in record["commands"]), record["commands"]
    assert record["training"]["kd"]["updates"] == 3 and record["training"]["warmup"]["updates"] == 2
    assert [point[:2] for point in record["training"]["kd"]["validation"]] == [[1, 3]]  # its one validation, at the end
    assert record["teacher"]["sha256"] and record["data"]["fingerprint"]
    assert set(record["metrics"]) == {"bleu_tok", "sacrebleu"}
    # the recipe's glibc malloc threshold (scripts/recipes/common.sh, unless the caller set one) reaches the record
    assert record["machine"]["malloc"] == os.environ.get("MALLOC_MMAP_THRESHOLD_", "4294967296")
    assert len(store_lib.Store(reference["store"]).outputs(record)) == 20  # SMOKE scores 20 test sentences
    # a second run finds the cell done and runs nothing
    again = ok(grid("run", reference["grid"], "--store", reference["store"], "--work", reference["work"]))
    assert "0 of 1 cells to run" in again
    plan = ok(grid("plan", reference["grid"], "--store", reference["store"], "--work", reference["work"]))
    line = next(line for line in plan.splitlines() if line.startswith("pet-s1"))
    assert " done " in line and f"{record['wall_s'] / 3600:.2f} h" in line  # the estimate: the measured wall


def test_a_cell_killed_then_stopped_at_a_device_budget_then_resumed_by_submitit_ends_as_an_uninterrupted_run(
        reference, tmp_path):
    """One cell through every interruption the executors meet, then compared with the uninterrupted run:
    1. a grid killed with kill -9 inside the cell (its warm-up done, its KD stage started): plan shows it started;
    2. the accelerator's executor (on the CPU) resumes it with a budget that ends inside it: it stops the cell and packs
       its state (what the stopped call made comes back);
    3. the pack, carried to another work folder and store, is resumed there by the submitit executor (its local
       executor: one `grid.py cell` job per cell, as on Slurm), running no finished stage again,
    to the record and outputs of the uninterrupted run."""
    pytest.importorskip("submitit")
    store, work = str(tmp_path / "store"), str(tmp_path / "work")
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               HEARTBEAT_S="0.5")
    proc = subprocess.Popen([sys.executable, GRID, "run", reference["grid"], "--store", store, "--work", work],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:  # inside the cell: its warm-up finished, its KD stage started and timed once
        if os.path.isdir(work) and any(os.path.exists(os.path.join(work, d, "kd", "TIMES.beat")) for d in os.listdir(work)):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the KD stage never started")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(store, "records.jsonl"))
    plan = ok(grid("plan", reference["grid"], "--store", store, "--work", work))
    assert "started" in plan  # its work folder is there, its marker's process is gone

    # the accelerator's executor, its budget ending inside the cell (a KD stage is more than 3 s of start-up alone)
    pack = str(tmp_path / "pack.tar.gz")
    out = ok(grid("run", reference["grid"], "--executor", "device", "--budget", "3", "--margin", "0",
                  "--pack", pack, "--store", store, "--work", work))
    assert "stopped at the budget" in out and "left: pet-s1" in out

    here_store, here_work = str(tmp_path / "here-store"), str(tmp_path / "here-work")
    ok(grid("unpack", reference["grid"], pack, "--store", here_store, "--work", here_work))
    (cell,) = os.listdir(here_work)
    assert os.path.exists(os.path.join(here_work, cell, "warmup", "DONE"))  # what the stopped call had came back
    out = ok(grid("run", reference["grid"], "--executor", "slurm", "--cluster", "local", "--threads", "1",
                  "--timeout-min", "15", "--store", here_store, "--work", here_work))
    assert "1 jobs submitted" in out
    resumed = only_record(here_store)
    assert next(c for c in resumed["commands"] if c["stage"] == "warmup")["attempts"] == 1  # not run again
    # the attempt killed with kill -9 counts (its last heartbeat), beside the one that finished
    with open(os.path.join(here_work, cell, "kd", "TIMES")) as f:
        attempts = f.read().splitlines()
    assert attempts[0].endswith(" killed") and float(attempts[0].split()[0]) > 0 and len(attempts) >= 2, attempts
    assert next(c for c in resumed["commands"] if c["stage"] == "kd")["attempts"] >= len(attempts)  # + untimed runs
    same(resumed, reference["record"], here_store, reference["store"])


def test_the_cells_work_folder_is_pet_shs_own(reference):
    """scripts/recipes/pet.sh rerun by hand on the cell's work folder with the cell's variables skips every stage and
    prints the run's score line; with another setting on its finished stages it is refused, naming the stage and the
    way out."""
    import grid as grid_lib

    (cell,) = grid_lib.Grid(reference["grid"], reference["work"], reference["store"]).cells
    with open(os.path.join(cell.work, "grid.log")) as f:
        scored = [line for line in f.read().splitlines() if line.startswith("score: pet BLEU (tok) ")]
    assert len(scored) == 1
    again = subprocess.run(cell.command(cell.work), env=cell.environment(threads=1), cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert [line for line in again.stdout.splitlines() if line.startswith("score: ")] == scored
    assert all(f"--- {s}: done, skipped" in again.stdout for s in ("warmup", "kd", "measure"))
    other = subprocess.run(cell.command(cell.work), env=dict(cell.environment(threads=1), LR="2e-3"), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    out = other.stdout + other.stderr
    assert other.returncode == 2 and "stage warmup in" in out and "was finished with another command" in out, out[-2000:]


def test_a_new_key_starts_from_the_earlier_folders_stages_that_run_the_same_commands(reference, tmp_path):
    """A cell whose key changed in its last stage only (here the measurement's flags) starts from a copy of the earlier
    folder's finished training stages and runs the last alone: the same checkpoint's score, the training's time carried
    into the record; a change in the first stage (the learning rate) copies nothing."""
    import shutil

    import grid as grid_lib

    work, store = str(tmp_path / "work"), str(tmp_path / "store")
    shutil.copytree(reference["work"], work)
    text = open(reference["grid"]).read()
    path = tmp_path / "smoke.toml"
    path.write_text(text.replace("RUNS = 1", 'RUNS = 1\nMEASURE_EXTRA = "--max-sentences 20"'))
    out = ok(grid("run", str(path), "--store", store, "--work", work, "--threads", "1"))
    assert "finished stages: warmup, kd\n" in out and "pet-s1 done" in out, out
    record, earlier = only_record(store), reference["record"]
    assert record["key"] != earlier["key"] and record["metrics"] == earlier["metrics"]
    (cell,) = grid_lib.Grid(str(path), work, store).cells
    with open(os.path.join(cell.work, "grid.log")) as f:
        log = f.read()
    assert "--- warmup: done, skipped" in log and "--- kd: done, skipped" in log and "--- measure: done" not in log
    stages = lambda r: {c["stage"]: c for c in r["commands"]}  # noqa: E731
    assert stages(record)["kd"] == stages(earlier)["kd"] and stages(record)["warmup"] == stages(earlier)["warmup"]
    assert stages(record)["measure"]["command"].count("--max-sentences 20") == 2
    path.write_text(text.replace("SMOKE = 1", 'SMOKE = 1\nLR = "2e-3"'))
    (other,) = grid_lib.Grid(str(path), work, store).cells
    grid_lib.reuse_stages(other.grid, other, print)
    assert not os.path.exists(other.work) or not os.listdir(other.work)


def test_a_record_of_other_data_is_stale(reference, tmp_path):
    store = str(tmp_path / "store")
    record = dict(reference["record"])
    record["data"] = dict(record["data"], fingerprint="0" * 64)
    os.makedirs(store)
    with open(os.path.join(store, "records.jsonl"), "w") as f:
        f.write(json.dumps(record) + "\n")
    plan = ok(grid("plan", reference["grid"], "--store", store, "--work", reference["work"]))
    assert next(line for line in plan.splitlines() if line.startswith("pet-s1")).split()[1] == "stale"


def test_a_cell_another_process_runs_is_left_to_it(reference, tmp_path):
    """Two runs of one grid share the cells left between them: a cell whose work folder's marker another process holds
    locked is neither rerun nor resumed beside it (two trainings would write one checkpoint), and the run says where it
    runs; once that process is gone, however it died, the cell is the next run's to resume."""
    import grid as grid_lib

    store, work = str(tmp_path / "store"), str(tmp_path / "work")
    (cell,) = grid_lib.Grid(reference["grid"], work, store).cells
    os.makedirs(cell.work)
    marker = os.path.join(cell.work, ".running")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); sys.stdin.read()", marker],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "1\n"  # the lock is taken
    out = ok(grid("run", reference["grid"], "--store", store, "--work", work))
    assert "0 of 1 cells to run (local); running in another process: pet-s1" in out
    assert grid_lib.run_cell(reference["grid"], work, store, "pet-s1", log=lambda line: None) is None
    assert os.listdir(cell.work) == [".running"] and not os.path.exists(os.path.join(store, "records.jsonl"))
    holder.kill()  # SIGKILL: no clean-up of its own; the kernel frees the lock, the marker stays
    holder.wait()
    assert os.path.exists(marker)
    plan = ok(grid("plan", reference["grid"], "--store", store, "--work", work))
    assert next(line for line in plan.splitlines() if line.startswith("pet-s1")).split()[1] == "started"


def test_a_file_system_without_locks_runs_the_cell_unguarded_and_says_so(reference, tmp_path, monkeypatch):
    """flock refused (e.g. Lustre mounted without it): the cell still runs, the log says it is not guarded, and its
    marker goes when it ends (here a recipe failing at once)."""
    import errno

    import grid as grid_lib

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(grid_lib.fcntl, "flock", no_locks)
    real_run = subprocess.run  # the recipe's dry run (the cell's key) runs; the recipe itself fails at once

    def recipe_fails(command, **kwargs):
        dry = kwargs.get("env", {}).get("DRY_RUN") == "1"
        return real_run(command, **kwargs) if dry else subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr(grid_lib.subprocess, "run", recipe_fails)
    store, work, said = str(tmp_path / "store"), str(tmp_path / "work"), []
    with pytest.raises(RuntimeError, match="exit 3"):
        grid_lib.run_cell(reference["grid"], work, store, "pet-s1", log=said.append)
    assert "No locks available" in said[0] and "not guarded against another run" in said[0]
    (cell,) = grid_lib.Grid(reference["grid"], work, store).cells
    assert os.listdir(cell.work) == ["grid.log"]


def test_a_stages_validation_curve_keeps_one_point_per_validation_across_resumed_runs(tmp_path):
    """record.validation_curve: each per-epoch validation of a fairseq-train log; a resumed run appends to the log and
    validates again where the interrupted one had (the last line counts); other subsets' lines are not the curve."""
    import record

    line = ("2026-11-29 08:11:01 | INFO | valid | epoch {:03d} | valid on '{}' subset | loss {} | nll_loss 2.522 | "
            "ppl 5.74 | wps 3632.3 | wpb 1280.2 | bsz 84.5 | num_updates {} | best_loss 4.019\n")
    log = tmp_path / "kd.log"
    log.write_text(line.format(1, "valid", 5.9, 246) + line.format(2, "valid", 5.4, 492) + "killed\n"
                   + line.format(2, "valid", 5.3, 492) + line.format(2, "test", 1.0, 492)
                   + line.format(3, "valid", "4.01", 738))
    assert record.validation_curve(str(log)) == [[1, 246, 5.9, 2.522], [2, 492, 5.3, 2.522], [3, 738, 4.01, 2.522]]
    log.write_text(line.format(1, "valid", 5.9, 246).replace("| nll_loss 2.522 ", ""))  # a criterion without NLL
    assert record.validation_curve(str(log)) == [[1, 246, 5.9, None]]
    assert record.validation_curve(str(tmp_path / "none.log")) == []


def test_a_stages_time_counts_the_runs_killed_before_they_could_record_it(tmp_path):
    """record.stage_times: common.sh's line per attempt, and before them the fairseq-train runs the stage's log shows
    that no line holds (killed where nothing could time them): each run's span of log timestamps, its CPU time at the
    recorded attempts' CPU/wall ratio; a heartbeat's 'killed' line is an attempt like any other."""
    import record

    stage = tmp_path / "kd"
    stage.mkdir()
    (stage / "TIMES").write_text("30.0 12.0 killed\n100.0 50.0\n")

    def run(start, end):
        return (f"2026-11-29 0{start[0]}:{start[1]:02d}:00 | INFO | fairseq.tasks | start-up, before the configuration\n"
                f"2026-11-29 0{start[0]}:{start[1]:02d}:00 | INFO | fairseq_cli.train | {{'_name': None}}\n"
                "warning without a timestamp\n"
                f"2026-11-29 0{end[0]}:{end[1]:02d}:00 | INFO | train_inner | epoch 001: 50 / 246 loss=5.1\n")

    (tmp_path / "kd.log").write_text(run((1, 0), (1, 10)) + run((2, 0), (2, 20)) + run((3, 0), (3, 1))
                                     + run((4, 0), (4, 2)))
    # 4 runs in the log, 2 timed by common.sh (the heartbeat of the third, the finished fourth): the first two from
    # the log, at 62 / 130 CPU seconds per wall second
    ratio = 62.0 / 130.0
    assert record.stage_times(str(stage)) == [(600.0, 600.0 * ratio, "log"), (1200.0, 1200.0 * ratio, "log"),
                                              (30.0, 12.0), (100.0, 50.0)]
    (tmp_path / "kd.log").unlink()
    assert record.stage_times(str(stage)) == [(30.0, 12.0), (100.0, 50.0)]


def test_bad_grids_are_refused_naming_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[cell]]\nname = "x"\nrecipe = "nope.sh"\n')
    proc = grid("plan", str(path))
    assert proc.returncode != 0 and "no recipe scripts/recipes/nope.sh" in proc.stderr
    path.write_text('[[cell]]\nname = "x"\n')
    proc = grid("plan", str(path))
    assert proc.returncode != 0 and "has no 'recipe'" in proc.stderr


def test_a_record_at_a_fixed_budget_does_not_estimate_a_cell_stopped_by_patience(tmp_path):
    """plan's estimate for a patience-stopped cell is its bound at the epoch cap even where the store holds a record of
    the same recipe and variables trained for a fixed number of updates (a 200-update timing run, say), whose wall
    says nothing of it; a cell with that fixed budget takes the record's wall."""
    import grid as grid_lib

    path = tmp_path / "budget.toml"
    path.write_text('name = "budget"\nseeds = [1]\n[inputs]\nDATA = "work/data/multi30k.de-en"\n'
                    '[[cell]]\nname = "patience"\nrecipe = "competitors.sh"\nvariables = { KIND = "word" }\n'
                    '[[cell]]\nname = "fixed"\nrecipe = "competitors.sh"\nvariables = { KIND = "word", UPDATES = "200" }\n'
                    '[[cell]]\nname = "big"\nrecipe = "competitors.sh"\nvariables = { STUDENT_FLAGS = "--arch x" }\n')
    store = tmp_path / "store"
    store.mkdir()
    timing = {"recipe": "competitors.sh", "grid": "timing", "cell": "online", "wall_s": 216.0, "updates": 200,
              "machine": {"device": "cpu"}, "variables": {"KIND": "word", "UPDATES": "200", "SEED": "1"},
              "data": {"path": "/elsewhere/multi30k.de-en"}, "training": {"train": {"updates": 200}},
              "commands": [{"stage": "train", "wall_s": 160.0}, {"stage": "measure", "wall_s": 56.0}]}
    (store / "records.jsonl").write_text(json.dumps(timing) + "\n")
    grid = grid_lib.Grid(str(path), str(tmp_path / "work"), str(store))
    patience, fixed, big = grid.cells
    # 60 epochs of Multi30k (grids/rates.toml: 246 updates each) at the record's training rate (200 updates in 160 s),
    # not the 216 s of its 200 updates
    assert grid_lib.estimate(grid, patience, "cpu") == (60 * 246 / (200 / 160), True)
    assert grid_lib.estimate(grid, fixed, "cpu") == (216.0, False)
    # another architecture (STUDENT_FLAGS): neither the record's rate nor grids/rates.toml's PET-size ones: unmeasured
    assert grid_lib.estimate(grid, big, "cpu") == (None, False)


def test_a_cell_without_a_gpu_rate_gets_its_cpu_estimate_scaled_by_the_measured_gpu_to_cpu_ratio(tmp_path, capsys):
    """plan: a recipe with a CPU rate (here from the store) and no GPU rate shows a GPU estimate marked ~: its CPU
    estimate divided by the smallest GPU/CPU ratio grids/rates.toml measured on one recipe (PET's: 11 / 0.93), said so."""
    import grid as grid_lib

    path = tmp_path / "scaled.toml"
    path.write_text('name = "scaled"\nseeds = [1]\n[inputs]\nDATA = "work/data/multi30k.de-en"\n'
                    '[[cell]]\nname = "apc"\nrecipe = "apc.sh"\nvariables = { COMPRESS_UPDATES = "100", '
                    'FINETUNE_EPOCHS = "1" }\n')
    store = tmp_path / "store"
    store.mkdir()
    timing = {"key": "x" * 64, "recipe": "apc.sh", "grid": "other", "cell": "x", "wall_s": 10000.0, "updates": 200,
              "machine": {"device": "cpu"}, "variables": {"COMPRESS_UPDATES": "200"},
              "data": {"path": "/elsewhere/multi30k.de-en"}, "training": {"train": {"updates": 200}},
              "commands": [{"stage": "train", "wall_s": 10000.0}]}
    (store / "records.jsonl").write_text(json.dumps(timing) + "\n")
    grid = grid_lib.Grid(str(path), str(tmp_path / "work"), str(store))
    assert grid_lib.gpu_over_cpu() == (11 / 0.93, {"recipe": "pet.sh"})
    grid_lib.plan(grid, grid.cells)
    out = capsys.readouterr().out
    cpu = (100 + 246) / (200 / 10000)  # 100 compression updates + one epoch of 246, at 200 updates in 10,000 s
    line = next(line for line in out.splitlines() if line.startswith("apc-s1"))
    assert line.split()[3:7] == ["%.2f" % (cpu / 3600), "h", "~%.2f" % (cpu / (11 / 0.93) / 3600), "h"], line
    assert "(~ : no GPU rate measured for the cell's recipe: its CPU estimate / 11.8" in out
    assert "(1 cells scaled)" in out


def test_a_cells_budget_is_its_stages_epochs_or_updates():
    """Each stage's epochs (of the data's measured epoch, or its training examples at the cell's batch) or updates;
    pet.sh adds its 3 warm-up epochs; a budget left to the recipe's defaults is unknown, not guessed."""
    import grid as grid_lib

    class Cell:
        def __init__(self, recipe, **variables):
            self.recipe, self.variables = recipe, {k: str(v) for k, v in variables.items()}

    glue = {"train_examples": 3302}  # ceil(3302 / 32) = 104 updates an epoch at batch 32
    assert grid_lib.budget(Cell("ghostbert.sh", DISTILL_EPOCHS=3, FINETUNE_EPOCHS=3), glue) == (624, False)
    assert grid_lib.budget(Cell("apc.sh", COMPRESS_UPDATES=100, FINETUNE_EPOCHS=2, BATCH=16), glue) == (100 + 414, False)
    assert grid_lib.budget(Cell("pet.sh", KD_UPDATES=500), {"updates_per_epoch": 10}) == (530, False)
    assert grid_lib.budget(Cell("pet.sh", MAX_EPOCHS=20), {"updates_per_epoch": 10}) == (230, True)
    assert grid_lib.budget(Cell("apc.sh", FINETUNE_EPOCHS=2), {}) == (None, False)
    assert grid_lib.budget(Cell("variator.sh", K=4), glue) == (None, False)


def test_a_runs_score_line_in_each_form(tmp_path):
    """record.score_line, the one format of the line every recipe prints last (record.py --score) and the method pages
    show: the student against the teacher's row at its share of the teacher's non-embedding parameters (translation:
    BLEU (tok); GLUE: the task's primary metric on dev), with its own count where no teacher was measured, and
    Variator's plugged backbone against the backbone alone with the plugin's cost."""
    import record

    def result(recipe, name, metrics, non_embedding, teacher=None, **fields):
        also = {"teacher": {"metrics": teacher[0], "params": {"non_embedding": teacher[1]}}} if teacher else {}
        return dict({"recipe": recipe, "name": name, "metrics": metrics, "params": {"non_embedding": non_embedding},
                     "sentences": 1000, "also": also, "variables": {}}, **fields)

    apc = result("apc.sh", "apc", {"bleu_tok": 35.371, "sacrebleu": 34.0}, 2771712, ({"bleu_tok": 36.29}, 5529600),
                 primary_metric="bleu_tok")
    line = ("score: apc BLEU (tok) 35.37 (teacher 36.29) at 50.12% of the teacher's non-embedding parameters, 1000 "
            "sentences -- work/grid/apc-s1/measure.md")
    assert record.score_line(apc, "work/grid/apc-s1") == line
    assert record.score_line(dict(apc, primary_metric=None), "work/grid/apc-s1") == line  # a record filed before
    mrpc = result("ghostbert.sh", "ghostbert-ghost", {"accuracy": 80.0, "f1": 86.456}, 787,
                  ({"accuracy": 84.0, "f1": 88.9}, 1000), primary_metric="f1", variables={"GLUE_TASK": "MRPC"})
    assert record.score_line(mrpc, "w") == ("score: ghostbert-ghost MRPC dev f1 86.46 (teacher 88.90) at 78.70% of the "
                                            "teacher's non-embedding parameters, 1000 sentences -- w/measure.md")
    with pytest.raises(ValueError, match="MRPC result that names no primary metric"):
        record.score_line(dict(mrpc, primary_metric=None), "w")
    word = result("competitors.sh", "word", {"bleu_tok": 0.2}, 501696, primary_metric="bleu_tok")
    assert record.score_line(word, ".") == ("score: word BLEU (tok) 0.20, 501,696 non-embedding parameters, 1000 "
                                            "sentences -- measure.md")
    cost = {"encoder_flops_saved_percent": 44.93, "extra_params_percent": 0.664}
    variator = result("variator.sh", "variator-k4", {"bleu_tok": 35.35}, 10, ({"bleu_tok": 36.29}, 10), cost=cost,
                      variables={"K": "4", "GLUE_TASK": ""}, primary_metric="bleu_tok")
    assert record.score_line(variator, "work/variator") == (
        "score: variator k=4 BLEU4 35.35 (backbone alone 36.29), 44.9% of the encoder's FLOPs saved with 0.66% extra "
        "parameters -- work/variator")
    rte = dict(variator, metrics={"accuracy": 60.289}, also={"teacher": {"metrics": {"accuracy": 61.01}}},
               variables={"K": "2", "GLUE_TASK": "RTE"}, primary_metric="accuracy")
    assert record.score_line(rte, "w").startswith("score: variator k=2 RTE dev accuracy 60.29 (backbone alone 61.01), ")
    # the command line: WORK named from the current folder, as the recipes print it
    work = tmp_path / "run"
    work.mkdir()
    (work / "result.json").write_text(json.dumps(word))
    out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "experiments", "record.py"), "--score",
                          "run/result.json"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert out == record.score_line(word, "run") + "\n" and out.endswith(" -- run/measure.md\n")


def test_scripts_hold_at_most_6000_lines_and_only_the_recipes_train():
    """One implementation of each job: scripts/ (Python and shell) stays within 6,000 lines, and no file under it but
    the recipes runs fairseq-train (the pattern is checked to find the recipes' own training stages)."""
    import glob
    import re

    files = [p for p in glob.glob(os.path.join(REPO, "scripts", "**", "*"), recursive=True) if p.endswith((".py", ".sh"))]
    lines = sum(sum(1 for _ in open(p, encoding="utf-8")) for p in files)
    assert lines <= 6000, f"scripts/ holds {lines} lines"
    trains = {".py": re.compile(r"""["'](fairseq-train|fairseq_cli\.train)["']"""),  # a command's word; not prose
              ".sh": re.compile(r"^\s*(stage\s+\S+\s+)?fairseq-train\s|-m\s+fairseq_cli\.train\b", re.M)}
    recipes = os.path.join(REPO, "scripts", "recipes") + os.sep
    found = {os.path.relpath(p, REPO) for p in files
             if trains[os.path.splitext(p)[1]].search(open(p, encoding="utf-8").read())}
    assert {"scripts/recipes/competitors.sh", "scripts/recipes/pet.sh"} <= found
    assert not {p for p in found if not os.path.join(REPO, p).startswith(recipes)}, found


def test_plan_reads_no_key_before_the_grids_data_exists(tmp_path, capsys):
    """A key reads the data (a recipe passes the raw references only where the preparer kept them): before the grid's
    preparation makes DATA, plan shows no key and calls a cell the store holds 'filed' (a record of its teacher: not
    counted in the time left) or 'to do' (another teacher's), never 'stale'."""
    import grid as grid_lib

    path = tmp_path / "fresh.toml"
    path.write_text(f'name = "fresh"\nseeds = [1]\n[inputs]\nDATA = "{tmp_path}/not-made"\n'
                    '[[cell]]\nname = "word"\nrecipe = "competitors.sh"\nvariables = { KIND = "word" }\n')
    store = tmp_path / "store"
    store.mkdir()
    record = {"key": "x" * 64, "grid": "fresh", "cell": "word", "seed": 1, "recipe": "other.sh",
              "machine": {"device": "gpu"}, "wall_s": 36000.0, "updates": 100, "teacher": {"sha256": "another"}}
    (store / "records.jsonl").write_text(json.dumps(record) + "\n")
    grid = grid_lib.Grid(str(path), str(tmp_path / "work"), str(store))
    grid_lib.plan(grid, grid.cells)
    out = capsys.readouterr().out.splitlines()
    line = next(line for line in out if line.startswith("word-s1"))
    assert line.split()[1:3] == ["to", "do"] and "-" * 10 in line, line
    assert out[-1].startswith("states: 1 to do; left to run: ") and not any(line.startswith("(filed") for line in out)
    assert "GPU 10.0 h" in out[-1], out[-1]  # the cell's own record's wall time: counted while it is to do
    (store / "records.jsonl").write_text(json.dumps(dict(record, teacher={"sha256": grid.teacher_sha})) + "\n")
    grid_lib.plan(grid_lib.Grid(str(path), str(tmp_path / "work"), str(store)), grid.cells)
    out = capsys.readouterr().out.splitlines()
    assert next(line for line in out if line.startswith("word-s1")).split()[1] == "filed"
    assert out[-1] == "states: 1 filed; left to run: CPU 0.0 h, GPU 0.0 h", out[-1]  # none left, none unmeasured
    assert any(line.startswith("(filed: the store holds a record of the cell and seed with this") for line in out)


def test_a_trained_teacher_is_known_by_its_weights_and_a_shipped_one_by_its_file(tmp_path):
    """Two trainings to the same weights write different bytes (fairseq's checkpoint keeps its run's timers): a
    checkpoint with optimizer state is identified by its weights, so a GLUE teacher made again on a new machine keeps
    the store's records current; another weight is another teacher; a shipped file (no optimizer state) by its bytes."""
    import torch

    from record import sha256_of

    def teacher_sha256(path):
        return sha256_of(path, teacher=True)

    def save(name, weight, timer, optimizer=True):
        path = str(tmp_path / name)
        torch.save({"model": {"w": torch.tensor([[1.0, weight]]), "b": torch.zeros(2, dtype=torch.float16)},
                    "last_optimizer_state": {"state": {0: torch.ones(2)}} if optimizer else None,
                    "extra_state": {"metrics": {"wall": timer}}}, path)
        return path

    first, again, other = save("a.pt", 2.0, 10.5), save("b.pt", 2.0, 99.0), save("c.pt", 2.5, 10.5)
    assert sha256_of(first) != sha256_of(again) and teacher_sha256(first) == teacher_sha256(again)
    assert teacher_sha256(other) != teacher_sha256(first)
    shipped = save("d.pt", 2.0, 10.5, optimizer=False)
    assert teacher_sha256(shipped) == sha256_of(shipped) != teacher_sha256(first)
