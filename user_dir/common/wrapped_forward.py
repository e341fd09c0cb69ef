"""Run a student through its own forward, as DistributedDataParallel needs, and keep what its
encoder computed on the way.

Under ``--ddp-backend pytorch_ddp`` (fairseq's default on GPUs) the model a criterion receives is
``ModuleProxyWrapper(DistributedDataParallel(model))``. Attribute access falls through to the inner
model, so ``model.encoder(...)`` runs -- but only a call of the wrapper itself, ``model(...)``, runs
DDP's forward, which arms the gradient all-reduce: a loss computed through a sub-module leaves
every rank with its own gradient. Criteria therefore call ``model(...)`` and read intermediate
results either from what the model's forward returns (``return_all_hiddens``, ``features_only``)
or through forward hooks (:func:`outputs_of`) that record a sub-module's output *during* that call;
registering a hook is attribute access, computing is left to the wrapper.

A translation model's forward always runs its decoder. When a loss needs only the encoder,
:func:`encode` gives the decoder a single target position (the cost of one token) instead of
calling the encoder alone; :func:`unused_output` then ties that output into the loss with weight 0,
so that every trainable decoder parameter receives a (zero) gradient -- what ``legacy_ddp`` gives a
parameter without one -- and DDP's reducer, which waits for a gradient of every parameter it saw in
the forward, finishes its all-reduce without ``--find-unused-parameters``.
"""
from contextlib import contextmanager
from typing import Dict

import torch
import torch.nn as nn


def is_sentence_model(model: nn.Module) -> bool:
    """RoBERTa-style sentence encoders (``model.encoder.sentence_encoder``) vs encoder-decoder models."""
    return hasattr(model.encoder, "sentence_encoder")


@contextmanager
def outputs_of(**modules: nn.Module):
    """``{name: output}`` of each module's last call during the ``with`` block (forward hooks)."""
    found: Dict[str, object] = {}
    handles = [module.register_forward_hook(lambda m, args, out, name=name: found.__setitem__(name, out))
               for name, module in modules.items()]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def encode(model: nn.Module, net_input: dict, whole_decoder: bool = False, **kwargs):
    """One forward of the whole (possibly wrapped) model; returns ``(encoder_out, output)``.

    Sentence models: ``encoder_out`` is the final features (B x T x C) and ``output`` is the model's
    (``(features, extra)``, or ``(logits, extra)`` with ``classification_head_name``). Translation
    models: ``encoder_out`` is the encoder's output dict (fairseq's ``encoder_out`` /
    ``encoder_padding_mask`` / ``encoder_states``) and ``output`` the decoder's, over every target
    position with ``whole_decoder``, else over the first one only. ``kwargs`` go to the
    model's forward (``return_all_hiddens``, ``classification_head_name`` ...)."""
    if is_sentence_model(model):
        with outputs_of(encoder=model.encoder) as found:
            output = model(net_input["src_tokens"], features_only=True, **kwargs)
        return found["encoder"][0], output
    prev = net_input["prev_output_tokens"]
    with outputs_of(encoder=model.encoder) as found:
        output = model(net_input["src_tokens"], net_input["src_lengths"], prev if whole_decoder else prev[:, :1],
                       **kwargs)
    return found["encoder"], output


def unused_output(output) -> torch.Tensor:
    """0 x (the model's first output): add it to a loss that does not read the output, so every
    trainable parameter that produced it gets a zero gradient (see the module docstring)."""
    return output[0].float().sum() * 0.0
