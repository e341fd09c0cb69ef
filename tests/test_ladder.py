"""The which-method ladders (scripts/experiments/ladder.py, rendered by render.py's ladder_table): the teacher and a
grid cell's records deployed in fairseq and CTranslate2 (float32, int8) for translation, in fairseq and ONNX Runtime
(fp32, int8) for GLUE, measured in one run, every seed scored in every engine, the run filed in the store and rendered
with the records' cost and the recommendation."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_DATA, USER_DIR, run_cli
from test_checkpoint_flags import PET, TEACHER, shipped_data  # noqa: F401  (shipped_data: a session fixture)

sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
import render  # noqa: E402
import store as store_lib  # noqa: E402
from record import data_fingerprint, sha256_of  # noqa: E402

LADDER = os.path.join(REPO, "scripts", "experiments", "ladder.py")


PET_CELLS = ('[[cell]]\nname = "pet"\nrecipe = "pet.sh"\n'
             '[[cell]]\nname = "word-kd"\nrecipe = "competitors.sh"\nvariables = { KIND = "word" }\n')


def ladder_files(tmp_path, data, inputs="", cells=PET_CELLS,
                 ladder='name = "lad"\nengines = ["fairseq", "ct2-float32", "ct2-int8"]\nlosses = [0.5, 1.0]\n'):
    """Grid g (seeds 1 and 2, its DATA and ``inputs``, its ``cells``) and a ladder over it measured at batch 8, three
    sentences' latency, one run and one thread."""
    grid = tmp_path / "grid.toml"
    grid.write_text(f'name = "g"\nseeds = [1, 2]\n[inputs]\nDATA = "{data}"\n{inputs}{cells}')
    path = tmp_path / "ladder.toml"
    path.write_text(f'{ladder}grids = ["{grid}"]\nbatch = 8\nlatency_sentences = 3\nruns = 1\nthreads = 1\n')
    return str(path)


def file_records(store, data, scores):
    """The grid's 'pet' cell at two seeds, both trained into the shipped PET student (a real checkpoint: what the
    ladder deploys), with their own scores and costs."""
    for seed, score in scores.items():
        result = {"recipe": "pet.sh", "name": "pet", "variables": {"SEED": str(seed)},
                  "commands": [{"stage": "warmup", "cpu_s": 1800.0 * seed}, {"stage": "kd", "cpu_s": 3600.0},
                               {"stage": "measure", "cpu_s": 99999.0}],
                  "teacher": {"path": TEACHER, "sha256": sha256_of(TEACHER, teacher=True)},
                  "data": {"path": data, "fingerprint": data_fingerprint(data)}, "checkpoint": PET,
                  "metrics": {"sacrebleu": score, "bleu_tok": score}, "outputs": None,
                  "machine": {"cpu": "test", "malloc": "4294967296"}}
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


def rendered(tmp_path, e, records=(), spec=""):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    control = '[[cell]]\nname = "teacher-rule"\nrecipe = "competitors.sh"\n'  # a control's cell (ladder_mt's)
    ladder = ladder_files(tmp_path, str(data), cells=PET_CELLS + control,
                          ladder=f'name = "lad"\nlosses = [0.5, 1.0]\n{spec}')
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
    assert "not met; nearest b in fairseq, 4.50x at +0.20 lost (1 seed(s))." in text
    assert "- Where the time goes, b in fairseq: not measured." in text  # (these rows carry no time_parts)
    rows[3]["time_parts"] = {"batch": {"encoder": 0.1, "decoder": 0.6, "search": 0.3},
                             "one": {"encoder": 0.05, "decoder": 0.75, "search": 0.2}}
    assert ("- Where the time goes, b in fairseq: at batch 64: encoder 10%, decoder 60%, search 30%; at batch 1: "
            "encoder 5%, decoder 75%, search 20%.") in rendered(tmp_path, entry(rows))
    rows[3]["sentences_per_s"] = 55.0
    assert "met by b in fairseq, 5.50x at +0.20 lost (1 seed(s))." in rendered(tmp_path, entry(rows))
    # the round trip: an engine's hypotheses identical to the same model's in fairseq, string for string
    rows[1].update(identical_to_fairseq=927, sentences=1000)
    text = rendered(tmp_path, entry(rows))
    assert "| hypotheses = fairseq's |" in text and "| teacher | ct2-int8 | 40.10 (1 seed) | -0.10 | 927/1,000 |" in text


def test_the_goal_is_asked_again_against_the_teacher_trained_by_the_students_rule(tmp_path):
    def row(model, quality, speed, engine="fairseq"):
        return {"model": model, "engine": engine, "deployed_quality": quality, "quality_seeds": {"1": quality},
                "sentences_per_s": speed}
    # students above a short-trained teacher (40.0); the control, its recipe trained as long as they are, scores 42.0
    rows = [row("teacher", 40.0, 10.0), row("teacher-rule", 42.0, 10.0), row("teacher-rule", 42.1, 30.0, "ct2-int8"),
            row("a", 41.7, 60.0), row("b", 41.0, 80.0)]
    models = [{"name": "teacher", "records": {}, "trained": {"epochs": 8, "updates": 1951}}] + [
        {"name": n, "records": {}} for n in ("teacher-rule", "a", "b")]
    spec = 'control = "teacher-rule"\n'
    text = rendered(tmp_path, entry(rows, models), spec=spec)
    grid = os.path.relpath(tmp_path / "grid.toml", REPO)  # the ladder's grid that holds the control's cell
    assert "Goal (5x the fairseq teacher's sentences/s at <= 0.5 sacreBLEU lost): met by b in fairseq, 8.00x" in text
    # against the control: b loses 1.00, a 0.30 at 6x; the control's own int8 row is no student
    assert ("- The teacher trained 1,951 updates (its recipe's), the students until validation stopped improving or their "
            "epoch cap: a student above it says the teacher stopped short. Against teacher-rule, the teacher's recipe "
            f"trained by the students' rule ({grid}): 42.00 (1 seed(s)); the fastest student within 0.5 of it is a "
            "in fairseq, 6.00x at +0.30 lost: the goal met.") in text
    rows[3] = row("a", 41.0, 60.0)
    assert "42.00 (1 seed(s)); no student is within 0.5 of it: the goal not met." in rendered(
        tmp_path, entry(rows, models), spec=spec)
    rows[3] = row("a", 41.7, 40.0)
    assert "a in fairseq, 4.00x at +0.30 lost: the goal not met." in rendered(tmp_path, entry(rows, models), spec=spec)
    # before the control's records: said, and the teacher's budget where the run did not record it
    text = rendered(tmp_path, entry(rows[:1] + rows[3:]), spec=spec)
    assert "- The teacher trained a fixed budget (its recipe's)" in text and f"({grid}): not measured yet." in text
    assert "Against" not in rendered(tmp_path, entry(rows))  # a ladder without a control
    # a control that names no cell of the ladder's grids is refused, naming the field
    with pytest.raises(SystemExit, match="control = 'teacher-rul' names no cell of its grids"):
        rendered(tmp_path, entry(rows, models), spec='control = "teacher-rul"\n')


def test_a_run_measured_before_newer_records_says_measure_again(tmp_path):
    rows = [{"model": "teacher", "engine": "fairseq", "deployed_quality": 40.0, "quality_seeds": {"0": 40.0},
             "sentences_per_s": 10.0},
            {"model": "pet", "engine": "fairseq", "deployed_quality": 39.0, "quality_seeds": {"1": 39.0},
             "sentences_per_s": 20.0}]
    models = [{"name": "teacher", "records": {}}, {"name": "pet", "records": {"1": "k1"}}]
    record = {"key": "k1", "grid": "g", "cell": "pet", "seed": 1, "commands": [], "machine": {},
              "teacher": {"sha256": "t"}, "data": {"fingerprint": "d"}}
    text = rendered(tmp_path, entry(rows, models), [record])
    assert "Measured before" not in text
    text = rendered(tmp_path, entry(rows, models), [record, dict(record, key="k2", seed=2)])
    assert "- Measured before the store's latest records of pet: measure again." in text
    text = rendered(tmp_path, entry(rows, models), [record, dict(record, key="k3", teacher={"sha256": "t2"})])
    assert "- Measured before the store's latest records of pet: measure again." in text  # a teacher made again
    text = rendered(tmp_path, entry(rows, models), [record, dict(record, key="k4", data={"fingerprint": "d2"})])
    assert "- Measured before the store's latest records of pet: measure again." in text  # data prepared again


def test_a_ladder_not_measured_counts_the_seeds_of_its_grids_newest_teacher(tmp_path):
    """Before its first run, the ladder lists its cells with records: the seeds of the teacher of the grid's newest
    record, as the claims count them (a GLUE teacher prepared again with other weights starts afresh)."""
    path = ladder_files(tmp_path, str(tmp_path / "data"))
    store = store_lib.Store(str(tmp_path / "store"))
    old = {"grid": "g", "cell": "pet", "commands": [], "machine": {}, "teacher": {"sha256": "t1"},
           "data": {"fingerprint": "d"}}
    for key, seed, teacher in (("a", 1, "t1"), ("b", 2, "t1"), ("c", 1, "t2"), ("d", 1, "t1")):
        store._append(dict(old, key=key, seed=seed, teacher={"sha256": teacher}))
    assert "records in the store: pet (2 seeds); without: word-kd." in render.ladder_table(store, path)
    store._append(dict(old, key="e", cell="word-kd", seed=2, teacher={"sha256": "t2"}))
    assert "records in the store: pet (1 seeds), word-kd (1 seeds); without: none." in render.ladder_table(store, path)


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
    record = {"key": "k1", "grid": "g", "cell": "pet", "seed": 1, "machine": {}, "teacher": {"sha256": "t"},
              "data": {"fingerprint": "d"},
              "commands": [{"stage": "kd", "cpu_s": 7200.0}, {"stage": "measure", "cpu_s": 999.0}]}
    rendered(tmp_path, dict(entry(rows, models), command="ladder.py measure lad.toml"), [record])
    ladder = Ladder(str(tmp_path / "ladder.toml"), str(tmp_path / "store"))
    run = render.ladder_run(ladder.store, ladder)
    assert [r["cost_h"] for r in run["rows"]] == [None, 2.0]
    assert [r["cost_malloc"] for r in run["rows"]] == [True, False]  # a seed made on a CPU with glibc's default
    assert "| 2.00* |" in render.ladder_table(ladder.store, str(tmp_path / "ladder.toml"))  # malloc threshold
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


# ---- GLUE: fairseq and ONNX Runtime fp32/int8 ------------------------------------------------------------------
@pytest.fixture(scope="module")
def wordpiece_mrpc(tmp_path_factory):
    """Real MRPC (64 training pairs, all 408 dev pairs) under a WordPiece vocabulary of single characters and the
    dev set's 500 commonest words (BERT's tokenizer, as fc-export-onnx needs), a tiny hf_bert classifier trained 2
    updates on it (2 layers, width 32), and GhostBERT cut from it at m = 2/4 with depthwise ghost convolutions (which
    ONNX takes) and with conv1d_f (refused)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"needs the shared corpora at {SHARED_DATA} (not part of a clone)")
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (the deploy/test extra)")
    import collections
    import re
    import string

    from preprocess.prepare_glue import main as prepare_glue
    from user_dir.ghost.tools import prune as ghost_prune

    root = tmp_path_factory.mktemp("glue_ladder")
    vocab = root / "vocab"
    vocab.mkdir()
    with open(os.path.join(SHARED_DATA, "glue", "MRPC", "dev.tsv"), encoding="utf-8") as f:
        words = collections.Counter(re.findall(r"[a-z]{2,}", f.read().lower()))
    pieces = list(string.ascii_lowercase + string.digits + string.punctuation) + [w for w, _ in words.most_common(500)]
    (vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + pieces
                                               + ["##" + p for p in pieces]) + "\n")
    (vocab / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces + ["##" + p for p in pieces]))
    data = root / "MRPC.wordpiece"
    prepare_glue(["--task", "MRPC", "--glue-dir", os.path.join(SHARED_DATA, "glue"), "--dest", str(data),
                  "--tokenizer", "wordpiece", "--wordpiece-vocab", str(vocab), "--dict", str(vocab / "dict.txt"),
                  "--max-length", "96", "--train-rows", "64", "--workers", "1"])
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--num-classes", "2",
            "--init-token", "0", "--max-positions", "512", "--shorten-method", "truncate", "--batch-size", "16",
            "--arch", "hf_bert", "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "4", "--criterion", "sentence_prediction", "--optimizer", "adam", "--lr",
            "1e-3", "--cpu", "--num-workers", "0", "--log-format", "simple", "--no-epoch-checkpoints", "--seed", "1",
            "--max-update", "2", "--save-dir", root / "teacher")
    out = {"data": str(data), "teacher": str(root / "teacher" / "checkpoint_last.pt")}
    for name, conv in (("ghost", "dwconv"), ("conv1d", "conv1d_f")):
        out[name] = str(root / f"{name}.pt")
        ghost_prune.main([str(data), "--path", out["teacher"], "--width-mult", "2/4", "--out", out[name],
                          "--ghost-positions", "o,ffn2", "--ghost-conv", conv, "--max-batches", "1", "--batch-size",
                          "8", "--cpu"])
    return out


def test_a_glue_ladder_deploys_in_onnx_runtime_compares_predictions_and_renders(wordpiece_mrpc, tmp_path):
    """A grid with GLUE_TASK makes a GLUE ladder: the teacher and a GhostBERT cell (2 seeds) in fairseq and ONNX
    Runtime fp32/int8 (fc-export-onnx, its tokenizer checked on every dev example's raw text), scored in MRPC's first
    metric (F1) on dev, each ONNX row's predictions compared with the same model's in fairseq; a conv1d_f GhostBERT
    (--extra) refused by ONNX with the reason; the run rendered, and the deployment page's GLUE rows read from it."""
    m = wordpiece_mrpc
    ladder = ladder_files(tmp_path, m["data"], f'TEACHER = "{m["teacher"]}"\n[variables]\nGLUE_TASK = "MRPC"\n',
                          '[[cell]]\nname = "ghost"\nrecipe = "ghostbert.sh"\n',
                          'name = "ladder_glue"\nlosses = [1.0, 2.0]\n')
    store = store_lib.Store(str(tmp_path / "store"))
    for seed, score in {1: 60.0, 2: 62.0}.items():
        store.add(f"key-{seed}", "g", "ghost", seed, {
            "recipe": "ghostbert.sh", "name": "ghost", "variables": {"SEED": str(seed)},
            "commands": [{"stage": "distill", "cpu_s": 3600.0}, {"stage": "measure", "cpu_s": 999.0}],
            "teacher": {"path": m["teacher"], "sha256": sha256_of(m["teacher"], teacher=True)},
            "data": {"path": m["data"], "fingerprint": data_fingerprint(m["data"])}, "checkpoint": m["ghost"],
            "metrics": {"f1": score, "accuracy": score - 5}, "outputs": None,
            "machine": {"cpu": "test", "malloc": "4294967296"}},
            str(store.root))
    proc = subprocess.run([sys.executable, LADDER, "measure", ladder, "--store", store.root, "--work",
                           str(tmp_path / "work"), "--max-sentences", "24", "--extra", f"conv={m['conv1d']}"],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=REPO,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = [json.loads(line) for line in open(tmp_path / "store" / "ladders" / "ladder_glue.jsonl")]
    assert entry["settings"]["task"] == "glue" and entry["settings"]["glue_task"] == "MRPC"
    assert entry["settings"]["metric"] == "f1" and entry["settings"]["subset"] == "dev"
    rows = {(r["model"], r["engine"]): r for r in entry["rows"]}
    assert set(rows) == {(m_, e) for m_ in ("teacher", "ghost") for e in ("fairseq", "onnx-fp32", "onnx-int8")} | {
        ("conv", "fairseq")}
    assert {(r["model"], r["engine"]) for r in entry["refused"]} == {("conv", "onnx-fp32"), ("conv", "onnx-int8")}
    assert all("conv1d_f" in r["reason"] for r in entry["refused"])
    # the export round trip: float32 gives fairseq's predicted class on every example; int8 is compared too
    for model in ("teacher", "ghost"):
        fp32, int8, fairseq = (rows[model, e] for e in ("onnx-fp32", "onnx-int8", "fairseq"))
        assert fp32["identical_to_fairseq"] == fp32["sentences"] == 24 and fp32["first_differences"] == []
        assert 0 <= int8["identical_to_fairseq"] <= 24 and "identical_to_fairseq" not in fairseq
        assert fp32["scores"] == fairseq["scores"] and set(fairseq["scores"]) == {"f1", "accuracy"}
        assert fp32["deployed_quality"] == fairseq["scores"]["f1"]
        assert int8["size_mb"] < fp32["size_mb"] and int8["non_embedding_params"] == fairseq["non_embedding_params"]
        assert len(fp32["latency_ms_runs"]) == 1 and fp32["time_parts"] == {"batch": None, "one": None}
    # fairseq: the records' scores; ONNX Runtime: each seed's checkpoint exported and run (one file: one score)
    assert rows["ghost", "fairseq"]["quality_seeds"] == {"1": 60.0, "2": 62.0}
    assert set(rows["ghost", "onnx-int8"]["quality_seeds"]) == {"1", "2"}
    assert len(set(rows["ghost", "onnx-int8"]["quality_seeds"].values())) == 1
    described = {d["name"]: d for d in entry["models"]}
    assert described["ghost"]["export"]["raw_text_checked"] == {"subset": "dev", "examples": 408}
    assert described["ghost"]["export"]["max_abs_diff"] <= 1e-4

    text = render.ladder_table(store, ladder)
    assert "| predictions = fairseq's |" in text and "F1 on MRPC's dev set" in text
    assert "| ghost | onnx-fp32 | " in text and " | 24/24 | " in text and "Where the time goes" not in text
    assert "- Not deployed: conv in onnx-fp32: " in text and "Goal (5x the fairseq teacher's" in text
    page = render.deploy_glue_table(store)  # grids/ladder_glue.toml's name: this store's run
    assert "| ghost, onnx-fp32 | " in page and "| 24/24 |" in page and "Archived" not in page


def test_a_glue_ladder_is_told_by_its_grids_or_data_and_takes_glue_engines_only(tmp_path):
    """A ladder whose data preprocess/prepare_glue.py made is a GLUE ladder of that task (engines fairseq, onnx-fp32,
    onnx-int8); CTranslate2 is refused there, and a translation ladder takes no ONNX engine."""
    from ladder import Ladder

    data = tmp_path / "rte"
    data.mkdir()
    (data / ".prepared.json").write_text(json.dumps({"config": {"task": "RTE", "glue_dir": "glue"}}))
    own = tmp_path / "own.toml"
    own.write_text(f'name = "own"\nteacher = "{TEACHER}"\ndata = "{data}"\n')
    ladder = Ladder(str(own), str(tmp_path / "store"))
    assert (ladder.task, ladder.glue_task, ladder.engines) == ("glue", "RTE", ["fairseq", "onnx-fp32", "onnx-int8"])
    own.write_text(own.read_text() + 'engines = ["fairseq", "ct2-int8"]\n')
    with pytest.raises(SystemExit, match="a glue ladder's are fairseq, onnx-fp32, onnx-int8"):
        Ladder(str(own), str(tmp_path / "store"))
    plain = tmp_path / "plain.toml"
    plain.write_text(f'name = "plain"\nteacher = "{TEACHER}"\ndata = "{tmp_path}"\nengines = ["onnx-fp32"]\n')
    with pytest.raises(SystemExit, match="a translation ladder's are fairseq, ct2-float32, ct2-int8"):
        Ladder(str(plain), str(tmp_path / "store"))


def test_a_deployment_of_an_older_checkpoint_is_made_again(tmp_path):
    """ladder.made_from: an export or conversion written before its checkpoint (a cell retrained under the same label)
    does not stand for it; one written after does; a missing one never."""
    from ladder import made_from

    checkpoint, deployed = tmp_path / "checkpoint.pt", tmp_path / "model.bin"
    checkpoint.write_text("c")
    assert not made_from(str(deployed), str(checkpoint))
    deployed.write_text("d")
    os.utime(deployed, (1000, 1000))
    assert not made_from(str(deployed), str(checkpoint))
    os.utime(deployed, None)
    os.utime(checkpoint, (1000, 1000))
    assert made_from(str(deployed), str(checkpoint))
