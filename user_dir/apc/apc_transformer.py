"""``--arch apc_transformer``: a stock fairseq ``transformer`` whose FFNs (APC paper, section 3.2, eq. 12),
multi-head attentions (section 3.2, eqs 5-9) and block widths (section 3.2 "Embedding Compression",
Appendix A) are APC-compressed, with per-layer sizes as in section 4.1 / Table 4.

The encoder and decoder are fairseq's own; after they are built, the FFN of every layer named by
``--apc-encoder-ffn-dims`` / ``--apc-decoder-ffn-dims`` is reparameterised (ffn_compression.py), and the
encoder self-attention, decoder self-attention and encoder-decoder attention of the layers named by
``--apc-encoder-attn-dims`` / ``--apc-decoder-attn-dims`` / ``--apc-cross-attn-dims``
(attention_compression.py), and the blocks named by ``--apc-encoder-embed-dims`` /
``--apc-decoder-embed-dims`` work at the compressed width between a pre- and a post-scaling
(embedding_compression.py). Every projection is reparameterised once, for all compressions that apply
to it (:func:`apply_apc`). Everything else (embeddings, the layer norms of uncompressed blocks) is the
stock module, so a teacher's state dict loads into it with only ``fc1.weight -> fc1.linear.weight``
(and the like) renamed (:meth:`load_uncompressed_state`).

Training modes (Table 3 of the paper, "fine-tuning strategies"):

* default: only APC's compression parameters (U, D, B, b_U, b_D) train, every original weight is
  frozen ("Compr. only"; Weight Squeezing's setting, and the paper's compression stage);
* ``--apc-train-original``: all parameters train ("All Params");
* ``--apc-finalized``: the FFNs are plain dense layers of the compressed widths (the folded model,
  "Finalized"). When every layer of a side shares one size, ``python -m user_dir.apc.tools.finalize``
  writes a stock ``transformer`` checkpoint instead, which needs no ``--user-dir``; this flag is for
  per-layer sizes that a stock architecture cannot express.
"""
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.models.transformer.transformer_encoder import TransformerEncoder

from ..common.distributed_support import check_ddp_backend, check_tpu
from .activation_sampling import ffn_layers, side_of
from .attention_compression import CompressedAttention
from .embedding_compression import (compress_block_embedding, compressed_norm_names, embedding_parameters,
                                    group_runs, runs_of)
from .ffn_compression import (APCConfigError, compress_ffn, is_compressed, parse_layer_dims, reconstruction_pair,
                              set_recording, shrink_ffn)
from .reparameterised_linear import APCLinear


def embed_dims(module, args, side: str) -> dict:
    """``{layer: cmp^e}`` of ``--apc-{side}-embed-dims`` (embedding_compression.py)."""
    return parse_layer_dims(getattr(args, f"apc_{side}_embed_dims", None), len(module.layers),
                            getattr(args, f"{side}_embed_dim"), f"--apc-{side}-embed-dims",
                            what=f"embedding width (--{side}-embed-dim)")


def apply_apc(module, args, side: str) -> None:
    """APC's three compressions (section 3.2) on the layers of ``module`` (an encoder or decoder), in place:
    feed-forward, attention, embedding; each projection is reparameterised once, for all that apply."""
    embed = embed_dims(module, args, side)
    apply_ffn_compression(module, args, side, embed)
    apply_attention_compression(module, args, side, embed)
    apply_embedding_compression(module, args, side, embed)


def apply_ffn_compression(module, args, side: str, embed: dict) -> None:
    flag = f"--apc-{side}-ffn-dims"
    original = getattr(args, f"{side}_ffn_embed_dim")
    dims = parse_layer_dims(getattr(args, f"apc_{side}_ffn_dims", None), len(module.layers), original, flag)
    for idx in sorted(set(dims) | set(embed)):
        layer = module.layers[idx]
        if type(layer.fc1) is not nn.Linear or type(layer.fc2) is not nn.Linear:
            raise APCConfigError(f"{flag}: layer {idx}'s FFN is not a plain Linear (quant-noise is not supported)")
        if getattr(args, "apc_finalized", False):
            shrink_ffn(layer, dims.get(idx), embed.get(idx))
        else:
            compress_ffn(layer, dims.get(idx), train_original=getattr(args, "apc_train_original", False),
                         cmp_e=embed.get(idx))


# (flag, side, attribute of the layer): every multi-head attention of a Transformer (section 3.2)
ATTENTION_FLAGS = (("--apc-encoder-attn-dims", "encoder", "self_attn"),
                   ("--apc-decoder-attn-dims", "decoder", "self_attn"),
                   ("--apc-cross-attn-dims", "decoder", "encoder_attn"))


def apply_attention_compression(module, args, side: str, embed: dict) -> None:
    for flag, flag_side, attr in ATTENTION_FLAGS:
        if flag_side != side:
            continue
        spec = getattr(args, flag[2:].replace("-", "_"), None)
        dims = parse_layer_dims(spec, len(module.layers), getattr(args, f"{side}_embed_dim"), flag,
                                what=f"attention width (--{side}-embed-dim)")
        if dims and side == "decoder" and getattr(args, "cross_self_attention", False):
            raise APCConfigError(f"{flag} is not supported with --cross-self-attention")
        if dims and side == "decoder" and getattr(args, "scale_heads", False):
            raise APCConfigError(f"{flag} is not supported with --scale-heads (it scales heads of the full head size)")
        for idx in sorted(set(dims) | set(embed)):
            layer = module.layers[idx]
            if getattr(layer, attr, None) is None:
                if idx in dims:
                    raise APCConfigError(f"{flag}: layer {idx} has no {attr} (--no-cross-attention?)")
                continue
            try:
                setattr(layer, attr, CompressedAttention(
                    getattr(layer, attr), dims.get(idx), train_original=getattr(args, "apc_train_original", False),
                    finalized=getattr(args, "apc_finalized", False), flag=f"{flag} (layer {idx})",
                    cmp_e=embed.get(idx)))
            except ValueError as err:
                raise APCConfigError(str(err)) from None


# decoder options whose extra modules work at the model's width inside a block (NormFormer, cross self-attention)
_FULL_WIDTH_DECODER_OPTIONS = ("cross_self_attention", "scale_attn", "scale_fc", "scale_heads", "scale_resids")


def apply_embedding_compression(module, args, side: str, embed: dict) -> None:
    if not embed:
        return
    flag = f"--apc-{side}-embed-dims"
    if getattr(args, f"{side}_layerdrop", 0) > 0:
        raise APCConfigError(f"{flag} is not supported with --{side}-layerdrop: dropping the first or last block of "
                             "a run would drop its pre- or post-scaling and change the stream's width")
    for option in _FULL_WIDTH_DECODER_OPTIONS if side == "decoder" else ():
        if getattr(args, option, False):
            raise APCConfigError(f"{flag} is not supported with --{option.replace('_', '-')} (its modules "
                                 "work at the model's width inside the block)")
    for run in runs_of(embed):
        for idx in run:
            compress_block_embedding(module.layers[idx], embed[idx], pre=idx == run[0], post=idx == run[-1])


class APCTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        apply_apc(self, args, "encoder")


class APCTransformerDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        apply_apc(self, args, "decoder")


def add_apc_args(parser, decoder: bool = True) -> None:
    """APC's model flags; an encoder-only model (``decoder=False``) has no decoder or cross-attention flags."""
    parser.add_argument("--apc-encoder-ffn-dims", type=str, metavar="SPEC", default=None,
                        help="APC cmp^f of the encoder FFNs (eq. 12): one size for every layer (e.g. 256) or "
                             "LAYER:SIZE pairs, 0-based (e.g. 1:256,2:256); unnamed layers stay uncompressed. "
                             "The paper has no default (its APC-50-ff: 3072 -> 256 on BERT layers 3-12); "
                             "default: none compressed")
    parser.add_argument("--apc-encoder-attn-dims", type=str, metavar="SPEC", default=None,
                        help="APC cmp^a of the encoder self-attentions (section 3.2, eqs 5-9: per-head size "
                             "cmp^a/heads, block-diagonal D^Q, D^K, D^V, full U^O), as --apc-encoder-ffn-dims. "
                             "The paper has no default (Table 4's searched sizes); default: none")
    sides = ("encoder", "decoder") if decoder else ("encoder",)
    if decoder:
        parser.add_argument("--apc-decoder-ffn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^f of the decoder FFNs, as --apc-encoder-ffn-dims (default: none)")
        parser.add_argument("--apc-decoder-attn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^a of the decoder self-attentions (section 3.2, eqs 5-9, applied to the "
                                 "decoder's causal self-attention; beam search keeps cmp^a/heads-wide key/value "
                                 "caches), as --apc-encoder-ffn-dims; default: none")
        parser.add_argument("--apc-cross-attn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^a of the decoder's encoder-decoder attentions (section 3.2, eqs 5-9; "
                                 "D^K, D^V act on the encoder output), as --apc-encoder-ffn-dims; default: none")
    for side in sides:
        parser.add_argument(f"--apc-{side}-embed-dims", type=str, metavar="SPEC", default=None,
                            help=f"APC cmp^e of the {side} blocks (section 3.2 'Embedding Compression': the block "
                                 "works at width cmp^e between a pre-scaling D^PS and a post-scaling U^PS, both "
                                 "omitted between consecutive blocks of one size, Appendix A), as "
                                 "--apc-encoder-ffn-dims. The paper has no default (Table 4's searched sizes); "
                                 "default: none")
    parser.add_argument("--apc-train-original", action="store_true", default=False,
                        help="train the original weights too (Table 3 'All Params'); default: only APC's "
                             "U, D, B, b_U, b_D train (Table 3 'Compr. only', the paper's compression stage)")
    parser.add_argument("--apc-finalized", action="store_true", default=False,
                        help="build the FFNs as plain dense layers of the compressed sizes (Table 3 "
                             "'Finalized'; what apc_finalize writes when per-layer sizes differ)")


def check_apc_args(args, arch: str) -> None:
    """Refuse, naming the flag, what APC cannot build."""
    if getattr(args, "quant_noise_pq", 0):
        raise APCConfigError(f"--quant-noise-pq is not supported with --arch {arch}")
    if getattr(args, "checkpoint_activations", False):
        raise APCConfigError(f"--checkpoint-activations is not supported with --arch {arch}")
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_layers_to_keep", None):
            raise APCConfigError(f"--{side}-layers-to-keep is not supported with --arch {arch}: APC's per-layer sizes "
                                 "and its initialisation from the teacher index the teacher's layers; drop layers "
                                 "before compressing, not while")
    if getattr(args, "apc_finalized", False) and getattr(args, "apc_train_original", False):
        raise APCConfigError("--apc-train-original has no meaning with --apc-finalized (all parameters of a "
                             "finalized model train)")


def freeze_all_but_compression(model, args) -> None:
    """The default 'Compr. only' mode: only APC's U, D, B, b_U, b_D train (with embedding compression also
    D^PS, U^PS and the compressed blocks' LayerNorms, all new). Parts a task adds after the model is built
    (a sentence task's classification head) stay trainable."""
    if getattr(args, "apc_finalized", False) or getattr(args, "apc_train_original", False):
        return
    compression = {id(p) for m in model.modules() if isinstance(m, APCLinear) for p in m.compression_parameters()}
    compression |= {id(p) for layer in ffn_layers(model).values() for p in embedding_parameters(layer)}
    if not compression:
        raise APCConfigError("no layer is compressed: give --apc-encoder-ffn-dims, --apc-encoder-attn-dims, "
                             "--apc-encoder-embed-dims (and for translation their --apc-decoder-* counterparts, "
                             "--apc-cross-attn-dims) or --apc-train-original to train a plain model")
    for p in model.parameters():
        p.requires_grad_(id(p) in compression)


class APCModelMixin:
    """APC's hooks used by the criterion, the initialisation and the finalize tool, for any model whose
    layer stacks :func:`~user_dir.apc.activation_sampling.layer_stacks` finds."""

    def apc_layers(self):
        """``[(name, layer)]`` of every layer whose FFN is compressed, e.g. ``("encoder.layers.1", layer)``."""
        return [(name, layer) for name, layer in ffn_layers(self).items() if is_compressed(layer)]

    def set_apc_recording(self, on: bool) -> None:
        for _, layer in self.apc_layers():
            set_recording(layer, on)

    def apc_reconstruction_pairs(self):
        """``[(side, X^{l+1}, X~^{l+1})]`` from the last recorded forward (eq. 4), ``(T, B, ffn)`` each."""
        return [(side_of(name), *reconstruction_pair(layer)) for name, layer in self.apc_layers()]

    def apc_attention_layers(self):
        """``[(name, CompressedAttention)]`` of every attention-compressed attention (eqs 5-9), named as its
        module, e.g. ``("decoder.layers.1.encoder_attn", attn)``."""
        return [(name, m) for name, m in self.named_modules()
                if isinstance(m, CompressedAttention) and m.cmp_a is not None]

    def apc_embedding_runs(self):
        """``[[layer name, ...], ...]``: the runs of embedding-compressed blocks (embedding_compression.py)."""
        return group_runs(ffn_layers(self))

    def finalize_(self) -> None:
        """Fold every reparameterised layer (FFN, attention, embedding compression) into a dense one
        (eqs 1-2), in place."""
        modules = dict(self.named_modules())
        for name, m in list(modules.items()):
            if isinstance(m, APCLinear):
                parent, _, leaf = name.rpartition(".")
                setattr(modules[parent], leaf, m.finalize())

    def load_uncompressed_state(self, state_dict) -> None:
        """Load the uncompressed model's state dict (the teacher): its FFN weights become the frozen ``W``
        of each compressed layer; APC's own parameters keep their current values."""
        apc_names = {n for n, m in self.named_modules() if isinstance(m, APCLinear)}
        new = set(compressed_norm_names(ffn_layers(self)))  # cmp^e-wide norms: set by the initialisation
        new |= {f"{name}.{s}" for name, layer in ffn_layers(self).items() for s in ("pre_scaling", "post_scaling")
                if getattr(layer, s, None) is not None}
        renamed = {}
        for key, value in state_dict.items():
            module, _, leaf = key.rpartition(".")
            if module in new:
                continue
            if module in apc_names and leaf in ("weight", "bias"):
                key = f"{module}.linear.{leaf}"
            renamed[key] = value
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        bad_missing = [k for k in missing if k.rpartition(".")[0] not in apc_names | new]
        if bad_missing or unexpected:
            raise ValueError(f"the uncompressed state dict does not fit this model: missing {bad_missing[:5]}, "
                             f"unexpected {list(unexpected)[:5]}")


@register_model("apc_transformer")
class APCTransformerModel(APCModelMixin, TransformerModel):
    """A fairseq Transformer with APC feed-forward and attention compression."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        add_apc_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_apc_args(args, "apc_transformer")
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        model = super().build_model(args, task)
        freeze_all_but_compression(model, args)
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return APCTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return APCTransformerDecoder(args, tgt_dict, embed_tokens,
                                     no_encoder_attn=getattr(args, "no_cross_attention", False))


@register_model_architecture("apc_transformer", "apc_transformer")
def apc_transformer(args):
    base_architecture(args)


@register_model_architecture("apc_transformer", "apc_transformer_iwslt_de_en")
def apc_transformer_iwslt_de_en(args):
    transformer_iwslt_de_en(args)
