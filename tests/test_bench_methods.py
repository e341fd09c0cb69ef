"""scripts/bench/bench_methods.py (issue 47): the Pareto fronts and the recommendation on hand-made points, refused
combinations with their reasons, and a smoke run end to end on the shipped teacher."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, TEACHER, TEACHER_DIR, clean_env, needs_teacher

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
])
def test_refused_combinations_name_method_and_reason(spec, words):
    with pytest.raises(bm.Refused) as e:
        bm.parse_spec(spec, ["int8"])
    assert str(e.value).startswith(f"--methods {spec}: ")
    for w in words:
        assert w in str(e.value)


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
    assert {s["steps"][0][0] for s in specs.values()} == set(bm.METHODS)


@needs_teacher
def test_smoke_run_end_to_end(tmp_path):
    """PET (its recipe, then fc-export and CTranslate2 int8) and a word-KD student in fairseq, a few updates each,
    measured on 20 test sentences: about 20 fresh Python processes, so about 2 minutes on an idle machine."""
    out = tmp_path / "methods"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench", "bench_methods.py"), "--smoke", "--methods", "pet:64x64",
         "word-kd:64x64@fairseq", "--ct2", "int8", "--teacher", TEACHER, "--data", os.path.join(TEACHER_DIR, "data-bin"),
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
