"""``--arch apc_transformer``: a stock fairseq ``transformer`` whose FFNs are APC-compressed
(APC paper, section 3.2, eq. 12; per-layer sizes as in section 4.1 / Table 4).

The encoder and decoder are fairseq's own; after they are built, the FFN of every layer named by
``--apc-encoder-ffn-dims`` / ``--apc-decoder-ffn-dims`` is reparameterised (ffn_compression.py).
Everything else (attention, embeddings, layer norms) is the stock module, so a teacher's state dict
loads into it with only ``fc1.weight -> fc1.linear.weight`` renamed (:meth:`load_uncompressed_state`).

Training modes (Table 3 of the paper, "fine-tuning strategies"):

* default: only APC's compression parameters (U, D, B, b_U, b_D) train, every original weight is
  frozen ("Compr. only"; Weight Squeezing's setting, and the paper's compression stage);
* ``--apc-train-original``: all parameters train ("All Params");
* ``--apc-finalized``: the FFNs are plain dense layers of the compressed widths (the folded model,
  "Finalized"). When every layer of a side shares one size, ``python -m user_dir.tools.apc_finalize``
  writes a stock ``transformer`` checkpoint instead, which needs no ``--user-dir``; this flag is for
  per-layer sizes that a stock architecture cannot express.
"""
import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.models.transformer.transformer_encoder import TransformerEncoder

from .attention_compression import CompressedSelfAttention
from .ffn_compression import (APCConfigError, compress_ffn, finalize_ffn, is_compressed, parse_layer_dims,
                              reconstruction_pair, set_recording, shrink_ffn)
from .reparameterised_linear import APCLinear


def _apply_ffn_compression(module, args, side: str) -> None:
    flag = f"--apc-{side}-ffn-dims"
    original = getattr(args, f"{side}_ffn_embed_dim")
    dims = parse_layer_dims(getattr(args, f"apc_{side}_ffn_dims", None), len(module.layers), original, flag)
    for idx, cmp in dims.items():
        layer = module.layers[idx]
        if type(layer.fc1) is not nn.Linear or type(layer.fc2) is not nn.Linear:
            raise APCConfigError(f"{flag}: layer {idx}'s FFN is not a plain Linear (quant-noise is not supported)")
        if getattr(args, "apc_finalized", False):
            shrink_ffn(layer, cmp)
        else:
            compress_ffn(layer, cmp, train_original=getattr(args, "apc_train_original", False))


def _apply_attention_compression(module, args) -> None:
    flag = "--apc-encoder-attn-dims"
    dims = parse_layer_dims(getattr(args, "apc_encoder_attn_dims", None), len(module.layers), args.encoder_embed_dim,
                            flag, what="attention width (--encoder-embed-dim)")
    for idx, cmp in dims.items():
        layer = module.layers[idx]
        try:
            layer.self_attn = CompressedSelfAttention(
                layer.self_attn, cmp, train_original=getattr(args, "apc_train_original", False),
                finalized=getattr(args, "apc_finalized", False), flag=f"{flag} (layer {idx})")
        except ValueError as err:
            raise APCConfigError(str(err)) from None


class APCTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        _apply_ffn_compression(self, args, "encoder")
        _apply_attention_compression(self, args)


class APCTransformerDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        _apply_ffn_compression(self, args, "decoder")


@register_model("apc_transformer")
class APCTransformerModel(TransformerModel):
    """A fairseq Transformer with APC feed-forward compression."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--apc-encoder-ffn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^f of the encoder FFNs (eq. 12): one size for every layer (e.g. 256) or "
                                 "LAYER:SIZE pairs, 0-based (e.g. 1:256,2:256); unnamed layers stay uncompressed. "
                                 "The paper has no default (its APC-50-ff: 3072 -> 256 on BERT layers 3-12); "
                                 "default: none compressed")
        parser.add_argument("--apc-decoder-ffn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^f of the decoder FFNs, as --apc-encoder-ffn-dims (default: none)")
        parser.add_argument("--apc-encoder-attn-dims", type=str, metavar="SPEC", default=None,
                            help="APC cmp^a of the encoder self-attentions (eqs 5-9; per-head size cmp^a/heads, "
                                 "block-diagonal D^Q, D^K, D^V), as --apc-encoder-ffn-dims; decoder attention is "
                                 "not compressed. The paper has no default (Table 4's searched sizes); default: none")
        parser.add_argument("--apc-train-original", action="store_true", default=False,
                            help="train the original weights too (Table 3 'All Params'); default: only APC's "
                                 "U, D, B, b_U, b_D train (Table 3 'Compr. only', the paper's compression stage)")
        parser.add_argument("--apc-finalized", action="store_true", default=False,
                            help="build the FFNs as plain dense layers of the compressed sizes (Table 3 "
                                 "'Finalized'; what apc_finalize writes when per-layer sizes differ)")

    @classmethod
    def build_model(cls, args, task):
        if getattr(args, "quant_noise_pq", 0):
            raise APCConfigError("--quant-noise-pq is not supported with --arch apc_transformer")
        if getattr(args, "checkpoint_activations", False):
            raise APCConfigError("--checkpoint-activations is not supported with --arch apc_transformer")
        if getattr(args, "apc_finalized", False) and getattr(args, "apc_train_original", False):
            raise APCConfigError("--apc-train-original has no meaning with --apc-finalized (all parameters of a "
                                 "finalized model train)")
        model = super().build_model(args, task)
        if not getattr(args, "apc_finalized", False) and not getattr(args, "apc_train_original", False):
            compression = {id(p) for m in model.modules() if isinstance(m, APCLinear)
                           for p in m.compression_parameters()}
            if not compression:
                raise APCConfigError("no layer is compressed: give --apc-encoder-ffn-dims, --apc-decoder-ffn-dims "
                                     "and/or --apc-encoder-attn-dims (or --apc-train-original to train a plain model)")
            for p in model.parameters():
                p.requires_grad_(id(p) in compression)
        return model

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return APCTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return APCTransformerDecoder(args, tgt_dict, embed_tokens,
                                     no_encoder_attn=getattr(args, "no_cross_attention", False))

    # ---- APC hooks used by the criterion, the initialisation and the finalize tool ----
    def apc_layers(self):
        """``[(name, layer)]`` of every layer whose FFN is compressed, e.g. ``("encoder.layers.1", layer)``."""
        out = []
        for side in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(self, side).layers):
                if is_compressed(layer):
                    out.append((f"{side}.layers.{i}", layer))
        return out

    def set_apc_recording(self, on: bool) -> None:
        for _, layer in self.apc_layers():
            set_recording(layer, on)

    def apc_reconstruction_pairs(self):
        """``[(side, X^{l+1}, X~^{l+1})]`` from the last recorded forward (eq. 4), ``(T, B, ffn)`` each."""
        return [(name.split(".")[0], *reconstruction_pair(layer)) for name, layer in self.apc_layers()]

    def apc_attention_layers(self):
        """``[(name, CompressedSelfAttention)]`` of every compressed encoder self-attention."""
        return [(f"encoder.layers.{i}", layer.self_attn) for i, layer in enumerate(self.encoder.layers)
                if isinstance(layer.self_attn, CompressedSelfAttention)]

    def finalize_(self) -> None:
        """Fold every compressed FFN and attention into dense layers (eqs 1-2), in place."""
        for _, layer in self.apc_layers():
            finalize_ffn(layer)
        for _, attn in self.apc_attention_layers():
            attn.finalize_()

    def load_uncompressed_state(self, state_dict) -> None:
        """Load a stock transformer's state dict (the teacher): its FFN weights become the frozen ``W``
        of each compressed layer; APC's own parameters keep their current values."""
        apc_names = {n for n, m in self.named_modules() if isinstance(m, APCLinear)}
        renamed = {}
        for key, value in state_dict.items():
            module, _, leaf = key.rpartition(".")
            if module in apc_names and leaf in ("weight", "bias"):
                key = f"{module}.linear.{leaf}"
            renamed[key] = value
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        bad_missing = [k for k in missing if k.rpartition(".")[0] not in apc_names]
        if bad_missing or unexpected:
            raise ValueError(f"the uncompressed state dict does not fit this model: missing {bad_missing[:5]}, "
                             f"unexpected {list(unexpected)[:5]}")


@register_model_architecture("apc_transformer", "apc_transformer")
def apc_transformer(args):
    base_architecture(args)


@register_model_architecture("apc_transformer", "apc_transformer_iwslt_de_en")
def apc_transformer_iwslt_de_en(args):
    transformer_iwslt_de_en(args)
