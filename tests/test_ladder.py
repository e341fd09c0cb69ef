"""The which-method ladder (scripts/experiments/ladder.py, rendered by render.py's ladder_table): the teacher and a
grid cell's records deployed in fairseq and CTranslate2 (float32, int8), measured in one run, every seed scored in
every engine, the run filed in the store and rendered with the records' cost and the recommendation."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO
from test_checkpoint_flags import PET, TEACHER, shipped_data  # noqa: F401  (shipped_data: a session fixture)

sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
import render  # noqa: E402
import store as store_lib  # noqa: E402
from record import data_fingerprint, sha256_of  # noqa: E402

LADDER = os.path.join(REPO, "scripts", "experiments", "ladder.py")


def ladder_files(tmp_path, data):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'name = "g"\nseeds = [1, 2]\n[inputs]\nDATA = "{data}"\n[[cell]]\nname = "pet"\nrecipe = "pet.sh"\n'
                    '[[cell]]\nname = "word-kd"\nrecipe = "competitors.sh"\nvariables = { KIND = "word" }\n')
    ladder = tmp_path / "ladder.toml"
    ladder.write_text(f'name = "lad"\ngrids = ["{grid}"]\nengines = ["fairseq", "ct2-float32", "ct2-int8"]\nbatch = 8\n'
                      'latency_sentences = 3\nruns = 1\nthreads = 1\nlosses = [0.5, 1.0]\n')
    return str(ladder)


def file_records(store, data, scores):
    """The grid's 'pet' cell at two seeds, both trained into the shipped PET student (a real checkpoint: what the
    ladder deploys), with their own scores and costs."""
    for seed, score in scores.items():
        result = {"recipe": "pet.sh", "name": "pet", "variables": {"SEED": str(seed)},
                  "commands": [{"stage": "warmup", "cpu_s": 1800.0 * seed}, {"stage": "kd", "cpu_s": 3600.0},
                               {"stage": "measure", "cpu_s": 99999.0}],
                  "teacher": {"path": TEACHER, "sha256": sha256_of(TEACHER)},
                  "data": {"path": data, "fingerprint": data_fingerprint(data)}, "checkpoint": PET,
                  "metrics": {"sacrebleu": score, "bleu_tok": score}, "machine": {"cpu": "test"}, "outputs": None}
        store.add(f"key-{seed}", "g", "pet", seed, result, str(store.root))


def test_a_ladder_deploys_measures_files_and_renders_its_run(shipped_data, tmp_path):  # noqa: F811
    ladder = ladder_files(tmp_path, shipped_data)
    store = store_lib.Store(str(tmp_path / "store"))
    file_records(store, shipped_data, {1: 30.0, 2: 31.0})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    plan = subprocess.run([sys.executable, LADDER, "plan", ladder, "--store", store.root], capture_output=True,
                          text=True, env=env, cwd=REPO)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "seeds 1, 2" in plan.stdout and "word-kd" in plan.stdout and "no records in the store yet" in plan.stdout
    proc = subprocess.run([sys.executable, LADDER, "measure", ladder, "--store", store.root, "--work",
                           str(tmp_path / "work"), "--max-sentences", "16", "--extra", f"mine={PET}"],
                          capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = [json.loads(line) for line in open(tmp_path / "store" / "ladders" / "lad.jsonl")]
    rows = {(r["model"], r["engine"]): r for r in entry["rows"]}
    assert set(rows) == {(m, e) for m in ("teacher", "pet", "mine") for e in ("fairseq", "ct2-float32", "ct2-int8")}
    assert not entry["refused"]
    # the conversion round trip: CTranslate2 float32 gives fairseq's hypotheses string for string; int8 is compared too
    assert rows["pet", "ct2-float32"]["identical_to_fairseq"] == rows["teacher", "ct2-float32"]["identical_to_fairseq"] == 16
    assert 0 <= rows["pet", "ct2-int8"]["identical_to_fairseq"] <= 16 and "identical_to_fairseq" not in rows["pet", "fairseq"]
    assert rows["mine", "ct2-int8"]["deployed_quality"] == rows["pet", "ct2-int8"]["deployed_quality"]  # --extra: PET
    assert {m["name"]: m["export"].get("non_embedding_export") for m in entry["models"]}["pet"] == 1_003_392
    # fairseq: the records' scores; CTranslate2: each seed's checkpoint decoded (the same file: the same score)
    assert rows["pet", "fairseq"]["quality_seeds"] == {"1": 30.0, "2": 31.0}
    int8 = rows["pet", "ct2-int8"]
    assert set(int8["quality_seeds"]) == {"1", "2"} and len(set(int8["quality_seeds"].values())) == 1
    assert int8["quality_seeds"]["1"] == int8["deployed_quality"]
    assert int8["sentences"] == 16 and len(int8["latency_ms_runs"]) == 1
    assert int8["non_embedding_params"] == rows["pet", "fairseq"]["non_embedding_params"] == 483_072
    assert int8["size_mb"] < rows["pet", "ct2-float32"]["size_mb"]  # int8 weights: a quarter of float32's
    # in fairseq, where the time goes: the encoder's and the decoder's forwards and the search around them
    for batch in ("batch", "one"):
        parts = rows["teacher", "fairseq"]["time_parts"][batch]
        assert parts["encoder"] > 0 and parts["decoder"] > 0 and parts["search"] >= 0  # shares, not an ordering
        assert sum(parts.values()) == pytest.approx(1.0)
    assert rows["pet", "ct2-int8"]["time_parts"] == {"batch": None, "one": None}
    described = {m["name"]: m for m in entry["models"]}
    assert described["pet"]["deployed_seed"] == 1 and described["pet"]["records"] == {"1": "key-1", "2": "key-2"}

    text = render.ladder_table(store, ladder)
    teacher = rows["teacher", "fairseq"]
    speedup = int8["sentences_per_s"] / teacher["sentences_per_s"]
    lost = teacher["deployed_quality"] - int8["deployed_quality"]
    line = next(line for line in text.splitlines() if line.startswith("| pet | ct2-int8 |"))
    # the seeds' mean, the ratio within the run, the training cost: the mean over seeds of warm-up + KD (not scoring)
    assert f"| {lost:+.2f} |" in line and f"| {speedup:.2f}x |" in line and line.endswith("| 1.75 |")
    assert "| pet | fairseq | 30.50 +- 0.71 (2 seeds) |" in text
    assert "Cells without records yet (not on the ladder): word-kd." in text
    assert "A pipeline check on 16 sentences: not a ladder." in text
    assert "Goal (5x the fairseq teacher's sentences/s at <= 0.5 sacreBLEU lost)" in text


def entry(rows, models=None):
    return {"settings": {"metric": "sacrebleu", "batch": 64, "runs": 3, "threads": 1, "beam": 5},
            "rows": [dict(r, latency_ms=r.get("latency_ms", 10.0), size_mb=r.get("size_mb", 1.0),
                          non_embedding_params=None) for r in rows],
            "models": models or [{"name": r["model"], "records": {}} for r in rows], "refused": [],
            "date": "d", "machine": "m", "command": "c", "load_average_before": [0.0], "load_average_after": [0.0]}


def rendered(tmp_path, e, records=()):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    ladder = ladder_files(tmp_path, str(data))
    store = store_lib.Store(str(tmp_path / "store"))
    for record in records:
        store._append(record)
    os.makedirs(os.path.join(store.root, "ladders"), exist_ok=True)
    with open(os.path.join(store.root, "ladders", "lad.jsonl"), "w") as f:
        f.write(json.dumps(e) + "\n")
    return render.ladder_table(store, ladder)


def test_the_recommendation_names_the_fastest_and_smallest_within_each_bound_and_the_goal(tmp_path):
    teacher = {"model": "teacher", "engine": "fairseq", "deployed_quality": 40.0, "quality_seeds": {"0": 40.0},
               "sentences_per_s": 10.0, "size_mb": 28.0}
    rows = [teacher,
            {"model": "teacher", "engine": "ct2-int8", "deployed_quality": 40.1, "quality_seeds": {"0": 40.1},
             "sentences_per_s": 30.0, "size_mb": 8.0},
            {"model": "a", "engine": "ct2-int8", "deployed_quality": 39.3, "quality_seeds": {"1": 39.2, "2": 39.4},
             "sentences_per_s": 60.0, "size_mb": 2.0},
            {"model": "b", "engine": "fairseq", "deployed_quality": 39.8, "quality_seeds": {"1": 39.8},
             "sentences_per_s": 45.0, "size_mb": 5.0}]
    text = rendered(tmp_path, entry(rows))
    # at <= 0.5 lost: b (0.2 lost) is the fastest student, teacher int8 (-0.1) is slower; a (0.7 lost) is out
    assert ("- At <= 0.5 sacreBLEU lost: fastest b in fairseq (4.50x the fairseq teacher's sentences/s, +0.20 lost); "
            "smallest b in fairseq (5.0 MB, +0.20 lost).") in text
    assert "- At <= 1 sacreBLEU lost: fastest a in ct2-int8 (6.00x" in text and "smallest a in ct2-int8 (2.0 MB" in text
    assert "not met; nearest b in fairseq, 4.50x at +0.20 lost." in text
    assert "- Where the time goes, b in fairseq: not measured." in text  # (these rows carry no time_parts)
    rows[3]["time_parts"] = {"batch": {"encoder": 0.1, "decoder": 0.6, "search": 0.3},
                             "one": {"encoder": 0.05, "decoder": 0.75, "search": 0.2}}
    assert ("- Where the time goes, b in fairseq: at batch 64: encoder 10%, decoder 60%, search 30%; at batch 1: "
            "encoder 5%, decoder 75%, search 20%.") in rendered(tmp_path, entry(rows))
    rows[3]["sentences_per_s"] = 55.0
    assert "met by b in fairseq, 5.50x at +0.20 lost." in rendered(tmp_path, entry(rows))


def test_a_run_measured_before_newer_records_says_measure_again(tmp_path):
    rows = [{"model": "teacher", "engine": "fairseq", "deployed_quality": 40.0, "quality_seeds": {"0": 40.0},
             "sentences_per_s": 10.0},
            {"model": "pet", "engine": "fairseq", "deployed_quality": 39.0, "quality_seeds": {"1": 39.0},
             "sentences_per_s": 20.0}]
    models = [{"name": "teacher", "records": {}}, {"name": "pet", "records": {"1": "k1"}}]
    record = {"key": "k1", "grid": "g", "cell": "pet", "seed": 1, "commands": [], "machine": {}}
    text = rendered(tmp_path, entry(rows, models), [record])
    assert "Measured before" not in text
    text = rendered(tmp_path, entry(rows, models), [record, dict(record, key="k2", seed=2)])
    assert "- Measured before the store's latest records of pet: measure again." in text


def test_the_plot_draws_the_latest_run_beside_its_store(tmp_path):
    """ladder.py plot: the latest run's points, each cost a panel (the CPU hours from the records' training, not their
    scoring), drawn beside the store it was read from (results/ only for the project's store), the command inside."""
    pytest.importorskip("matplotlib")
    from ladder import Ladder, plot

    rows = [{"model": "teacher", "engine": "fairseq", "deployed_quality": 40.0, "quality_seeds": {"0": 40.0},
             "sentences_per_s": 10.0},
            {"model": "pet", "engine": "ct2-int8", "deployed_quality": 39.0, "quality_seeds": {"1": 39.0},
             "sentences_per_s": 20.0}]
    models = [{"name": "teacher", "records": {}}, {"name": "pet", "records": {"1": "k1"}}]
    record = {"key": "k1", "grid": "g", "cell": "pet", "seed": 1, "machine": {},
              "commands": [{"stage": "kd", "cpu_s": 7200.0}, {"stage": "measure", "cpu_s": 999.0}]}
    rendered(tmp_path, dict(entry(rows, models), command="ladder.py measure lad.toml"), [record])
    ladder = Ladder(str(tmp_path / "ladder.toml"), str(tmp_path / "store"))
    run = render.ladder_run(ladder.store, ladder)
    assert [r["cost_h"] for r in run["rows"]] == [None, 2.0]
    png = plot(ladder)
    assert png == str(tmp_path / "store" / "ladders" / "lad.png")
    assert b"ladder.py measure lad.toml" in open(png, "rb").read()


def test_a_ladder_of_your_own_names_its_teacher_and_data_and_a_ladder_with_grids_takes_theirs(tmp_path):
    """A ladder without grids (your teacher, data and students) names its teacher and data; one with grids may not
    name others; one with neither is refused, naming what it lacks."""
    from ladder import Ladder

    data = tmp_path / "data"
    data.mkdir()
    own = tmp_path / "own.toml"
    own.write_text(f'name = "own"\nteacher = "{TEACHER}"\ndata = "{data}"\n[[extra]]\nname = "s"\npath = "{PET}"\n')
    ladder = Ladder(str(own), str(tmp_path / "store"))
    models, missing = ladder.models()
    assert (ladder.teacher, ladder.data) == (TEACHER, str(data)) and [m["path"] for m in models] == [PET] and not missing
    both = tmp_path / "both.toml"
    both.write_text(open(ladder_files(tmp_path, str(data))).read() + f'teacher = "{TEACHER}"\n')
    with pytest.raises(SystemExit, match="takes their teacher and data"):
        Ladder(str(both), str(tmp_path / "store"))
    (tmp_path / "none.toml").write_text('name = "none"\n')
    with pytest.raises(SystemExit, match="no grids"):
        Ladder(str(tmp_path / "none.toml"), str(tmp_path / "store"))
