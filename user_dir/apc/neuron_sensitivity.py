"""Neuron sensitivity (Molchanov et al. 2016, as used by the APC paper, section 2.1 "Pruning" and
section 4.2 "Neuron Sensitivity Pruning Initialization", Algorithm 1).

A mask ``M = 1`` (one entry per FFN neuron) multiplies each ``fc1`` output, ``M * (x^T W + b^T)``;
the gradient of the task loss with respect to ``M`` scores each neuron. Our choices where the paper is
silent: the loss is the summed token NLL of the reference translations (teacher-forced, eval mode,
so no dropout and no label smoothing), or for a sentence-level task (an encoder with a
classification head, e.g. GLUE on ``hf_bert``) the summed cross-entropy of the labels (squared error
for a one-output regression head such as STS-B's); the score of a neuron is the mean over batches of
``|dL/dM|`` (Michel et al. 2019's head importance ``E|dL/d xi|``, computed per batch rather than per
example); the ``cmp`` highest-scoring neurons are kept.
"""
from typing import Dict

import torch
import torch.nn.functional as F

from .activation_sampling import ffn_layers


def task_loss(model, sample, pad: int) -> torch.Tensor:
    """The summed loss of ``sample`` under ``model``: token NLL (translation) or the classification head's
    cross-entropy / squared error (sentence tasks)."""
    net = sample["net_input"]
    heads = getattr(model, "classification_heads", None)
    if "prev_output_tokens" not in net and heads:
        if len(heads) != 1:
            raise ValueError(f"the model has {len(heads)} classification heads ({', '.join(heads)}); expected one")
        logits = model(**net, features_only=True, classification_head_name=next(iter(heads)))[0].float()
        target = sample["target"].view(-1)
        if logits.size(-1) == 1:
            return F.mse_loss(logits.view(-1), target.float(), reduction="sum")
        return F.cross_entropy(logits, target, reduction="sum")
    net_output = model(**net)
    lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
    target = sample["target"]
    return F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), ignore_index=pad, reduction="sum")


def neuron_sensitivity(model, batches, pad: int, num_batches: int) -> Dict[str, torch.Tensor]:
    """``{"encoder.layers.i": scores (ffn,)}`` for every FFN of ``model``, from ``num_batches`` batches."""
    layers = ffn_layers(model)
    return mask_sensitivity(model, batches, pad, num_batches,
                            {name: (layer.fc1, layer.fc1.out_features, "output") for name, layer in layers.items()})


def hidden_sensitivity(model, batches, pad: int, num_batches: int) -> Dict[str, torch.Tensor]:
    """``{"encoder.layers.i": scores (embed,)}``: the sensitivity of each hidden dimension of every layer's
    input (the residual stream entering the block), for embedding compression's neuron-pruning
    initialisation (embedding_compression.py): the mask multiplies the block's input."""
    layers = ffn_layers(model)
    return mask_sensitivity(model, batches, pad, num_batches,
                            {name: (layer, layer.fc1.in_features, "input") for name, layer in layers.items()})


def attention_sensitivity(model, batches, pad: int, num_batches: int, names) -> Dict[str, tuple]:
    """``{"encoder.layers.i.self_attn": (query/key scores (embed,), value scores (embed,))}`` for every attention
    of ``model`` named in ``names``, for attention compression's neuron-pruning initialisation
    (attention_compression.py): the mask multiplies the ``q_proj`` output (``q_j k_j`` leaves every score
    with ``q_j``) and the ``v_proj`` output."""
    modules = dict(model.named_modules())
    attentions = [modules[name] for name in names]
    saved = [a.skip_embed_dim_check for a in attentions]
    for a in attentions:  # fairseq's fused path reads the projections' weights and never calls q_proj / v_proj;
        a.skip_embed_dim_check = True  # its unfused path computes the same attention through them
    try:
        scores = mask_sensitivity(model, batches, pad, num_batches, {
            f"{name}.{proj}": (getattr(modules[name], proj), getattr(modules[name], proj).out_features, "output")
            for name in names for proj in ("q_proj", "v_proj")})
    finally:
        for a, s in zip(attentions, saved):
            a.skip_embed_dim_check = s
    return {name: (scores[f"{name}.q_proj"], scores[f"{name}.v_proj"]) for name in names}


def mask_sensitivity(model, batches, pad: int, num_batches: int, targets) -> Dict[str, torch.Tensor]:
    """Molchanov's first-order scores ``mean over batches |dL/dM|`` of a mask ``M = 1`` multiplying each target's
    output (``"output"``) or first input (``"input"``); ``targets`` is ``{name: (module, width, where)}``."""
    if num_batches <= 0:
        raise ValueError(f"num_batches must be > 0, got {num_batches}")
    model.eval()
    ref = next(model.parameters())
    masks = {name: torch.ones(width, device=ref.device, dtype=ref.dtype, requires_grad=True)
             for name, (_, width, _) in targets.items()}

    def masked_input(name):
        def hook(module, args):
            return (args[0] * masks[name],) + tuple(args[1:])
        return hook
    hooks = []
    for name, (module, _, where) in targets.items():
        if where == "output":
            hooks.append(module.register_forward_hook(lambda m, inp, out, name=name: out * masks[name]))
        else:
            hooks.append(module.register_forward_pre_hook(masked_input(name)))
    scores = {name: torch.zeros(m.numel(), dtype=torch.float64) for name, m in masks.items()}
    done = 0
    try:
        for sample in batches:
            loss = task_loss(model, sample, pad)
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
