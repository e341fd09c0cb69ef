"""Is variant A better than variant B, or is the difference noise? Paired tests over test examples.

Both functions compare two systems on the same examples and return the difference A - B, its 95%
interval and a two-sided p-value, over *(seed, example)* units: with k seeds per variant, seed i of A
is paired with seed i of B and the k outputs are concatenated (references / labels repeated), so the
test resamples examples of every seed alike. The seed-to-seed spread is reported beside the test by
the benchmarks (mean, spread, each seed); the test itself answers "would other test sentences give the
same sign?".

* :func:`paired_bleu`: sacrebleu's paired bootstrap resampling (``sacrebleu.significance.PairedTest``,
  ``test_type="bs"``, Koehn 2004; the Moses script's behaviour) gives the p-value. sacrebleu reports
  each system's interval, not the difference's: the interval of A - B is computed from the same
  resamples (the same seed draws the same indices, as sacrebleu's own ``_paired_bs_test`` does) on
  sacrebleu's sentence-level BLEU sufficient statistics, summed per resample into corpus BLEU. Note that
  sacrebleu's p counts only resamples *strictly* beyond the observed difference (after multeval), so two
  identical systems get the smallest p (1 / (n + 1)), not 1: :func:`verdict` therefore also asks the
  interval to exclude 0, which an identical pair's [0, 0] never does.
* :func:`paired_glue`: ``scipy.stats.bootstrap(paired=True)`` for the interval of metric(A) -
  metric(B) (percentile method) and ``scipy.stats.permutation_test(permutation_type="samples")``
  for p (under H0 the two systems' predictions on an example are exchangeable). Metrics: accuracy,
  F1, Matthews, Pearson, Spearman (percentages, glue_metrics.py).
"""
from typing import Dict, List, Sequence

import numpy as np

from .glue_metrics import METRIC_FUNCTIONS


def _concat_seeds(hyps_a: Sequence[Sequence], hyps_b: Sequence[Sequence], refs: Sequence, what: str):
    if not hyps_a or len(hyps_a) != len(hyps_b):
        raise ValueError(f"{what}: A has {len(hyps_a)} seeds' outputs and B {len(hyps_b)}; pair them seed by seed")
    for i, (a, b) in enumerate(zip(hyps_a, hyps_b)):
        if not len(a) == len(b) == len(refs):
            raise ValueError(f"{what}: seed {i}: A has {len(a)} outputs, B {len(b)}, the references {len(refs)}")
    return ([x for a in hyps_a for x in a], [x for b in hyps_b for x in b], [r for _ in hyps_a for r in refs])


def paired_bleu(hyps_a: List[List[str]], hyps_b: List[List[str]], refs: List[str], n_samples: int = 1000,
                seed: int = 12345, tokenize: str = "13a") -> Dict[str, float]:
    """BLEU(A) - BLEU(B) with sacrebleu's paired bootstrap: ``dict(a, b, diff, low, high, p, n)``.

    ``hyps_a`` / ``hyps_b``: one list of detokenised hypotheses per seed (same seed order), each in
    the order of ``refs``."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    a, b, r = _concat_seeds(hyps_a, hyps_b, refs, "paired_bleu")
    metric = BLEU(tokenize=tokenize)
    test = PairedTest([("B", b), ("A", a)], {"BLEU": metric}, [r], test_type="bs", n_samples=n_samples)
    test._seed = seed  # PairedTest reads SACREBLEU_SEED; the argument wins, so both halves draw the same indices
    _, scores = test()
    base, system = scores["BLEU"]
    # the interval of the difference, on the resamples sacrebleu drew (its _paired_bs_test: same rng, same call)
    idxs = np.random.default_rng(seed).choice(len(a), size=(n_samples, len(a)), replace=True)
    stats_a = np.array(metric._extract_corpus_statistics(a, [r]), dtype="float32")
    stats_b = np.array(metric._extract_corpus_statistics(b, [r]), dtype="float32")
    diffs = np.array([metric._compute_score_from_stats(sa.sum(0)).score - metric._compute_score_from_stats(sb.sum(0)).score
                      for sa, sb in zip(stats_a[idxs], stats_b[idxs])])
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"a": system.score, "b": base.score, "diff": system.score - base.score, "low": float(low),
            "high": float(high), "p": float(system.p_value), "n": len(a)}


def paired_glue(preds_a: List[Sequence], preds_b: List[Sequence], labels: Sequence, metric: str,
                n_resamples: int = 10000, seed: int = 12345) -> Dict[str, float]:
    """metric(A) - metric(B) on GLUE predictions: ``dict(a, b, diff, low, high, p, n)``.

    ``preds_a`` / ``preds_b``: one list of predictions per seed (same seed order), in the order of
    ``labels``; ``metric``: accuracy, f1, mcc, pearson or spearman."""
    from scipy import stats

    if metric not in METRIC_FUNCTIONS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(METRIC_FUNCTIONS)}")
    a, b, y = (np.asarray(x) for x in _concat_seeds(preds_a, preds_b, labels, "paired_glue"))
    score = METRIC_FUNCTIONS[metric]

    def difference(pa, pb, gold=y):
        return score(pa, gold) - score(pb, gold)

    rng = np.random.default_rng(seed)
    if metric in COUNT_METRICS:  # vectorised over resamples: seconds instead of minutes on a dev set x seeds
        batched = COUNT_METRICS[metric]
        ci = stats.bootstrap((a, b, y), lambda pa, pb, gold, axis=-1: batched(pa, gold) - batched(pb, gold),
                             paired=True, vectorized=True, n_resamples=n_resamples, confidence_level=0.95,
                             method="percentile", random_state=rng)
        test = stats.permutation_test((a, b), lambda pa, pb, axis=-1: batched(pa, y) - batched(pb, y),
                                      permutation_type="samples", vectorized=True, n_resamples=n_resamples,
                                      alternative="two-sided", random_state=rng)
    else:
        ci = stats.bootstrap((a, b, y), lambda pa, pb, gold: difference(pa, pb, gold), paired=True, vectorized=False,
                             n_resamples=n_resamples, confidence_level=0.95, method="percentile", random_state=rng)
        test = stats.permutation_test((a, b), lambda pa, pb: difference(pa, pb), permutation_type="samples",
                                      vectorized=False, n_resamples=n_resamples, alternative="two-sided",
                                      random_state=rng)
    return {"a": score(a, y), "b": score(b, y), "diff": difference(a, b), "low": float(ci.confidence_interval.low),
            "high": float(ci.confidence_interval.high), "p": float(test.pvalue), "n": len(y)}


def _counts(pred, gold):
    """Confusion counts (tp, fp, fn, tn) of binary predictions along the last axis (broadcast over the rest)."""
    pred, gold = np.asarray(pred) == 1, np.broadcast_to(np.asarray(gold) == 1, np.shape(pred))
    return ((pred & gold).sum(-1), (pred & ~gold).sum(-1), (~pred & gold).sum(-1), (~pred & ~gold).sum(-1))


def _accuracy(pred, gold):
    return 100.0 * (np.asarray(pred) == np.asarray(gold)).mean(-1)


def _f1(pred, gold):
    tp, fp, fn, _ = _counts(pred, gold)
    return 100.0 * np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros(np.shape(tp)), where=(2 * tp + fp + fn) > 0)


def _mcc(pred, gold):
    tp, fp, fn, tn = (c.astype(float) for c in _counts(pred, gold))
    den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 100.0 * np.divide(tp * tn - fp * fn, den, out=np.zeros(np.shape(den)), where=den > 0)


# batched forms of glue_metrics' accuracy / F1 / Matthews (binary tasks; equal to them, tested): the metric on
# every resample at once, which scipy's vectorised bootstrap and permutation test call with a batch axis
COUNT_METRICS = {"accuracy": _accuracy, "f1": _f1, "mcc": _mcc}


def verdict(result: Dict[str, float], alpha: float = 0.05) -> str:
    """'A better' / 'B better' when p < alpha and the interval excludes 0, else 'inconclusive'."""
    if result["p"] < alpha and (result["low"] > 0 or result["high"] < 0):
        return "A better" if result["diff"] > 0 else "B better"
    return "inconclusive"
