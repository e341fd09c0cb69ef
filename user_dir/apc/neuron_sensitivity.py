"""Neuron sensitivity (Molchanov et al. 2016, as used by the APC paper, section 2.1 "Pruning" and
section 4.2 "Neuron Sensitivity Pruning Initialization", Algorithm 1).

A mask ``M = 1`` (one entry per FFN neuron) multiplies each ``fc1`` output, ``M * (x^T W + b^T)``;
the gradient of the task loss with respect to ``M`` scores each neuron. Our choices where the paper is
silent: the loss is the summed token NLL of the reference translations (teacher-forced, eval mode,
so no dropout and no label smoothing); the score of a neuron is the mean over batches of
``|dL/dM|`` (Michel et al. 2019's head importance ``E|dL/d xi|``, computed per batch rather than per
example); the ``cmp`` highest-scoring neurons are kept.
"""
from typing import Dict

import torch
import torch.nn.functional as F


def neuron_sensitivity(model, batches, pad: int, num_batches: int) -> Dict[str, torch.Tensor]:
    """``{"encoder.layers.i": scores (ffn,)}`` for every FFN of ``model``, from ``num_batches`` batches."""
    if num_batches <= 0:
        raise ValueError(f"num_batches must be > 0, got {num_batches}")
    model.eval()
    layers = {f"{side}.layers.{i}": layer for side in ("encoder", "decoder")
              for i, layer in enumerate(getattr(model, side).layers)}
    ref = next(model.parameters())
    masks = {name: torch.ones(layer.fc1.out_features, device=ref.device, dtype=ref.dtype, requires_grad=True)
             for name, layer in layers.items()}
    hooks = [layer.fc1.register_forward_hook(lambda m, inp, out, name=name: out * masks[name])
             for name, layer in layers.items()]
    scores = {name: torch.zeros(m.numel(), dtype=torch.float64) for name, m in masks.items()}
    done = 0
    try:
        for sample in batches:
            net_output = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
            target = sample["target"]
            loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=pad, reduction="sum")
            grads = torch.autograd.grad(loss, list(masks.values()))
            for name, g in zip(masks, grads):
                scores[name] += g.detach().abs().double().cpu()
            done += 1
            if done >= num_batches:
                break
    finally:
        for h in hooks:
            h.remove()
    if done == 0:
        raise ValueError("no batch to score the neurons on")
    return {name: s / done for name, s in scores.items()}
