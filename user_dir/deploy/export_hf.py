"""``fc-export-hf CKPT --out DIR``: a fine-tuned GLUE encoder (``hf_bert``, GhostBERT's pruned-only
``ghost_hf_bert``, APC-finalized ``apc_hf_bert``) as a Hugging Face transformers directory that
``AutoModelForSequenceClassification.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
load with no custom code (``BertForSequenceClassification`` + ``BertTokenizer``): config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, and export.json (what was mapped, the check).

    fc-export-hf work/glue/MRPC/checkpoints/checkpoint_best.pt --out deploy/mrpc-hf
    fc-export-hf pruned.pt --out deploy/pruned-hf --zero-pad      # pruned heads: see below

The mapping inverts user_dir/bert/tools/import_hf.py exactly:
* vocabulary: fairseq's dictionary (<s> <pad> </s> <unk>, the WordPieces, <mask>) back to BERT's
  vocab.txt order ([CLS] [PAD] [SEP] [UNK] [MASK] renamed back), by name, every row checked;
* positions: fairseq's rows 2.. (numbered from padding_idx + 1) are BERT's rows 0..; the segment-0
  vector the importer folded into them stays there, so BERT's token-type table holds 0 for segment 0
  and hf_bert's ``SegmentEmbedding`` differences (segment 1 minus segment 0) for segment 1, or zeros
  when the model reads every token as segment 0 (``--fold-segments``, the GLUE recipe's default);
* LayerNorm epsilon (``--layernorm-eps``) -> ``layer_norm_eps``; fairseq's exact GELU -> ``gelu``;
* the classification head: fairseq's dense + tanh + out_proj on the first token is BERT's pooler
  (dense + tanh on [CLS]) + classifier, the same function; another activation, an inner width other
  than the model's, or mean pooling is not;
* labels: ``id2label`` from the task's label dictionary and ``label/names.txt`` (prepare_glue.py);
  STS-B's regression head as ``num_labels = 1``, ``problem_type = "regression"``;
* the tokenizer: BERT's WordPiece with the settings preprocess/prepare_glue.py tokenised with (read
  by preprocess/wordpiece.py), ``model_max_length`` = the data's ``--max-length``, so
  ``tok(a, b, truncation=True)`` cuts pairs longest first exactly as the data was cut.

Pruned heads and per-layer FFN widths: transformers 5 removed head pruning (``config.pruned_heads``
and ``PreTrainedModel.prune_heads`` are gone; BERT's attention has ``num_attention_heads`` heads of
``hidden_size / num_attention_heads`` in every layer), and one ``intermediate_size`` serves every
layer. A narrower FFN of one width in every layer is written as ``intermediate_size``. Anything else
is refused, naming what and what it would cost, unless ``--zero-pad``: every pruned head is put back
with zero Q, K, V and O weights (it attends uniformly to zero values and adds nothing), every narrow
FFN is widened to the widest with zero rows and columns (GELU(0) = 0): the same function, at the
padded model's parameters and FLOPs. The compact model is the ONNX export
(user_dir/deploy/export_onnx.py), which also takes ghost modules, per-layer widths and mean pooling.

Refused with the reason (nothing written): ghost modules (no transformers module; ONNX), Variator
plugins, APC models that are not finalized (run user_dir.apc.tools.finalize), APC compressed
attention or embedding compression, mean pooling heads (ONNX), data not tokenised with WordPiece,
RoBERTa-style pairs (``--separator-token``).

Verified before anything is written to DIR: both models are loaded back (transformers from the
written files) and run on the first ``--check-examples`` examples of the data's valid split, from raw
text through the exported tokenizer: the token ids must equal the binarised ids prepare_glue.py wrote
and the logits fairseq's within ``--atol`` (1e-4), or the export is refused.
"""
import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from typing import Dict, List, Optional

import torch
import torch.nn as nn

HEAD = "sentence_classification_head"
DEPLOYABLE_TASKS = ("sentence_prediction",)  # the tasks whose checkpoints hold a plain classifier


class ExportHFError(ValueError):
    """A checkpoint that cannot be exported as asked; the message says why and the way out."""


def _transformers():
    """transformers, whose BERT model (what the export's users load) must import: a torchaudio built for another
    torch (fairseq-fixed requires one; the index's 2.11 cannot load beside torch 2.13) breaks it."""
    try:
        import transformers.models.bert.modeling_bert  # noqa: F401  (imports torchaudio where it is installed)
    except OSError as e:
        raise ExportHFError(f"transformers cannot import its BERT model ({e}): a torchaudio built for another torch "
                            f"than {torch.__version__} is installed; `pip uninstall torchaudio` (scripts/setup_env.sh "
                            "does) or install the torchaudio of this torch") from e
    import transformers

    return transformers


# ----------------------------------------------------------------------------------------------
# the checkpoint, its data and its tokenizer
# ----------------------------------------------------------------------------------------------
def load_classifier(path: str, data: Optional[str] = None):
    """(model in eval mode, cfg, task, data folder) of a sentence-prediction checkpoint."""
    import user_dir  # noqa: F401  (the plug-in's models and its checkpoint-loading allow-list)
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise ExportHFError(f"CKPT {path}: no such checkpoint")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state.get("cfg")
    if cfg is None:
        raise ExportHFError(f"{path}: a checkpoint without cfg (fairseq < 0.10)")
    task_name = cfg["task"]._name if cfg.get("task") is not None else None
    if task_name == "variator_sentence_prediction":
        raise ExportHFError(f"{path}: a Variator model (task {task_name}): its compression plugins (k hidden "
                            "vectors merged into one around each FFN) have no transformers module; export the "
                            "--variator-backbone checkpoint, the plain fine-tuned encoder, instead")
    if task_name not in DEPLOYABLE_TASKS:
        raise ExportHFError(f"{path}: task {task_name}: fc-export-hf writes sentence classifiers "
                            f"({', '.join(DEPLOYABLE_TASKS)} checkpoints); translation models: fc-export")
    data = data or cfg["task"].data
    if not data or not os.path.isdir(data):
        raise ExportHFError(f"--data {data}: no such folder (the GLUE data-bin the model was trained on, "
                            "preprocess/prepare_glue.py output: its dictionaries, labels and tokeniser settings)")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data},
                                                                       state=state)
    return models[0].eval(), cfg, task, data


def prepared_settings(data: str) -> dict:
    """preprocess/prepare_glue.py's options for ``data`` (its .prepared.json), checked for BERT's layout."""
    path = os.path.join(data, ".prepared.json")
    if not os.path.isfile(path):
        raise ExportHFError(f"--data {data}: no .prepared.json (prepare the data with preprocess/prepare_glue.py "
                            "--tokenizer wordpiece: the export reproduces its tokenisation)")
    with open(path) as f:
        settings = json.load(f)["config"]
    if settings.get("tokenizer") != "wordpiece":
        raise ExportHFError(f"--data {data}: prepared with --tokenizer {settings.get('tokenizer')}; BERT's tokenizer "
                            "reproduces only --tokenizer wordpiece (the imported checkpoint's vocabulary)")
    if settings.get("pair_specials", 3) != 3:
        raise ExportHFError(f"--data {data}: prepared with --pair-specials {settings['pair_specials']}; BERT's pairs "
                            "have 3 special tokens ([CLS] a [SEP] b [SEP])")
    vocab = settings.get("wordpiece_vocab")
    if not vocab or not os.path.exists(vocab):
        raise ExportHFError(f"--data {data}: its --wordpiece-vocab {vocab} is gone (needed for the tokenizer)")
    return settings


def check_bert_layout(task, path: str) -> None:
    """fairseq's sentence_prediction inputs must be BERT's: [CLS] a [SEP] (b [SEP])."""
    d = task.source_dictionary
    if task.cfg.init_token != d.bos():
        raise ExportHFError(f"{path}: --init-token {task.cfg.init_token}: BERT's inputs start with [CLS] "
                            f"(<s>, --init-token {d.bos()})")
    if task.cfg.separator_token is not None:
        raise ExportHFError(f"{path}: --separator-token {task.cfg.separator_token}: RoBERTa's pair layout "
                            "<s> a </s></s> b </s>; BERT's is [CLS] a [SEP] b [SEP] (no --separator-token)")


def wordpiece(settings: dict):
    from preprocess.wordpiece import load_wordpiece

    return load_wordpiece(settings["wordpiece_vocab"])


def vocabulary_map(dictionary, vocab: List[str], fairseq_specials: Dict[str, str]) -> torch.Tensor:
    """``to_fairseq[bert_id]`` = the fairseq dictionary index of BERT's token ``bert_id`` (by name, the
    specials renamed as the importer did); a bijection, or ExportHFError."""
    index = {}
    for bert_id, token in enumerate(vocab):
        symbol = fairseq_specials.get(token, token)
        i = dictionary.index(symbol)
        if i == dictionary.unk() and symbol != "<unk>":
            raise ExportHFError(f"vocab.txt token {token!r} (id {bert_id}) is not in the model's dictionary: the "
                                "data was binarised with another vocabulary")
        index[bert_id] = i
    if len(set(index.values())) != len(vocab) or len(dictionary) != len(vocab):
        raise ExportHFError(f"the model's dictionary ({len(dictionary)} symbols) and vocab.txt ({len(vocab)} "
                            "tokens) are not one-to-one")
    return torch.tensor([index[i] for i in range(len(vocab))])


def label_names(task, data: str, num_outputs: int):
    """(id2label, regression?) from the task's label dictionary and label/names.txt."""
    if getattr(task.cfg, "regression_target", False):
        if num_outputs != 1:
            raise ExportHFError(f"a regression task with {num_outputs} outputs")
        return {0: "score"}, True
    labels = task.label_dictionary
    symbols = [labels[i + labels.nspecial] for i in range(num_outputs)]
    names_path = os.path.join(data, "label", "names.txt")
    names = {}
    if os.path.isfile(names_path):
        with open(names_path, encoding="utf-8") as f:
            names = dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())
    return {i: names.get(s, s) for i, s in enumerate(symbols)}, False


def hf_tokenizer(settings: dict):
    """transformers' BertTokenizer with prepare_glue.py's WordPiece settings (preprocess/wordpiece.py)."""
    transformers = _transformers()
    pieces = wordpiece(settings)
    norm = pieces.tokenizer.normalizer
    names = {symbol: name for name, symbol in pieces.fairseq_specials.items()}
    vocab = read_vocab(settings)
    max_length = settings.get("max_length") or None
    return transformers.BertTokenizer(
        vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=norm.lowercase, strip_accents=norm.strip_accents,
        tokenize_chinese_chars=norm.handle_chinese_chars, cls_token=names["<s>"], sep_token=names["</s>"],
        pad_token=names["<pad>"], unk_token=names["<unk>"], mask_token=names["<mask>"],
        **({"model_max_length": max_length} if max_length else {}))


def read_vocab(settings: dict) -> List[str]:
    vocab = settings["wordpiece_vocab"]
    path = os.path.join(vocab, "vocab.txt") if os.path.isdir(vocab) else vocab
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


# ----------------------------------------------------------------------------------------------
# what the encoder is made of
# ----------------------------------------------------------------------------------------------
def _refusal(module: nn.Module) -> Optional[str]:
    """Why ``module`` has no transformers equivalent (None: it may have one)."""
    from user_dir.apc.attention_compression import CompressedAttention
    from user_dir.apc.reparameterised_linear import APCLinear
    from user_dir.bert.hf_bert_model import MeanPoolClassificationHead
    from user_dir.ghost.ghost_attention import GhostAttention
    from user_dir.ghost.ghost_module import GhostActivation, GhostConv, GhostLinear

    if isinstance(module, (GhostLinear, GhostActivation, GhostConv, GhostAttention)):
        return ("a GhostBERT ghost module (a depthwise convolution over the sequence added to a sub-layer's "
                "output) has no transformers BERT module; export the pruned-only model (--ghost-positions none) "
                "here, or this model to ONNX (python -m user_dir.deploy.export_onnx), which expresses the convolution")
    if isinstance(module, APCLinear):
        return ("an APC model still holds its compression factors (U, D, B) beside the original weights: run "
                "`python -m user_dir.apc.tools.finalize CKPT --out FINAL.pt` first, then export FINAL.pt")
    if isinstance(module, CompressedAttention):
        return ("APC's compressed attention has heads narrower than hidden_size / num_attention_heads: finalize with "
                "`python -m user_dir.apc.tools.finalize CKPT --out FINAL.pt --pad-attention` (the same function, "
                "full heads), or export to ONNX")
    if isinstance(module, MeanPoolClassificationHead):
        return ("a mean-pooling head (--classification-pooling mean): BertForSequenceClassification reads the [CLS] "
                "vector only; export to ONNX (python -m user_dir.deploy.export_onnx), which keeps the pooling")
    return None


def _allowed_types():
    from fairseq.models.roberta.model import RobertaClassificationHead, RobertaEncoder, RobertaLMHead
    from fairseq.models.transformer import TransformerEncoder, TransformerEncoderBase
    from fairseq.modules import (FairseqDropout, LayerNorm, LearnedPositionalEmbedding, MultiheadAttention,
                                 TransformerEncoderLayer)
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    from user_dir.bert.hf_bert_model import HFBertModel, SegmentEmbedding
    from user_dir.common.structured_pruning import PrunedMultiheadAttention

    norms = {nn.LayerNorm, type(LayerNorm(4))}
    return {HFBertModel, RobertaEncoder, RobertaLMHead, TransformerEncoder, TransformerEncoderBase,
            TransformerEncoderLayerBase, nn.Dropout,
            TransformerEncoderLayer, MultiheadAttention, PrunedMultiheadAttention, RobertaClassificationHead,
            nn.Linear, nn.Embedding, SegmentEmbedding, LearnedPositionalEmbedding, FairseqDropout, nn.ModuleList,
            nn.ModuleDict, *norms}


def check_modules(model: nn.Module, head: str) -> None:
    """Refuse what BertForSequenceClassification cannot compute: named modules, forward hooks, types."""
    from user_dir.bert.hf_bert_model import HFBertModel

    if not isinstance(model, HFBertModel):
        raise ExportHFError(f"a {type(model).__name__}: fc-export-hf writes BERT-family encoders (hf_bert, "
                            "ghost_hf_bert, apc_hf_bert, as user_dir.bert.tools.import_hf imports them)")
    if head not in model.classification_heads:
        raise ExportHFError(f"--head {head}: the model has the heads {sorted(model.classification_heads)}")
    allowed = _allowed_types()
    parts = {"encoder.sentence_encoder": model.encoder.sentence_encoder,
             f"classification_heads.{head}": model.classification_heads[head]}
    modules = [(name, module) for prefix, part in parts.items() for name, module in part.named_modules(prefix=prefix)]
    for name, module in modules:  # what the method added, named, before the generic checks
        reason = _refusal(module)
        if reason:
            raise ExportHFError(f"{name} ({type(module).__name__}): {reason}")
    for name, module in modules:
        if module._forward_hooks or module._forward_pre_hooks:
            what = ("APC's embedding compression (a pre-/post-scaling around the block, per-block widths)"
                    if getattr(module, "cmp_e", None) else "a forward hook")
            raise ExportHFError(f"{name} ({type(module).__name__}): {what} changes what this module computes; "
                                "BERT's layers have no such step: export to ONNX (python -m "
                                "user_dir.deploy.export_onnx)")
        if type(module) not in allowed:
            raise ExportHFError(f"{name}: a {type(module).__module__}.{type(module).__name__} has no mapped "
                                "transformers counterpart (export to ONNX instead)")

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_accurate": "gelu_new", "relu": "relu"}  # fairseq name -> transformers


def encoder_shape(model: nn.Module, args) -> dict:
    """Widths of the encoder, checked against what BERT computes: heads kept and FFN width per layer."""
    enc = model.encoder.sentence_encoder
    d, n_heads = args.encoder_embed_dim, args.encoder_attention_heads
    if d % n_heads:
        raise ExportHFError(f"--encoder-embed-dim {d} does not split into {n_heads} heads")
    head_dim = d // n_heads
    if getattr(args, "encoder_normalize_before", False) or enc.layer_norm is not None:
        raise ExportHFError("--encoder-normalize-before: pre-LayerNorm layers; BERT's are post-LayerNorm")
    if enc.layernorm_embedding is None:
        raise ExportHFError("no LayerNorm on the embeddings (--layernorm-embedding): BERT has one")
    if enc.embed_scale not in (None, 1.0):
        raise ExportHFError("scaled embeddings (no --no-scale-embedding): BERT does not scale them")
    if type(enc.embed_positions).__name__ != "LearnedPositionalEmbedding":
        raise ExportHFError("sinusoidal positions: BERT's are learned (absolute)")
    act = getattr(args, "activation_fn", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ExportHFError(f"--activation-fn {act}: transformers' BERT has {', '.join(HF_ACTIVATIONS)}")
    heads, ffn = [], []
    for i, layer in enumerate(enc.layers):
        attn = layer.self_attn
        if attn.head_dim != head_dim or attn.q_proj.out_features != attn.num_heads * head_dim:
            raise ExportHFError(f"layer {i}: heads of width {attn.head_dim}, not hidden_size / num_attention_heads = "
                                f"{head_dim}")
        if attn.bias_k is not None or attn.add_zero_attn:
            raise ExportHFError(f"layer {i}: --add-bias-kv / --add-zero-attn have no BERT counterpart")
        heads.append(attn.num_heads)
        ffn.append(layer.fc1.out_features)
    return {"hidden": d, "heads": n_heads, "head_dim": head_dim, "kept_heads": heads, "ffn": ffn,
            "activation": HF_ACTIVATIONS[act]}


def padding_cost(shape: dict) -> dict:
    """Parameters the zero-padded BERT holds beyond the compact encoder (pruned heads, narrow FFNs)."""
    d, dh, wide = shape["hidden"], shape["head_dim"], max(shape["ffn"])
    heads = sum((shape["heads"] - h) * dh * (4 * d + 3) for h in shape["kept_heads"])  # Q, K, V rows + O columns
    ffn = sum((wide - f) * (2 * d + 1) for f in shape["ffn"])  # fc1 rows (+ bias) + fc2 columns
    compact = sum(4 * h * dh * d + 3 * h * dh + 2 * f * d + f + 6 * d  # + the biases of O and fc2, two LayerNorms
                  for h, f in zip(shape["kept_heads"], shape["ffn"]))
    return {"heads": heads, "ffn": ffn, "compact_layers": compact}


def needs_padding(shape: dict) -> List[str]:
    out = []
    pruned = {i: shape["heads"] - h for i, h in enumerate(shape["kept_heads"]) if h != shape["heads"]}
    if pruned:
        n_heads = shape["heads"]
        out.append(f"pruned heads ({', '.join(f'layer {i}: {n} of {n_heads}' for i, n in pruned.items())}): "
                   "transformers 5 has no head pruning (config.pruned_heads and prune_heads were removed; every BERT "
                   "layer has num_attention_heads heads of hidden_size / num_attention_heads)")
    if len(set(shape["ffn"])) > 1:
        out.append(f"per-layer FFN widths {shape['ffn']}: BERT has one intermediate_size for every layer")
    return out


# ----------------------------------------------------------------------------------------------
# the tensors
# ----------------------------------------------------------------------------------------------
def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.size(0), *t.shape[1:])]) if rows > t.size(0) else t


def _pad_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(t.size(0), cols - t.size(1))], dim=1) if cols > t.size(1) else t


def bert_state(model: nn.Module, shape: dict, to_fairseq: torch.Tensor, head: str) -> Dict[str, torch.Tensor]:
    """BertForSequenceClassification's tensors (``bert.`` prefix) from the fairseq model."""
    from user_dir.bert.hf_bert_model import SegmentEmbedding

    enc = model.encoder.sentence_encoder
    d, inner, wide = shape["hidden"], shape["heads"] * shape["head_dim"], max(shape["ffn"])
    out = {"bert.embeddings.word_embeddings.weight": enc.embed_tokens.weight.detach()[to_fairseq],
           "bert.embeddings.position_embeddings.weight": enc.embed_positions.weight.detach()[
               enc.embed_positions.padding_idx + 1:],
           "bert.embeddings.LayerNorm.weight": enc.layernorm_embedding.weight.detach(),
           "bert.embeddings.LayerNorm.bias": enc.layernorm_embedding.bias.detach()}
    if isinstance(enc.embed_tokens, SegmentEmbedding):  # segment 0 is in the positions; rows are differences
        segments = enc.embed_tokens.segments.detach()
        out["bert.embeddings.token_type_embeddings.weight"] = _pad_rows(segments, 2)
    else:  # every token reads segment 0, folded into the positions
        out["bert.embeddings.token_type_embeddings.weight"] = torch.zeros(2, d)
    for i, layer in enumerate(enc.layers):
        p, a = f"bert.encoder.layer.{i}.", layer.self_attn
        for hf, lin in (("attention.self.query", a.q_proj), ("attention.self.key", a.k_proj),
                        ("attention.self.value", a.v_proj)):
            out[p + hf + ".weight"] = _pad_rows(lin.weight.detach(), inner)
            out[p + hf + ".bias"] = _pad_rows(lin.bias.detach(), inner)
        out[p + "attention.output.dense.weight"] = _pad_cols(a.out_proj.weight.detach(), inner)
        out[p + "attention.output.dense.bias"] = a.out_proj.bias.detach()
        for hf, norm in (("attention.output.LayerNorm", layer.self_attn_layer_norm),
                         ("output.LayerNorm", layer.final_layer_norm)):
            out[p + hf + ".weight"], out[p + hf + ".bias"] = norm.weight.detach(), norm.bias.detach()
        out[p + "intermediate.dense.weight"] = _pad_rows(layer.fc1.weight.detach(), wide)
        out[p + "intermediate.dense.bias"] = _pad_rows(layer.fc1.bias.detach(), wide)
        out[p + "output.dense.weight"] = _pad_cols(layer.fc2.weight.detach(), wide)
        out[p + "output.dense.bias"] = layer.fc2.bias.detach()
    h = model.classification_heads[head]
    out.update({"bert.pooler.dense.weight": h.dense.weight.detach(), "bert.pooler.dense.bias": h.dense.bias.detach(),
                "classifier.weight": h.out_proj.weight.detach(), "classifier.bias": h.out_proj.bias.detach()})
    return {k: v.float().contiguous().clone() for k, v in out.items()}


def check_head(model: nn.Module, args, head: str) -> None:
    h = model.classification_heads[head]
    act = getattr(args, "pooler_activation_fn", "tanh")
    if act != "tanh":
        raise ExportHFError(f"--pooler-activation-fn {act}: BERT's pooler is dense + tanh")
    if h.dense.out_features != args.encoder_embed_dim:
        raise ExportHFError(f"the head's inner width {h.dense.out_features}: BERT's pooler keeps the hidden size "
                            f"{args.encoder_embed_dim}")
    if type(h.out_proj) is not nn.Linear or type(h.dense) is not nn.Linear:
        raise ExportHFError("a spectral-normed or quant-noise head: BERT's classifier is a plain Linear")


# ----------------------------------------------------------------------------------------------
# the check: raw text -> tokenizer -> both models
# ----------------------------------------------------------------------------------------------
def check_examples(data: str, task, settings: dict, tokenizer, to_fairseq: torch.Tensor, n: int,
                   subset: str = "valid"):
    """The first ``n`` examples of ``subset``: the exported tokenizer's encoding of the raw text (checked
    against the binarised ids prepare_glue.py wrote, mapped to BERT's ids) as a padded batch dict."""
    from fairseq.data import data_utils

    d = task.source_dictionary
    columns = [data_utils.load_indexed_dataset(os.path.join(data, f"input{i}", subset), d)
               for i in range(2) if os.path.exists(os.path.join(data, f"input{i}", subset + ".bin"))]
    if not columns:
        raise ExportHFError(f"--data {data}: no {subset} split to check the export on")
    n = min(n, len(columns[0]))
    to_bert = torch.empty(len(d), dtype=torch.long)
    to_bert[to_fairseq] = torch.arange(len(to_fairseq))
    # fairseq's sentence_prediction example: --init-token ([CLS]), input0 and input1 each ending with </s> ([SEP])
    binarised = [to_bert[torch.cat([torch.tensor([d.bos()])] + [c[i] for c in columns])].tolist() for i in range(n)]
    raw = [os.path.join(data, "text", f"{subset}.raw.input{i}") for i in range(len(columns))]
    if all(os.path.isfile(p) for p in raw):
        texts = []
        for p in raw:
            with open(p, encoding="utf-8") as f:
                texts.append([next(f).rstrip("\n") for _ in range(n)])
        max_length = settings.get("max_length") or None
        enc = tokenizer(*texts, truncation=bool(max_length), max_length=max_length)["input_ids"]
        bad = [i for i in range(n) if enc[i] != binarised[i]]
        if bad:
            raise ExportHFError(f"the exported tokenizer encodes {len(bad)} of {n} {subset} examples differently from "
                                f"prepare_glue.py (first: example {bad[0]}); nothing written")
        batch = tokenizer(*texts, truncation=bool(max_length), max_length=max_length, padding=True,
                          return_tensors="pt")
        return dict(batch), True
    width = max(map(len, binarised))
    ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    for i, seq in enumerate(binarised):
        ids[i, : len(seq)] = torch.tensor(seq)
    mask = ids.ne(tokenizer.pad_token_id).long()
    types = torch.zeros_like(ids)
    for i, seq in enumerate(binarised):  # segment 1 after the first [SEP]
        sep = seq.index(tokenizer.sep_token_id)
        types[i, sep + 1: len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, False


def fairseq_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, to_fairseq: torch.Tensor,
                   pad: int, head: str = HEAD) -> torch.Tensor:
    """The fairseq model's logits for a batch of BERT ids (right-padded, as the tokenizer pads)."""
    src = to_fairseq[input_ids].masked_fill(attention_mask.eq(0), pad)
    with torch.no_grad():
        logits, _ = model(src, features_only=True, classification_head_name=head)
    return logits.float()


# ----------------------------------------------------------------------------------------------
# the export
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def staged_directory(out: str, prefix: str):
    """A fresh folder beside ``out`` to write into; it replaces ``out`` only when the block ends without an
    error (a failed check leaves nothing, and an earlier export at ``out`` untouched)."""
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would outlive the rename
    try:
        yield staging
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)


def write_summary(folder: str, summary: dict) -> None:
    with open(os.path.join(folder, "export.json"), "w") as f:
        json.dump(summary, f, indent=1)


def export_hf(path: str, out: str, data: Optional[str] = None, head: str = HEAD, zero_pad: bool = False,
              atol: float = 1e-4, n_check: int = 64) -> dict:
    """Write ``path``'s classifier as a transformers directory at ``out``; returns export.json's summary."""
    transformers = _transformers()
    model, cfg, task, data = load_classifier(path, data)
    args = cfg.model
    settings = prepared_settings(data)
    check_bert_layout(task, path)
    check_modules(model, head)
    check_head(model, args, head)
    shape = encoder_shape(model, args)
    padded = needs_padding(shape)
    cost = padding_cost(shape)
    if padded and not zero_pad:
        extra = cost["heads"] + cost["ffn"]
        raise ExportHFError(
            f"{path}: " + "; ".join(padded) + f". --zero-pad writes the same function with zero weights in their place: "
            f"{extra:,} more parameters than the compact encoder layers' {cost['compact_layers']:,} "
            f"(+{100 * extra / cost['compact_layers']:.0f}%), and their FLOPs; the compact model: export to ONNX "
            "(python -m user_dir.deploy.export_onnx)")
    pieces = wordpiece(settings)
    vocab = read_vocab(settings)
    to_fairseq = vocabulary_map(task.source_dictionary, vocab, pieces.fairseq_specials)
    num_outputs = model.classification_heads[head].out_proj.out_features
    id2label, regression = label_names(task, data, num_outputs)
    tokenizer = hf_tokenizer(settings)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=shape["hidden"], num_hidden_layers=len(shape["ffn"]),
        num_attention_heads=shape["heads"], intermediate_size=max(shape["ffn"]), hidden_act=shape["activation"],
        hidden_dropout_prob=float(args.dropout), attention_probs_dropout_prob=float(args.attention_dropout),
        classifier_dropout=float(args.pooler_dropout), max_position_embeddings=model.encoder.sentence_encoder
        .embed_positions.max_positions, type_vocab_size=2, layer_norm_eps=float(getattr(args, "layernorm_eps", 1e-5)),
        pad_token_id=tokenizer.pad_token_id, num_labels=num_outputs, id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        problem_type="regression" if regression else "single_label_classification",
        architectures=["BertForSequenceClassification"])
    hf = transformers.BertForSequenceClassification(config).eval()
    target = hf.state_dict()
    mapped = bert_state(model, shape, to_fairseq, head)
    missing = sorted(k for k in target if k not in mapped and not k.endswith(("position_ids", "token_type_ids")))
    unknown = sorted(k for k in mapped if k not in target or target[k].shape != mapped[k].shape)
    if missing or unknown:
        raise ExportHFError(f"internal: tensors without a value {missing[:5]}, or of the wrong shape {unknown[:5]}")
    hf.load_state_dict({**target, **mapped}, strict=True)

    with staged_directory(out, ".fc-export-hf-") as staging:
        hf.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # loaded back as any user would, with no custom code
        loaded = transformers.AutoModelForSequenceClassification.from_pretrained(staging).eval()
        loaded_tok = transformers.AutoTokenizer.from_pretrained(staging)
        batch, from_text = check_examples(data, task, settings, loaded_tok, to_fairseq, n_check)
        with torch.no_grad():
            theirs = loaded(**batch).logits.float()
        ours = fairseq_logits(model, batch["input_ids"], batch["attention_mask"], to_fairseq,
                              task.source_dictionary.pad(), head)
        diff = (theirs - ours).abs().max().item()
        same = regression or bool(torch.equal(theirs.argmax(-1), ours.argmax(-1)))
        if not (diff <= atol and same):
            raise ExportHFError(f"{path}: the transformers model's logits differ from fairseq's by {diff:.3g} "
                                f"(> --atol {atol}) or its predictions differ; nothing written")
        summary = {"checkpoint": os.path.abspath(path), "data": os.path.abspath(data), "head": head,
                   "arch": args.arch, "kept_heads": shape["kept_heads"], "ffn_widths": shape["ffn"],
                   "zero_padded": padded, "padding_parameters": cost["heads"] + cost["ffn"] if padded else 0,
                   "labels": {str(k): v for k, v in id2label.items()}, "regression": regression,
                   "max_length": settings.get("max_length"), "checked_examples": int(batch["input_ids"].size(0)),
                   "checked_from_raw_text": from_text, "max_abs_diff": diff, "atol": atol,
                   "parameters": sum(p.numel() for p in loaded.parameters()),
                   "transformers": transformers.__version__}
        write_summary(staging, summary)
    return summary


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fc-export-hf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a fine-tuned sentence_prediction checkpoint (hf_bert, ghost_hf_bert pruned "
                                      "only, apc_hf_bert finalized)")
    p.add_argument("--out", required=True, help="the Hugging Face model directory to write (replaced if it exists)")
    p.add_argument("--data", default=None, help="the GLUE data-bin the model was trained on (default: the "
                                                 "checkpoint's own --data)")
    p.add_argument("--head", default=HEAD, help=f"the classification head to export (default {HEAD})")
    p.add_argument("--zero-pad", action="store_true",
                   help="write pruned heads and narrower per-layer FFNs as zero weights of BERT's full widths (the "
                        "same function at the padded model's cost; default: refuse, saying what it costs)")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="largest logit difference to fairseq accepted by the check (default 1e-4)")
    p.add_argument("--check-examples", type=int, default=64,
                   help="valid examples the check runs, from raw text through the exported tokenizer (default 64)")
    return p


def main(argv=None) -> dict:
    args = get_parser().parse_args(argv)
    try:
        summary = export_hf(args.checkpoint, args.out, args.data, args.head, args.zero_pad, args.atol,
                            args.check_examples)
    except ExportHFError as e:
        raise SystemExit(f"fc-export-hf: {e}")
    print(f"fc-export-hf: {summary['arch']} -> BertForSequenceClassification ({summary['parameters']:,} parameters"
          + (f", {summary['padding_parameters']:,} of them zero padding" if summary["zero_padded"] else "")
          + f"), labels {summary['labels']}; logits equal fairseq's to {summary['max_abs_diff']:.1e} on "
          f"{summary['checked_examples']} valid examples" + (" from raw text" if summary["checked_from_raw_text"]
                                                              else "") + f"; written {args.out}", file=sys.stderr)
    return summary


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
