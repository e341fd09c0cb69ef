"""``--criterion ghost_distill``: GhostBERT's distillation stage (section 2.3 "Distillation",
eq 6; hyper-parameters of Table 8).

From the frozen, unpruned fine-tuned teacher (``--teacher-path``, loaded by
``common/teacher.py``: never saved into the student) to the pruned (+ghost) student of the same
depth and hidden size:

    L = lambda_pred * L_pred + lambda_hidden * (l_mha + l_ffn) + lambda_emb * l_emb
    l_emb = MSE(E^m, E),  l_mha = sum_l MSE(M^m_l, M_l),  l_ffn = sum_l MSE(F^m_l, F_l)

E is the embedding output (token + position embeddings, after the embedding LayerNorm where the
model has one, before the embedding dropout), M_l the hidden state after the
MHA sub-layer (after its residual connection and, in post-LN layers, its LayerNorm), F_l the
layer's output (after the FFN sub-layer).

Choices the paper leaves open, and ours:
* Table 8 lists "lambda_1, lambda_2, lambda_3 = 0, 1, 1" for distillation and "1, 0, 0" for
  fine-tuning without defining them. We read lambda_1 as the prediction loss (cross-entropy with
  the labels; label-smoothed for translation), lambda_2 as the hidden-state terms l_mha + l_ffn
  and lambda_3 as l_emb (eq 6 weighs all three hidden terms 1). The defaults are the distillation
  stage's; the fine-tuning stage is stock ``fairseq-train --criterion
  label_smoothed_cross_entropy`` (or ``sentence_prediction``), i.e. 1, 0, 0.
* The MSE is a mean over the non-padding positions and the hidden dimensions (padding never
  enters the loss); summed over layers as eq 6 writes.
* The teacher runs in eval mode (no dropout); the student in its training mode.
* TinyBERT's data augmentation is left out (it needs GloVe and BERT's MLM predictions, not
  available offline); pruned-only and GhostBERT get exactly the same procedure (Table 3 / 10).
"""
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..common.layer_lists import dropping_sides, every_layer
from ..common.structured_pruning import transformer_encoder
from ..common.teacher import TeacherConfigError, load_frozen_teacher
from ..common.wrapped_forward import encode, is_sentence_model, unused_output


@dataclass
class GhostDistillConfig(FairseqDataclass):
    teacher_path: str = field(default="", metadata={
        "help": "the unpruned fine-tuned teacher's fairseq checkpoint (section 2.3: the full-sized model)"})
    ghost_lambda_pred: float = field(default=0.0, metadata={
        "help": "weight of the prediction loss (Table 8 lambda_1: 0 in distillation, 1 in fine-tuning)"})
    ghost_lambda_hidden: float = field(default=1.0, metadata={
        "help": "weight of l_mha + l_ffn, the post-MHA and post-FFN hidden-state MSE (Table 8 lambda_2: 1)"})
    ghost_lambda_emb: float = field(default=1.0, metadata={
        "help": "weight of l_emb, the embedding-output MSE (Table 8 lambda_3: 1)"})
    label_smoothing: float = field(default=0.1, metadata={
        "help": "translation: label smoothing of the prediction loss when --ghost-lambda-pred > 0"})
    # read by the sentence_prediction task's config (as with fairseq's sentence_prediction criterion)
    classification_head_name: str = field(default="sentence_classification_head", metadata={
        "help": "sentence prediction: the classification head of the prediction loss and accuracy"})
    regression_target: bool = field(default=False, metadata={
        "help": "sentence prediction: a regression task (STS-B): MSE prediction loss, no accuracy"})


@contextmanager
def hidden_states(encoder):
    """Collect E (B x T x C, the embedding output before its dropout), M_l and F_l (T x B x C) of
    ``encoder``'s next forward."""
    found: Dict[str, List[torch.Tensor]] = {"emb": [], "mha": [], "ffn": []}
    # E before the embedding dropout: the student's dropped-out E against the teacher's clean one would add an
    # MSE term whose gradient shrinks the (shared) embeddings, (1 - p) / p * E per position
    handles = [encoder.dropout_module.register_forward_pre_hook(lambda m, args: found["emb"].append(args[0]))]
    for layer in every_layer(encoder.layers):
        if layer.normalize_before:  # the residual stream after MHA is the input of the FFN's LayerNorm
            handles.append(layer.final_layer_norm.register_forward_pre_hook(
                lambda m, args: found["mha"].append(args[0])))
        else:
            handles.append(layer.self_attn_layer_norm.register_forward_hook(
                lambda m, args, out: found["mha"].append(out)))
        handles.append(layer.register_forward_hook(
            lambda m, args, out: found["ffn"].append(out[0] if isinstance(out, tuple) else out)))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def masked_mse(student: torch.Tensor, teacher: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the positions where ``keep`` (T x B x 1) is 1, and the dimensions."""
    squared = ((student.float() - teacher.float()) ** 2).mean(-1, keepdim=True)
    return (squared * keep).sum() / keep.sum().clamp(min=1)


@register_criterion("ghost_distill", dataclass=GhostDistillConfig)
class GhostDistillCriterion(FairseqCriterion):
    def __init__(self, task, teacher_path="", ghost_lambda_pred=0.0, ghost_lambda_hidden=1.0, ghost_lambda_emb=1.0,
                 label_smoothing=0.1, classification_head_name="sentence_classification_head",
                 regression_target=False):
        super().__init__(task)
        for flag, value in (("--ghost-lambda-pred", ghost_lambda_pred), ("--ghost-lambda-hidden", ghost_lambda_hidden),
                            ("--ghost-lambda-emb", ghost_lambda_emb)):
            if value < 0:
                raise ValueError(f"{flag} {value}: must be >= 0")
        self.lambda_pred, self.lambda_hidden, self.lambda_emb = ghost_lambda_pred, ghost_lambda_hidden, ghost_lambda_emb
        self.eps, self.head, self.regression = label_smoothing, classification_head_name, regression_target
        self.teacher = load_frozen_teacher(teacher_path, task)
        self._checked = False

    def _check_teacher(self, student_encoder, teacher_encoder) -> None:
        s, t = student_encoder, teacher_encoder
        if len(s.layers) != len(t.layers) or s.layers[0].embed_dim != t.layers[0].embed_dim:
            raise TeacherConfigError(
                f"--teacher-path {self.teacher.path}: the teacher's encoder has {len(t.layers)} layers of width "
                f"{t.layers[0].embed_dim}, the student's {len(s.layers)} of width {s.layers[0].embed_dim}; GhostBERT "
                "distils layer l into layer l and needs equal depth and hidden size")
        self._checked = True

    def forward(self, model, sample, reduce=True):
        net_input = sample["net_input"]
        is_sentence = is_sentence_model(model)
        encoder = transformer_encoder(model)
        teacher = self.teacher.match(next(model.parameters()))
        teacher_encoder = transformer_encoder(teacher)
        if not self._checked:
            for side, p in dropping_sides(model):
                if side == "encoder":  # a dropped layer has no M_l / F_l: the rest would meet the wrong teacher layers
                    raise ValueError(f"--encoder-layerdrop {p} with --criterion ghost_distill: eq 6 matches every "
                                     "student layer with the teacher's same layer, and a dropped layer has no "
                                     "hidden states; distil without layerdrop (the fine-tuning stage may use it)")
            self._check_teacher(encoder, teacher_encoder)
        need_prediction = self.lambda_pred > 0 or (is_sentence and not model.training)
        head = {"classification_head_name": self.head} if need_prediction and is_sentence else {}
        # through the model's own forward (DDP averages only what it runs); the hooks record M_l, F_l on the way
        with hidden_states(encoder) as student:
            _, output = encode(model, net_input, whole_decoder=need_prediction, **head)
        with torch.no_grad(), hidden_states(teacher_encoder) as target:
            encode(teacher, net_input)
        keep = net_input["src_tokens"].ne(encoder.padding_idx).t().unsqueeze(-1).float()
        l_emb = masked_mse(student["emb"][0].transpose(0, 1), target["emb"][0].transpose(0, 1), keep)
        l_mha = sum(masked_mse(s, t, keep) for s, t in zip(student["mha"], target["mha"]))
        l_ffn = sum(masked_mse(s, t, keep) for s, t in zip(student["ffn"], target["ffn"]))
        loss = self.lambda_emb * l_emb + self.lambda_hidden * (l_mha + l_ffn)
        if not need_prediction:  # a translation decoder eq 6 does not train: zero gradients (wrapped_forward.py)
            loss = loss + unused_output(output)
        log = {"l_emb": l_emb.detach(), "l_mha": l_mha.detach(), "l_ffn": l_ffn.detach(), "sample_size": 1,
               "nsentences": net_input["src_tokens"].size(0), "ntokens": sample.get("ntokens", 0)}
        if self.lambda_pred > 0:
            logits = output[0]
            if is_sentence and self.regression:
                pred_loss = F.mse_loss(logits.view(-1).float(), sample["target"].view(-1).float())
            elif is_sentence:
                pred_loss = F.cross_entropy(logits.float(), sample["target"].view(-1))
            else:
                lprobs = model.get_normalized_probs(output, log_probs=True)
                pred_loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                                                       self.eps, ignore_index=self.padding_idx, reduce=True)
                pred_loss = pred_loss / sample["ntokens"]
            loss = loss + self.lambda_pred * pred_loss
            log["l_pred"] = pred_loss.detach()
        if need_prediction and is_sentence and not self.regression and "target" in sample:
            log["ncorrect"] = (output[0].argmax(-1) == sample["target"].view(-1)).sum().item()
        log["loss"] = loss.detach()
        return loss, 1, log

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        n = max(sum(log.get("sample_size", 0) for log in logging_outputs), 1)
        for key in ("loss", "l_emb", "l_mha", "l_ffn", "l_pred"):
            if any(key in log for log in logging_outputs):
                metrics.log_scalar(key, sum(float(log.get(key, 0)) for log in logging_outputs) / n, n, round=5)
        if logging_outputs and "ncorrect" in logging_outputs[0]:
            nsent = max(sum(log.get("nsentences", 0) for log in logging_outputs), 1)
            metrics.log_scalar("accuracy", 100.0 * sum(log["ncorrect"] for log in logging_outputs) / nsent, nsent,
                               round=2)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False
