"""Every layer of a fairseq layer list, whatever the module's training mode.

With ``--encoder-layerdrop`` / ``--decoder-layerdrop`` > 0 fairseq keeps the layers in a
``LayerDropModuleList`` (fairseq/modules/layer_drop.py), whose *iteration* in training mode skips each
layer with probability p: that is how layers are dropped in the forward pass. Code that walks the
layers to build, hook, prune or fold them (a freshly built model is in training mode) must index the
list instead, or it silently misses random layers.
"""
from typing import List, Tuple

from torch import nn


def every_layer(layers: nn.ModuleList) -> List[nn.Module]:
    """All of ``layers`` in order, never dropped (indexing a LayerDropModuleList does not drop)."""
    return [layers[i] for i in range(len(layers))]


def dropping_sides(model) -> List[Tuple[str, float]]:
    """``[(side, p)]`` for each of ``model``'s encoder / decoder that drops layers (``--{side}-layerdrop p``,
    p > 0). A criterion that matches layer l's hidden states with another model's layer l must refuse
    these: in a forward pass fairseq runs, hooks and lists only the layers that were not dropped."""
    found = []
    for side in ("encoder", "decoder"):
        module = getattr(model, side, None)
        module = getattr(module, "sentence_encoder", module)  # RoBERTa-family: the TransformerEncoder inside
        p = getattr(module, f"{side}_layerdrop", 0) or 0
        if p > 0:
            found.append((side, p))
    return found
