"""GLUE metrics (Wang et al. 2019, Table 1) and a criterion that reports the right one per task.

Pure functions (:func:`accuracy`, :func:`f1`, :func:`matthews_corrcoef`, :func:`pearson`,
:func:`spearman`, :func:`glue_score`) serve offline evaluation (the measurement command, test-set
predictions). During training, ``--criterion glue_sentence_prediction --glue-task TASK`` switches on
the matching reports of fairseq's ``sentence_prediction`` criterion (which aggregates predictions
over the whole validation set), so ``--best-checkpoint-metric`` can be set to the task's metric:

| task | metrics | --best-checkpoint-metric |
| --- | --- | --- |
| CoLA | Matthews correlation | mcc |
| SST-2, QNLI, RTE, WNLI | accuracy | accuracy |
| MRPC, QQP | F1 and accuracy | f1 (or acc_and_f1) |
| STS-B | Pearson and Spearman (regression) | pearson_and_spearman |
| MNLI | accuracy, matched and mismatched | accuracy (reported on ``dev``, matched, and ``dev1``, mismatched; chosen on the held-out ``valid``: preprocess/prepare_glue.py) |

Use ``--maximize-best-checkpoint-metric`` with all of these.
"""
import warnings
from dataclasses import dataclass, field
from typing import Dict, Sequence

import numpy as np
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score
from sklearn.metrics import matthews_corrcoef as sklearn_matthews_corrcoef

GLUE_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")
TASK_METRICS = {
    "CoLA": ("mcc",), "SST-2": ("accuracy",), "MRPC": ("f1", "accuracy"), "STS-B": ("pearson", "spearman"),
    "QQP": ("f1", "accuracy"), "MNLI": ("accuracy",), "QNLI": ("accuracy",), "RTE": ("accuracy",),
    "WNLI": ("accuracy",),
}
BEST_CHECKPOINT_METRIC = {
    "CoLA": "mcc", "MRPC": "f1", "QQP": "f1", "STS-B": "pearson_and_spearman",
}


def _arrays(preds, labels):
    p, l = np.asarray(preds), np.asarray(labels)
    if p.shape != l.shape or p.ndim != 1:
        raise ValueError(f"predictions {p.shape} and labels {l.shape} must be 1-D and of one length")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, l


# Each metric is scikit-learn's or scipy's (the libraries fairseq's sentence_prediction criterion scores
# with), scaled to percent; a metric that is undefined (no positive prediction or label for F1, a
# constant input for a correlation) is 0, not nan, so a degenerate model ranks last instead of
# poisoning a comparison.
def accuracy(preds: Sequence, labels: Sequence) -> float:
    p, l = _arrays(preds, labels)
    return 100.0 * float(accuracy_score(l, p))


def f1(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC/QQP convention), in percent (sklearn's f1_score)."""
    p, l = _arrays(preds, labels)
    return 100.0 * float(f1_score(l, p, pos_label=positive, average="binary", zero_division=0))


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation in percent (sklearn's; CoLA's metric, defined for any number of classes)."""
    p, l = _arrays(preds, labels)
    return 100.0 * float(sklearn_matthews_corrcoef(l, p))


def _correlation(function, preds, labels) -> float:
    p, l = _arrays(preds, labels)
    with warnings.catch_warnings():  # scipy warns, and returns nan, on a constant input
        warnings.simplefilter("ignore")
        r = float(function(p.astype(np.float64), l.astype(np.float64))[0])
    return 0.0 if np.isnan(r) else 100.0 * r


def pearson(preds: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson's r in percent (scipy.stats.pearsonr)."""
    return _correlation(pearsonr, preds, labels)


def spearman(preds: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman's rho in percent (scipy.stats.spearmanr: ties share their mean rank)."""
    return _correlation(spearmanr, preds, labels)


METRIC_FUNCTIONS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson,
                    "spearman": spearman}


def glue_score(task: str, preds: Sequence, labels: Sequence) -> Dict[str, float]:
    """Every metric GLUE reports for ``task`` (percentages)."""
    if task not in TASK_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(GLUE_TASKS)}")
    return {name: METRIC_FUNCTIONS[name](preds, labels) for name in TASK_METRICS[task]}


@dataclass
class GlueSentencePredictionConfig(SentencePredictionConfig):
    glue_task: str = field(
        default="SST-2",
        metadata={"help": "GLUE task whose metrics are reported at validation: " + ", ".join(GLUE_TASKS)},
    )


@register_criterion("glue_sentence_prediction", dataclass=GlueSentencePredictionConfig)
class GlueSentencePredictionCriterion(SentencePredictionCriterion):
    """fairseq's ``sentence_prediction`` with the reports that ``--glue-task`` calls for."""

    def __init__(self, cfg: GlueSentencePredictionConfig, task):
        if cfg.glue_task not in TASK_METRICS:
            raise ValueError(f"--glue-task {cfg.glue_task!r}: expected one of {', '.join(GLUE_TASKS)}")
        metrics = TASK_METRICS[cfg.glue_task]
        cfg.report_mcc = cfg.report_mcc or "mcc" in metrics
        cfg.report_acc_and_f1 = cfg.report_acc_and_f1 or "f1" in metrics
        cfg.report_pearson_and_spearman = cfg.report_pearson_and_spearman or "pearson" in metrics
        if cfg.glue_task == "STS-B" and not cfg.regression_target:
            raise ValueError("--glue-task STS-B is a regression task: add --regression-target (and --num-classes 1)")
        super().__init__(cfg, task)
