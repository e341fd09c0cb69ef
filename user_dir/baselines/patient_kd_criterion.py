"""``--criterion patient_kd``: Patient Knowledge Distillation (Sun et al., EMNLP-IJCNLP 2019), one of PET's
competitors (PET Table 7), for encoder-decoder translation models.

    loss per target token = (1 - alpha) * label-smoothed CE + alpha * T^2 * KL(teacher^T || student^T)
                            + beta * L_PT
    L_PT = mean over matched layer pairs (j, t) of
           mean over non-padding positions and hidden units of (W h_s^j / |W h_s^j| - h_t^t / |h_t^t|)^2

i.e. the word-level KD loss of ``--criterion kd`` plus Patient-KD's distance between L2-normalised hidden
states (PKD Sec. 3.2, eq. 5) in the authors' units: their code takes ``F.mse_loss`` of the normalised states
stacked as batch x matched layers x hidden units, which averages over the layers as well as the hidden units
(:func:`patience_loss`). PKD matched the [CLS] vector of a BERT classifier; for translation we match every
non-padding position of the encoder states and of the decoder states (PAPERS.md). Each matched layer pair
counts once in the mean, encoder and decoder pairs alike.

Scaling. fairseq sums a criterion's loss over the batch and divides it by ``sample_size`` (the target tokens;
the sentences with ``--sentence-avg``), so the CE and KD terms enter as means per target token -- per
prediction, as PKD's CE and KD are means per classified example. L_PT is a mean already, so the criterion adds
``beta * L_PT * sample_size``; after fairseq's division the hidden term is ``beta * L_PT`` beside per-token CE
and KD, the relation beta has in the authors' loss ``(1 - alpha) CE + alpha KD + beta L_PT``. With gradient
accumulation or several GPUs each batch's L_PT weighs by its sample_size, as its tokens do. ``pkd_loss`` in the
log is L_PT itself (unweighted by beta, in nats). One difference left as it is: the authors' KD term is
``nn.KLDivLoss(reduction='mean')``, which also divides by the number of classes; ours is the KL per token.

Only intermediate layers are matched: the authors stack ``full_output[:-1]``, leaving the last layer to the KD
loss, and their teacher layers never include the last one either. Layer maps (``--pkd-encoder-map`` /
``--pkd-decoder-map``), for a student of M layers and a teacher of N:
* ``skip`` (default), PKD-Skip generalised to any depths: student layer j = 1..M-1 learns from teacher layer
  floor(j * N / M) (a 6-layer student of a 12-layer teacher: 2, 4, 6, 8, 10 as in the paper);
* ``last``, PKD-Last: student layer j = 1..M-1 learns from teacher layer N - M + j (6 of 12: 7, ..., 11);
* ``none``; or explicit ``1:2,2:4`` student:teacher pairs (1-based), each below its model's last layer.
Indices are checked against both models' depths before training starts. A one-layer student has no
intermediate layer: with both maps empty the criterion is ``--criterion kd`` (a warning says so).

Choices the papers leave open, stated:
* widths: PKD's students keep the teacher's width. A student at PET's size must be narrower, so a learned
  linear map per side (encoder, decoder) takes the student's states to the teacher's width before
  normalisation (as TinyBERT's W_h). It lives in the criterion: it trains with the student, is saved in the
  checkpoint's criterion state, and is not part of the model that is deployed or counted. With equal widths,
  or no pair on that side, no map is created (plain PKD).
* initialisation: PKD starts the student from the first layers of the pre-trained BERT its teacher was
  fine-tuned from (their ``--encoder_checkpoint`` defaults to it). That is impossible here: the student is
  narrower than the teacher, so no teacher weight fits it. At equal widths the analogue (the teacher's first
  layers) is not supported either: fairseq builds the model before the criterion, and its
  ``--finetune-from-model`` refuses a checkpoint with more layers. Students start from fairseq's initialisation.
* ``--pkd-beta`` default 100: PKD tunes beta over the grid {10, 100, 500, 1000} (the paper; the authors'
  ``scripts/run_student_patience.py``), and the authors' released best 6-layer runs pick 100 for five of their
  seven tasks (SST-2, MNLI, QNLI, QQP, RACE; ``result/glue/result_summary/pkd_6layer_mean.csv``); PET gives no
  value, and no budget here allows a grid search. On an untrained student the hidden term is then a modest part
  of the first loss (tests/test_patient_kd.py).
"""
import logging
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.logging import metrics
from omegaconf import II

from ..common.kd_losses import interpolated_kd_loss, word_kd_loss
from ..common.layer_lists import dropping_sides
from ..common.wrapped_forward import encode
from ..common.word_kd_criterion import WordKDConfig, WordKDCriterion

logger = logging.getLogger(__name__)


class PatientKDConfigError(ValueError):
    """A layer map or width that cannot work, raised before the first training step."""


@dataclass
class PatientKDConfig(WordKDConfig):
    pkd_beta: float = field(
        default=100.0, metadata={"help": "weight beta of Patient-KD's L_PT, the mean squared error of L2-normalised "
                                         "intermediate hidden states (the authors' units, PKD Sec. 3.2); PKD's grid "
                                         "{10,100,500,1000}; default 100, the value the authors' released best runs "
                                         "pick most often (PET gives none)"})
    pkd_encoder_map: str = field(
        default="skip", metadata={"help": "student:teacher encoder layers, 1-based, intermediate only: 'skip' "
                                          "(PKD-Skip, j -> floor(j*N/M)), 'last' (PKD-Last, j -> N-M+j), 'none' "
                                          "or e.g. '1:2,2:4'"})
    pkd_decoder_map: str = field(
        default="skip", metadata={"help": "student:teacher decoder layers, as --pkd-encoder-map"})
    # the student's depths and widths: fairseq fills criterion fields named like command-line
    # arguments from them (the --encoder-layers etc. of the model), before any update
    encoder_layers: int = II("model.encoder_layers")
    decoder_layers: int = II("model.decoder_layers")
    encoder_embed_dim: int = II("model.encoder_embed_dim")
    decoder_embed_dim: int = II("model.decoder_embed_dim")


def parse_layer_map(spec: str, student_layers: int, teacher_layers: int, flag: str) -> List[Tuple[int, int]]:
    """(student, teacher) pairs of intermediate layers, 1-based, from a ``--pkd-*-map`` value; errors name the
    flag. The last layers are never matched: Patient-KD leaves them to the KD loss."""
    spec = spec.strip()
    if spec == "none":
        return []
    if spec in ("skip", "last"):
        if student_layers > teacher_layers:
            raise PatientKDConfigError(
                f"{flag} {spec}: the student has more layers ({student_layers}) than the teacher "
                f"({teacher_layers}); give an explicit map such as '1:1,2:2'")
        if spec == "skip":
            return [(j, j * teacher_layers // student_layers) for j in range(1, student_layers)]
        return [(j, teacher_layers - student_layers + j) for j in range(1, student_layers)]
    pairs = []
    for item in spec.split(","):
        try:
            s, t = (int(x) for x in item.split(":"))
        except ValueError:
            raise PatientKDConfigError(f"{flag} {spec!r}: expected 'skip', 'last', 'none' or pairs like '1:2,2:4'")
        for who, layer, depth in (("student", s, student_layers), ("teacher", t, teacher_layers)):
            if not 1 <= layer <= depth:
                raise PatientKDConfigError(f"{flag} {spec!r}: {who} layer {layer} is out of range 1..{depth}")
            if layer == depth:
                raise PatientKDConfigError(
                    f"{flag} {spec!r}: {who} layer {layer} is the {who}'s last layer; Patient-KD matches "
                    f"intermediate layers only (1..{depth - 1}) and leaves the last one to the KD loss")
        pairs.append((s, t))
    if len({s for s, _ in pairs}) != len(pairs):
        raise PatientKDConfigError(f"{flag} {spec!r}: a student layer appears twice")
    return pairs


def normalized_layer_mse(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                         pad_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.mse_loss`` of the L2-normalised states of one layer pair: the mean, over non-padding positions and
    hidden units, of ``(h_s/|h_s| - h_t/|h_t|)^2``. States are ``(..., D)`` of one width (project first);
    ``pad_mask`` is ``(...)``, True at padding; 0 when every position is. Computed in float32."""
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(f"hidden-state shapes differ: {tuple(student_hidden.shape)} vs {tuple(teacher_hidden.shape)}")
    if pad_mask is not None:
        if pad_mask.shape != student_hidden.shape[:-1]:
            raise ValueError(f"pad_mask of shape {tuple(pad_mask.shape)} does not match "
                             f"{tuple(student_hidden.shape[:-1])}")
        student_hidden, teacher_hidden = student_hidden[~pad_mask], teacher_hidden[~pad_mask]
    if student_hidden.numel() == 0:  # nothing but padding: no distance (F.mse_loss of nothing would be NaN)
        return student_hidden.float().sum()
    s = F.normalize(student_hidden.float(), dim=-1)
    t = F.normalize(teacher_hidden.float(), dim=-1)
    return F.mse_loss(s, t)


def patience_loss(layer_pairs: Sequence[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]) -> torch.Tensor:
    """Patient-KD's L_PT in its authors' units: the mean over matched layer pairs ``(h_s, h_t, pad_mask)`` of
    :func:`normalized_layer_mse` -- what their ``F.mse_loss`` over batch x layers x hidden units gives when every
    layer has the same positions."""
    if not layer_pairs:
        raise ValueError("patience_loss needs at least one matched layer pair")
    return torch.stack([normalized_layer_mse(s, t, mask) for s, t, mask in layer_pairs]).mean()


@register_criterion("patient_kd", dataclass=PatientKDConfig)
class PatientKDCriterion(WordKDCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 teacher_path=None, kd_alpha=0.5, kd_temperature=1.0, pkd_beta=100.0, pkd_encoder_map="skip",
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
        self.encoder_map = parse_layer_map(pkd_encoder_map, encoder_layers, t_enc_layers, "--pkd-encoder-map")
        self.decoder_map = parse_layer_map(pkd_decoder_map, decoder_layers, t_dec_layers, "--pkd-decoder-map")
        if pkd_beta > 0 and not (self.encoder_map or self.decoder_map):
            logger.warning("--criterion patient_kd: no intermediate layers to match (--pkd-encoder-map %s, "
                           "--pkd-decoder-map %s, student layers %s+%s): this is word-level KD",
                           pkd_encoder_map, pkd_decoder_map, encoder_layers, decoder_layers)
        # a learned width map per side when the student is narrower (see the module docstring)
        self.encoder_proj = (nn.Linear(encoder_embed_dim, t_enc_dim)
                             if self.encoder_map and encoder_embed_dim != t_enc_dim else None)
        self.decoder_proj = (nn.Linear(decoder_embed_dim, t_dec_dim)
                             if self.decoder_map and decoder_embed_dim != t_dec_dim else None)

    @staticmethod
    def _layer_pairs(student_states, teacher_states, layer_map, proj, pad_mask):
        """(h_s, h_t, pad_mask) per mapped pair; states are fairseq's lists [embeddings, layer 1, ..., layer N]
        of T x B x C, returned as B x T x C with the student's projected to the teacher's width."""
        pairs = []
        for s, t in layer_map:
            h_s = student_states[s].transpose(0, 1)
            if proj is not None:
                h_s = proj(h_s.to(proj.weight.dtype))
            pairs.append((h_s, teacher_states[t].transpose(0, 1), pad_mask))
        return pairs

    def forward(self, model, sample, reduce=True):
        if not model.training or self.beta == 0 or not (self.encoder_map or self.decoder_map):
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
        l_pt = patience_loss(
            self._layer_pairs(encoder_out["encoder_states"], t_encoder_out["encoder_states"], self.encoder_map,
                              self.encoder_proj, src_pad)
            + self._layer_pairs(net_output[1]["inner_states"], t_output[1]["inner_states"], self.decoder_map,
                                self.decoder_proj, tgt_pad))
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        hidden = l_pt * sample_size  # summed like the token losses: fairseq divides by sample_size (docstring)
        loss = interpolated_kd_loss(task_loss, kd, self.alpha) + self.beta * hidden
        logging_output = {"loss": loss.data, "nll_loss": nll_loss.data, "task_loss": task_loss.data,
                          "kd_loss": kd.data, "pkd_loss": hidden.data, "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size}
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        if any("pkd_loss" in log for log in logging_outputs) and sample_size > 0:
            total = sum(log.get("pkd_loss", 0) for log in logging_outputs)
            metrics.log_scalar("pkd_loss", total / sample_size, sample_size, round=5)  # L_PT, unweighted, not in bits
