"""Data-parallel training on 2 CPU ranks through the launcher, and the measurement command."""
import json
import os
import re
import shutil

import pytest

from conftest import REPO, TEACHER, TINY_TRANSFORMER, TRAIN_FLAGS, USER_DIR, needs_teacher, run_cli
from test_distributed_equality import assert_same_weights, train_on_two_ranks


def _updates_per_epoch(log):
    return int(re.search(r"epoch 001:\s+\d+ / (\d+)", log).group(1))


def _per_update(log):
    """``{update: {stat: value}}`` from the train_inner lines of a --log-format simple log."""
    lines = re.findall(r"epoch 001:\s+\d+ / \d+ (loss=.*)", log)
    stats = [dict(kv.split("=", 1) for kv in line.split(", ")) for line in lines]
    return {int(s["num_updates"]): s for s in stats}


def test_two_cpu_ranks_train_halve_updates_and_resume(multi30k_slice, tmp_path):
    flags = [multi30k_slice, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS, "--max-tokens", "1024",
             "--disable-validation"]
    single = run_cli("fairseq_cli.train", *flags, "--max-update", "3", "--no-save", "--cpu")
    flags += ["--max-update", "5", "--save-interval-updates", "3"]
    dist = train_on_two_ranks([*flags, "--save-dir", tmp_path / "whole"], tmp_path / "logs")
    assert dist.returncode == 0, dist.stderr[-4000:]
    log0 = dist.stdout + dist.stderr
    log1 = (tmp_path / "logs" / "rank1.log").read_text()
    assert "distributed init (rank 0)" in log0 and "distributed init (rank 1)" in log1
    assert "num_updates=5" in log0 and "num_updates 5" in log0
    # rank 1 trains too (fairseq silences INFO logs on ranks > 0): every update averages the
    # batches of both ranks, so the target tokens per update double, and the launcher's exit status
    # (checked above) is non-zero if any rank fails
    wpb = lambda log: float(re.search(r"\| train \| epoch 001 .*\| wpb ([\d.]+)", log).group(1))  # noqa: E731
    assert 1.7 < wpb(log0) / wpb(single.stdout + single.stderr) < 2.3  # tokens per batch are capped by --max-tokens
    assert "Traceback" not in log1
    # each update consumes one batch per rank, so an epoch has half the updates
    n1, n2 = _updates_per_epoch(single.stdout + single.stderr), _updates_per_epoch(log0)
    assert n2 in (n1 // 2, (n1 + 1) // 2) and n2 > 5, (n1, n2)
    # both ranks killed after update 3, mid-epoch: resumed from what was saved then (checkpoint_last.pt),
    # updates 4-5 (dropout on) equal those of the run that never stopped, loss for loss and weight for weight
    (tmp_path / "killed").mkdir()
    shutil.copy(tmp_path / "whole" / "checkpoint_1_3.pt", tmp_path / "killed" / "checkpoint_last.pt")
    resumed = train_on_two_ranks([*flags, "--save-dir", tmp_path / "killed"], tmp_path / "logs")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 3 updates\)", log), log[-3000:]
    whole, after = _per_update(log0), _per_update(log)
    assert sorted(whole) == [1, 2, 3, 4, 5] and sorted(after) == [4, 5]
    for k in (4, 5):
        for key in ("loss", "nll_loss", "gnorm", "lr", "wpb", "bsz"):
            assert after[k][key] == whole[k][key], (k, key, after[k], whole[k])
    assert_same_weights(tmp_path / "whole", tmp_path / "killed")


@needs_teacher
def test_measure_table_for_teacher_and_a_small_model(tmp_path):
    data = os.path.join(os.path.dirname(TEACHER), "data-bin")
    small = tmp_path / "small"
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS, "--max-update", "2",
            "--save-dir", small, "--cpu", "--no-save-optimizer-state", "--disable-validation")
    out, js = tmp_path / "table.md", tmp_path / "table.json"
    run_cli("user_dir.tools.measure", data, "--path", TEACHER, small / "checkpoint_last.pt", "--names", "teacher",
            "tiny", "--max-sentences", "24", "--batch-size", "8", "--runs", "2", "--max-len-b", "30",
            "--out", out, "--json", js)
    rows = {r["name"]: r for r in json.loads(js.read_text())["rows"]}
    teacher, tiny = rows["teacher"], rows["tiny"]
    assert teacher["params"] == 7_550_976 and teacher["compression_rate"] == 100.0
    assert teacher["sentences"] == 24 and len(teacher["sentences_per_s_runs"]) == 2
    assert teacher["bleu_tok"] > 25 and teacher["sacrebleu"] > 25  # a trained model; the tiny one is not
    assert tiny["bleu_tok"] < 5
    expected_rate = 100 * tiny["non_embedding_params"] / teacher["non_embedding_params"]
    assert abs(tiny["compression_rate"] - expected_rate) < 1e-9 and tiny["compression_rate"] < 10
    assert teacher["outputs_identical_across_runs"] and teacher["peak_memory_mb"] > 0
    # speed: the median of the timed runs, and the speed-up relative to the first model (the reference)
    import statistics

    for row in (teacher, tiny):
        assert abs(row["sentences_per_s"] - statistics.median(row["sentences_per_s_runs"])) < 1e-9
        assert abs(row["speedup"] - row["sentences_per_s"] / teacher["sentences_per_s"]) < 1e-9
    # the table shows the JSON's numbers, and says how they were made
    table = out.read_text()
    for row in (teacher, tiny):
        assert (f"| {row['name']} | {row['bleu_tok']:.2f} | {row['sacrebleu']:.2f} | {row['params']:,} | "
                f"{row['non_embedding_params']:,} | {row['compression_rate']:.2f}% | {row['weights_mb']:.1f} | "
                f"{row['checkpoint_mb']:.1f} | {row['sentences_per_s']:.1f} | {row['tokens_per_s']:.0f} | "
                f"{row['speedup']:.2f}x | {row['peak_memory_mb']:.0f} |") in table
    raw = json.loads(js.read_text())
    assert raw["command"].startswith("python -m user_dir.tools.measure ") and raw["command"] in table
    assert f"Machine: {raw['machine']}" in table and f"Date: {raw['date']}." in table
    # the paths were given absolute: those inside the checkout are written relative to it, the others as given --
    # the table, the JSON and the command they record hold no absolute path of this machine's checkout
    assert teacher["path"] == os.path.relpath(TEACHER, REPO) == os.path.join("work", "test-teacher", "multi30k.de-en",
                                                                             "teacher.pt")
    assert tiny["path"] == str(small / "checkpoint_last.pt")
    assert f"of `{os.path.relpath(data, REPO)}`," in table
    assert f" {os.path.relpath(data, REPO)} --path {teacher['path']} {tiny['path']} " in raw["command"]
    assert REPO + os.sep not in table and REPO + os.sep not in js.read_text()


def test_measure_shows_paths_inside_the_checkout_relative_to_it_and_others_as_given():
    from user_dir.tools.measure import shown_path
    assert shown_path(os.path.join(REPO, "work", "x.pt")) == os.path.join("work", "x.pt")
    assert shown_path(REPO) == "."
    for given in ("work/x.pt", "../shared/teacher.pt", "/elsewhere/x.pt", REPO + "-other/x.pt",
                  os.path.join(os.path.dirname(REPO), "shared", "teacher.pt")):
        assert shown_path(given) == given


def test_measure_rejects_bad_arguments(multi30k_slice, tmp_path):
    bad = run_cli("user_dir.tools.measure", multi30k_slice, "--path", tmp_path / "missing.pt", check=False)
    assert bad.returncode != 0 and "--path" in bad.stderr and "missing.pt: no such checkpoint" in bad.stderr


def test_measure_scores_against_the_tokenized_reference_text(tmp_path):
    """--tokenized-reference: BLEU (tok) against the text itself, where the binarised references
    read <unk> for words outside the dictionary (the IWSLT'14 protocol)."""
    from user_dir.tools.measure import translation_scores

    text = ["a man rides a zebrafish through the park .", "two dogs play in the snow ."]
    ref = tmp_path / "test.en"
    ref.write_text("\n".join(text) + "\n")
    binarised = ["a man rides a <unk> through the park .", "two dogs play in the snow ."]
    hyps = list(text)
    assert translation_scores(hyps, binarised, [0, 1], "en", None)["bleu_tok"] < 90
    scores = translation_scores(hyps, binarised, [0, 1], "en", None, tokenized_reference=str(ref))
    assert abs(scores["bleu_tok"] - 100) < 1e-6 and abs(scores["sacrebleu"] - 100) < 1e-6
    # ids index the file's lines: a file of another test set is refused, naming the flag
    with pytest.raises(SystemExit, match="--tokenized-reference .* has 2 lines .* sentence id 5"):
        translation_scores(hyps, binarised, [0, 5], "en", None, tokenized_reference=str(ref))
