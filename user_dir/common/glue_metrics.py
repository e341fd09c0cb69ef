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
| MNLI | accuracy, matched and mismatched | accuracy (``--valid-subset valid,valid1``: valid is matched, valid1 mismatched) |

Use ``--maximize-best-checkpoint-metric`` with all of these.
"""
import math
from dataclasses import dataclass, field
from typing import Dict, Sequence

import numpy as np
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import SentencePredictionConfig, SentencePredictionCriterion

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


def accuracy(preds: Sequence, labels: Sequence) -> float:
    p, l = _arrays(preds, labels)
    return 100.0 * float((p == l).mean())


def f1(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC/QQP convention), in percent; 0 when undefined."""
    p, l = _arrays(preds, labels)
    tp = float(((p == positive) & (l == positive)).sum())
    fp = float(((p == positive) & (l != positive)).sum())
    fn = float(((p != positive) & (l == positive)).sum())
    return 0.0 if tp == 0 else 100.0 * 2 * tp / (2 * tp + fp + fn)


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
    """Binary Matthews correlation in percent (0 when a row or column of the confusion is empty)."""
    p, l = _arrays(preds, labels)
    tp = float(((p == 1) & (l == 1)).sum())
    tn = float(((p != 1) & (l != 1)).sum())
    fp = float(((p == 1) & (l != 1)).sum())
    fn = float(((p != 1) & (l == 1)).sum())
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else 100.0 * (tp * tn - fp * fn) / denom


def pearson(preds: Sequence[float], labels: Sequence[float]) -> float:
    p, l = _arrays(preds, labels)
    p, l = p.astype(np.float64), l.astype(np.float64)
    p, l = p - p.mean(), l - l.mean()
    denom = math.sqrt(float((p * p).sum() * (l * l).sum()))
    return 0.0 if denom == 0 else 100.0 * float((p * l).sum()) / denom


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(preds: Sequence[float], labels: Sequence[float]) -> float:
    p, l = _arrays(preds, labels)
    return pearson(_ranks(p.astype(np.float64)), _ranks(l.astype(np.float64)))


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
