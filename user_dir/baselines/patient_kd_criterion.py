"""``--criterion patient_kd``: Patient Knowledge Distillation (Sun et al., EMNLP 2019), one of
PET's competitors (PET Table 7), for encoder-decoder translation models.

    loss = (1 - alpha) * label-smoothed CE + alpha * T^2 * KL(teacher^T || student^T)
           + beta * sum_{matched layers (j, t)} sum_{non-padding positions} || W h_s^j / |W h_s^j| - h_t^t / |h_t^t| ||^2

i.e. the word-level KD loss of ``--criterion kd`` plus Patient-KD's distance between
L2-normalised hidden states (PKD eq. 5, ``kd_losses.normalized_hidden_mse``) of matched layers.
PKD matched the [CLS] vector of a BERT classifier; for translation we match every non-padding
position of the encoder states and of the decoder states (PAPERS.md), summed like the CE.

Layer maps (``--pkd-encoder-map`` / ``--pkd-decoder-map``): ``skip`` (default) is PKD-skip
generalised to any depths: student layer j (1..M) learns from teacher layer floor(j * N / M), so a
student with half the teacher's layers learns from layers 2, 4, ..., N (PKD: "student layer i <-
teacher layer 2i"), and the last student layer always from the last teacher layer. ``last`` matches
only the last layers; an explicit ``1:2,2:4`` gives student:teacher pairs (1-based). Indices are
checked against both models' depths before training starts.

Choices the papers leave open, stated:
* widths: PKD's students keep the teacher's width. A student at PET's size must be narrower, so a
  learned linear map per side (encoder, decoder) takes the student's states to the teacher's width
  before normalisation (as TinyBERT's W_h). It lives in the criterion: it trains with the student,
  is saved in the checkpoint's criterion state, and is not part of the model that is deployed or
  counted. With equal widths no map is created (plain PKD).
* ``--pkd-beta`` default 10, the smallest value of PKD's search grid {10, 100, 500, 1000}: our
  distance is summed over every target and source position rather than taken once per example.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import torch
import torch.nn as nn
from fairseq.criterions import register_criterion
from fairseq.logging import metrics
from omegaconf import II

from ..common.kd_losses import interpolated_kd_loss, normalized_hidden_mse, word_kd_loss
from ..common.layer_lists import dropping_sides
from ..common.wrapped_forward import encode
from ..common.word_kd_criterion import WordKDConfig, WordKDCriterion


class PatientKDConfigError(ValueError):
    """A layer map or width that cannot work, raised before the first training step."""


@dataclass
class PatientKDConfig(WordKDConfig):
    pkd_beta: float = field(
        default=10.0, metadata={"help": "weight beta of Patient-KD's hidden-state loss (PKD eq. 7; its grid "
                                        "{10,100,500,1000}, default 10: ours sums over every position)"})
    pkd_encoder_map: str = field(
        default="skip", metadata={"help": "student:teacher encoder layers, 1-based: 'skip' (PKD-skip, "
                                          "j -> floor(j*N/M)), 'last', 'none' or e.g. '1:2,2:4'"})
    pkd_decoder_map: str = field(
        default="skip", metadata={"help": "student:teacher decoder layers, as --pkd-encoder-map"})
    # the student's depths and widths: fairseq fills criterion fields named like command-line
    # arguments from them (the --encoder-layers etc. of the model), before any update
    encoder_layers: int = II("model.encoder_layers")
    decoder_layers: int = II("model.decoder_layers")
    encoder_embed_dim: int = II("model.encoder_embed_dim")
    decoder_embed_dim: int = II("model.decoder_embed_dim")


def parse_layer_map(spec: str, student_layers: int, teacher_layers: int, flag: str) -> List[Tuple[int, int]]:
    """(student, teacher) layer pairs, 1-based, from a ``--pkd-*-map`` value; errors name the flag."""
    spec = spec.strip()
    if spec == "none":
        return []
    if spec == "last":
        return [(student_layers, teacher_layers)]
    if spec == "skip":
        if student_layers > teacher_layers:
            raise PatientKDConfigError(
                f"{flag} skip: the student has more layers ({student_layers}) than the teacher "
                f"({teacher_layers}); give an explicit map such as '1:1,2:2'")
        return [(j, j * teacher_layers // student_layers) for j in range(1, student_layers + 1)]
    pairs = []
    for item in spec.split(","):
        try:
            s, t = (int(x) for x in item.split(":"))
        except ValueError:
            raise PatientKDConfigError(f"{flag} {spec!r}: expected 'skip', 'last', 'none' or pairs like '1:2,2:4'")
        if not 1 <= s <= student_layers:
            raise PatientKDConfigError(f"{flag} {spec!r}: student layer {s} is out of range 1..{student_layers}")
        if not 1 <= t <= teacher_layers:
            raise PatientKDConfigError(f"{flag} {spec!r}: teacher layer {t} is out of range 1..{teacher_layers}")
        pairs.append((s, t))
    if len({s for s, _ in pairs}) != len(pairs):
        raise PatientKDConfigError(f"{flag} {spec!r}: a student layer appears twice")
    return pairs


@register_criterion("patient_kd", dataclass=PatientKDConfig)
class PatientKDCriterion(WordKDCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 teacher_path=None, kd_alpha=0.5, kd_temperature=1.0, pkd_beta=10.0, pkd_encoder_map="skip",
                 pkd_decoder_map="skip", encoder_layers=None, decoder_layers=None, encoder_embed_dim=None,
                 decoder_embed_dim=None, ddp_backend=None):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy,
                         teacher_path, kd_alpha, kd_temperature, ddp_backend)
        if pkd_beta < 0:
            raise PatientKDConfigError(f"--pkd-beta {pkd_beta}: must be >= 0")
        self.beta = pkd_beta
        t_enc_layers = len(self.teacher.model.encoder.layers)
        t_dec_layers = len(self.teacher.model.decoder.layers)
        t_enc_dim = self.teacher.model.encoder.embed_tokens.embedding_dim
        t_dec_dim = self.teacher.model.decoder.embed_tokens.embedding_dim
        s_enc_layers, s_dec_layers, s_enc_dim, s_dec_dim = encoder_layers, decoder_layers, encoder_embed_dim, decoder_embed_dim
        self.encoder_map = parse_layer_map(pkd_encoder_map, s_enc_layers, t_enc_layers, "--pkd-encoder-map")
        self.decoder_map = parse_layer_map(pkd_decoder_map, s_dec_layers, t_dec_layers, "--pkd-decoder-map")
        # a learned width map per side when the student is narrower (see the module docstring)
        self.encoder_proj = nn.Linear(s_enc_dim, t_enc_dim) if s_enc_dim != t_enc_dim else None
        self.decoder_proj = nn.Linear(s_dec_dim, t_dec_dim) if s_dec_dim != t_dec_dim else None

    def _hidden_loss(self, student_states, teacher_states, layer_map, proj, pad_mask):
        """Sum over mapped layers; states are fairseq's lists [embeddings, layer 1, ..., layer N] of T x B x C."""
        total = 0.0
        for s, t in layer_map:
            h_s = student_states[s].transpose(0, 1)
            if proj is not None:
                h_s = proj(h_s.to(proj.weight.dtype))
            total = total + normalized_hidden_mse(h_s, teacher_states[t].transpose(0, 1), pad_mask=pad_mask)
        return total

    def forward(self, model, sample, reduce=True):
        if not model.training or (self.beta == 0 and self.alpha == 0):
            return super().forward(model, sample, reduce)
        for side, _ in dropping_sides(model):  # fairseq lists only the layers that ran: the map would pair wrong ones
            raise PatientKDConfigError(f"--{side}-layerdrop with --criterion patient_kd: a dropped layer has no "
                                       f"hidden state for --pkd-{side}-map to match; train without layerdrop")
        net_input = sample["net_input"]
        # through the model's own forward (DDP averages only what it runs); the encoder's states on the way
        encoder_out, net_output = encode(model, net_input, whole_decoder=True, return_all_hiddens=True)
        task_loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)

        teacher = self.teacher.match(next(model.parameters()))
        with torch.no_grad():
            t_encoder_out, t_output = encode(teacher, net_input, whole_decoder=True, return_all_hiddens=True)
        target = model.get_targets(sample, net_output)
        kd = word_kd_loss(net_output[0], t_output[0], self.temperature, pad_mask=target.eq(self.padding_idx))
        src_pad = net_input["src_tokens"].eq(self.padding_idx)
        tgt_pad = net_input["prev_output_tokens"].eq(self.padding_idx)
        hidden = (self._hidden_loss(encoder_out["encoder_states"], t_encoder_out["encoder_states"],
                                    self.encoder_map, self.encoder_proj, src_pad)
                  + self._hidden_loss(net_output[1]["inner_states"], t_output[1]["inner_states"],
                                      self.decoder_map, self.decoder_proj, tgt_pad))
        loss = interpolated_kd_loss(task_loss, kd, self.alpha) + self.beta * hidden
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.data, "nll_loss": nll_loss.data, "task_loss": task_loss.data,
                          "kd_loss": kd.data, "pkd_loss": float(hidden.detach()) if torch.is_tensor(hidden) else hidden, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size}
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if any("pkd_loss" in log for log in logging_outputs) and sample_size > 0:
            total = sum(log.get("pkd_loss", 0) for log in logging_outputs)
            metrics.log_scalar("pkd_loss", total / sample_size, sample_size, round=4)  # per token, not in bits
