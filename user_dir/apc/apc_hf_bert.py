"""``--arch apc_hf_bert`` / ``apc_hf_minilm_l6``: an imported Hugging Face BERT-family encoder (``hf_bert``,
user_dir/bert) whose FFNs (APC paper, section 3.2, eq. 12), self-attentions (eqs 5-9) and block widths
(embedding compression) are APC-compressed, for GLUE with ``--task sentence_prediction`` (the paper's own
setting: BERT-base, Table 2).

The encoder is built as ``hf_bert`` builds it; then the layers named by ``--apc-encoder-ffn-dims`` /
``--apc-encoder-attn-dims`` / ``--apc-encoder-embed-dims`` are reparameterised exactly as in
``apc_transformer`` (same modules, same modes: 'Compr. only' by default, ``--apc-train-original``,
``--apc-finalized``). The paper's APC-50-ff,
"feed-forward compression on layers 3 to 12, limiting them to a dimension of 256", is
``--apc-encoder-ffn-dims 2:256,3:256,...,11:256``.

Our choice where the paper is silent: in the default 'Compr. only' mode the sentence task's
classification head trains with APC's parameters (the task adds it after the model is built). The
paper fine-tunes BERT, which has no GLUE head, so its 'Compr. only' strategy (Table 3) must train one.
"""
from fairseq.models import register_model, register_model_architecture

from ..bert.hf_bert_model import HFBertModel, hf_bert, hf_minilm_l6
from .apc_transformer import APCModelMixin, add_apc_args, apply_apc, check_apc_args, freeze_all_but_compression


@register_model("apc_hf_bert")
class APCHFBertModel(APCModelMixin, HFBertModel):
    """An imported BERT-family encoder with APC feed-forward and self-attention compression."""

    @staticmethod
    def add_args(parser):
        HFBertModel.add_args(parser)
        add_apc_args(parser, decoder=False)

    @classmethod
    def build_model(cls, args, task):
        check_apc_args(args, args.arch)
        model = super().build_model(args, task)
        apply_apc(model.encoder.sentence_encoder, args, "encoder")
        freeze_all_but_compression(model, args)
        return model


@register_model_architecture("apc_hf_bert", "apc_hf_bert")
def apc_hf_bert(args):
    hf_bert(args)


@register_model_architecture("apc_hf_bert", "apc_hf_minilm_l6")
def apc_hf_minilm_l6(args):
    hf_minilm_l6(args)
