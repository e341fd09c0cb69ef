"""Rewiring and slicing (GhostBERT section 2.3 "Pruning", following DynaBERT section 3.1): each
layer's heads and FFN neurons reordered by importance, most important first, and the first
M = floor(N_H m) heads and d_ff * M / N_H neurons kept ("M of N_H folds"), as a smaller dense layer
(``common/structured_pruning.py``). The FFN folds of eq 4 are then consecutive blocks of
d_ff / N_H kept neurons in importance order (what the unshared per-fold ghost modules see).

Choices the paper leaves open, and ours: neurons are ranked one by one (DynaBERT), not as whole
folds; ties go to the lower index; the width multiplier is exact (``2/4``, ``0.5``) and
M = floor(N_H m) is computed in exact fractions. A target whose V / O projections keep all N_H
heads (ghost modules after QK / after V, section 4.2: "left unpruned") gets them in the order kept
heads first (importance order), then the pruned ones by index (ghost head f takes head M + f's).
"""
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..common.structured_pruning import encoder_prefix, slice_encoder_layer_state, top_units, transformer_encoder
from .ghost_module import GhostConfigError


def kept_counts(width_mult: str, heads: int, ffn: int) -> Tuple[int, int]:
    """(M, kept FFN neurons) for a width multiplier written ``M/N`` or as a decimal."""
    try:
        m = Fraction(width_mult)
    except (ValueError, ZeroDivisionError):
        raise GhostConfigError(f"--width-mult {width_mult!r}: give a fraction like 2/4 or a number like 0.5")
    if not 0 < m <= 1:
        raise GhostConfigError(f"--width-mult {width_mult}: must be in (0, 1]")
    kept = int(heads * m)  # floor for a positive Fraction
    if kept < 1:
        raise GhostConfigError(f"--width-mult {width_mult}: M = floor({heads} x {m}) = 0 keeps no attention head")
    return kept, ffn * kept // heads


def prune_plan(head_importance: torch.Tensor, neuron_importance: torch.Tensor, kept_heads: int,
               kept_ffn: int) -> List[Tuple[List[int], List[int]]]:
    """Per layer: (kept heads, kept neurons), most important first."""
    return [(top_units(h, kept_heads), top_units(n, kept_ffn)) for h, n in zip(head_importance, neuron_importance)]


def pruned_state_dict(model: nn.Module, plan: List[Tuple[List[int], List[int]]],
                      target_shapes: Optional[Dict[str, torch.Size]] = None) -> Dict[str, torch.Tensor]:
    """``model``'s state dict with every encoder layer sliced to its plan. Where ``target_shapes``
    (name -> shape of the model to load into) wants all heads of a projection, it gets all of them,
    kept heads first."""
    encoder = transformer_encoder(model)
    head_dim, num_heads = encoder.layers[0].self_attn.head_dim, encoder.layers[0].self_attn.num_heads
    state = dict(model.state_dict())
    prefix = encoder_prefix(model)
    for i, (heads, neurons) in enumerate(plan):
        layer = f"{prefix}layers.{i}."
        sliced = slice_encoder_layer_state(state, layer, heads, neurons, head_dim)
        if target_shapes is not None:
            every = list(heads) + [h for h in range(num_heads) if h not in heads]
            whole = slice_encoder_layer_state(state, layer, every, neurons, head_dim)
            sliced.update({k: v for k, v in whole.items()
                           if k in target_shapes and sliced[k].shape != target_shapes[k] == v.shape})
        state.update(sliced)
    return state


def load_pruned(target: nn.Module, source: nn.Module, plan) -> List[str]:
    """Load ``source`` sliced to ``plan`` into ``target`` (a ghost_* model of the kept widths).
    Returns the target's tensors the source does not have (the ghost modules', freshly initialised);
    anything else missing or left over is an error."""
    state = pruned_state_dict(source, plan, {k: v.shape for k, v in target.state_dict().items()})
    result = target.load_state_dict(state, strict=False)
    others = [k for k in result.missing_keys if ".ghost." not in k]
    if others or result.unexpected_keys:
        raise GhostConfigError(f"the pruned model does not fit the source: missing {others[:5]}, "
                               f"unexpected {result.unexpected_keys[:5]}")
    return list(result.missing_keys)
