"""The paired significance tests of user_dir/common/significance.py against hand-computed cases."""
import pytest
import sacrebleu

from user_dir.common.significance import paired_bleu, paired_glue, verdict


def test_glue_permutation_p_is_the_exact_sign_flip_probability():
    # 6 dev examples: A alone is right on 4 (the discordant pairs), both right on 1, both wrong on 1.
    # Under H0 each discordant pair flips sign with probability 1/2 and a concordant pair changes nothing, so
    # |acc(A) - acc(B)| >= 4/6 only when all 4 flips agree: p = 2 / 2^4 = 0.125 (scipy enumerates all 2^6).
    labels = [1, 1, 0, 0, 1, 0]
    a = [1, 1, 0, 0, 1, 1]
    b = [0, 0, 1, 1, 1, 1]
    r = paired_glue([a], [b], labels, "accuracy", n_resamples=1000)
    assert r["a"] == pytest.approx(500 / 6) and r["b"] == pytest.approx(100 / 6)
    assert r["diff"] == pytest.approx(400 / 6)
    assert r["p"] == pytest.approx(0.125)
    assert r["low"] <= r["diff"] <= r["high"] and r["n"] == 6


def test_glue_seeds_are_paired_and_concatenated():
    labels = [1, 0, 1, 0, 1, 0, 1, 0]
    a = [[1, 0, 1, 0, 1, 0, 1, 1], [1, 0, 1, 0, 1, 0, 0, 0]]
    b = [[1, 0, 1, 0, 1, 0, 1, 1], [1, 0, 1, 0, 1, 0, 0, 0]]
    same = paired_glue(a, b, labels, "f1", n_resamples=500)
    assert same["diff"] == 0 and same["low"] == same["high"] == 0 and same["p"] == pytest.approx(1.0)
    assert verdict(same) == "inconclusive" and same["n"] == 16
    with pytest.raises(ValueError, match="seeds"):
        paired_glue(a, b[:1], labels, "f1")
    with pytest.raises(ValueError, match="metric"):
        paired_glue(a, b, labels, "bleu")


def test_glue_clear_difference_is_significant():
    labels = [i % 2 for i in range(200)]
    a = list(labels)
    b = [1 - y if i % 3 == 0 else y for i, y in enumerate(labels)]  # B wrong on every third example
    r = paired_glue([a], [b], labels, "accuracy", n_resamples=2000)
    assert r["diff"] == pytest.approx(100 * 67 / 200)
    assert r["p"] < 1e-3 and r["low"] > 20 and verdict(r) == "A better"


REFS = ["the cat sat on the mat .", "a man rides a horse on the beach .", "two dogs play in the snow .",
        "a woman is reading a book in the park .", "children are playing football .",
        "an old man walks down the street .", "a boy jumps into the lake .", "people are dancing at a party ."]
B_HYPS = ["a cat sits on a mat .", "a man is riding a horse .", "dogs play in snow .",
          "a woman reads in a park .", "kids play soccer .", "an old man walks .", "a boy jumps in a lake .",
          "people dance ."]


def test_bleu_scores_are_sacrebleus_and_the_seeds_are_concatenated():
    r = paired_bleu([REFS, B_HYPS], [B_HYPS, B_HYPS], REFS, n_samples=200)
    assert r["a"] == pytest.approx(sacrebleu.corpus_bleu(REFS + B_HYPS, [REFS + REFS]).score)
    assert r["b"] == pytest.approx(sacrebleu.corpus_bleu(B_HYPS + B_HYPS, [REFS + REFS]).score)
    assert r["diff"] == pytest.approx(r["a"] - r["b"]) and r["n"] == 16
    assert r["low"] <= r["diff"] <= r["high"]


def test_bleu_identical_systems_and_a_perfect_one():
    same = paired_bleu([B_HYPS], [B_HYPS], REFS, n_samples=200)
    assert same["diff"] == 0 and same["low"] == same["high"] == 0 and verdict(same) == "inconclusive"
    assert same["p"] == pytest.approx(1 / 201)  # sacrebleu's strict count: the interval decides, not p
    perfect = paired_bleu([REFS], [B_HYPS], REFS, n_samples=200)
    assert perfect["a"] == pytest.approx(100.0) and perfect["low"] > 0
    # sacrebleu's p: (1 + resamples at least as extreme) / (1 + resamples); none of 200 is
    assert perfect["p"] == pytest.approx(1 / 201) and verdict(perfect) == "A better"
    with pytest.raises(ValueError, match="seed 0"):
        paired_bleu([REFS[:3]], [B_HYPS], REFS)


@pytest.mark.parametrize("metric", ["accuracy", "f1", "mcc"])
def test_batched_metrics_equal_glue_metrics(metric):
    import numpy as np

    from user_dir.common.glue_metrics import METRIC_FUNCTIONS
    from user_dir.common.significance import COUNT_METRICS

    rng = np.random.default_rng(0)
    preds, gold = rng.integers(0, 2, size=(5, 40)), rng.integers(0, 2, size=40)
    preds[0] = 0  # a degenerate row: no positive prediction (F1 0, MCC 0 by sklearn's convention)
    batched = COUNT_METRICS[metric](preds, gold)
    for row, value in zip(preds, batched):
        assert value == pytest.approx(METRIC_FUNCTIONS[metric](row, gold))


def test_command_line(tmp_path):
    from conftest import run_cli

    for name, lines in (("a", REFS), ("b", B_HYPS), ("refs", REFS)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    out = run_cli("user_dir.tools.significance", "bleu", "--refs", tmp_path / "refs", "--a", tmp_path / "a", "--b",
                  tmp_path / "b", "--samples", "100", "--json").stdout
    import json
    result = json.loads(out)
    assert result["a"] == pytest.approx(100.0) and result["verdict"] == "A better"
    bad = run_cli("user_dir.tools.significance", "bleu", "--refs", tmp_path / "refs", "--a", tmp_path / "a",
                  "--b", tmp_path / "missing", check=False)
    assert bad.returncode != 0 and "--b" in bad.stderr and "missing" in bad.stderr
