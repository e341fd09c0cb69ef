"""Ghost modules inside multi-head attention: the "After QK" and "After V" positions of GhostBERT
(Huang et al., section 4.2, Figure 4 (a) and (b), Table 6 / Table 11).

With M = floor(N_H m) kept heads (section 2.1.1), the ghost module generates the N_H - M pruned
heads' tensors from the kept heads' ones, inside the attention:

* **After QK** (``--ghost-positions qk``): Q and K keep M heads; the V and output projections are
  left unpruned (N_H heads: "the parameters in the value and projection layer of MHA are left
  unpruned", section 4.2). Each of the N_H - M ghost heads f gets an attention map
  ``P_f = ReLU( sum_h Conv2D_{f,h}(A_h) )`` from the kept heads' attention maps A_h (n x n), with
  Conv2D as section 4.1 defines it (one input and one output channel, a k x k kernel over both
  map dimensions; "we use Conv2D as the ghost module for After QK because the attention map
  encodes attention probabilities in both dimensions"), and ghost head f's context is P_f V_f.
* **After V** (``--ghost-positions v``): Q, K and V keep M heads, the output projection is left
  unpruned. The kept heads' contexts C_h = A_h V_h (n x d_h) give N_H - M ghost contexts
  ``G_f = ReLU( sum_h DWConv_{f,h}(C_h) )`` -- a DWConv over the sequence (section 2.2.1, d_h
  channels) from M input to N_H - M output channels ("to match the dimension of other parameters,
  the number of input and output channels are M and N_H - M"), concatenated after the kept heads'
  contexts and projected by the unpruned O.

Choices the paper leaves open, and ours (also in README's GhostBERT section):
* The number of ghost heads is N_H - M (what makes the unpruned V / O fit), so both positions need
  M < N_H (refused otherwise, naming ``--ghost-heads``). Every (f, h) pair has its own kernel (the
  stated M -> N_H - M channels; with one kernel for all f the ghost heads would be identical),
  softmax-normalised over its own taps (k x k after QK, k per channel after V; section 2.2.2),
  xavier-uniform initialisation (fairseq's LightweightConv), no bias. Parameters per layer:
  (N_H - M) M k^2 after QK, (N_H - M) M d_h k after V, plus the unpruned V / O.
* After QK convolves the attention *probabilities* (after the softmax: the "attention map"), before
  the attention dropout; the dropout then applies to kept and ghost maps alike. The ghost maps are
  used as they come out of the ReLU (not renormalised: the paper gives no normalisation).
* Padding: the rows of padding queries (and, already zero after the softmax, the columns of
  padding keys) are zeroed before Conv2D, and the ghost maps' padding rows and columns are zeroed
  after it; after V, padding positions of the contexts are zeroed before the DWConv and in the
  ghost contexts. Zero padding is also what lies outside the sequence, and the convolutions are
  translation-equivariant, so the output on real tokens does not depend on how much padding
  (left or right) a batch has (tested).
* In the pruned checkpoint (``rewiring.py``) the unpruned V rows / O columns are ordered kept
  heads first (importance order), then the pruned heads by index: ghost head f takes over the
  (M + f)-th head's V and O weights.
* ``--ghost-conv``, ``--ghost-features`` and ``--ghost-unshared`` configure the modules after O /
  FFN1 / FFN2 only; the kernel size, ``--ghost-no-softmax`` and ``--ghost-no-relu`` apply here too.
* Encoder self-attention only (no incremental state): the ghost_* architectures prune encoders.

The attention is computed here (rather than by fairseq's ``MultiheadAttention.forward``, whose
fused path never exposes the per-head maps and contexts) for the encoder self-attention case; the
module subclasses :class:`PrunedMultiheadAttention` (fairseq's ``MultiheadAttention``), so the
projections, their names in the state dict, the scaling and dropout are fairseq's.
"""
from dataclasses import replace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq import utils

from ..common.structured_pruning import PrunedMultiheadAttention
from .ghost_module import ATTENTION_POSITIONS, GhostConfig, GhostConfigError, GhostConv, normalised_kernel


def zero_padding(y: torch.Tensor, padding_mask: Optional[torch.Tensor], dims=(2,)) -> torch.Tensor:
    """``y`` (B x heads x ...) with the positions marked in ``padding_mask`` (B x T) zeroed along each
    of the dimensions ``dims`` (of size T)."""
    if padding_mask is None:
        return y
    keep = (~padding_mask).to(y.dtype)
    for dim in dims:
        shape = [1] * y.dim()
        shape[0], shape[dim] = keep.size(0), keep.size(1)
        y = y * keep.view(shape)
    return y


class AttentionMapGhost(nn.Module):
    """After QK: N_H - M ghost attention maps from the M kept ones, ``P_f = ReLU(sum_h Conv2D_{f,h}(A_h))``."""

    def __init__(self, kept_heads: int, ghost_heads: int, cfg: GhostConfig):
        super().__init__()
        self.cfg, self.kept_heads, self.ghost_heads = cfg, kept_heads, ghost_heads
        k = cfg.kernel_size
        self.weight = nn.Parameter(torch.empty(ghost_heads, kept_heads, k, k))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, probs: torch.Tensor, padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """``probs``: B x M x T x S attention probabilities; returns B x (N_H - M) x T x S."""
        probs = zero_padding(probs, padding_mask, dims=(2, 3))
        kernel = normalised_kernel(self.weight, self.cfg.softmax, dims=2)
        maps = F.conv2d(probs, kernel.to(probs.dtype), padding=self.cfg.kernel_size // 2)
        maps = F.relu(maps) if self.cfg.relu else maps
        return zero_padding(maps, padding_mask, dims=(2, 3))

    def parameter_count(self) -> int:
        return self.weight.numel()

    def flops(self, length: int) -> int:
        """2 (N_H - M) M k^2 n^2 on one sequence of n = ``length`` tokens (counted by torch's counter too)."""
        return 2 * self.ghost_heads * self.kept_heads * self.cfg.kernel_size ** 2 * length * length


class GhostAttention(PrunedMultiheadAttention):
    """Encoder self-attention with M kept heads and a ghost module after QK or after V (Table 6)."""

    def __init__(self, embed_dim: int, num_heads: int, kept_heads: int, position: str, cfg: GhostConfig,
                 dropout: float = 0.0):
        if position not in ATTENTION_POSITIONS:
            raise GhostConfigError(f"--ghost-positions: {position!r} is not an attention position "
                                   f"({', '.join(ATTENTION_POSITIONS)})")
        if not 1 <= kept_heads < num_heads:
            raise GhostConfigError(f"--ghost-positions {position}: the ghost module generates the N_H - M pruned "
                                   f"heads, so --ghost-heads must be below the layer's {num_heads} heads "
                                   f"(got {kept_heads}; ghost_prune: a --width-mult below 1)")
        super().__init__(embed_dim, num_heads, kept_heads, dropout=dropout)
        self.position, self.total_heads = position, num_heads
        full = num_heads * self.head_dim
        if position == "qk":  # V and O unpruned
            self.v_proj = nn.Linear(embed_dim, full)
        self.out_proj = nn.Linear(full, embed_dim)
        self.reset_parameters()
        ghosts = num_heads - kept_heads
        if position == "qk":
            self.ghost = AttentionMapGhost(kept_heads, ghosts, cfg)
        else:  # DWConv over the sequence, d_h channels, M -> N_H - M heads, a kernel per (f, h)
            self.ghost = GhostConv(self.head_dim, kept_heads,
                                   replace(cfg, conv="dwconv", features=ghosts, shared=False, compiled=False))

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if incremental_state is not None or static_kv or before_softmax or key is not query or value is not query:
            raise NotImplementedError("ghost modules after QK / after V are built for encoder self-attention only")
        T, B, _ = query.shape
        M, H, dh = self.num_heads, self.total_heads, self.head_dim
        q = (self.q_proj(query) * self.scaling).view(T, B, M, dh).permute(1, 2, 0, 3)  # B x M x T x dh
        k = self.k_proj(query).view(T, B, M, dh).permute(1, 2, 3, 0)  # B x M x dh x T
        scores = torch.matmul(q, k)  # B x M x T x T
        if attn_mask is not None:
            scores = scores + attn_mask.to(scores.dtype)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(torch.bool)
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        probs = utils.softmax(scores, dim=-1).type_as(scores)  # in float32, as fairseq's attention
        v = self.v_proj(query).view(T, B, -1, dh).permute(1, 2, 0, 3)  # B x (H or M) x T x dh
        if self.position == "qk":
            probs = torch.cat([probs, self.ghost(probs, key_padding_mask)], dim=1)  # B x H x T x T
            context = torch.matmul(self.dropout_module(probs), v)
        else:
            kept = torch.matmul(self.dropout_module(probs), v)  # B x M x T x dh
            ghost = self.ghost(zero_padding(kept, key_padding_mask).permute(2, 0, 1, 3))  # T x B x (H - M) x dh
            ghost = F.relu(ghost) if self.ghost.cfg.relu else ghost
            context = torch.cat([kept, zero_padding(ghost.permute(1, 2, 0, 3), key_padding_mask)], dim=1)
        out = self.out_proj(context.permute(2, 0, 1, 3).reshape(T, B, H * dh))
        weights = None
        if need_weights or need_head_weights:
            weights = probs.transpose(0, 1)  # heads x B x T x S, as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def ghost_parameter_count(self) -> int:
        return self.ghost.parameter_count()

    def ghost_flops(self, length: int) -> int:
        return self.ghost.flops(length)
