"""``--criterion apc_activation_kd``: APC's activation knowledge distillation (APC paper, section 4.3,
after Chumachenko et al. 2020 and Zagoruyko & Komodakis 2017):

    L_total = 0.7 L_CE + 0.3 * beta * sum_l || X^{l+1} - X~^{l+1} ||_F,   beta = 1e5

where ``X^{l+1}`` is a compressed FFN's uncompressed activation and ``X~^{l+1}`` its reconstruction
through the bottleneck (eq. 3; ffn_compression.reconstruction_pair), for every compressed layer.

The paper's other two losses need no new code: CE is ``--criterion label_smoothed_cross_entropy
--label-smoothing 0`` (or ``cross_entropy``), and KD (0.7 CE + 0.3 soft-target loss, T = 1) is the
shared ``--criterion kd --teacher-path TEACHER.pt --kd-alpha 0.3 --kd-temperature 1``.

Our choices where the paper is silent: ``L_CE`` is the mean token cross-entropy (label smoothing as
``--label-smoothing``, default 0) and the Frobenius norm runs over a batch's non-padding positions
(target positions for decoder layers); fairseq sums losses and divides by the sample size, so the
reconstruction term is multiplied by the sample size here to make the optimised objective exactly
the formula above. The target activation is detached. Validation reports the CE alone.

Precision: float32 and bfloat16 (``fc-train-bf16 ... --bf16``) train; ``--fp16`` is refused at the first
update: at beta = 1e5 the reconstruction gradients summed over a batch's tokens leave float16's range at every
loss scale fairseq's scaler allows (on an H100 the scaler fell from 128 to --min-loss-scale 1e-4 in 20 skipped
updates, results/archive/gpu_check_apc_fp16_overflow.md). ``--amp`` is refused the same way, by what the forward runs
in rather than the parameters' dtype: its parameters stay float32, but fairseq's train_step runs the criterion
under float16 autocast, so the FFNs' matrix products, and the backward through them that carries the
reconstruction gradients to every layer below, are float16 as with --fp16 (computing the norm itself in float32,
as here, cannot help). bfloat16 autocast (float32's range) trains.
"""
import math
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (LabelSmoothedCrossEntropyCriterion,
                                                             LabelSmoothedCrossEntropyCriterionConfig)
from fairseq.logging import metrics

from ..common.layer_lists import dropping_sides


@dataclass
class APCActivationKDConfig(LabelSmoothedCrossEntropyCriterionConfig):
    apc_ce_weight: float = field(default=0.7, metadata={
        "help": "weight of the CE term; the reconstruction term gets 1 minus it (APC section 4.3: 0.7 / 0.3)"})
    apc_beta: float = field(default=1e5, metadata={
        "help": "beta scaling the summed reconstruction errors (APC section 4.3: 1e5)"})
    # --task sentence_prediction's config reads criterion.classification_head_name: without this field fairseq
    # fails deep in omegaconf before the criterion can say it is for translation
    classification_head_name: str = field(default="sentence_classification_head", metadata={
        "help": "not used (present so that --task sentence_prediction reaches this criterion's clear refusal)"})


@register_criterion("apc_activation_kd", dataclass=APCActivationKDConfig)
class APCActivationKDCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 apc_ce_weight=0.7, apc_beta=1e5, classification_head_name=None):
        from fairseq.tasks.sentence_prediction import SentencePredictionTask
        if isinstance(task, SentencePredictionTask):
            raise ValueError("--criterion apc_activation_kd is for translation (a decoder's token cross-entropy); for "
                             "a sentence task compress with --criterion glue_sentence_prediction (the paper's CE, "
                             "section 4.3)")
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if not 0.0 <= apc_ce_weight <= 1.0:
            raise ValueError(f"--apc-ce-weight {apc_ce_weight}: must lie in [0, 1]")
        if apc_beta < 0:
            raise ValueError(f"--apc-beta {apc_beta}: must be >= 0")
        self.ce_weight, self.beta = apc_ce_weight, apc_beta
        self._checked_layerdrop = False

    def reconstruction_loss(self, model, sample) -> torch.Tensor:
        net = sample["net_input"]
        masks = {"encoder": net["src_tokens"].ne(self.padding_idx).t(),
                 "decoder": net["prev_output_tokens"].ne(self.padding_idx).t()}
        total = 0.0
        for side, target, approx in model.apc_reconstruction_pairs():
            total = total + (target - approx)[masks[side]].float().norm()
        return total

    @staticmethod
    def runs_in_float16(model) -> bool:
        """Whether the forward computes in float16: float16 parameters (--fp16, --memory-efficient-fp16) or float16
        autocast on the parameters' device (--amp: fairseq_task.train_step runs the criterion under it)."""
        param = next(model.parameters())
        device = param.device.type
        return param.dtype == torch.float16 or (torch.is_autocast_enabled(device)
                                                and torch.get_autocast_dtype(device) == torch.float16)

    def forward(self, model, sample, reduce=True):
        if not hasattr(model, "set_apc_recording"):
            raise ValueError("--criterion apc_activation_kd needs --arch apc_transformer (a model with "
                             "APC-compressed layers)")
        record = model.training
        if record and not self._checked_layerdrop:
            for side, _ in dropping_sides(model):
                raise ValueError(f"--{side}-layerdrop with --criterion apc_activation_kd: a dropped layer has no "
                                 "activations to reconstruct (eq. 4); train without layerdrop, or use CE/KD")
            if self.beta > 0 and self.runs_in_float16(model):
                raise ValueError(
                    f"--criterion apc_activation_kd with --fp16 / --memory-efficient-fp16 / --amp (float16 parameters "
                    f"or float16 autocast): the reconstruction term "
                    f"(beta = {self.beta:g}, eq. 4) has gradients about beta times the cross-entropy's, which overflow "
                    f"float16 at every loss scale down to fairseq's --min-loss-scale (measured with --fp16 on an H100: "
                    f"results/archive/gpu_check_apc_fp16_overflow.md); train in bfloat16 (fc-train-bf16 ... --bf16) or "
                    f"float32, or lower --apc-beta")
            if not model.apc_layers():
                raise ValueError("--criterion apc_activation_kd reconstructs the activations of compressed FFNs "
                                 "(eq. 4) and this model has none (--apc-*-ffn-dims); for attention or embedding "
                                 "compression alone use CE or KD")
            self._checked_layerdrop = True
        model.set_apc_recording(record)
        try:
            net_output = model(**sample["net_input"])
            ce, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
            sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
            logging_output = {"nll_loss": nll_loss.data, "ntokens": sample["ntokens"],
                              "nsentences": sample["target"].size(0), "sample_size": sample_size,
                              "ce_loss": ce.data}
            loss = ce
            if record:
                recon = self.reconstruction_loss(model, sample)
                loss = self.ce_weight * ce + (1.0 - self.ce_weight) * self.beta * recon * sample_size
                logging_output["reconstruction"] = float(recon.detach()) * sample_size
        finally:
            model.set_apc_recording(False)
        logging_output["loss"] = loss.data
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        ce = sum(log.get("ce_loss", 0) for log in logging_outputs)
        if sample_size > 0:
            metrics.log_scalar("ce_loss", ce / sample_size / math.log(2), sample_size, round=3)
        if any("reconstruction" in log for log in logging_outputs) and sample_size > 0:
            rec = sum(log.get("reconstruction", 0) for log in logging_outputs)
            metrics.log_scalar("reconstruction", rec / sample_size, sample_size, round=4)
