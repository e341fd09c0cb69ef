"""CAN, the Compressed-Attention Network (Li et al., AAAI 2021, "An Efficient Transformer Decoder
with Compressed Sub-layers"), one of PET's competitors (PET Table 7).

Each decoder layer is ONE sub-layer instead of three (self-attention, encoder-decoder attention,
FFN):

    q = x W_q                                       (the decoder state at each target position)
    K = [H W_k^enc ; X W_k^self]                    (encoder states ; target prefix)
    V = [H W_v^enc ; X W_v^self]                    (values of width d_ffn: W_v = W_v' W_o W_1 folded)
    a = softmax(q K^T / sqrt(d_head) + masks) V     (one softmax over both sources, per head)
    y = LayerNorm(x + W_2 act(a))                   (W_2: the FFN's second linear acts as the output projection)

The self- and encoder-decoder attentions become one attention with a joint softmax; since the
attention output projection and the FFN's first linear are linear maps applied after the
(linear) attention average, they fold into the value projections, whose width is therefore the
FFN's; the activation follows the attention, and the FFN's second linear maps back to the model
width. CAN pairs this shallow decoder with a deep encoder (``--arch can_transformer_iwslt``:
12 encoder layers, 1 decoder layer; both are flags).

Choices the paper leaves to us, stated: keys and values of the two sources keep separate
projections (the parameters of the two merged attentions; queries are shared); activation ReLU
(``--activation-fn``); post-norm like the rest of the model (``--decoder-normalize-before`` for
pre-norm). Incremental decoding caches the prefix keys/values and the encoder keys/values per
layer and reorders them with the beam, so beam search scores equal a teacher-forced pass (tested).
"""
import math
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from ..common.distributed_support import check_ddp_backend, check_tpu


@with_incremental_state
class CompressedAttentionLayer(nn.Module):
    """One CAN decoder layer, a drop-in for fairseq's TransformerDecoderLayer (same call signature)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d, f, h = cfg.decoder.embed_dim, cfg.decoder.ffn_embed_dim, cfg.decoder.attention_heads
        d_enc = cfg.encoder.embed_dim
        if d % h or f % h:
            raise ValueError(f"--decoder-attention-heads {h} must divide --decoder-embed-dim {d} and "
                             f"--decoder-ffn-embed-dim {f} (CAN splits queries/keys and the FFN-wide values by head)")
        self.embed_dim, self.ffn_dim, self.num_heads = d, f, h
        self.head_dim, self.value_head_dim = d // h, f // h
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(d, d)
        self.k_self, self.v_self = nn.Linear(d, d), nn.Linear(d, f)
        self.k_enc, self.v_enc = nn.Linear(d_enc, d), nn.Linear(d_enc, f)
        self.fc2 = nn.Linear(f, d)  # the FFN's second linear, acting as the attention's output projection
        self.activation_fn = utils.get_activation_fn(cfg.activation_fn)
        self.dropout = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        self.attention_dropout = FairseqDropout(cfg.attention_dropout, module_name=self.__class__.__name__)
        self.activation_dropout = FairseqDropout(cfg.activation_dropout, module_name=self.__class__.__name__)
        self.normalize_before = cfg.decoder.normalize_before
        self.layer_norm = LayerNorm(d)
        for proj in (self.q_proj, self.k_self, self.v_self, self.k_enc, self.v_enc):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.fc2.weight)
        nn.init.constant_(self.fc2.bias, 0.0)

    def _heads(self, x: Tensor, width: int) -> Tensor:
        """T x B x (H*w) -> B x H x T x w"""
        t, b, _ = x.shape
        return x.view(t, b, self.num_heads, width).permute(1, 2, 0, 3)

    def forward(self, x: Tensor, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state=None, prev_attn_state=None, self_attn_mask: Optional[Tensor] = None,
                self_attn_padding_mask: Optional[Tensor] = None, need_attn: bool = False,
                need_head_weights: bool = False):
        if encoder_out is None:
            raise ValueError("CAN's compressed attention needs encoder states (it has no decoder-only mode)")
        residual = x
        if self.normalize_before:
            x = self.layer_norm(x)
        q = self._heads(self.q_proj(x) * self.scaling, self.head_dim)
        k_self, v_self = self._heads(self.k_self(x), self.head_dim), self._heads(self.v_self(x), self.value_head_dim)
        cache = self.get_incremental_state(incremental_state, "can") if incremental_state is not None else None
        if cache is not None and "k_enc" in cache:
            k_enc, v_enc = cache["k_enc"], cache["v_enc"]
            k_self, v_self = torch.cat([cache["k_self"], k_self], 2), torch.cat([cache["v_self"], v_self], 2)
        else:
            k_enc = self._heads(self.k_enc(encoder_out), self.head_dim)
            v_enc = self._heads(self.v_enc(encoder_out), self.value_head_dim)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "can", {"k_enc": k_enc, "v_enc": v_enc,
                                                                  "k_self": k_self, "v_self": v_self})
        s_enc = k_enc.size(2)
        scores = torch.matmul(q, torch.cat([k_enc, k_self], 2).transpose(-1, -2))  # B x H x T x (S_enc + S_self)
        mask = scores.new_zeros(scores.shape[-2:]).unsqueeze(0).unsqueeze(0)
        if self_attn_mask is not None:  # the future mask over the prefix (teacher forcing)
            mask = mask + F.pad(self_attn_mask.to(scores.dtype), (s_enc, 0)).unsqueeze(0).unsqueeze(0)
        scores = scores + mask
        if encoder_padding_mask is not None or self_attn_padding_mask is not None:
            b = scores.size(0)
            enc_pad = (encoder_padding_mask if encoder_padding_mask is not None
                       else scores.new_zeros(b, s_enc, dtype=torch.bool))
            self_pad = (self_attn_padding_mask.bool() if self_attn_padding_mask is not None
                        else scores.new_zeros(b, k_self.size(2), dtype=torch.bool))
            if self_pad.size(1) < k_self.size(2):  # incremental: the mask covers the new step only
                self_pad = F.pad(self_pad, (k_self.size(2) - self_pad.size(1), 0), value=False)
            pad = torch.cat([enc_pad.bool(), self_pad], 1)[:, None, None, :]
            scores = scores.masked_fill(pad, float("-inf"))
        probs = utils.softmax(scores, dim=-1).type_as(scores)
        attn = torch.matmul(self.attention_dropout(probs), torch.cat([v_enc, v_self], 2))  # B x H x T x f/H
        b, _, t, _ = attn.shape
        attn = attn.permute(2, 0, 1, 3).reshape(t, b, self.ffn_dim)
        x = self.fc2(self.activation_dropout(self.activation_fn(attn)))
        x = residual + self.dropout(x)
        if not self.normalize_before:
            x = self.layer_norm(x)
        weights = probs[..., :s_enc].transpose(0, 1) if (need_attn or need_head_weights) else None  # H x B x T x S
        return x, weights, None

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        cache = self.get_incremental_state(incremental_state, "can")
        if cache is not None:
            self.set_incremental_state(incremental_state, "can",
                                       {k: v.index_select(0, new_order) for k, v in cache.items()})
        return incremental_state


class CANTransformerDecoder(TransformerDecoder):
    def build_decoder_layer(self, args, no_encoder_attn=False):
        if no_encoder_attn:
            raise ValueError("--arch can_transformer: CAN's decoder layer needs encoder-decoder attention")
        return CompressedAttentionLayer(TransformerConfig.from_namespace(args))


@register_model("can_transformer")
class CANTransformerModel(TransformerModel):
    """A fairseq Transformer whose decoder layers are CAN's compressed-attention layers."""

    @classmethod
    def build_model(cls, args, task):
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        return super().build_model(args, task)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return CANTransformerDecoder(args, tgt_dict, embed_tokens,
                                     no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model_architecture("can_transformer", "can_transformer_iwslt")
def can_transformer_iwslt(args):
    """CAN's deep encoder and shallow decoder (12 + 1 layers) on the IWSLT Transformer's widths."""
    args.encoder_layers = getattr(args, "encoder_layers", 12)
    args.decoder_layers = getattr(args, "decoder_layers", 1)
    transformer_iwslt_de_en(args)
