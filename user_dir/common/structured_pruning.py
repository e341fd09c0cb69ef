"""Structured width pruning of fairseq Transformer encoder layers: fewer attention heads and fewer
FFN neurons, as genuinely smaller dense layers (smaller projection matrices, fewer heads).

A layer is pruned per *unit*: attention head h owns rows ``h*d_h:(h+1)*d_h`` of the Q, K and V
projections (weights and biases) and the same columns of the output projection; FFN neuron i owns
row i of ``fc1`` (weight and bias) and column i of ``fc2``. Biases of the output projection and of
``fc2`` belong to no unit and are kept whole. Keeping units in a given order (most important
first, "rewiring") and slicing the tensors gives a layer that computes exactly what the unpruned
layer computes with the other units' outputs multiplied by zero (tested).

fairseq's ``MultiheadAttention`` derives ``head_dim = embed_dim // num_heads``, so a layer with
fewer heads of the *original* head width needs its own module: :class:`PrunedMultiheadAttention`
(a subclass: projections of ``kept_heads * head_dim`` outputs; fairseq's own attribute
convention for pruned heads, ``embed_dim`` = inner width and ``skip_embed_dim_check``, so the
inherited forward, incremental decoding included, works unchanged).

Works for every fairseq ``TransformerEncoderLayerBase``: translation encoders (``model.encoder``)
and RoBERTa-style sentence encoders (``model.encoder.sentence_encoder``). Knows no compression
method: which units to keep is the caller's choice.
"""
from typing import Dict, List, Sequence

import torch
import torch.nn as nn
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise

ATTENTION_ROWS = ("q_proj", "k_proj", "v_proj")


class PruningError(ValueError):
    """A pruning request that cannot be served by this model."""


def transformer_encoder(model: nn.Module) -> nn.Module:
    """The fairseq TransformerEncoder inside a translation or RoBERTa-style model."""
    encoder = getattr(model, "encoder", None)
    encoder = getattr(encoder, "sentence_encoder", encoder)
    if encoder is None or not hasattr(encoder, "layers"):
        raise PruningError(f"{type(model).__name__} has no fairseq Transformer encoder to prune")
    return encoder


def encoder_prefix(model: nn.Module) -> str:
    """State-dict prefix of the encoder returned by :func:`transformer_encoder`."""
    return "encoder.sentence_encoder." if hasattr(model.encoder, "sentence_encoder") else "encoder."


class PrunedMultiheadAttention(MultiheadAttention):
    """Self-attention keeping ``kept_heads`` of ``num_heads`` heads of width ``embed_dim // num_heads``.

    Q, K, V map ``embed_dim`` to ``kept_heads * head_dim``; the output projection maps it back.
    The scaling stays ``head_dim ** -0.5`` (the unpruned heads' own).
    """

    def __init__(self, embed_dim: int, num_heads: int, kept_heads: int, dropout: float = 0.0,
                 q_noise: float = 0.0, qn_block_size: int = 8):
        if not 1 <= kept_heads <= num_heads:
            raise PruningError(f"a layer of {num_heads} heads cannot keep {kept_heads}")
        super().__init__(embed_dim, num_heads, dropout=dropout, self_attention=True, q_noise=q_noise,
                         qn_block_size=qn_block_size)
        self.kept_heads = kept_heads
        inner = kept_heads * self.head_dim
        for name in ATTENTION_ROWS:
            setattr(self, name, quant_noise(nn.Linear(embed_dim, inner), q_noise, qn_block_size))
        self.out_proj = quant_noise(nn.Linear(inner, embed_dim), q_noise, qn_block_size)
        self.num_heads = kept_heads
        self.embed_dim = inner  # fairseq's convention for pruned heads (MultiheadAttention._adaptive_prune_heads)
        self.skip_embed_dim_check = True  # the query is embed_dim wide, the inner width is not
        self.reset_parameters()


def resize_encoder_layer(layer: nn.Module, kept_heads: int, kept_ffn: int) -> None:
    """Give ``layer`` (a TransformerEncoderLayerBase) a self-attention of ``kept_heads`` heads and an
    FFN of ``kept_ffn`` neurons, with fresh weights of the new shapes (load or slice them after)."""
    attn = layer.self_attn
    heads, d = attn.num_heads, layer.embed_dim
    if not 1 <= kept_ffn <= layer.fc1.out_features:
        raise PruningError(f"an FFN of {layer.fc1.out_features} neurons cannot keep {kept_ffn}")
    qn, block = layer.quant_noise, layer.quant_noise_block_size
    layer.self_attn = PrunedMultiheadAttention(d, heads, kept_heads, dropout=attn.dropout_module.p,
                                               q_noise=qn, qn_block_size=block)
    layer.fc1 = layer.build_fc1(d, kept_ffn, qn, block)
    layer.fc2 = layer.build_fc2(kept_ffn, d, qn, block)


def head_rows(heads: Sequence[int], head_dim: int) -> torch.Tensor:
    """Row indices of the Q/K/V projections (columns of the output projection) owned by ``heads``."""
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads])


def slice_encoder_layer_state(state: Dict[str, torch.Tensor], prefix: str, heads: Sequence[int],
                              neurons: Sequence[int], head_dim: int) -> Dict[str, torch.Tensor]:
    """The tensors of encoder layer ``prefix`` (e.g. ``encoder.layers.0.``) in ``state`` keeping
    ``heads`` and ``neurons`` in the given order. Other tensors of the layer are returned unchanged."""
    rows = head_rows(heads, head_dim)
    neurons = torch.as_tensor(list(neurons), dtype=torch.long)
    out = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if name.split(".")[0] == "self_attn" and name.split(".")[1] in ATTENTION_ROWS:
            value = value.index_select(0, rows)
        elif name == "self_attn.out_proj.weight":
            value = value.index_select(1, rows)
        elif name in ("fc1.weight", "fc1.bias"):
            value = value.index_select(0, neurons)
        elif name == "fc2.weight":
            value = value.index_select(1, neurons)
        out[key] = value.clone()
    return out


def top_units(importance: torch.Tensor, keep: int) -> List[int]:
    """Indices of the ``keep`` largest scores, most important first (ties: lower index first)."""
    order = sorted(range(importance.numel()), key=lambda i: (-float(importance[i]), i))
    return order[:keep]
