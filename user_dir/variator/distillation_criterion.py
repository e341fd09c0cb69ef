"""``--criterion variator_distill``: trains Variator plugins by hidden-state distillation
(Variator, section 3.3, eq. 1; Appendix B for the optional task loss).

The teacher is the same network with its plugins bypassed: the loss is the mean squared error
between the final encoder hidden states of the plugged model and of the backbone alone, over
every non-padding position (averaged over positions and dimensions). With
``--variator-task-weight lambda`` > 0 the task loss of the plugged model is added (label-smoothed
cross-entropy for translation, cross-entropy for sentence prediction): L = lambda * L_t + L_d.
The paper finds lambda = 0 best (Table 7) and uses it everywhere; so do we by default.

The frozen backbone runs as at inference (eval mode: no dropout) for both passes, so the
distillation target is the exact output the plugged model must reproduce; the plugins have no
dropout of their own. At validation, sentence-prediction tasks also report the plugged model's
accuracy (and F1 / MCC for ``--glue-task`` tasks that use them), so ``--best-checkpoint-metric
accuracy`` works; translation reports BLEU with the task's ``--eval-bleu``.
"""
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..common.glue_metrics import TASK_METRICS, glue_score
from ..common.wrapped_forward import encode, is_sentence_model
from .plugged_encoder import VariatorError


@dataclass
class VariatorDistillConfig(FairseqDataclass):
    variator_task_weight: float = field(default=0.0, metadata={
        "help": "lambda of L = lambda * task loss + distillation loss (Appendix B; paper: 0)"})
    label_smoothing: float = field(default=0.1, metadata={
        "help": "label smoothing of the translation task loss when --variator-task-weight > 0"})
    glue_task: Optional[str] = field(default=None, metadata={
        "help": "sentence prediction: the GLUE task whose metrics validation reports (e.g. MRPC adds F1)"})
    # read by the sentence_prediction task's config (as with fairseq's sentence_prediction criterion)
    classification_head_name: str = field(default="sentence_classification_head", metadata={
        "help": "sentence prediction: the classification head whose accuracy validation reports"})
    regression_target: bool = field(default=False, metadata={
        "help": "sentence prediction: regression tasks (STS-B) report no accuracy"})


@contextmanager
def eval_mode(model):
    """The frozen backbone (and the plugins, which have no dropout) as at inference."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@register_criterion("variator_distill", dataclass=VariatorDistillConfig)
class VariatorDistillCriterion(FairseqCriterion):
    def __init__(self, task, variator_task_weight=0.0, label_smoothing=0.1, glue_task=None,
                 classification_head_name="sentence_classification_head", regression_target=False):
        super().__init__(task)
        self.head, self.regression = classification_head_name, regression_target
        if variator_task_weight < 0:
            raise VariatorError(f"--variator-task-weight {variator_task_weight}: must be >= 0")
        if glue_task is not None and glue_task not in TASK_METRICS:
            raise VariatorError(f"--glue-task {glue_task!r}: expected one of {', '.join(TASK_METRICS)}")
        self.task_weight, self.eps, self.glue_task = variator_task_weight, label_smoothing, glue_task

    def encode(self, model, net_input, with_task_output: bool):
        """Final encoder hidden states (B x T x C), their padding mask, and the model's output, from one
        forward of the whole model (wrapped_forward.encode): with ``with_task_output`` the sentence
        classifier's logits or the translation decoder over every target position."""
        src_tokens = net_input["src_tokens"]
        if is_sentence_model(model):
            head = {"classification_head_name": self.head} if with_task_output else {}
            features, output = encode(model, net_input, **head)
            return features, src_tokens.eq(model.encoder.sentence_encoder.padding_idx), output
        out, output = encode(model, net_input, whole_decoder=with_task_output)
        mask = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else src_tokens.eq(model.encoder.padding_idx)
        return out["encoder_out"][0].transpose(0, 1), mask, output

    def forward(self, model, sample, reduce=True):
        if getattr(model, "variator", None) is None:
            raise VariatorError("variator_distill needs a model with Variator plugins: use --task variator_translation "
                                "or variator_sentence_prediction")
        net_input = sample["net_input"]
        is_sentence = is_sentence_model(model)
        with_task_output = self.task_weight > 0 or (is_sentence and not model.training)
        with eval_mode(model):
            hidden, pad, output = self.encode(model, net_input, with_task_output)
            if model.variator.active is None:  # --variator-ratio 0 (evaluation of the backbone): nothing to distil
                target = hidden.detach()
            else:
                with torch.no_grad(), model.variator.bypassed():
                    target, _, _ = self.encode(model, net_input, with_task_output=False)
        keep = (~pad).unsqueeze(-1).to(torch.float32)
        ntokens = keep.sum()
        squared = ((hidden.float() - target.float()) ** 2).mean(-1, keepdim=True)
        mse = (squared * keep).sum() / ntokens.clamp(min=1)
        loss = mse
        nsentences = net_input["src_tokens"].size(0)
        logging_output = {"mse": mse.detach() * ntokens, "ntokens": ntokens.detach(), "nsentences": nsentences,
                          "sample_size": 1}
        logits = output[0] if is_sentence and with_task_output else None
        if self.task_weight > 0:
            if is_sentence and self.regression:
                task_loss = F.mse_loss(logits.view(-1).float(), sample["target"].view(-1).float())
            elif is_sentence:
                task_loss = F.cross_entropy(logits.float(), sample["target"].view(-1), reduction="mean")
            else:
                lprobs = model.get_normalized_probs(output, log_probs=True)
                task_loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                                                       self.eps, ignore_index=self.padding_idx, reduce=True)
                task_loss = task_loss / sample["ntokens"]
            loss = loss + self.task_weight * task_loss
            logging_output["task_loss"] = task_loss.detach()
        if logits is not None and "target" in sample and not self.regression:
            preds, targets = logits.argmax(-1), sample["target"].view(-1)
            logging_output.update(ncorrect=(preds == targets).sum().item(), pred=preds.tolist(), targ=targets.tolist())
            if self.glue_task:
                logging_output["glue_task"] = self.glue_task
        logging_output["loss"] = loss.detach()
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        n = sum(log.get("sample_size", 0) for log in logging_outputs)
        ntokens = sum(float(log.get("ntokens", 0)) for log in logging_outputs)
        metrics.log_scalar("loss", sum(float(log.get("loss", 0)) for log in logging_outputs) / max(n, 1), n, round=5)
        metrics.log_scalar("mse", sum(float(log.get("mse", 0)) for log in logging_outputs) / max(ntokens, 1),
                           ntokens, round=5)
        if any("task_loss" in log for log in logging_outputs):
            metrics.log_scalar("task_loss", sum(float(log.get("task_loss", 0)) for log in logging_outputs) / max(n, 1),
                               n, round=3)
        if not logging_outputs or "ncorrect" not in logging_outputs[0]:
            return
        nsent = sum(log.get("nsentences", 0) for log in logging_outputs)
        metrics.log_scalar("accuracy", 100.0 * sum(log["ncorrect"] for log in logging_outputs) / max(nsent, 1),
                           nsent, round=2)
        glue_task = logging_outputs[0].get("glue_task")
        if glue_task and any(m != "accuracy" for m in TASK_METRICS[glue_task]):
            # predictions concatenated over the whole validation set, so F1 / MCC are exact
            for key in ("pred", "targ"):
                values = [v for log in logging_outputs for v in log.get(key, [])]
                metrics.log_concat_tensor(key, torch.tensor(values), dim=0)
            for name in TASK_METRICS[glue_task]:
                if name != "accuracy":
                    metrics.log_derived(name, lambda meters, name=name: round(glue_score(
                        glue_task, meters["pred"].tensor.numpy(), meters["targ"].tensor.numpy())[name], 2))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False

