"""PET's replaceable pairs (Jeon et al. 2023, "Finding replaceable pairs in encoder and decoder").

A student with L logical layers is built from L/2 physical ones:

* **Layer-wise pairs** (Table 2): the two layers of a pair share every weight. Patterns, shown for
  L = 4 and generalised to any even L: ``interleaved`` {(1,3),(2,4)} (the paper's choice),
  ``adjacent`` {(1,2),(3,4)}, ``mirrored`` {(1,4),(2,3)}, ``none`` (a vanilla L-layer model).
* **Encoder matrix-wise pairs** (Table 3, Fig 2): in the second layer of each pair two projections
  of self-attention trade roles, e.g. ``qk``: Q_3 is K_1 and K_3 is Q_1 (nothing else moves; the
  published code also permutes V, which the paper does not). ``kv``, ``vq``, ``none``.
* **Decoder matrix-wise pairs**: ``qself-qed`` (Fig 3, the paper's choice): in every layer the
  self-attention query and the encoder-decoder-attention query are one matrix, which also removes
  a matrix per layer. The alternatives of Table 8: ``qself-kself`` (self-attention Q and K one
  matrix), ``kv-self-ed`` (K and V one matrix, in both attentions). The cross-layer swaps of
  Table 4: ``swap-{qk,kv,vq}-self`` (self-attention only) and ``swap-{qk,kv,vq}-all`` (both
  attentions; the paper shows these collapse). ``none``.

Logical layers that reuse a physical layer are *views*: new module objects whose submodules are
the physical layer's own (so parameters are shared tensors, counted and optimised once, and stay
shared through save/load), but whose attention modules are distinct objects, so each logical
decoder layer keeps its own incremental-decoding cache (the published code shares one cache
between the two passes of a shared layer, which breaks beam search).
"""
import copy
from typing import Dict, List, Optional, Sequence, Tuple

import torch.nn as nn

LAYER_PAIRINGS = ("interleaved", "adjacent", "mirrored", "none")
ENCODER_MATRIX_PAIRS = ("qk", "kv", "vq", "none")
DECODER_MATRIX_PAIRS = (
    "qself-qed", "qself-kself", "kv-self-ed",
    "swap-qk-self", "swap-kv-self", "swap-vq-self", "swap-qk-all", "swap-kv-all", "swap-vq-all", "none",
)
_SWAPS = {"qk": ("q_proj", "k_proj"), "kv": ("k_proj", "v_proj"), "vq": ("v_proj", "q_proj")}


class PETConfigError(ValueError):
    """A PET configuration that cannot be built; the message names the flag."""


def layer_pairs(num_layers: int, pairing: str, flag: str = "--encoder-layers") -> List[Tuple[int, int]]:
    """0-based (first, second) logical-layer pairs; the second reuses the first's weights."""
    if pairing not in LAYER_PAIRINGS:
        raise PETConfigError(f"--layer-pairing {pairing!r}: expected one of {', '.join(LAYER_PAIRINGS)}")
    if pairing == "none":
        return []
    if num_layers < 2 or num_layers % 2:
        raise PETConfigError(f"{flag} {num_layers}: --layer-pairing {pairing} pairs layers, so the number "
                             "of logical layers must be even and at least 2 (or use --layer-pairing none)")
    half = num_layers // 2
    if pairing == "interleaved":
        return [(i, i + half) for i in range(half)]
    if pairing == "adjacent":
        return [(2 * i, 2 * i + 1) for i in range(half)]
    return [(i, num_layers - 1 - i) for i in range(half)]  # mirrored


def _view(module: nn.Module, replace: Optional[Dict[str, nn.Module]] = None) -> nn.Module:
    """A new module object sharing ``module``'s submodules, parameters and buffers (not copies).

    Its tables (submodules, parameters, buffers, hooks) are its own copies, so replacing an entry or
    registering a hook on one logical layer leaves the other alone. It computes with its class's
    ``forward``: a module whose instance carries its own bound ``forward`` (fairseq's
    ``checkpoint_wrapper`` binds the wrapped layer's) would make the view compute as that very
    layer, so such a module is refused; pet_transformer.py wraps the logical layers after sharing.
    """
    if "forward" in vars(module):
        raise PETConfigError(
            f"{type(module).__name__} carries an instance-bound forward (activation checkpointing?): a view "
            "of it would compute as the original layer; share the layers first, then wrap the logical ones")
    view = copy.copy(module)
    for name, value in vars(module).items():
        if isinstance(value, (dict, set)):
            vars(view)[name] = copy.copy(value)
    for name, sub in (replace or {}).items():
        view._modules[name] = sub
    return view


def attention_view(attn: nn.Module, swap: Optional[str] = None) -> nn.Module:
    """A view of a fairseq MultiheadAttention with its own incremental-state key, and two
    projections trading roles if ``swap`` ('qk', 'kv' or 'vq') is given."""
    replace = {}
    if swap:
        a, b = _SWAPS[swap]
        replace = {a: attn._modules[b], b: attn._modules[a]}
    view = _view(attn, replace)
    if hasattr(view, "init_incremental_state"):
        view.init_incremental_state()  # a fresh cache key: this logical layer's own cache
    return view


def _check_swap_shapes(attn: nn.Module, swap: str, flag: str) -> None:
    a, b = _SWAPS[swap]
    wa, wb = attn._modules[a].weight, attn._modules[b].weight
    if wa.shape != wb.shape:
        raise PETConfigError(
            f"{flag}: {a} {tuple(wa.shape)} and {b} {tuple(wb.shape)} of the encoder-decoder attention "
            "differ in shape (encoder and decoder dims differ), so they cannot trade roles; use equal "
            "--encoder-embed-dim and --decoder-embed-dim or another pattern")


def share_encoder_layers(layers: Sequence[nn.Module], pairing: str, matrix_pairs: str) -> List[nn.Module]:
    """Logical encoder layers from fairseq TransformerEncoderLayers (Table 2, Table 3)."""
    if matrix_pairs not in ENCODER_MATRIX_PAIRS:
        raise PETConfigError(f"--encoder-matrix-pairs {matrix_pairs!r}: expected one of {', '.join(ENCODER_MATRIX_PAIRS)}")
    if matrix_pairs != "none" and pairing == "none":
        raise PETConfigError(f"--encoder-matrix-pairs {matrix_pairs} pairs matrices across a layer pair: "
                             "it needs --layer-pairing other than none")
    logical = list(layers)
    for first, second in layer_pairs(len(layers), pairing, "--encoder-layers"):
        physical = logical[first]
        swap = None if matrix_pairs == "none" else matrix_pairs
        logical[second] = _view(physical, {"self_attn": attention_view(physical.self_attn, swap)})
    return logical


def share_decoder_layers(layers: Sequence[nn.Module], pairing: str, matrix_pairs: str) -> List[nn.Module]:
    """Logical decoder layers from fairseq TransformerDecoderLayers (Tables 2, 4, 8; Fig 3)."""
    if matrix_pairs not in DECODER_MATRIX_PAIRS:
        raise PETConfigError(f"--decoder-matrix-pairs {matrix_pairs!r}: expected one of {', '.join(DECODER_MATRIX_PAIRS)}")
    pairs = layer_pairs(len(layers), pairing, "--decoder-layers")
    if matrix_pairs.startswith("swap-") and pairing == "none":
        raise PETConfigError(f"--decoder-matrix-pairs {matrix_pairs} pairs matrices across a layer pair: "
                             "it needs --layer-pairing other than none")
    logical = list(layers)
    physical_ids = {first for first, _ in pairs} if pairs else set(range(len(layers)))
    for i in sorted(physical_ids):
        layer = logical[i]
        ed = getattr(layer, "encoder_attn", None)
        if matrix_pairs == "qself-qed":
            if ed is None:
                raise PETConfigError("--decoder-matrix-pairs qself-qed needs encoder-decoder attention")
            ed._modules["q_proj"] = layer.self_attn._modules["q_proj"]
        elif matrix_pairs == "qself-kself":
            layer.self_attn._modules["k_proj"] = layer.self_attn._modules["q_proj"]
        elif matrix_pairs == "kv-self-ed":
            layer.self_attn._modules["v_proj"] = layer.self_attn._modules["k_proj"]
            if ed is not None:
                ed._modules["v_proj"] = ed._modules["k_proj"]
    swap = matrix_pairs.split("-")[1] if matrix_pairs.startswith("swap-") else None
    for first, second in pairs:
        physical = logical[first]
        replace = {"self_attn": attention_view(physical.self_attn, swap)}
        ed = getattr(physical, "encoder_attn", None)
        if ed is not None:
            ed_swap = swap if matrix_pairs.endswith("-all") else None
            if ed_swap:
                _check_swap_shapes(ed, ed_swap, f"--decoder-matrix-pairs {matrix_pairs}")
            replace["encoder_attn"] = attention_view(ed, ed_swap)
        logical[second] = _view(physical, replace)
    return logical
