"""First-order importance of attention heads and FFN neurons (GhostBERT section 2.3 "Pruning",
following DynaBERT, Hou et al. 2020, section 3.1 / its ``compute_neuron_head_importance``).

A mask of ones multiplies each head's output (the context vector of head h, before the output
projection O: H_h of eq 1 is linear in it) and each FFN neuron's activation (before fc2). The
importance of a unit is |dL/d mask|, the first-order change of the loss when the unit is removed,
accumulated as a sum of absolute values over batches (DynaBERT sums |grad| batch by batch):

    I_h = sum_batches | dL_batch / d m_h |

Choices the paper leaves open, and ours:
* The loss is the task loss of the fine-tuned model (cross-entropy of the translation's target
  tokens, summed over tokens; cross-entropy of the sentence label for GLUE), computed in eval mode
  (no dropout), as DynaBERT does; ``python -m user_dir.ghost.tools.prune --subset`` chooses the
  data (DynaBERT: the dev set).
* Neuron importance is the gradient w.r.t. a neuron mask. This equals DynaBERT's fc2-column term
  sum_j W2_ji dL/dW2_ji exactly; DynaBERT also adds a fc1-row-and-bias term, which we leave out (the
  brief of issue 20 asks for mask gradients for both kinds of unit).
* Heads and neurons are ranked within each layer (every layer keeps the same M, as in the paper).
"""
from contextlib import contextmanager
from typing import Callable, Iterable, Tuple

import torch
import torch.nn as nn

from ..common.layer_lists import every_layer
from ..common.structured_pruning import transformer_encoder


class ImportanceMasks:
    """Masks of ones on every encoder layer's heads (L x H) and FFN neurons (L x d_ff)."""

    def __init__(self, model: nn.Module):
        self.layers = every_layer(transformer_encoder(model).layers)
        reference = next(model.parameters())
        heads = {layer.self_attn.num_heads for layer in self.layers}
        widths = {layer.fc1.out_features for layer in self.layers}
        if len(heads) != 1 or len(widths) != 1:
            raise ValueError("importance masks need every encoder layer to have the same heads and FFN width")
        kw = dict(device=reference.device, dtype=torch.float32)
        self.head_mask = torch.ones(len(self.layers), heads.pop(), requires_grad=True, **kw)
        self.neuron_mask = torch.ones(len(self.layers), widths.pop(), requires_grad=True, **kw)
        self._handles, self._saved = [], []

    def __enter__(self):
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            self._saved.append(attn.skip_embed_dim_check)
            attn.skip_embed_dim_check = True  # the unfused path, which calls out_proj as a module

            def mask_heads(module, args, i=i, heads=attn.num_heads):
                x = args[0]
                shape = x.shape
                mask = self.head_mask[i].to(x.dtype).view(1, 1, heads, 1)
                return ((x.view(*shape[:-1], heads, -1) * mask).view(shape),)

            def mask_neurons(module, args, i=i):
                return (args[0] * self.neuron_mask[i].to(args[0].dtype),)

            self._handles.append(attn.out_proj.register_forward_pre_hook(mask_heads))
            self._handles.append(layer.fc2.register_forward_pre_hook(mask_neurons))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        for layer, saved in zip(self.layers, self._saved):
            layer.self_attn.skip_embed_dim_check = saved
        self._handles, self._saved = [], []

    def zero_grad(self) -> None:
        self.head_mask.grad = None
        self.neuron_mask.grad = None


@contextmanager
def frozen_eval(model: nn.Module):
    """Eval mode and no parameter gradients (only the masks need them); restored afterwards."""
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    model.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)


def accumulate_importance(model: nn.Module, loss_fn: Callable, batches: Iterable) -> Tuple[torch.Tensor, torch.Tensor]:
    """(head importance L x H, neuron importance L x d_ff): sum over ``batches`` of |dL/d mask|,
    ``loss_fn(model, batch)`` giving the scalar loss of one batch."""
    with frozen_eval(model), ImportanceMasks(model) as masks:
        heads = torch.zeros_like(masks.head_mask)
        neurons = torch.zeros_like(masks.neuron_mask)
        count = 0
        for batch in batches:
            masks.zero_grad()
            loss_fn(model, batch).backward()
            heads += masks.head_mask.grad.abs()
            neurons += masks.neuron_mask.grad.abs()
            count += 1
    if count == 0:
        raise ValueError("no batch to compute importance on (empty data set?)")
    return heads.detach().cpu(), neurons.detach().cpu()
