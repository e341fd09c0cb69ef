"""Data-parallel training on 2 CPU ranks through the launcher, and the measurement command."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import REPO, TEACHER, TINY_TRANSFORMER, TRAIN_FLAGS, USER_DIR, clean_env, needs_teacher, run_cli


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _updates_per_epoch(log):
    return int(re.search(r"epoch 001:\s+\d+ / (\d+)", log).group(1))


def test_two_cpu_ranks_train_halve_updates_and_resume(multi30k_slice, tmp_path):
    flags = [multi30k_slice, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS, "--max-update", "3",
             "--save-dir", str(tmp_path / "ck"), "--max-tokens", "1024"]
    single = run_cli("fairseq_cli.train", *flags[:-2], "--save-dir", str(tmp_path / "single"), "--max-tokens", "1024",
                     "--cpu")

    def launch():
        env = dict(clean_env(), LOG_DIR=str(tmp_path / "logs"), OMP_NUM_THREADS="1", PYTHON=sys.executable)
        return subprocess.run(["bash", os.path.join(REPO, "scripts", "distributed_train.sh"), "--nproc", "2",
                               "--master-port", str(_free_port()), "--cpu", "--", *flags],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=600)

    dist = launch()
    assert dist.returncode == 0, dist.stderr[-4000:]
    log0 = dist.stdout + dist.stderr
    log1 = (tmp_path / "logs" / "rank1.log").read_text()
    assert "distributed init (rank 0)" in log0 and "distributed init (rank 1)" in log1
    assert "num_updates=3" in log0 and "num_updates 3" in log0
    # rank 1 trains too (fairseq silences INFO logs on ranks > 0): every update averages the
    # batches of both ranks, so the target tokens per update double, and the launcher's exit status
    # (checked above) is non-zero if any rank fails
    wpb = lambda log: float(re.search(r"\| train \| epoch 001 .*\| wpb ([\d.]+)", log).group(1))  # noqa: E731
    assert 1.7 < wpb(log0) / wpb(single.stdout + single.stderr) < 2.3  # tokens per batch are capped by --max-tokens
    assert "Traceback" not in log1
    # each update consumes one batch per rank, so an epoch has half the updates
    n1, n2 = _updates_per_epoch(single.stdout + single.stderr), _updates_per_epoch(log0)
    assert n2 in (n1 // 2, (n1 + 1) // 2), (n1, n2)
    # resume from checkpoint_last.pt with more updates
    flags[flags.index("--max-update") + 1] = "5"
    resumed = launch()
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 3 updates\)", log), log[-3000:]
    assert "num_updates 5" in log


@needs_teacher
def test_measure_table_for_teacher_and_a_small_model(tmp_path):
    data = os.path.join(os.path.dirname(TEACHER), "data-bin")
    small = tmp_path / "small"
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS, "--max-update", "2",
            "--save-dir", small, "--cpu", "--no-save-optimizer-state")
    out, js = tmp_path / "table.md", tmp_path / "table.json"
    run_cli("user_dir.tools.measure", data, "--path", TEACHER, small / "checkpoint_last.pt", "--names", "teacher",
            "tiny", "--max-sentences", "48", "--batch-size", "16", "--runs", "2", "--max-len-b", "30",
            "--out", out, "--json", js)
    rows = {r["name"]: r for r in json.loads(js.read_text())["rows"]}
    teacher, tiny = rows["teacher"], rows["tiny"]
    assert teacher["params"] == 7_550_976 and teacher["compression_rate"] == 100.0
    assert teacher["sentences"] == 48 and len(teacher["sentences_per_s_runs"]) == 2
    assert teacher["bleu_tok"] > 25 and teacher["sacrebleu"] > 25  # a trained model; the tiny one is not
    assert tiny["bleu_tok"] < 5
    expected_rate = 100 * tiny["non_embedding_params"] / teacher["non_embedding_params"]
    assert abs(tiny["compression_rate"] - expected_rate) < 1e-9 and tiny["compression_rate"] < 10
    assert teacher["outputs_identical_across_runs"] and teacher["peak_memory_mb"] > 0
    table = out.read_text()
    assert "| teacher |" in table and "| tiny |" in table and "Command:" in table and "Machine:" in table


def test_measure_rejects_bad_arguments(multi30k_slice, tmp_path):
    bad = run_cli("user_dir.tools.measure", multi30k_slice, "--path", tmp_path / "missing.pt", check=False)
    assert bad.returncode != 0 and "--path" in bad.stderr and "missing.pt: no such checkpoint" in bad.stderr


def test_measure_scores_against_the_tokenized_reference_text(tmp_path):
    """--tokenized-reference: BLEU (tok) against the text itself, where the binarised references
    read <unk> for words outside the dictionary (the IWSLT'14 protocol, scripts/bench_iwslt14.py)."""
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
