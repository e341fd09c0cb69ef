"""GhostBERT models (Huang et al., section 2.1, Figure 2): a fairseq encoder whose layers keep M
heads and a narrower FFN (a genuinely smaller dense model), with ghost modules after O and after
FFN2 (eqs 3 and 5), or at the other positions of Table 6 (after FFN1: on the intermediate layer's
output after the activation, fc2 reading it at its kept width, ghost_module.GhostActivation; after QK /
after V inside the attention, ghost_attention.py, which leave V and O / O unpruned as section 4.2 says).

* ``--arch ghost_transformer`` / ``ghost_transformer_iwslt_de_en``: fairseq's translation
  ``transformer`` with such an encoder (the decoder is unchanged);
* ``--arch ghost_hf_bert`` / ``ghost_hf_minilm_l6``: the imported Hugging Face BERT-family
  encoders (``user_dir/bert/``, the GLUE backbones) with such an encoder.

The widths are architecture flags (``--ghost-heads``, ``--ghost-ffn-dim``), so a pruned (+ghost)
model is an ordinary fairseq checkpoint: ``fairseq-train``, ``-generate``, ``-validate`` and
``-interactive`` build it from the checkpoint's own arguments. ``--encoder-attention-heads`` and
``--encoder-ffn-embed-dim`` stay the unpruned model's (the head width is ``embed_dim /
encoder_attention_heads``). The pruned initial checkpoint comes from ``python -m
user_dir.ghost.tools.prune`` (importance.py, rewiring.py).

Every layer keeps the same M heads and the same FFN width, as in the paper (M = floor(N_H m) per
layer, M of N_H folds of FFN neurons). ``--ghost-positions none`` is the "pruned only" model of
Table 3 / Table 10; ``--ghost-heads`` equal to the encoder's heads with ghost positions is
GhostBERT on the unpruned model (m = 12/12 in Table 1).
"""
import copy
import types

import torch
import torch.nn as nn
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import base_architecture, transformer_iwslt_de_en

from ..bert.hf_bert_model import HFBertModel, hf_bert, hf_minilm_l6
from ..common.distributed_support import check_ddp_backend, check_tpu
from ..common.layer_lists import every_layer
from ..common.structured_pruning import PrunedMultiheadAttention, resize_encoder_layer, transformer_encoder
from .ghost_attention import GhostAttention
from .ghost_module import (ATTENTION_POSITIONS, CONV_TYPES, POSITIONS, GhostActivation, GhostConfig, GhostConfigError,
                           GhostLinear)


# the ghost_* architecture that prunes each supported model type
GHOST_ARCH = {"transformer": "ghost_transformer", "hf_bert": "ghost_hf_bert"}


def ghost_model_args(model_args, **ghost_flags):
    """A copy of a checkpoint's model arguments (a ``transformer`` or ``hf_bert`` model) turned into
    those of the matching ghost_* architecture with ``ghost_flags`` (e.g. ``ghost_heads=2``)."""
    base = ARCH_MODEL_NAME_REGISTRY.get(getattr(model_args, "arch", None))
    if base not in GHOST_ARCH:
        raise GhostConfigError(f"a '{base}' model (arch {getattr(model_args, 'arch', None)}): GhostBERT prunes "
                               f"{' and '.join(GHOST_ARCH)} models")
    args = copy.deepcopy(model_args)
    args.arch = args._name = GHOST_ARCH[base]
    for name, value in ghost_flags.items():
        if not name.startswith("ghost_"):
            raise ValueError(f"{name} is not a ghost flag")
        setattr(args, name, value)
    ARCH_CONFIG_REGISTRY[args.arch](args)
    return args


def add_ghost_args(parser) -> None:
    """The architecture flags of a GhostBERT encoder (also read by tools/ghost_prune.py)."""
    parser.add_argument("--ghost-heads", type=int, metavar="M",
                        help="attention heads kept in every encoder layer: M = floor(N_H * m) (section 2.1.1; "
                             "default: all of --encoder-attention-heads, the unpruned m = 1)")
    parser.add_argument("--ghost-ffn-dim", type=int, metavar="N",
                        help="FFN neurons kept in every encoder layer: M of N_H folds, i.e. d_ff * M / N_H "
                             "(section 2.1.2; default: all of --encoder-ffn-embed-dim)")
    parser.add_argument("--ghost-positions", type=str, metavar="LIST",
                        help="where ghost modules go, comma-separated from " + ", ".join(POSITIONS)
                             + " (after QK: Conv2D on the kept heads' attention maps, V and O unpruned / "
                               "after V: DWConv from the M kept to the N_H - M pruned heads' contexts, O "
                               "unpruned / after O / after FFN1: on act(X W1 + b1), added before fc2 / after "
                               "FFN2; section 4.2, Table 6; qk and v "
                               "exclude each other); 'none' = pruned only (Table 3); paper: o,ffn2")
    parser.add_argument("--ghost-kernel-size", type=int, metavar="K",
                        help="convolution kernel size, odd (section 3.1, Figure 3 / Table 9; paper: 3)")
    parser.add_argument("--ghost-conv", choices=CONV_TYPES,
                        help="convolution type of the modules after O / FFN1 / FFN2 (section 4.1, Table 5; "
                             "after QK is always Conv2D and after V DWConv, Table 6; paper: dwconv)")
    parser.add_argument("--ghost-conv1d-f-length", type=int, metavar="N",
                        help="--ghost-conv conv1d_f: its n input/output channels, one per token position, the "
                             "longest sentence it takes (section 4.1; paper: 128, its padded length)")
    parser.add_argument("--ghost-no-softmax", action="store_true", default=None,
                        help="do not softmax-normalise the kernels (Table 4 '- Softmax'; paper: normalised)")
    parser.add_argument("--ghost-no-relu", action="store_true", default=None,
                        help="no nonlinearity on the ghost features (Table 4 '- ReLU'; paper: ReLU, eq 2)")
    parser.add_argument("--ghost-features", type=int, metavar="F",
                        help="ghost features per sub-layer, F of eqs 3 and 5 (Appendix B.4; paper: 1)")
    parser.add_argument("--ghost-zero-init", action="store_true", default=None,
                        help="multiply each ghost module's features by a learnable scale initialised to 0, so the "
                             "model starts exactly as the pruned one (ours: the paper does not say how ghost modules "
                             "start; default off, the kernels' xavier initialisation); after O / FFN1 / FFN2 only")
    parser.add_argument("--ghost-compile", action="store_true", default=None,
                        help="at inference (no autograd), run each depthwise ghost module as one torch.compile'd "
                             "kernel (Inductor: C++ on a CPU, Triton on CUDA) instead of the eager form's k + 3 "
                             "passes over the activations; the same values, the first forward of each shape "
                             "compiles (seconds), training unchanged; the modules after O / FFN1 / FFN2. Ours "
                             "(issue 35), not the paper's; default off. On a trained checkpoint: --model-overrides "
                             "\"{'ghost_compile': True}\"")
    parser.add_argument("--ghost-unshared", action="store_true", default=None,
                        help="a ghost module per (feature, head) G_{f,h} instead of one shared by the heads "
                             "(Appendix B.4; paper: shared, section 2.3); after O and FFN2 only (refused with ffn1, "
                             "whose depthwise module already has a kernel per fold neuron)")


def ghost_defaults(args) -> None:
    """The paper's values for every ghost flag not given."""
    args.ghost_heads = getattr(args, "ghost_heads", None)
    args.ghost_ffn_dim = getattr(args, "ghost_ffn_dim", None)
    args.ghost_positions = getattr(args, "ghost_positions", None) or "o,ffn2"
    args.ghost_kernel_size = getattr(args, "ghost_kernel_size", None) or 3
    args.ghost_conv = getattr(args, "ghost_conv", None) or "dwconv"
    args.ghost_conv1d_f_length = getattr(args, "ghost_conv1d_f_length", None) or 128
    args.ghost_no_softmax = bool(getattr(args, "ghost_no_softmax", False))
    args.ghost_no_relu = bool(getattr(args, "ghost_no_relu", False))
    args.ghost_features = getattr(args, "ghost_features", None) or 1
    args.ghost_unshared = bool(getattr(args, "ghost_unshared", False))
    args.ghost_zero_init = bool(getattr(args, "ghost_zero_init", False))
    args.ghost_compile = bool(getattr(args, "ghost_compile", False))


def parse_positions(spec: str) -> tuple:
    if spec.strip() == "none":
        return ()
    positions = tuple(p.strip() for p in spec.split(",") if p.strip())
    bad = [p for p in positions if p not in POSITIONS]
    if bad or not positions:
        raise GhostConfigError(f"--ghost-positions {spec!r}: give 'none' or a comma-separated list of "
                               f"{', '.join(POSITIONS)}")
    if all(p in positions for p in ATTENTION_POSITIONS):
        raise GhostConfigError(f"--ghost-positions {spec!r}: qk and v both generate the pruned heads; give one")
    return positions


def ghost_config(args) -> GhostConfig:
    return GhostConfig(kernel_size=args.ghost_kernel_size, conv=args.ghost_conv, softmax=not args.ghost_no_softmax,
                       relu=not args.ghost_no_relu, features=args.ghost_features, shared=not args.ghost_unshared,
                       conv1d_f_length=args.ghost_conv1d_f_length, zero_init=args.ghost_zero_init,
                       compiled=args.ghost_compile)


def kept_widths(args, heads: int, ffn: int) -> tuple:
    """(M, FFN width) of ``args``, checked against the unpruned ``heads`` and ``ffn``."""
    kept_heads = heads if args.ghost_heads is None else args.ghost_heads
    kept_ffn = ffn if args.ghost_ffn_dim is None else args.ghost_ffn_dim
    if not 1 <= kept_heads <= heads:
        raise GhostConfigError(f"--ghost-heads {kept_heads}: a layer of {heads} heads must keep 1..{heads} "
                               "(a width multiplier m with floor(N_H m) = 0 keeps no head)")
    if not 1 <= kept_ffn <= ffn:
        raise GhostConfigError(f"--ghost-ffn-dim {kept_ffn}: an FFN of {ffn} neurons must keep 1..{ffn}")
    return kept_heads, kept_ffn


def ghost_encoder_layer(layer: nn.Module, kept_heads: int, kept_ffn: int, positions: tuple, cfg: GhostConfig) -> None:
    """Resize ``layer`` to ``kept_heads`` / ``kept_ffn`` and put ghost modules at ``positions``."""
    heads, ffn = layer.self_attn.num_heads, layer.fc1.out_features
    if (kept_heads, kept_ffn) != (heads, ffn):
        resize_encoder_layer(layer, kept_heads, kept_ffn)
    ghosts = []
    inside = [p for p in positions if p in ATTENTION_POSITIONS]
    if inside:  # after QK / after V: the attention computes N_H heads from M (ghost_attention.py)
        layer.self_attn = GhostAttention(layer.embed_dim, heads, kept_heads, inside[0], cfg,
                                         dropout=layer.self_attn.dropout_module.p)
    if "o" in positions:
        attn = layer.self_attn
        if not isinstance(attn, PrunedMultiheadAttention):  # the fused fast path would bypass out_proj
            resize_encoder_layer(layer, kept_heads, kept_ffn)
            attn = layer.self_attn
        # O's input: M heads, or all N_H after QK / after V
        attn.out_proj = GhostLinear(attn.out_proj.in_features, layer.embed_dim,
                                    attn.out_proj.in_features // attn.head_dim, cfg)
        ghosts.append(attn.out_proj)
    if "ffn2" in positions:
        layer.fc2 = GhostLinear(kept_ffn, layer.embed_dim, kept_heads, cfg)  # M folds of kept_ffn / M neurons
        ghosts.append(layer.fc2)
    if "ffn1" in positions:  # after the activation: fairseq computes fc2(activation_dropout(activation_fn(fc1(x))))
        layer.activation_fn = GhostActivation(layer.activation_fn, kept_ffn, cfg)
        ghosts.append(layer.activation_fn)
    if ghosts:
        layer.register_forward_pre_hook(give_padding_mask, with_kwargs=True)
    if any(isinstance(g, GhostLinear) for g in ghosts) and not getattr(layer, "return_fc", False):
        # (return_fc hands fc2's own output on: no fusion)
        layer.residual_connection = types.MethodType(residual_connection, layer)
        layer.register_forward_hook(check_deferred)


# The hooks and the residual add below find the layer's ghost modules when called, never through a closure, so a
# deep copy of the model (fairseq's EMA, bench_ghost_costs.py's forms) keeps them pointing at its own modules.
def layer_ghosts(layer: nn.Module) -> list:
    """The ghost modules of an encoder layer that take its padding mask: after O, FFN1's activation, after FFN2."""
    found = (getattr(layer.self_attn, "out_proj", None), layer.activation_fn, layer.fc2)
    return [m for m in found if isinstance(m, (GhostLinear, GhostActivation))]


def give_padding_mask(layer: nn.Module, args, kwargs) -> None:
    """Before each forward: the layer's padding mask to its ghost modules; and, at inference with --ghost-compile,
    the modules after O and FFN2 defer their ghost features to the layer's residual adds
    (:func:`residual_connection`, installed where the layer has one of them). Training and ONNX export run every
    module whole."""
    mask = kwargs["encoder_padding_mask"] if "encoder_padding_mask" in kwargs else (args[1] if len(args) > 1 else None)
    fused = ("residual_connection" in vars(layer) and not torch.is_grad_enabled() and not layer.training
             and not torch.onnx.is_in_onnx_export())
    for ghost in layer_ghosts(layer):
        ghost.padding_mask = mask
        if isinstance(ghost, GhostLinear):
            ghost.defer = fused and ghost.cfg.compiled


def residual_connection(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """fairseq's ``residual + x``; where ``x`` is the projection a ghost module after O or FFN2 deferred (fairseq's
    layer computes ``residual_connection(dropout(out_proj(...)), residual)``, and the same after fc2; an inference
    dropout returns its input itself), ``residual + y + ghost(y)`` in one compiled pass
    (ghost_module.shifted_ghost_residual_graph): the module alone makes one more pass over the activations than
    pruned only's add (results/archive/deploy_glue.md)."""
    for ghost in layer_ghosts(layer):
        out = ghost.add_deferred(x, residual) if isinstance(ghost, GhostLinear) else None
        if out is not None:
            return out
    return type(layer).residual_connection(layer, x, residual)


def check_deferred(layer: nn.Module, args, output) -> None:
    """After each forward: a deferral the forward did not consume is an error, never a silently missing module."""
    for ghost in layer_ghosts(layer):
        if isinstance(ghost, GhostLinear):
            ghost.defer = False
            if ghost.deferred is not None:
                ghost.deferred = None
                raise RuntimeError("--ghost-compile: a ghost module's output did not reach its layer's residual add "
                                   "(fairseq's encoder layer changed?); load the model without ghost_compile")


def build_ghost_encoder(model: nn.Module, args) -> None:
    """Turn ``model``'s freshly built encoder into a GhostBERT encoder as ``args`` say."""
    encoder = transformer_encoder(model)
    if getattr(args, "quant_noise_pq", 0):
        raise GhostConfigError("--quant-noise-pq is not supported by the ghost_* architectures")
    if getattr(args, "encoder_layers_to_keep", None):
        raise GhostConfigError("--encoder-layers-to-keep is not supported by the ghost_* architectures: GhostBERT "
                               "keeps the teacher's depth (layer l is distilled from the teacher's layer l, eq 6); "
                               "drop layers before pruning, not while")
    layer0 = encoder.layers[0]
    kept_heads, kept_ffn = kept_widths(args, layer0.self_attn.num_heads, layer0.fc1.out_features)
    positions, cfg = parse_positions(args.ghost_positions), ghost_config(args)
    if positions and all(p in ATTENTION_POSITIONS for p in positions) and (
            cfg.conv != "dwconv" or cfg.features != 1 or not cfg.shared):
        raise GhostConfigError(f"--ghost-conv / --ghost-features / --ghost-unshared configure the modules after O, "
                               f"FFN1 and FFN2; --ghost-positions {args.ghost_positions} has none (after QK is "
                               "Conv2D and after V DWConv, Table 6)")
    if cfg.zero_init and any(p in ATTENTION_POSITIONS for p in positions):
        raise GhostConfigError(f"--ghost-zero-init scales the modules after O, FFN1 and FFN2; --ghost-positions "
                               f"{args.ghost_positions} puts one inside the attention (after QK / V), which generates "
                               "heads rather than adding features")
    if cfg.compiled and not any(p in ("o", "ffn1", "ffn2") for p in positions):
        raise GhostConfigError(f"--ghost-compile compiles the modules after O, FFN1 and FFN2; --ghost-positions "
                               f"{args.ghost_positions} has none")
    if not cfg.shared and kept_ffn % kept_heads and "ffn2" in positions:
        raise GhostConfigError(f"--ghost-unshared: --ghost-ffn-dim {kept_ffn} does not split into "
                               f"{kept_heads} folds")
    for layer in every_layer(encoder.layers):
        ghost_encoder_layer(layer, kept_heads, kept_ffn, positions, cfg)


class GhostEncoderMixin:
    """The ghost flags and the GhostBERT encoder, added to a fairseq model class."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_ghost_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        model = super().build_model(args, task)
        build_ghost_encoder(model, args)
        return model


@register_model("ghost_transformer")
class GhostTransformerModel(GhostEncoderMixin, TransformerModel):
    """fairseq's translation Transformer with a GhostBERT encoder."""


@register_model("ghost_hf_bert")
class GhostHFBertModel(GhostEncoderMixin, HFBertModel):
    """An imported BERT-family encoder (hf_bert) with a GhostBERT encoder."""


@register_model_architecture("ghost_transformer", "ghost_transformer")
def ghost_transformer(args):
    ghost_defaults(args)
    base_architecture(args)


@register_model_architecture("ghost_transformer", "ghost_transformer_iwslt_de_en")
def ghost_transformer_iwslt_de_en(args):
    ghost_defaults(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("ghost_hf_bert", "ghost_hf_bert")
def ghost_hf_bert(args):
    ghost_defaults(args)
    hf_bert(args)


@register_model_architecture("ghost_hf_bert", "ghost_hf_minilm_l6")
def ghost_hf_minilm_l6(args):
    ghost_defaults(args)
    hf_minilm_l6(args)
