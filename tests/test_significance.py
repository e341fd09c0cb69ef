"""The cluster tests of user_dir/common/significance.py against hand-computed cases (issue 44)."""
import json

import numpy as np
import pytest
import sacrebleu

from user_dir.common.significance import (bleu_from_statistics, bleu_statistics, claim_verdict, glue_statistics, holm,
                                          pack, paired_bleu, paired_glue, retention, unpack, verdict)

REFS = ["the cat sat on the mat .", "a man rides a horse on the beach .", "two dogs play in the snow .",
        "a woman is reading a book in the park .", "children are playing football .",
        "an old man walks down the street .", "a boy jumps into the lake .", "people are dancing at a party ."]
B_HYPS = ["a cat sits on a mat .", "a man is riding a horse .", "dogs play in snow .",
          "a woman reads in a park .", "kids play soccer .", "an old man walks .", "a boy jumps in a lake .",
          "people dance ."]


def test_identical_seeds_give_the_one_seed_interval():
    """The bug of issue 44: 3 copies of one seed's outputs made the interval ~1/sqrt(3) as wide. As clusters,
    each example's 3 copies travel together: the same draws give the same interval, BLEU and GLUE."""
    refs, a, b = REFS * 5, [h for _ in range(5) for h in REFS], B_HYPS * 5
    one = paired_bleu([a], [b], refs, n_samples=500)
    three = paired_bleu([a] * 3, [b] * 3, refs, n_samples=500)
    assert three["low"] == pytest.approx(one["low"]) and three["high"] == pytest.approx(one["high"])
    assert three["high"] - three["low"] > 0 and three["n"] == 40 and three["seeds"] == 3
    labels = [i % 2 for i in range(120)]
    pa = [y if i % 4 else 1 - y for i, y in enumerate(labels)]
    pb = [y if i % 3 else 1 - y for i, y in enumerate(labels)]
    for metric in ("accuracy", "f1", "mcc"):
        g1 = paired_glue([pa], [pb], labels, metric, n_resamples=2000)
        g3 = paired_glue([pa] * 3, [pb] * 3, labels, metric, n_resamples=2000)
        assert (g3["low"], g3["high"], g3["diff"]) == pytest.approx((g1["low"], g1["high"], g1["diff"]))
        assert g3["per_seed"] == pytest.approx([g1["diff"]] * 3) and g3["per_seed_std"] == pytest.approx(0)


def test_two_identical_systems_give_zero_and_p_one():
    same = paired_bleu([B_HYPS, REFS], [B_HYPS, REFS], REFS, n_samples=300)
    assert same["diff"] == 0 and same["low"] == same["high"] == 0 and same["p"] == 1.0
    assert verdict(same) == "inconclusive"
    labels = [1, 0, 1, 0, 1, 0, 1, 0]
    a = [[1, 0, 1, 0, 1, 0, 1, 1], [1, 0, 1, 0, 1, 0, 0, 0]]
    g = paired_glue(a, a, labels, "f1", n_resamples=500)
    assert g["diff"] == 0 and g["low"] == g["high"] == 0 and g["p"] == 1.0 and g["per_seed"] == [0, 0]


def test_known_shift_is_found_with_the_binomial_interval():
    # B is wrong on every third of 300 examples, A never: diff = 100 X / n with X ~ Bin(300, 1/3) under the
    # bootstrap, so the 95% interval is 33.33 +- 1.96 * 100 sqrt((1/3)(2/3) / 300) = 33.33 +- 5.33
    labels = [i % 2 for i in range(300)]
    b = [1 - y if i % 3 == 0 else y for i, y in enumerate(labels)]
    r = paired_glue([labels, labels], [b, b], labels, "accuracy", n_resamples=10000)
    assert r["diff"] == pytest.approx(100 / 3) and r["per_seed"] == pytest.approx([100 / 3] * 2)
    assert r["low"] == pytest.approx(100 / 3 - 5.33, abs=0.6) and r["high"] == pytest.approx(100 / 3 + 5.33, abs=0.6)
    assert r["p"] == pytest.approx(1 / 10001)  # no sign-flip reaches |33.3| (that needs all 100 flips to agree)
    assert verdict(r) == "A better" and claim_verdict(r, 0.0) == "reproduced" and claim_verdict(r, 40) == "not reproduced"
    perfect = paired_bleu([REFS], [B_HYPS], REFS, n_samples=500)
    assert perfect["a"] == pytest.approx(100.0) and perfect["b"] == pytest.approx(sacrebleu.corpus_bleu(B_HYPS, [REFS]).score)
    assert perfect["low"] > 0 and verdict(perfect) == "A better"


def test_two_sided_sign_flip_p():
    # 6 examples, A alone right on 4 of them: |d*| >= 4/6 only when the 4 discordant flips all agree, either way:
    # p = 2 / 2^4 = 0.125 (two-sided; one side would be 0.0625)
    labels = [1, 1, 0, 0, 1, 0]
    a, b = [1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1]
    r = paired_glue([a], [b], labels, "accuracy", n_resamples=20000)
    assert r["diff"] == pytest.approx(400 / 6) and r["p"] == pytest.approx(0.125, abs=0.01)
    swapped = paired_glue([b], [a], labels, "accuracy", n_resamples=20000)
    assert swapped["p"] == pytest.approx(r["p"], abs=0.01) and swapped["diff"] == pytest.approx(-r["diff"])


def test_per_seed_differences_and_the_verdict_needs_every_seed():
    labels = [1] * 10
    # seed 1: A right on 8, B on 5 (+30); seed 2: A 7, B 6 (+10); seed 3: A 6, B 7 (-10)
    a = [[1] * 8 + [0] * 2, [1] * 7 + [0] * 3, [1] * 6 + [0] * 4]
    b = [[1] * 5 + [0] * 5, [1] * 6 + [0] * 4, [1] * 7 + [0] * 3]
    r = paired_glue(a, b, labels, "accuracy", n_resamples=500)
    assert r["per_seed"] == pytest.approx([30, 10, -10]) and r["per_seed_mean"] == pytest.approx(10)
    assert r["per_seed_std"] == pytest.approx(20) and r["diff"] == pytest.approx(10)
    made = {"diff": 1.0, "low": 0.5, "high": 1.5, "p": 0.001}
    assert claim_verdict(dict(made, per_seed=[1.2, 0.9, 0.8])) == "reproduced"
    assert claim_verdict(dict(made, per_seed=[1.2, 0.9, -0.1])) == "inconclusive"  # a seed disagrees
    assert claim_verdict(dict(made, per_seed=[1.2, 0.9, 0.8]), p=0.2) == "inconclusive"  # e.g. its Holm p
    # a drop bound needs its own (Holm) p as well (one rule): with p 0.9 the same interval is no verdict
    assert claim_verdict(dict(made, per_seed=[1.2, 0.9, 0.8]), threshold=-2.0, p=0.9) == "inconclusive"
    assert claim_verdict(dict(made, per_seed=[1.2, 0.9, 0.8]), threshold=-2.0, p=0.01) == "reproduced"


def test_holm_on_hand_made_ps():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, 1.5])


def test_tost_on_a_hand_made_case():
    # 400 examples: A alone right on 8, B alone right on 4: diff = +1 point, bootstrap sd 100 sqrt((12/400 -
    # (4/400)^2) / 400) = 0.865, 90% interval 1 +- 1.42 = [-0.42, 2.42]
    labels = [1] * 400
    a = [0] * 4 + [1] * 8 + [1] * 388
    b = [1] * 4 + [0] * 8 + [1] * 388
    wide = paired_glue([a], [b], labels, "accuracy", n_resamples=10000, margin=3.0)
    assert wide["diff"] == pytest.approx(1.0)
    assert wide["low90"] == pytest.approx(-0.42, abs=0.3) and wide["high90"] == pytest.approx(2.42, abs=0.3)
    # P*(d* >= 3) = P(Z >= 2 / 0.865 = 2.31) = 0.010
    assert wide["equivalent"] and wide["tost_p"] == pytest.approx(0.010, abs=0.008)
    narrow = paired_glue([a], [b], labels, "accuracy", n_resamples=10000, margin=1.5)
    # P*(d* >= 1.5) = P(Z >= 0.58) = 0.28
    assert not narrow["equivalent"] and narrow["tost_p"] == pytest.approx(0.28, abs=0.06)
    with pytest.raises(ValueError, match="margin"):
        paired_glue([a], [b], labels, "accuracy", margin=0)


def test_retention_ratio_and_its_binomial_interval():
    # the teacher is right on all 400, A on 360: ratio 0.9 = acc(A*) under every draw, sd sqrt(0.9 * 0.1 / 400) =
    # 0.015: interval 0.9 +- 0.0294
    labels = [1] * 400
    teacher, a = [1] * 400, [1] * 360 + [0] * 40
    r = retention(glue_statistics([a, a], labels, "accuracy"), glue_statistics([teacher, teacher], labels, "accuracy"),
                  "accuracy", n_resamples=10000)
    assert r["ratio"] == pytest.approx(0.9) and r["per_seed"] == pytest.approx([0.9, 0.9])
    assert r["low"] == pytest.approx(0.8706, abs=0.006) and r["high"] == pytest.approx(0.9294, abs=0.006)
    half = retention(bleu_statistics([B_HYPS], REFS), bleu_statistics([REFS], REFS), "bleu", n_resamples=200)
    assert half["ratio"] == pytest.approx(sacrebleu.corpus_bleu(B_HYPS, [REFS]).score / 100)


def test_bleu_from_statistics_is_sacrebleus():
    from sacrebleu.metrics import BLEU

    stats = bleu_statistics([B_HYPS, REFS, ["a", "b", "c", "d", "e", "f", "g", "h"], [""] * 8], REFS)
    rng = np.random.default_rng(0)
    rows = stats.reshape(-1, 10)  # 4 systems x 8 sentences
    summed = np.concatenate([rng.integers(0, 3, size=(30, len(rows))) @ rows, stats.sum(1)])
    ours = bleu_from_statistics(summed)
    theirs = [BLEU()._compute_score_from_stats(list(s)).score for s in summed]
    assert ours == pytest.approx(theirs, abs=1e-9)


@pytest.mark.parametrize("metric", ["accuracy", "f1", "mcc", "pearson", "spearman"])
def test_pooled_metric_is_glue_metrics_on_the_concatenation(metric):
    from user_dir.common.glue_metrics import METRIC_FUNCTIONS

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, size=40) if metric not in ("pearson", "spearman") else rng.normal(size=40)
    a = [rng.integers(0, 2, size=40) if metric not in ("pearson", "spearman") else gold + rng.normal(size=40)
         for _ in range(2)]
    b = [np.zeros(40, dtype=int), a[1]]  # seed 1 of B degenerate: no positive prediction (F1 0, MCC 0)
    r = paired_glue(a, b, gold, metric, n_resamples=50)
    assert r["a"] == pytest.approx(METRIC_FUNCTIONS[metric](np.concatenate(a), np.concatenate([gold, gold])))
    assert r["per_seed"][0] == pytest.approx(METRIC_FUNCTIONS[metric](a[0], gold) - METRIC_FUNCTIONS[metric](b[0], gold))


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="seeds"):
        paired_glue([[1, 0]], [[1, 0], [0, 1]], [1, 0], "f1")
    with pytest.raises(ValueError, match="metric"):
        paired_glue([[1, 0]], [[1, 0]], [1, 0], "bleu")
    with pytest.raises(ValueError, match="seed 0"):
        paired_bleu([REFS[:3]], [B_HYPS], REFS)


def test_pack_round_trip():
    assert unpack(pack({"a": [REFS, B_HYPS]})) == {"a": [REFS, B_HYPS]}


def test_command_line_takes_one_file_per_seed(tmp_path):
    from conftest import run_cli

    for name, lines in (("a1", REFS), ("a2", REFS), ("b1", B_HYPS), ("b2", REFS[:4] + B_HYPS[4:]), ("refs", REFS)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    out = run_cli("user_dir.tools.significance", "bleu", "--refs", tmp_path / "refs", "--a", tmp_path / "a1",
                  tmp_path / "a2", "--b", tmp_path / "b1", tmp_path / "b2", "--samples", "200", "--json").stdout
    result = json.loads(out)
    assert {"low", "high", "p"} <= result.keys() and result["seeds"] == 2 and len(result["per_seed"]) == 2
    assert result["a"] == pytest.approx(100.0) and result["verdict"] == "A better"
    bad = run_cli("user_dir.tools.significance", "bleu", "--refs", tmp_path / "refs", "--a", tmp_path / "a1",
                  "--b", tmp_path / "missing", check=False)
    assert bad.returncode != 0 and "--b" in bad.stderr and "missing" in bad.stderr


# ---- the one verdict rule (significance.claim_verdict), each branch ------------------------------------------------
def _result(diff, low, high, per_seed, p, **extra):
    return dict(diff=diff, low=low, high=high, per_seed=per_seed, p=p, **extra)


def test_the_rule_for_a_claim_that_a_beats_b():
    from user_dir.common.significance import claim_verdict

    assert claim_verdict(_result(1.0, 0.4, 1.6, [0.8, 1.1, 0.9], 0.001)) == "reproduced"
    assert claim_verdict(_result(1.0, 0.4, 1.6, [0.8, 1.1, 0.9], 0.001), p=0.2) == "inconclusive"  # Holm p too large
    assert claim_verdict(_result(1.0, 0.4, 1.6, [0.8, -0.1, 0.9], 0.001)) == "inconclusive"  # a seed on the other side
    assert claim_verdict(_result(-1.0, -1.6, -0.4, [-0.8, -1.1, -0.9], 0.001)) == "not reproduced"
    assert claim_verdict(_result(-1.0, -1.6, -0.4, [-0.8, -1.1, -0.9], 0.3)) == "inconclusive"


def test_a_drop_bound_needs_its_p_too():
    """'A - B > -2' with the interval and every seed above -2 but the bound's own (Holm) p large: not a verdict."""
    from user_dir.common.significance import claim_verdict

    drop = _result(-0.5, -1.9, 0.8, [-0.4, -0.7, -0.3], 0.5, threshold_p=0.04)
    assert claim_verdict(drop, -2.0, p=0.04) == "reproduced"
    assert claim_verdict(drop, -2.0, p=0.12) == "inconclusive"
    below = _result(-3.0, -3.8, -2.3, [-2.9, -3.2, -3.1], 0.001)
    assert claim_verdict(below, -2.0, p=0.9) == "not reproduced"  # the interval itself is the test below the bound


def test_parity_needs_equivalence_and_its_p_and_is_refuted_only_on_one_side():
    from user_dir.common.significance import claim_verdict

    same = _result(0.1, -0.5, 0.7, [0.2, -0.1, 0.3], 0.7, equivalent=True)
    assert claim_verdict(same, kind="parity", margin=1.0, p=0.01) == "reproduced"
    assert claim_verdict(same, kind="parity", margin=1.0, p=0.2) == "inconclusive"
    apart = _result(2.0, 1.3, 2.8, [1.8, 2.2, 1.5], 0.001, equivalent=False)
    assert claim_verdict(apart, kind="parity", margin=1.0, p=0.9) == "not reproduced"
    # seeds beyond the margin but on both sides: no seed-consistent difference, so not a refutation
    split = _result(1.6, 1.1, 2.1, [3.0, -1.5, 3.3], 0.01, equivalent=False)
    assert claim_verdict(split, kind="parity", margin=1.0, p=0.9) == "inconclusive"


def test_a_ratio_claim_reads_its_interval_and_every_seed():
    from user_dir.common.significance import claim_verdict

    assert claim_verdict(dict(low=0.97, high=1.02, per_seed=[0.98, 1.0, 0.99]), kind="ratio", ratio=0.96) == "reproduced"
    assert claim_verdict(dict(low=0.9, high=0.95, per_seed=[0.92, 0.93, 0.94]), kind="ratio", ratio=0.96) == \
        "not reproduced"
    assert claim_verdict(dict(low=0.95, high=1.0, per_seed=[0.97, 0.98, 0.95]), kind="ratio", ratio=0.96) == \
        "inconclusive"


def test_the_detectable_difference_is_the_larger_of_the_interval_and_the_seeds_parts():
    from scipy.stats import norm
    from user_dir.common.significance import detectable_difference

    d = detectable_difference(0.5, 1.0, 3)
    assert d["interval_part"] == pytest.approx((norm.ppf(0.975) + norm.ppf(0.8)) * 0.5)
    # every one of 3 seeds on the true difference's side with probability 0.8: Phi(d / sd)^3 = 0.8
    assert norm.cdf(d["seeds_part"] / 1.0) ** 3 == pytest.approx(0.8)
    assert d["detectable"] == max(d["interval_part"], d["seeds_part"])
    # the rule wants every seed on one side: with more seeds (at the same interval) that alone needs a larger difference
    assert detectable_difference(0.5, 1.0, 5)["seeds_part"] > d["seeds_part"]
