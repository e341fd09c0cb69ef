"""APC's feed-forward compression (APC paper, section 3.2 "Feed Forward Compression", eq. 12).

    FF~(X) = sigma((X W^alpha + b^alpha) D^alpha) U^beta W^beta + b^beta

The FFN's first linear (fairseq's ``fc1``) gets the down-projection ``D^alpha`` on its output (with
``b_D`` and a corrective ``B^alpha``), the second (``fc2``) gets the paired up-projection ``U^beta``
on its input (with ``b_U`` and ``B^beta``): a bottleneck of width ``cmp^f`` at the activation. Both are
:class:`~user_dir.apc.reparameterised_linear.APCLinear`; finalising folds them into two dense layers
of widths ``in x cmp^f`` and ``cmp^f x out``, exactly a stock FFN of ``--*-ffn-embed-dim cmp^f``.

Per-layer sizes are given as a flag value (:func:`parse_layer_dims`): ``"256"`` compresses every layer
to 256; ``"1:256,2:128"`` compresses layers 1 and 2 (0-based) and leaves the others as they are
(the paper's APC-50-ff leaves BERT's first two layers uncompressed, Table 4).

The reconstruction pair of eq. 4 for this compression is ``X^{l+1} = sigma(X W^alpha + b^alpha)`` (the
uncompressed activation) and ``X~^{l+1} = sigma((X W^alpha + b^alpha) D + b_D + X B^alpha) U + b_U``;
:func:`reconstruction_pair` returns both from the tensors the two layers recorded in their last forward.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn

from .reparameterised_linear import APCLinear


class APCConfigError(ValueError):
    """An APC configuration that cannot be built; the message names the flag."""


def parse_layer_dims(spec: Optional[str], num_layers: int, original: int, flag: str,
                     what: str = "FFN width") -> Dict[int, int]:
    """``"256"`` -> every layer; ``"0:256,2:128"`` -> those layers; ``None``/``""`` -> none.

    A size must satisfy ``0 < size <= original`` (a size equal to the original still reparameterises
    the layer); a layer index must lie in ``0..num_layers-1`` and appear once.
    """
    if spec is None or str(spec).strip() == "":
        return {}
    spec = str(spec).strip()
    dims: Dict[int, int] = {}
    try:
        if ":" not in spec:
            dims = {i: int(spec) for i in range(num_layers)}
        else:
            for item in spec.split(","):
                idx, size = item.split(":")
                idx, size = int(idx), int(size)
                if idx in dims:
                    raise APCConfigError(f"{flag} {spec!r}: layer {idx} is given twice")
                if not 0 <= idx < num_layers:
                    raise APCConfigError(
                        f"{flag} {spec!r}: layer index {idx} is out of range (the model has {num_layers} "
                        f"layers, indices 0..{num_layers - 1})")
                dims[idx] = size
    except APCConfigError:
        raise
    except ValueError:
        raise APCConfigError(
            f"{flag} {spec!r}: expected one size (e.g. 256) or comma-separated LAYER:SIZE pairs (e.g. 1:256,2:128)")
    for idx, size in dims.items():
        if size <= 0:
            raise APCConfigError(f"{flag} {spec!r}: the size of layer {idx} must be > 0, got {size}")
        if size > original:
            raise APCConfigError(
                f"{flag} {spec!r}: the size of layer {idx} ({size}) is larger than the original {what} "
                f"{original}; APC only compresses")
    return dims


def compress_ffn(layer: nn.Module, cmp: Optional[int], train_original: bool, cmp_e: Optional[int] = None) -> None:
    """Reparameterise ``layer.fc1``/``layer.fc2`` (a fairseq Transformer layer) with a ``cmp``-wide
    bottleneck (eq. 12), in place; ``cmp_e`` (the block's embedding compression, embedding_compression.py)
    adds ``U^alpha`` on fc1's input and ``D^beta`` on fc2's output. ``None`` leaves that side alone."""
    layer.fc1 = APCLinear(layer.fc1, cmp_in=cmp_e, cmp_out=cmp, train_original=train_original)
    layer.fc2 = APCLinear(layer.fc2, cmp_in=cmp, cmp_out=cmp_e, train_original=train_original)


def shrink_ffn(layer: nn.Module, cmp: Optional[int], cmp_e: Optional[int] = None) -> None:
    """Replace ``fc1``/``fc2`` by dense layers of FFN width ``cmp`` and block width ``cmp_e`` (the finalised
    shape, ``None`` = unchanged; values are set by loading a finalised state dict)."""
    fc1, fc2 = layer.fc1, layer.fc2
    factory = dict(device=fc1.weight.device, dtype=fc1.weight.dtype)
    layer.fc1 = nn.Linear(cmp_e or fc1.in_features, cmp or fc1.out_features, **factory)
    layer.fc2 = nn.Linear(cmp or fc2.in_features, cmp_e or fc2.out_features, **factory)


def is_compressed(layer: nn.Module) -> bool:
    """Whether the layer's FFN has APC's bottleneck (eq. 12), i.e. ``fc1`` a down-projection ``D^alpha``."""
    fc1 = getattr(layer, "fc1", None)
    return isinstance(fc1, APCLinear) and fc1.D is not None


def set_recording(layer: nn.Module, on: bool) -> None:
    if is_compressed(layer):
        for fc in (layer.fc1, layer.fc2):
            fc.record = on
            if not on:
                fc.recorded_full_output = fc.recorded_reconstruction = None


def reconstruction_pair(layer: nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(X^{l+1}, X~^{l+1})`` of eq. 4 from the layer's last recorded forward, both ``(..., ffn)``.

    The target is detached: it is the uncompressed network's activation (identical to the teacher's
    while ``W`` is frozen), which the compressed one is pulled towards (activation KD, section 4.3).
    """
    pre = layer.fc1.recorded_full_output
    approx = layer.fc2.recorded_reconstruction
    if pre is None or approx is None:
        raise RuntimeError("no recorded forward: call set_recording(layer, True) before the forward pass")
    return layer.activation_fn(pre).detach(), approx


def pruned_ffn_state(fc1_weight, fc1_bias, fc2_weight, keep: torch.Tensor):
    """Plain neuron pruning: the rows of fc1 and columns of fc2 listed in ``keep`` (sorted)."""
    return fc1_weight[keep], fc1_bias[keep], fc2_weight[:, keep]
