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
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture, transformer_iwslt_de_en
from fairseq.models.transformer.transformer_decoder import TransformerDecoder
from fairseq.models.transformer.transformer_encoder import TransformerEncoder
from fairseq.modules import LayerDropModuleList

from .replaceable_pairs import (DECODER_MATRIX_PAIRS, ENCODER_MATRIX_PAIRS, LAYER_PAIRINGS, share_decoder_layers,
                                share_encoder_layers)


def _replace_layers(module, logical):
    if isinstance(module.layers, LayerDropModuleList):
        module.layers = LayerDropModuleList(p=module.layers.p, modules=logical)
    else:
        module.layers.__init__(logical)  # an nn.ModuleList holding the logical layers, views included
    module.num_layers = len(module.layers)


class PETTransformerEncoder(TransformerEncoder):
    def __init__(self, args, dictionary, embed_tokens, return_fc=False):
        super().__init__(args, dictionary, embed_tokens, return_fc=return_fc)
        _replace_layers(self, share_encoder_layers(list(self.layers), args.layer_pairing, args.encoder_matrix_pairs))


class PETTransformerDecoder(TransformerDecoder):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        _replace_layers(self, share_decoder_layers(list(self.layers), args.layer_pairing, args.decoder_matrix_pairs))


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
        guessed = getattr(args, "pet_dims_guessed_without_langs", False)
        if guessed and getattr(task.cfg, "source_lang", None) == "en" and getattr(task.cfg, "target_lang", None) != "en":
            raise ValueError(
                f"--arch {args.arch}: the student's dims depend on the direction (PET: (320, 240) into English, "
                "(240, 320) out of English) but -s/-t were not given when the arch was resolved, and the data's "
                "source is English; pass -s en -t XX (or --encoder-embed-dim/--decoder-embed-dim)")
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


def _student_dims(args, wide: int, narrow: int):
    """(320, 240) when the target is English, (240, 320) when the source is (PET, Training details)."""
    source_is_english = getattr(args, "source_lang", None) == "en" and getattr(args, "target_lang", None) != "en"
    if getattr(args, "source_lang", None) is None and not hasattr(args, "encoder_embed_dim"):
        args.pet_dims_guessed_without_langs = True  # checked against the task's languages in build_model
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
