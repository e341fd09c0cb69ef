"""Every layer of a fairseq layer list, whatever the module's training mode.

With ``--encoder-layerdrop`` / ``--decoder-layerdrop`` > 0 fairseq keeps the layers in a
``LayerDropModuleList`` (fairseq/modules/layer_drop.py), whose *iteration* in training mode skips each
layer with probability p: that is how layers are dropped in the forward pass. Code that walks the
layers to build, hook, prune or fold them (a freshly built model is in training mode) must index the
list instead, or it silently misses random layers.
"""
from typing import List

from torch import nn


def every_layer(layers: nn.ModuleList) -> List[nn.Module]:
    """All of ``layers`` in order, never dropped (indexing a LayerDropModuleList does not drop)."""
    return [layers[i] for i in range(len(layers))]
