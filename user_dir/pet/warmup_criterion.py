"""``--criterion pet_warmup``: PET's warm-up on the simplified four-class task (Jeon et al. 2023,
"Warming up with a simplified task", Table 5, eqs 2-4; the naive mappings of Table 10).

For every non-padding target token, the frozen teacher (``--teacher-path``) assigns one of the four
classes of Table 5 with thresholds ``--eps1``/``--eps2``; the student is trained to predict that
class by maximum likelihood. ``--warmup-mapping`` chooses how the student gets four probabilities:

* ``pet`` (the paper's method): mapped from its own vocabulary distribution (eqs 2-4,
  simplified_task.py); no parameter is added, so KD continues from exactly this model.
* ``output-layer`` (Table 10, naive 1): a 4-way output layer on the decoder features replaces
  the vocabulary projection during warm-up and is discarded for KD.
* ``projection`` (Table 10, naive 2): an extra linear layer maps the vocabulary logits to 4
  classes during warm-up and is discarded for KD.
The naive layers live in this criterion (fairseq optimises a criterion's parameters too), so the
student checkpoint keeps its original structure in every case.

Defaults ``--eps1 0.5 --eps2 0.5``: the paper does not give its thresholds. 0.5 is the one value at
which "confident" has a model-free meaning (the top token is more likely than all others
together). The class shares are logged as ``cls0``..``cls3`` at every update and validation, so a
user sees at once whether a teacher and thresholds give degenerate labels (with the Multi30k
reference teacher all four classes are well populated).
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from ..common.distributed_support import check_ddp_backend, check_tpu
from ..common.teacher import load_frozen_teacher
from .simplified_task import NUM_CLASSES, student_class_lprobs, teacher_labels

WARMUP_MAPPINGS = ChoiceEnum(["pet", "output-layer", "projection"])


@dataclass
class PETWarmupConfig(FairseqDataclass):
    teacher_path: Optional[str] = field(default=None, metadata={"help": "fairseq checkpoint of the teacher"})
    eps1: float = field(default=0.5, metadata={
        "help": "PET Table 5 eps1: a correct teacher prediction with max prob >= eps1 is 'confidently correct' (default 0.5)"})
    eps2: float = field(default=0.5, metadata={
        "help": "PET Table 5 eps2: a wrong teacher prediction with max prob >= eps2 is 'confidently wrong' (default 0.5)"})
    warmup_mapping: WARMUP_MAPPINGS = field(default="pet", metadata={
        "help": "how the student gets 4 class probabilities: pet (eqs 2-4, the paper's), output-layer or "
                "projection (the naive mappings of PET Table 10)"})
    decoder_embed_dim: int = II("model.decoder_embed_dim")
    sentence_avg: bool = II("optimization.sentence_avg")
    ddp_backend: str = II("distributed_training.ddp_backend")
    tpu: bool = II("common.tpu")
    bf16: bool = II("common.bf16")


@register_criterion("pet_warmup", dataclass=PETWarmupConfig)
class PETWarmupCriterion(FairseqCriterion):
    def __init__(self, cfg: PETWarmupConfig, task):
        super().__init__(task)
        check_ddp_backend(cfg.ddp_backend, "--criterion pet_warmup")
        check_tpu(getattr(cfg, "tpu", None), getattr(cfg, "bf16", None), "--criterion pet_warmup", task)
        if not (0.0 <= cfg.eps1 <= 1.0 and 0.0 <= cfg.eps2 <= 1.0):
            raise ValueError(f"--eps1 {cfg.eps1} / --eps2 {cfg.eps2}: thresholds are probabilities in [0, 1]")
        self.eps1, self.eps2, self.mapping = cfg.eps1, cfg.eps2, str(cfg.warmup_mapping)
        self.sentence_avg = cfg.sentence_avg
        self.teacher = load_frozen_teacher(cfg.teacher_path, task, flag="--teacher-path")
        self.head: Optional[nn.Module] = None
        if self.mapping == "output-layer":
            self.head = nn.Linear(cfg.decoder_embed_dim, NUM_CLASSES)
        elif self.mapping == "projection":
            self.head = nn.Linear(len(task.target_dictionary), NUM_CLASSES)

    def class_lprobs(self, model, sample):
        if self.mapping == "output-layer":
            features, _ = model(**sample["net_input"], features_only=True)
            return F.log_softmax(self.head(features).float(), dim=-1)
        net_output = model(**sample["net_input"])
        if self.mapping == "projection":
            return F.log_softmax(self.head(net_output[0]).float(), dim=-1)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        return student_class_lprobs(lprobs, sample["target"])

    def forward(self, model, sample, reduce=True):
        target = sample["target"]
        pad = target.eq(self.padding_idx)
        with torch.no_grad():
            reference = next(model.parameters())
            teacher_out = self.teacher(reference, **sample["net_input"])
            teacher_lprobs = self.teacher.model.get_normalized_probs(teacher_out, log_probs=True)
            labels = teacher_labels(teacher_lprobs, target, self.eps1, self.eps2)
        lprobs = self.class_lprobs(model, sample)
        keep = ~pad
        nll = -lprobs[keep].gather(-1, labels[keep].unsqueeze(-1)).squeeze(-1)
        loss = nll.sum() if reduce else nll
        sample_size = target.size(0) if self.sentence_avg else sample["ntokens"]
        counts = torch.bincount(labels[keep], minlength=NUM_CLASSES)
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": target.size(0),
                          "sample_size": sample_size, "n_labels": int(keep.sum()),
                          "n_correct": int((lprobs[keep].argmax(-1) == labels[keep]).sum())}
        for c in range(NUM_CLASSES):
            logging_output[f"cls{c}"] = int(counts[c])
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        n_labels = sum(log.get("n_labels", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        if n_labels:
            metrics.log_scalar("class_acc", 100.0 * sum(log.get("n_correct", 0) for log in logging_outputs) / n_labels,
                               n_labels, round=1)
            for c in range(NUM_CLASSES):
                share = sum(log.get(f"cls{c}", 0) for log in logging_outputs) / n_labels
                metrics.log_scalar(f"cls{c}", share, n_labels, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
