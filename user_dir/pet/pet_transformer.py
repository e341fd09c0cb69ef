"""PET's student: a Transformer whose logical layers share weights in replaceable pairs
(Jeon et al. 2023, Sec. "Finding replaceable pairs"; Figs 2-3; Tables 2-4 and 8).

``--arch pet_transformer_iwslt`` is the paper's IWSLT student (teacher ``transformer_iwslt_de_en``):
4 logical encoder and decoder layers from 2 physical ones each, encoder/decoder dims (320, 240)
when the target is English and (240, 320) when the source is English, FFN = 2x the dim, 4 heads.
``--arch pet_transformer_wmt`` is the same for the Transformer-base teacher (8 heads). Every
dimension stays a flag (``--encoder-embed-dim`` ...), and the sharing patterns are chosen by
``--layer-pairing``, ``--encoder-matrix-pairs`` and ``--decoder-matrix-pairs``
(see replaceable_pairs.py).
"""
import copy
import os

import torch.nn as nn
from fairseq import utils
from fairseq.data.data_utils import infer_language_pair
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.models.transformer.transformer_encoder import TransformerEncoder
from fairseq.modules import LayerDropModuleList
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..common.distributed_support import check_ddp_backend, check_tpu
from ..common.layer_lists import every_layer
from .replaceable_pairs import (DECODER_MATRIX_PAIRS, ENCODER_MATRIX_PAIRS, LAYER_PAIRINGS, PETConfigError,
                                share_decoder_layers, share_encoder_layers)


def _without_checkpointing(cfg):
    """``cfg`` for building a physical layer: fairseq's checkpoint_wrapper binds the wrapped layer's own
    ``forward`` on the instance, which a logical-layer view would inherit and compute as the physical
    layer (no Q<->K swap, the physical layer's cache key), so physical layers are built unwrapped."""
    cfg = copy.copy(cfg)
    cfg.checkpoint_activations = cfg.offload_activations = False
    return cfg


def _install_logical_layers(module, logical: list, cfg, layerdrop: float) -> None:
    """The logical layers become the stack: under ``--checkpoint-activations`` (or
    ``--offload-activations``) each logical layer is wrapped on its own, after sharing, so a view
    recomputes as itself (its swapped projections, its own cache key); under
    ``--encoder-layerdrop`` / ``--decoder-layerdrop`` fairseq's LayerDropModuleList drops logical
    layers at training time, each independently of its pair, and runs them all in eval mode."""
    offload = bool(getattr(cfg, "offload_activations", False))
    if offload or getattr(cfg, "checkpoint_activations", False):
        logical = [checkpoint_wrapper(layer, offload_to_cpu=offload) for layer in logical]
    module.layers = LayerDropModuleList(p=layerdrop, modules=logical) if layerdrop > 0 else nn.ModuleList(logical)
    module.num_layers = len(module.layers)


class PETTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        logical = share_encoder_layers(every_layer(self.layers), args.layer_pairing, args.encoder_matrix_pairs)
        _install_logical_layers(self, logical, args, self.encoder_layerdrop)

    def build_encoder_layer(self, args):
        return super().build_encoder_layer(_without_checkpointing(args))


class PETTransformerDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        logical = share_decoder_layers(every_layer(self.layers), args.layer_pairing, args.decoder_matrix_pairs)
        _install_logical_layers(self, logical, args, self.decoder_layerdrop)

    def build_decoder_layer(self, args, no_encoder_attn=False):
        return super().build_decoder_layer(_without_checkpointing(args), no_encoder_attn=no_encoder_attn)


@register_model("pet_transformer")
class PETTransformerModel(TransformerModel):
    """A fairseq Transformer whose layers share weights in PET's replaceable pairs."""

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument("--layer-pairing", choices=LAYER_PAIRINGS,
                            help="layer-wise replaceable pairs (PET Table 2; paper: interleaved = {(1,3),(2,4)}): "
                                 "the two layers of a pair share all weights")
        parser.add_argument("--encoder-matrix-pairs", choices=ENCODER_MATRIX_PAIRS,
                            help="encoder matrix-wise pairs (PET Table 3; paper: qk = Q_1<->K_3, Q_2<->K_4): "
                                 "projections that trade roles in the second layer of each pair")
        parser.add_argument("--decoder-matrix-pairs", choices=DECODER_MATRIX_PAIRS,
                            help="decoder matrix-wise pairs (PET Fig 3, Tables 4 and 8; paper: qself-qed = one "
                                 "query matrix for self- and encoder-decoder attention in each layer)")

    @classmethod
    def build_model(cls, args, task):
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        for side in ("encoder", "decoder"):
            keep = getattr(args, f"{side}_layers_to_keep", None)
            if keep:
                keep = ",".join(map(str, keep)) if isinstance(keep, (list, tuple)) else keep
                raise PETConfigError(
                    f"--{side}-layers-to-keep {keep}: LayerDrop's pruning keeps a subset of logical layers, but "
                    "in PET a logical layer is a role of a shared physical layer (its pair partner, its swapped "
                    "projections), which pruning by index does not keep; train a student with fewer "
                    f"--{side}-layers instead")
        guessed = getattr(args, "pet_dims_guessed_without_langs", False)
        if guessed and getattr(task.cfg, "source_lang", None) == "en" and getattr(task.cfg, "target_lang", None) != "en":
            raise ValueError(
                f"--arch {args.arch}: the student's dims depend on the direction (PET: (320, 240) into English, "
                "(240, 320) out of English) but when the arch was resolved neither -s/-t nor a data directory named "
                "the languages, and the task's source is English; pass -s en -t XX (or --encoder-embed-dim/"
                "--decoder-embed-dim)")
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return PETTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return PETTransformerDecoder(args, tgt_dict, embed_tokens,
                                     no_encoder_attn=getattr(args, "no_cross_attention", False))


def _pet_defaults(args):
    args.encoder_layers = getattr(args, "encoder_layers", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 4)
    args.layer_pairing = getattr(args, "layer_pairing", None) or "interleaved"
    args.encoder_matrix_pairs = getattr(args, "encoder_matrix_pairs", None) or "qk"
    args.decoder_matrix_pairs = getattr(args, "decoder_matrix_pairs", None) or "qself-qed"


def _languages(args):
    """(source, target) as fairseq's translation task resolves them: ``-s``/``-t``, else inferred from
    the first data directory's file names with the task's own ``infer_language_pair``."""
    source, target = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    data = getattr(args, "data", None)
    if (source is None or target is None) and data:
        path = utils.split_paths(data)[0]
        if os.path.isdir(path):
            source, target = infer_language_pair(path)
    return source, target


def _student_dims(args, wide: int, narrow: int):
    """(320, 240) when the target is English, (240, 320) when the source is (PET, Training details).
    Without ``-s``/``-t`` the direction is the one fairseq infers from the data directory, so the
    stock command needs neither; the criterion's ``model.decoder_embed_dim`` sees the same width."""
    missing = not (hasattr(args, "encoder_embed_dim") and hasattr(args, "decoder_embed_dim"))
    source, target = _languages(args) if missing else (None, None)  # both widths given: no direction needed
    if source is None and missing:
        args.pet_dims_guessed_without_langs = True  # checked against the task's languages in build_model
    source_is_english = source == "en" and target != "en"
    enc, dec = (narrow, wide) if source_is_english else (wide, narrow)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", enc)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", dec)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 2 * args.encoder_embed_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 2 * args.decoder_embed_dim)


def _pet_student(args):
    """The PET student's shape (Training details): 4 logical layers, direction-dependent dims,
    FFN 2x, 4 heads; the base arch then fills in everything else."""
    _pet_defaults(args)
    _student_dims(args, wide=320, narrow=240)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)


@register_model_architecture("pet_transformer", "pet_transformer_iwslt")
def pet_transformer_iwslt(args):
    """Student of the IWSLT teacher ``transformer_iwslt_de_en``."""
    _pet_student(args)
    transformer_iwslt_de_en(args)


@register_model_architecture("pet_transformer", "pet_transformer_wmt")
def pet_transformer_wmt(args):
    """Student of the WMT teacher, Transformer-base (the paper does not give the student's heads: 4)."""
    _pet_student(args)
    base_architecture(args)
