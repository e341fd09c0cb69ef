"""Variator's compression plugin (Xiao et al., "Variator: Accelerating Pre-trained Models with
Plug-and-Play Compression Modules", section 3.2, Figure 2).

A plugin wraps one neural layer (an FFN by default) of a frozen encoder layer:

* **hidden compression layer**: the sequence is cut into groups of k consecutive vectors
  g_i = {h_ik, ..., h_(i+1)k-1}; each group becomes one vector
      a = softmax(W_c concat(g_i) + b_c),   g_i = sum_j a_j h_ik+j          (W_c: k x kd, b_c: k)
  so the wrapped layer runs on n/k vectors;
* **hidden decompression layer**: the wrapped layer's output g_i^o is copied back to the k positions
  of its group and an adapter restores token-level information
      o_ik+j = g_i^o + W_u2 (W_u1 concat(g_i^o, h_ik+j) + b_u1) + b_u2    (W_u1: r x 2d, W_u2: d x r)

What the paper leaves open, and our choices (each a flag of the Variator tasks):
* Padding. The authors' code fails on lengths that are not a multiple of k and averages pad
  vectors into groups. Here each sequence's real tokens are first gathered to the front (so
  fairseq's left-padded sources and right-padded sentences are grouped the same way, independent
  of the batch), the tail is filled to a multiple of k, and pad positions are masked out of the
  softmax and zeroed before the concatenation: a pad's content cannot change any merged vector.
  A group made only of padding merges to the zero vector.
* The adapter has no non-linearity in the paper's equation; the authors' code puts a Tanh between
  the two linears (``--variator-adapter-activation tanh``). Default: the paper's equation.
* h in the adapter is the wrapped layer's input, i.e. the FFN input after its LayerNorm (pre-norm)
  or after the attention block's LayerNorm (post-norm), as the authors' code does.

Ablations of Table 2: ``mean`` compression (w/o Com: mean pooling over the group's real tokens)
and ``copy`` decompression (w/o DeCom: g_i^o copied to every position, no adapter).

Att-KV (section 4.7): only the keys and values of self-attention are computed from merged
vectors; queries stay token-level, so the output keeps its length and needs no decompression.

Tensors are time-major (T x B x C), as in fairseq's encoder layers.
"""
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

COMPRESSIONS = ("learned", "mean")
DECOMPRESSIONS = ("adapter", "copy")
PLACES = ("ffn", "att-kv")
ACTIVATIONS = {"none": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


class Groups(NamedTuple):
    """A sequence cut into groups of k (what decompression needs to undo the merge)."""
    vectors: torch.Tensor  # G x k x B x C, real tokens first in each sequence, pads zeroed
    keep: torch.Tensor  # G x k x B, True where a real token sits
    order: Optional[torch.Tensor]  # B x T, the gather that put real tokens first (None: nothing moved)
    length: int  # T, the original length


def group_sequence(x: torch.Tensor, pad_mask: Optional[torch.Tensor], k: int) -> Groups:
    """Cut ``x`` (T x B x C) into ceil(T/k) groups of k vectors, per sequence, real tokens first.

    ``pad_mask`` (B x T, True at padding) may be None. Padding is moved behind each sequence's real
    tokens (a stable sort keeps their order), the tail is filled to a multiple of k, and every pad
    position is zeroed and marked in ``keep``.
    """
    T, B, C = x.shape
    order = None
    if pad_mask is not None and bool(pad_mask.any()):
        order = torch.sort(pad_mask.to(torch.uint8), dim=1, stable=True).indices  # B x T
        x = x.gather(0, order.t().unsqueeze(-1).expand(T, B, C))
        keep = ~pad_mask.gather(1, order).t()  # T x B
        x = x * keep.unsqueeze(-1).to(x.dtype)
    else:
        keep = x.new_ones(T, B, dtype=torch.bool)
    G = math.ceil(T / k)
    if G * k != T:
        x = F.pad(x, (0, 0, 0, 0, 0, G * k - T))
        keep = F.pad(keep, (0, 0, 0, G * k - T), value=False)
    return Groups(x.view(G, k, B, C), keep.view(G, k, B), order, T)


def ungroup_sequence(y: torch.Tensor, groups: Groups) -> torch.Tensor:
    """Inverse of :func:`group_sequence` for per-position outputs ``y`` ((G*k) x B x C)."""
    y = y[: groups.length]
    if groups.order is None:
        return y
    T, B, C = y.shape
    inverse = torch.argsort(groups.order, dim=1)  # B x T
    return y.gather(0, inverse.t().unsqueeze(-1).expand(T, B, C))


def merge_weights(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax over each group's k slots (``logits``: G x B x k), pads excluded; all-pad groups get 0."""
    keep = keep.permute(0, 2, 1)  # G x B x k
    logits = logits.float().masked_fill(~keep, float("-inf"))
    any_real = keep.any(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(~any_real, 0.0), dim=-1)
    return weights.masked_fill(~any_real, 0.0)


def mean_weights(keep: torch.Tensor) -> torch.Tensor:
    """Mean pooling over each group's real tokens (the 'w/o Com' ablation of Table 2)."""
    keep = keep.permute(0, 2, 1).float()  # G x B x k
    return keep / keep.sum(-1, keepdim=True).clamp(min=1.0)


def weighted_merge(groups: Groups, weights: torch.Tensor) -> torch.Tensor:
    """g_i = sum_j a_j h_ik+j: G x B x C from weights G x B x k."""
    return torch.einsum("gbk,gkbc->gbc", weights.to(groups.vectors.dtype), groups.vectors)


@dataclass(frozen=True)
class PluginConfig:
    """What one plugin is; stored in plugin files so a plugin rebuilds itself."""
    ratio: int = 4  # k
    layers: tuple = ()  # 0-based encoder layer indices that carry a plugin
    place: str = "ffn"  # 'ffn' or 'att-kv'
    bottleneck: int = 64  # r
    compression: str = "learned"  # or 'mean' (w/o Com)
    decompression: str = "adapter"  # or 'copy' (w/o DeCom)
    adapter_activation: str = "none"  # the paper's equation; the authors' code: 'tanh'

    def __post_init__(self):
        if self.ratio < 1:
            raise ValueError(f"--variator-ratio {self.ratio}: the compression ratio k must be >= 1")
        for value, choices, flag in ((self.place, PLACES, "--variator-place"),
                                     (self.compression, COMPRESSIONS, "--variator-compression"),
                                     (self.decompression, DECOMPRESSIONS, "--variator-decompression"),
                                     (self.adapter_activation, tuple(ACTIVATIONS), "--variator-adapter-activation")):
            if value not in choices:
                raise ValueError(f"{flag} {value!r}: choose one of {', '.join(choices)}")
        if self.bottleneck < 1:
            raise ValueError(f"--variator-bottleneck {self.bottleneck}: must be >= 1")

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "layers": list(self.layers), "place": self.place,
                "bottleneck": self.bottleneck, "compression": self.compression,
                "decompression": self.decompression, "adapter_activation": self.adapter_activation}

    @classmethod
    def from_dict(cls, d: dict) -> "PluginConfig":
        return cls(**{**d, "layers": tuple(d["layers"])})


class HiddenCompression(nn.Module):
    """The hidden compression layer: W_c (k x kd) and b_c (k) score the k vectors of a group."""

    def __init__(self, embed_dim: int, ratio: int, mode: str = "learned"):
        super().__init__()
        self.ratio, self.mode = ratio, mode
        self.scorer = nn.Linear(ratio * embed_dim, ratio) if mode == "learned" else None
        if self.scorer is not None:
            # start as mean pooling (zero scores); training moves away from it
            nn.init.zeros_(self.scorer.weight)
            nn.init.zeros_(self.scorer.bias)

    def forward(self, x: torch.Tensor, pad_mask: Optional[torch.Tensor]):
        groups = group_sequence(x, pad_mask, self.ratio)
        if self.scorer is None:
            weights = mean_weights(groups.keep)
        else:
            G, k, B, C = groups.vectors.shape
            concat = groups.vectors.permute(0, 2, 1, 3).reshape(G, B, k * C)
            weights = merge_weights(self.scorer(concat), groups.keep)
        return weighted_merge(groups, weights), groups

    def macs_per_token(self, embed_dim: int) -> int:
        """Multiply-adds per input token: the scorer (k*d) and the weighted sum (d)."""
        return (self.ratio * embed_dim if self.scorer is not None else 0) + embed_dim


class HiddenDecompression(nn.Module):
    """The hidden decompression layer: copy g_i^o to its k positions, add the adapter's correction."""

    def __init__(self, embed_dim: int, bottleneck: int, mode: str = "adapter", activation: str = "none"):
        super().__init__()
        self.mode = mode
        if mode == "adapter":
            self.down = nn.Linear(2 * embed_dim, bottleneck)  # W_u1, b_u1
            self.activation = ACTIVATIONS[activation]()
            self.up = nn.Linear(bottleneck, embed_dim)  # W_u2, b_u2
            # a zero up-projection makes a fresh plugin start as 'copy'
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)

    def forward(self, merged_out: torch.Tensor, groups: Groups) -> torch.Tensor:
        G, k, B, C = groups.vectors.shape
        group_out = merged_out.unsqueeze(1)  # G x 1 x B x C: g_i^o, broadcast over its k positions
        if self.mode == "adapter":
            # W_u1 concat(g_i^o, h) = W_u1[:, :d] g_i^o + W_u1[:, d:] h: the g_i^o half runs once per
            # group instead of once per token, and no concatenated copy is made (same result)
            w = self.down.weight
            z = F.linear(groups.vectors, w[:, C:], self.down.bias) + F.linear(group_out, w[:, :C])
            out = group_out + self.up(self.activation(z))
        else:
            out = group_out.expand(G, k, B, C)
        return ungroup_sequence(out.reshape(G * k, B, C), groups)

    def macs(self, embed_dim: int, groups: int, ratio: int) -> int:
        """Multiply-adds for ``groups`` groups of ``ratio`` positions: W_u1's token half on every
        position, its group half once per group, W_u2 on every position."""
        if self.mode != "adapter":
            return 0
        r = self.down.out_features
        return groups * ratio * 2 * embed_dim * r + groups * embed_dim * r


class CompressionPlugin(nn.Module):
    """One layer's plugin: compression (+ decompression for 'ffn'; 'att-kv' needs none)."""

    def __init__(self, embed_dim: int, config: PluginConfig):
        super().__init__()
        self.config = config
        self.compression = HiddenCompression(embed_dim, config.ratio, config.compression)
        self.decompression = (HiddenDecompression(embed_dim, config.bottleneck, config.decompression,
                                                  config.adapter_activation)
                              if config.place == "ffn" else None)

    def macs(self, embed_dim: int, length: int) -> int:
        """Multiply-adds the plugin adds on one sequence of ``length`` positions (section 3.4)."""
        groups = math.ceil(length / self.config.ratio)
        macs = groups * self.config.ratio * self.compression.macs_per_token(embed_dim)
        if self.decompression is not None:
            macs += self.decompression.macs(embed_dim, groups, self.config.ratio)
        return macs


def group_padding_mask(groups: Groups) -> torch.Tensor:
    """B x G mask of groups holding no real token (for attention over merged keys and values)."""
    return ~groups.keep.any(1).t()
