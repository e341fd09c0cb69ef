"""CAN, the Compressed-Attention Network (Li et al., AAAI 2021, "An Efficient Transformer Decoder
with Compressed Sub-layers"; PET's reference [34] and one of its competitors, PET Table 7).

Each decoder layer is ONE sub-layer instead of three (self-attention, encoder-decoder attention,
FFN). Written for one head (x the layer's input, x^ = LayerNorm(x) with pre-norm, else x; H the
encoder states; X^ the target prefix):

    Attn(x^) = W_o softmax(q K^T / sqrt(d_head) + masks) V      q = W_q x^
                                                                 K = [W_k^enc H ; W_k^self X^]
                                                                 V = [W_v^enc H ; W_v^self X^]
    y = x + W_2 act(W_1 (x^ + Attn(x^)) + b_1) + b_2             the FFN on the attention's residual sum

The self- and encoder-decoder attentions become one attention with a joint softmax over both
sources, and the FFN's first linear distributes over the sum: W_1 (x^ + Attn(x^)) =
W_1 x^ + sum_j a_j (W_1 W_o W_v) h_j, so W_1 W_o W_v folds into FFN-wide value projections
(``v_enc``, ``v_self``, width ``--decoder-ffn-embed-dim``) and the FFN's first linear stays only on
the decoder state's path (``fc1``: the authors' ``q_relu_weight`` and ``relu_bias``); the FFN's
second linear (``fc2``) is the sub-layer's output projection. With one head the fold is exact
(tests/test_can.py builds the layer from an unfolded attention and FFN and compares); with h heads
each head reads its own FFN-wide slice of the values, as in the authors' code.

``--arch can_transformer_iwslt`` has the authors' configuration (their
``can_transformer_t2t_wmt_en_de_el12_dl2``, github.com/Lollipop321/compressed-attention,
``fairseq/models/can_transformer.py``): a deep encoder (12 layers), 2 compressed decoder layers,
pre-norm in encoder and decoder, attention and ReLU dropout 0.1; the IWSLT Transformer's widths.
Each is a stock flag (``--encoder-layers`` ...), its help naming the authors' value. As in the
authors' ``compressed_sublayer.py``: separate key/value projections per source and one shared
query; biases on every projection; the decoder state dropped out (``--dropout``) before ``fc1``;
Xavier-uniform initialisation of [q; k_self; v_self] and of [k_enc; v_enc] each as one matrix.

Ours, not the authors': the encoder states may be wider than the decoder (``--encoder-embed-dim``
!= ``--decoder-embed-dim``); the target prefix's padding is masked; the attention weights returned
for alignment are each head's weights on the encoder states. Incremental decoding caches the prefix
and encoder keys/values per layer and reorders them with the beam, so beam search scores equal a
teacher-forced pass (tested). A checkpoint of this layer before ``fc1`` existed (no ``version``)
loads with ``fc1`` = 0, which computes exactly what it computed then.
"""
import math
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils
from fairseq.distributed import fsdp_wrap
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.modules import LayerNorm
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.fairseq_dropout import FairseqDropout
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor

from ..common.distributed_support import check_ddp_backend, check_tpu

AUTHORS_CODE = "Li et al. 2021's can_transformer_t2t_wmt_en_de_el12_dl2, github.com/Lollipop321/compressed-attention"
# --arch can_transformer_iwslt's defaults: the authors' configuration (flag: value, what it is)
AUTHORS_DEFAULTS = {
    "encoder_layers": (12, "CAN's deep encoder"),
    "decoder_layers": (2, "compressed decoder layers"),
    "encoder_normalize_before": (True, "pre-norm; on by default, no flag turns it off"),
    "decoder_normalize_before": (True, "pre-norm; on by default, no flag turns it off"),
    "attention_dropout": (0.1, "dropout of the attention weights"),
    "activation_dropout": (0.1, "after the ReLU of the compressed sub-layer and of the FFNs; the authors' "
                                "--relu-dropout, which sets it too"),
}
VERSION = 2  # 1 (no version buffer): the layer before fc1, the FFN's first linear on the decoder state's path


def _xavier_uniform_as_one_(*linears: nn.Linear) -> None:
    """Xavier-uniform of the stacked weights of ``linears`` (same input width), as if one matrix: the authors
    initialise [q; k_self; v_self] (``in_proj_weight``) and [k_enc; v_enc] (``encoder_weight``) that way."""
    fan_in, fan_out = linears[0].in_features, sum(linear.out_features for linear in linears)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    for linear in linears:
        nn.init.uniform_(linear.weight, -bound, bound)
        nn.init.zeros_(linear.bias)


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

        def linear(n_in, n_out):
            return quant_noise(nn.Linear(n_in, n_out), cfg.quant_noise.pq, cfg.quant_noise.pq_block_size)

        self.q_proj, self.k_self, self.v_self = linear(d, d), linear(d, d), linear(d, f)
        self.k_enc, self.v_enc = linear(d_enc, d), linear(d_enc, f)  # values FFN-wide: W_1 W_o W_v folded
        self.fc1 = linear(d, f)  # the FFN's first linear on the decoder state (authors: q_relu_weight, relu_bias)
        self.fc2 = linear(f, d)  # the FFN's second linear, acting as the attention's output projection
        self.activation_fn = utils.get_activation_fn(cfg.activation_fn)
        self.dropout = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        self.attention_dropout = FairseqDropout(cfg.attention_dropout, module_name=self.__class__.__name__)
        activation_dropout = cfg.activation_dropout or cfg.relu_dropout or 0.0  # as fairseq's layers read them
        self.activation_dropout = FairseqDropout(float(activation_dropout), module_name=self.__class__.__name__)
        self.normalize_before = cfg.decoder.normalize_before
        self.layer_norm = LayerNorm(d, export=cfg.export)
        self.register_buffer("version", torch.tensor([float(VERSION)]))
        _xavier_uniform_as_one_(self.q_proj, self.k_self, self.v_self)
        _xavier_uniform_as_one_(self.k_enc, self.v_enc)
        for ffn_linear in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(ffn_linear.weight)
            nn.init.zeros_(ffn_linear.bias)

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
        if self_attn_mask is not None:  # the future mask over the prefix (teacher forcing)
            scores = scores + F.pad(self_attn_mask.to(scores.dtype), (s_enc, 0))[None, None]
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
        attn = attn.permute(2, 0, 1, 3).reshape(t, b, self.ffn_dim)  # = W_1 Attn(x^), folded
        hidden = self.activation_fn(self.fc1(self.dropout(x)) + attn)  # act(W_1 (x^ + Attn(x^)) + b_1)
        x = self.fc2(self.activation_dropout(hidden))
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

    def upgrade_state_dict_named(self, state_dict, name):
        """A layer saved before ``fc1`` existed (no ``version``) had no path from the decoder state into the
        FFN; ``fc1`` = 0 computes exactly what it computed."""
        prefix = f"{name}." if name else ""
        if prefix + "version" not in state_dict and prefix + "q_proj.weight" in state_dict:
            for key in ("weight", "bias"):
                state_dict.setdefault(f"{prefix}fc1.{key}", torch.zeros_like(getattr(self.fc1, key)))
        state_dict[prefix + "version"] = torch.tensor([float(VERSION)])


class CANTransformerDecoder(TransformerDecoder):
    def build_decoder_layer(self, args, no_encoder_attn=False):
        if no_encoder_attn:
            raise ValueError("--arch can_transformer: CAN's decoder layer needs encoder-decoder attention")
        cfg = TransformerConfig.from_namespace(args)
        layer = CompressedAttentionLayer(cfg)
        if cfg.checkpoint_activations:  # as fairseq's TransformerDecoderBase.build_decoder_layer wraps its layers
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


@register_model("can_transformer")
class CANTransformerModel(TransformerModel):
    """A fairseq Transformer whose decoder layers are CAN's compressed-attention layers."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        for dest, (value, meaning) in AUTHORS_DEFAULTS.items():
            action = parser._option_string_actions["--" + dest.replace("_", "-")]
            action.help = f"{action.help} [can_transformer_iwslt: {value}, {meaning} ({AUTHORS_CODE})]"

    @classmethod
    def build_model(cls, args, task):
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        if getattr(args, "cross_self_attention", False):
            raise ValueError(f"--cross-self-attention with --arch {args.arch}: CAN's compressed attention already "
                             "attends over [encoder states; target prefix] with one softmax; the flag changes only "
                             "fairseq's stock decoder layer, which CAN replaces")
        if getattr(args, "decoder_xformers_att_config", None):
            raise ValueError(f"--decoder-xformers-att-config with --arch {args.arch}: CAN's decoder layer computes "
                             "its compressed attention itself (FFN-wide values, one softmax over two sources), not "
                             "with xFormers")
        return super().build_model(args, task)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return CANTransformerDecoder(args, tgt_dict, embed_tokens,
                                     no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model_architecture("can_transformer", "can_transformer_iwslt")
def can_transformer_iwslt(args):
    """CAN as its authors configure it (AUTHORS_DEFAULTS) on the IWSLT Transformer's widths."""
    if not hasattr(args, "activation_dropout") and getattr(args, "relu_dropout", None) is not None:
        args.activation_dropout = args.relu_dropout  # the authors' flag; fairseq reads it only where the other is 0
    for dest, (value, _) in AUTHORS_DEFAULTS.items():
        setattr(args, dest, getattr(args, dest, value))
    transformer_iwslt_de_en(args)
