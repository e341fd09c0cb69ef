"""Is variant A better than variant B, or the same, or is the difference noise? Paired tests over test examples.

Every test here compares two systems on the same test examples, each run with the same k seeds (seed i of A
paired with seed i of B), and treats a **test example as one cluster**: the k seeds' outputs of an example
(of both systems) always travel together. One test sentence therefore counts once however many seeds ran
(issue 44: resampling the k x n (seed, example) units independently made every interval up to sqrt(k) too
narrow).

The statistic
    The metric is pooled over the seeds: BLEU is sacreBLEU's corpus BLEU over all seeds' hypotheses of the
    (drawn) sentences, summed from sacreBLEU's own sufficient statistics; a GLUE metric (accuracy, F1,
    Matthews, Pearson, Spearman) is computed over the (drawn) examples of all seeds pooled (F1 and Matthews
    from the pooled confusion counts, Pearson from pooled moments). Pooling, rather than the mean over seeds
    of each seed's metric, is the one definition that is the same for BLEU (a corpus metric, not a mean of
    sentence scores) and GLUE; for accuracy both are equal. ``diff`` = metric(A) - metric(B).

The interval (:func:`cluster_test`, ``low`` / ``high``, and ``low90`` / ``high90``)
    A percentile bootstrap over example clusters: each resample draws n example indices with replacement
    (one draw, as a count per example) and applies it to every seed of both systems; the sufficient
    statistics are summed per resample with one matrix product, so 1,000-10,000 resamples take seconds.

The p-value: one two-sided convention for BLEU and GLUE
    A paired sign-flip (permutation) test over example clusters: under H0 (A and B exchangeable) swapping
    A's and B's outputs of an example, on every seed at once, changes nothing; each resample swaps a random
    half-probability set of examples and p = (1 + #{|d*| >= |d|}) / (1 + R), counting both tails (the +1
    correction keeps p > 0 for a finite R). Two identical systems give d* = 0 = d on every resample, so
    p = 1. (sacreBLEU's own paired-bootstrap p counts one side only, beyond the observed difference, and is
    not used.)

Seeds
    Beside the cluster test every result reports each seed's own difference (``per_seed``: metric(A_i) -
    metric(B_i) on all examples), their mean and sample std. The cluster interval holds the seeds fixed, so
    seed-to-seed variance is not in it; with the k = 3 seeds the tables run, a seed-level interval is too
    coarse to help (a t interval on 2 degrees of freedom is +-4.3 standard errors; a hierarchical bootstrap
    of 3 seeds sees only 10 distinct seed multisets). **The verdict therefore requires both** (:func:`verdict`,
    :func:`claim_verdict`): the cluster interval (and p) on one side of the threshold *and* every seed's own
    difference on that same side. When they disagree the verdict is "inconclusive": the seeds then say
    that another seed could reverse what the examples' interval says.

Equivalence ("on par with"), :func:`cluster_test` with ``margin``
    Two one-sided tests (TOST) at level 0.05 against a stated margin m, by the bootstrap: ``tost_p`` =
    max(P*(d* <= -m), P*(d* >= m)) with the +1 correction, and ``equivalent`` when the 90% interval lies
    inside (-m, m) (the same decision) and every seed's difference does too.

Retention ("retains about 97% of the teacher"), :func:`retention`
    metric(A) / metric(teacher) with its cluster-bootstrap percentile interval (the same draws for both).

A table of claims is corrected for testing many rows at once with :func:`holm` (Holm 1979, step-down),
shown beside the raw p.
"""
import base64
import json
import lzma
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

# ---- sufficient statistics: additive per (seed, example) --------------------------------------------------


def bleu_statistics(hyps: Sequence[Sequence[str]], refs: Sequence[str], tokenize: str = "13a") -> np.ndarray:
    """sacreBLEU's sentence statistics (hyp length, ref length, 4 matches, 4 totals) as ``(seeds, n, 10)``."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(tokenize=tokenize)
    return np.array([metric._extract_corpus_statistics(list(h), [list(refs)]) for h in hyps], dtype=np.float64)


def bleu_from_statistics(stats: np.ndarray) -> np.ndarray:
    """Corpus BLEU from summed statistics ``(..., 10)``, vectorised: sacreBLEU's ``compute_bleu`` (smoothing
    'exp', no effective order), equal to it to float precision (tested)."""
    stats = np.asarray(stats, dtype=np.float64)
    sys_len, ref_len = stats[..., 0], stats[..., 1]
    correct, total = stats[..., 2:6], stats[..., 6:10]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len >= ref_len, 1.0, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0))
        # 'exp' smoothing: the j-th order without a match gets 100 / (2^j * total)
        zero = correct == 0
        smooth = 2.0 ** np.cumsum(zero, axis=-1)
        prec = np.where(zero, 100.0 / (smooth * total), 100.0 * correct / total)
        log_prec = np.where(total > 0, np.log(np.where(prec > 0, prec, 1.0)), -np.inf)
        score = bp * np.exp(log_prec.sum(-1) / 4)
    # sacreBLEU: no match at all, or an order without n-grams (its early break leaves a 0 precision): 0
    return np.where((correct.sum(-1) == 0) | (total == 0).any(-1), 0.0, np.nan_to_num(score))


def _glue_stats(preds, labels, metric):
    p, y = np.asarray(preds, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    y = np.broadcast_to(y, p.shape)
    if metric == "accuracy":
        return np.stack([p == y, np.ones_like(p)], -1).astype(np.float64)
    if metric in ("f1", "mcc"):
        pp, yy = p == 1, y == 1
        return np.stack([pp & yy, pp & ~yy, ~pp & yy, ~pp & ~yy], -1).astype(np.float64)
    if metric == "pearson":
        return np.stack([np.ones_like(p), p, y, p * p, y * y, p * y], -1)
    return np.stack([p, y], -1)  # spearman: the raw pairs (ranks are not additive)


def _accuracy(s):
    return 100.0 * s[..., 0] / s[..., 1]


def _f1(s):
    tp, fp, fn = s[..., 0], s[..., 1], s[..., 2]
    den = 2 * tp + fp + fn
    return 100.0 * np.divide(2 * tp, den, out=np.zeros(np.shape(den)), where=den > 0)


def _mcc(s):
    tp, fp, fn, tn = s[..., 0], s[..., 1], s[..., 2], s[..., 3]
    den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 100.0 * np.divide(tp * tn - fp * fn, den, out=np.zeros(np.shape(den)), where=den > 0)


def _pearson(s):
    n, x, y, xx, yy, xy = (s[..., i] for i in range(6))
    den = np.sqrt(np.maximum(n * xx - x * x, 0) * np.maximum(n * yy - y * y, 0))
    return 100.0 * np.divide(n * xy - x * y, den, out=np.zeros(np.shape(den)), where=den > 1e-12)


def _spearman_pooled(pairs):
    """Spearman over the pooled (prediction, label) pairs ``(m, 2)`` (glue_metrics' definition)."""
    from .glue_metrics import spearman

    return spearman(pairs[:, 0], pairs[:, 1])


# metric -> score of summed statistics (additive) ; spearman is scored on the pooled pairs instead
ADDITIVE = {"bleu": bleu_from_statistics, "accuracy": _accuracy, "f1": _f1, "mcc": _mcc, "pearson": _pearson}
GLUE_METRICS = ("accuracy", "f1", "mcc", "pearson", "spearman")


def glue_statistics(preds: Sequence[Sequence], labels: Sequence, metric: str) -> np.ndarray:
    """Per (seed, example) statistics of a GLUE metric, ``(seeds, n, d)``."""
    if metric not in GLUE_METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(GLUE_METRICS)}")
    return _glue_stats(preds, labels, metric)


# ---- scoring resamples -----------------------------------------------------------------------------------


def _score_fn(metric: str) -> Callable:
    """``score(stats (k, n, d), weights (R, n) or None) -> (R,) or scalar``: the pooled metric of each
    resample, examples weighted by how often the resample drew them (all seeds alike)."""
    if metric in ADDITIVE:
        final = ADDITIVE[metric]

        def score(stats, weights=None):
            per_example = stats.sum(0)  # (n, d): every seed of an example together
            return final(per_example.sum(0) if weights is None else weights @ per_example)
        return score

    def score_pooled(stats, weights=None):
        if weights is None:
            return _spearman_pooled(stats.reshape(-1, stats.shape[-1]))
        out = np.empty(len(weights))
        for r, w in enumerate(weights):
            idx = np.repeat(np.arange(stats.shape[1]), w.astype(int))
            out[r] = _spearman_pooled(stats[:, idx].reshape(-1, stats.shape[-1]))
        return out
    return score_pooled


def _draw_counts(rng, n, n_resamples):
    """Each resample's count of each example (n draws with replacement): ``(R, n)``."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples).astype(np.float64)


def _check_pairs(stats_a, stats_b, what):
    if stats_a.shape[0] == 0 or stats_a.shape[0] != stats_b.shape[0]:
        raise ValueError(f"{what}: A has {stats_a.shape[0]} seeds' outputs and B {stats_b.shape[0]}; "
                         "pair them seed by seed")


def cluster_test(stats_a: np.ndarray, stats_b: np.ndarray, metric: str, n_resamples: int = 10000,
                 seed: int = 12345, margin: Optional[float] = None, threshold: Optional[float] = None) -> Dict:
    """metric(A) - metric(B) over example clusters (the module docstring): ``dict(a, b, diff, low, high,
    low90, high90, p, n, seeds, per_seed, per_seed_mean, per_seed_std, resamples)``; with ``margin`` also
    ``margin, tost_p, equivalent``; with ``threshold`` also ``threshold_p``, the one-sided bootstrap p of
    "A - B > threshold" (a drop bound: (1 + #{d* <= threshold}) / (1 + R), from the interval's draws). ``stats_*``: ``(seeds, n, d)`` from :func:`bleu_statistics` /
    :func:`glue_statistics` (the metric's name: 'bleu' or a GLUE metric)."""
    _check_pairs(stats_a, stats_b, f"the {metric} test")
    score = _score_fn(metric)
    k, n = stats_a.shape[:2]
    a, b = float(score(stats_a)), float(score(stats_b))
    diff = a - b
    per_seed = [float(score(stats_a[i:i + 1]) - score(stats_b[i:i + 1])) for i in range(k)]
    rng = np.random.default_rng(seed)
    counts = _draw_counts(rng, n, n_resamples)
    boot = score(stats_a, counts) - score(stats_b, counts)
    low, high = np.percentile(boot, [2.5, 97.5])
    low90, high90 = np.percentile(boot, [5, 95])
    # sign flips: swap A's and B's outputs of the examples where swap = 1, on every seed
    swap = rng.integers(0, 2, size=(n_resamples, n)).astype(np.float64)
    keep = 1.0 - swap
    if metric in ADDITIVE:
        final = ADDITIVE[metric]
        ea, eb = stats_a.sum(0), stats_b.sum(0)
        flipped = final(keep @ ea + swap @ eb) - final(keep @ eb + swap @ ea)
    else:
        flipped = np.array([float(score(np.where(s[None, :, None] > 0, stats_b, stats_a))
                                  - score(np.where(s[None, :, None] > 0, stats_a, stats_b))) for s in swap])
    tol = 1e-9 * max(1.0, abs(diff))
    p = (1 + int(np.sum(np.abs(flipped) >= abs(diff) - tol))) / (1 + n_resamples)
    result = {"a": a, "b": b, "diff": diff, "low": float(low), "high": float(high), "low90": float(low90),
              "high90": float(high90), "p": float(p), "n": int(n), "seeds": int(k), "per_seed": per_seed,
              "per_seed_mean": float(np.mean(per_seed)),
              "per_seed_std": float(np.std(per_seed, ddof=1)) if k > 1 else 0.0, "resamples": int(n_resamples)}
    if margin is not None:
        result.update(equivalence(boot, per_seed, margin, low90, high90))
    if threshold is not None:
        result["threshold_p"] = (1 + int(np.sum(boot <= threshold))) / (1 + n_resamples)
    return result


def equivalence(boot, per_seed, margin: float, low90: float, high90: float) -> Dict:
    """TOST against +-``margin`` from the bootstrap differences ``boot`` (module docstring)."""
    if not margin > 0:
        raise ValueError(f"equivalence margin {margin!r}: must be > 0")
    r = len(boot)
    p_low = (1 + int(np.sum(boot <= -margin))) / (1 + r)
    p_high = (1 + int(np.sum(boot >= margin))) / (1 + r)
    inside = -margin < low90 and high90 < margin and all(-margin < d < margin for d in per_seed)
    return {"margin": float(margin), "tost_p": float(max(p_low, p_high)), "equivalent": bool(inside)}


def retention(stats_a: np.ndarray, stats_t: np.ndarray, metric: str, n_resamples: int = 10000,
              seed: int = 12345) -> Dict:
    """metric(A) / metric(teacher) pooled over seeds, with its 95% cluster-bootstrap interval:
    ``dict(ratio, low, high, per_seed, n, seeds)`` (a teacher without seeds: give its output once per seed)."""
    _check_pairs(stats_a, stats_t, f"the {metric} retention")
    score = _score_fn(metric)
    k, n = stats_a.shape[:2]
    counts = _draw_counts(np.random.default_rng(seed), n, n_resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = score(stats_a, counts) / score(stats_t, counts)
    low, high = np.nanpercentile(boot, [2.5, 97.5])
    per_seed = [float(score(stats_a[i:i + 1]) / score(stats_t[i:i + 1])) for i in range(k)]
    return {"ratio": float(score(stats_a) / score(stats_t)), "low": float(low), "high": float(high),
            "per_seed": per_seed, "n": int(n), "seeds": int(k)}


# ---- the two entry points the benchmarks and fc-significance call -----------------------------------------


def _check_lengths(outs_a, outs_b, refs, what):
    if not outs_a or len(outs_a) != len(outs_b):
        raise ValueError(f"{what}: A has {len(outs_a)} seeds' outputs and B {len(outs_b)}; pair them seed by seed")
    for i, (a, b) in enumerate(zip(outs_a, outs_b)):
        if not len(a) == len(b) == len(refs):
            raise ValueError(f"{what}: seed {i}: A has {len(a)} outputs, B {len(b)}, the references {len(refs)}")


def paired_bleu(hyps_a: List[List[str]], hyps_b: List[List[str]], refs: List[str], n_samples: int = 2000,
                seed: int = 12345, tokenize: str = "13a", margin: Optional[float] = None) -> Dict:
    """BLEU(A) - BLEU(B) by :func:`cluster_test`. ``hyps_a`` / ``hyps_b``: one list of detokenised hypotheses
    per seed (same seed order), each in the order of ``refs``; ``tokenize="none"`` for tokenised text."""
    _check_lengths(hyps_a, hyps_b, refs, "paired_bleu")
    return cluster_test(bleu_statistics(hyps_a, refs, tokenize), bleu_statistics(hyps_b, refs, tokenize), "bleu",
                        n_samples, seed, margin)


def paired_glue(preds_a: List[Sequence], preds_b: List[Sequence], labels: Sequence, metric: str,
                n_resamples: int = 10000, seed: int = 12345, margin: Optional[float] = None) -> Dict:
    """metric(A) - metric(B) on GLUE predictions by :func:`cluster_test`: one list of predictions per seed
    (same seed order), in the order of ``labels``; ``metric``: accuracy, f1, mcc, pearson or spearman."""
    if metric not in GLUE_METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {', '.join(GLUE_METRICS)}")
    _check_lengths(preds_a, preds_b, labels, "paired_glue")
    return cluster_test(glue_statistics(preds_a, labels, metric), glue_statistics(preds_b, labels, metric), metric,
                        n_resamples, seed, margin)


# ---- a table of tests -------------------------------------------------------------------------------------


def holm(ps: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: sorted ascending, the i-th
    (from 0) becomes max over j <= i of min(1, (m - j) p_(j))."""
    ps = [float(p) for p in ps]
    if any(not 0 <= p <= 1 for p in ps):
        raise ValueError(f"p-values must lie in [0, 1]: {ps}")
    m, out, running = len(ps), [0.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def claim_verdict(result: Dict, threshold: float = 0.0, alpha: float = 0.05, p: Optional[float] = None,
                  kind: str = "better", margin: Optional[float] = None, ratio: Optional[float] = None) -> str:
    """The one verdict rule of every claim (results/claims.md, the glossary and the pages say it as here).

    ``p``: the claim's own test's p, Holm-corrected by the table (default the result's raw ``p``).
    * ``kind="better"``, the claim "A - B > threshold" (a drop bound when threshold < 0): **reproduced** when the
      95% interval lies above the threshold, every seed's own difference too, and p < alpha; **not reproduced**
      when the interval and every seed lie below it (and, for threshold 0, p < alpha); else **inconclusive**.
    * ``kind="parity"``, "|A - B| < margin": **reproduced** when TOST says equivalent (the 90% interval and every
      seed inside the margin, ``result['equivalent']``) and p (TOST's) < alpha; **not reproduced** when the 95%
      interval lies beyond the margin on one side and every seed beyond it on that same side; else
      **inconclusive**.
    * ``kind="ratio"``, "A / teacher > ratio": the 95% interval of the ratio and every seed's ratio above it:
      reproduced; both below: not reproduced; else inconclusive (a retention row has no p)."""
    p = result.get("p") if p is None else p
    if kind == "ratio":
        if result["low"] > ratio and all(x > ratio for x in result["per_seed"]):
            return "reproduced"
        if result["high"] < ratio and all(x < ratio for x in result["per_seed"]):
            return "not reproduced"
        return "inconclusive"
    seeds = result.get("per_seed") or [result["diff"]]
    if kind == "parity":
        if result["equivalent"] and p < alpha:
            return "reproduced"
        above = result["low"] > margin and all(d > margin for d in seeds)
        below = result["high"] < -margin and all(d < -margin for d in seeds)
        return "not reproduced" if above or below else "inconclusive"
    if kind != "better":
        raise ValueError(f"claim kind {kind!r}: better, parity or ratio")
    if result["low"] > threshold and all(d > threshold for d in seeds) and p < alpha:
        return "reproduced"
    if result["high"] < threshold and all(d < threshold for d in seeds) and (threshold != 0 or p < alpha):
        return "not reproduced"
    return "inconclusive"


def verdict(result: Dict, alpha: float = 0.05) -> str:
    """'A better' / 'B better' when p < alpha, the 95% interval excludes 0 and every seed's difference has
    its sign; else 'inconclusive'."""
    if claim_verdict(result, 0.0, alpha) == "reproduced":
        return "A better"
    if claim_verdict(result, 0.0, alpha) == "not reproduced":
        return "B better"
    return "inconclusive"


def detectable_difference(interval_se: float, seed_sd: float, seeds: int, alpha: float = 0.05,
                          power: float = 0.8) -> Dict:
    """The smallest true difference |A - B| a row of ``seeds`` paired seeds detects with probability ``power``
    under :func:`claim_verdict`'s rule, which needs both (a) the cluster interval off the threshold and (b) every
    seed's own difference on that side:
    (a) ``(z_{1-alpha/2} + z_power) * interval_se``, the usual two-sided normal approximation, with
        ``interval_se`` the cluster bootstrap's standard error of the pooled difference (its 95% interval's width
        / 3.92);
    (b) ``seed_sd * Phi^-1(power^(1/seeds))``: k independent seed differences of spread ``seed_sd`` all share the
        sign of a true difference d with probability Phi(d / seed_sd)^k.
    Returns ``dict(detectable, interval_part, seeds_part)``; the detectable difference is the larger part."""
    from scipy.stats import norm

    if seeds < 1:
        raise ValueError(f"seeds {seeds}: at least 1")
    interval_part = (norm.ppf(1 - alpha / 2) + norm.ppf(power)) * interval_se
    seeds_part = seed_sd * norm.ppf(power ** (1.0 / seeds))
    return {"detectable": float(max(interval_part, seeds_part)), "interval_part": float(interval_part),
            "seeds_part": float(seeds_part)}


# ---- keeping per-example outputs compactly (results-side JSON) -------------------------------------------


def pack(obj) -> str:
    """A JSON-able object as base64 of its xz-compressed JSON (hypotheses of 3 seeds x 1,000 sentences: tens of kB)."""
    return base64.b64encode(lzma.compress(json.dumps(obj, separators=(",", ":")).encode("utf-8"))).decode("ascii")


def unpack(text: str):
    return json.loads(lzma.decompress(base64.b64decode(text)).decode("utf-8"))
