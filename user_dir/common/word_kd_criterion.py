"""``--criterion kd``: word-level knowledge distillation (Hinton et al. 2015; Kim & Rush 2016),
the KD stage of PET and the baseline every compression method is compared with.

    loss = (1 - alpha) * label-smoothed CE(student, reference) + alpha * T^2 * KL(teacher^T || student^T)

summed over non-padding target tokens (kd_losses.word_kd_loss). The teacher is a fairseq
checkpoint (``--teacher-path``) loaded once, frozen, by common/teacher.py. In validation the loss
reported is the task loss alone (label-smoothed CE, and nll_loss), so validation losses and
best-checkpoint choices compare across methods and with the teacher; ``--eval-bleu`` of the
translation task reports BLEU as usual.

``--teacher-cache DIR`` (built once per teacher and data by ``python -m user_dir.tools.teacher_cache``) reads the
teacher's log-probabilities on the training set from DIR instead of running the teacher in training: the same loss
up to float16 rounding of the teacher's outputs, at any temperature (common/teacher_cache.py). ``--teacher-path`` is
still given and loaded (its dictionaries and its checkpoint's sha256 are checked against the cache) but not run. A
subclass that overrides :meth:`forward` runs the teacher itself (Patient-KD also needs its hidden states) and refuses
the flag, unless it sets ``reads_teacher_cache`` and gets the teacher's scores from :meth:`teacher_scores`.

Defaults: ``--kd-alpha 0.5``, ``--kd-temperature 1``. PET's paper trains with "conventional KD" and
fairseq's defaults without giving alpha or T; an equal mix at T = 1 is the usual word-level KD
setting (Kim & Rush 2016) and is our stated choice.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq import utils
from fairseq.criterions import CRITERION_REGISTRY, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (LabelSmoothedCrossEntropyCriterion,
                                                             LabelSmoothedCrossEntropyCriterionConfig)
from fairseq.logging import metrics
from omegaconf import II

from .distributed_support import check_ddp_backend, check_tpu
from .kd_losses import interpolated_kd_loss, word_kd_loss
from .teacher import load_frozen_teacher
from .teacher_cache import TeacherCache, TeacherCacheError


@dataclass
class WordKDConfig(LabelSmoothedCrossEntropyCriterionConfig):
    teacher_path: Optional[str] = field(
        default=None, metadata={"help": "fairseq checkpoint of the teacher (same dictionaries as the student)"})
    kd_alpha: float = field(
        default=0.5, metadata={"help": "weight of the KD term: (1-alpha)*CE + alpha*T^2*KL (default 0.5)"})
    kd_temperature: float = field(
        default=1.0, metadata={"help": "softmax temperature T of the KD term (default 1)"})
    teacher_cache: Optional[str] = field(
        default=None, metadata={"help": "folder of the teacher's cached outputs on the training subset (built by "
                                        "python -m user_dir.tools.teacher_cache for this --teacher-path and data): "
                                        "read in training instead of running the teacher; the same loss up to "
                                        "float16 rounding (default: none, the teacher runs online)"})
    ddp_backend: str = II("distributed_training.ddp_backend")
    tpu: bool = II("common.tpu")
    bf16: bool = II("common.bf16")


@register_criterion("kd", dataclass=WordKDConfig)
class WordKDCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 teacher_path=None, kd_alpha=0.5, kd_temperature=1.0, ddp_backend=None, tpu=None, bf16=None,
                 teacher_cache=None):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        check_ddp_backend(ddp_backend, "a frozen teacher's criterion (--teacher-path)")
        check_tpu(tpu, bf16, "a frozen teacher's criterion (--teacher-path)", task)
        if not 0.0 <= kd_alpha <= 1.0:
            raise ValueError(f"--kd-alpha {kd_alpha}: must lie in [0, 1]")
        if kd_temperature <= 0:
            raise ValueError(f"--kd-temperature {kd_temperature}: must be > 0")
        self.alpha, self.temperature = kd_alpha, kd_temperature
        self.teacher = load_frozen_teacher(teacher_path, task, flag="--teacher-path")
        self.teacher_cache = None
        if teacher_cache:
            self.use_teacher_cache(teacher_cache)

    # a subclass that overrides forward() and takes the teacher's scores from teacher_scores() sets this
    reads_teacher_cache = False

    @classmethod
    def build_criterion(cls, cfg, task):
        """fairseq's construction, then ``--teacher-cache`` for a subclass whose ``__init__`` does not take it."""
        criterion = super().build_criterion(cfg, task)
        directory = getattr(cfg, "teacher_cache", None)
        if directory and criterion.teacher_cache is None:
            criterion.use_teacher_cache(directory)
        return criterion

    def use_teacher_cache(self, directory: str) -> None:
        """Read the teacher's training outputs from ``directory`` (refused for another teacher or data)."""
        cls = type(self)
        if cls.forward is not WordKDCriterion.forward and not cls.reads_teacher_cache:
            name = next((k for k, v in CRITERION_REGISTRY.items() if v is cls), cls.__name__)
            raise TeacherCacheError(
                f"--teacher-cache {directory} with --criterion {name}: this criterion runs the teacher itself (its "
                "forward is its own, e.g. for the teacher's hidden states, which the cache does not hold); train it "
                "without --teacher-cache")
        cache = TeacherCache(directory)
        cache.check(self.teacher.path, self.task)
        self.teacher_cache = cache

    def teacher_scores(self, model, sample):
        """The teacher's scores over the target vocabulary, ``B x T x V`` on the student's device and dtype: its
        logits run online, or its cached log-probabilities (which differ by one constant per position; the KD loss,
        through a softmax, ignores it)."""
        reference = next(model.parameters())
        if self.teacher_cache is not None:
            return self.teacher_cache.gather(sample["id"], sample["target"], self.padding_idx, reference,
                                             sample["net_input"].get("src_lengths"))
        return self.teacher(reference, **sample["net_input"])[0]

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        task_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"nll_loss": nll_loss.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size,
                          "task_loss": task_loss.data}
        loss = task_loss
        if model.training and self.alpha > 0:
            target = model.get_targets(sample, net_output)
            kd = word_kd_loss(net_output[0], self.teacher_scores(model, sample), self.temperature,
                              pad_mask=target.eq(self.padding_idx))
            loss = interpolated_kd_loss(task_loss, kd, self.alpha)
            logging_output["kd_loss"] = kd.data
        logging_output["loss"] = loss.data
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        for key in ("kd_loss", "task_loss"):
            total = sum(log.get(key, 0) for log in logging_outputs)
            if any(key in log for log in logging_outputs) and sample_size > 0:
                metrics.log_scalar(key, total / sample_size / math.log(2), sample_size, round=3)
