"""BERT's WordPiece tokenisation (Devlin et al. 2019, §3 "Input/Output Representations"), by the
Hugging Face ``tokenizers`` package (Rust): the same normaliser, pre-tokeniser and WordPiece model
as transformers' ``BertTokenizer``, loaded from a checkpoint's ``vocab.txt`` with the settings of
its ``tokenizer_config.json``:

* ``do_lower_case`` (default true) lowercases; ``strip_accents`` (default: as lowercasing) strips
  accents; ``tokenize_chinese_chars`` (default true) puts a space around every CJK ideograph;
* control characters are dropped and whitespace is normalised (``clean_text``, always on in BERT);
* the special tokens (``[CLS] [SEP] [PAD] [UNK] [MASK]`` or the names the config gives) are found
  anywhere in the text, inside words too, as transformers does.

``WordPiece.fairseq_pieces`` writes pieces as fairseq dictionary symbols: the special tokens become
``<s> </s> <pad> <unk> <mask>``, the names user_dir/bert/tools/import_hf.py gives them in the
imported model's dictionary, so ``fairseq-preprocess --srcdict dict.txt`` gives BERT's ids.
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List

from tokenizers import BertWordPieceTokenizer

# BERT's special tokens (tokenizer_config.json keys and their defaults) -> fairseq's symbols
FAIRSEQ_SPECIALS = {"cls_token": ("[CLS]", "<s>"), "sep_token": ("[SEP]", "</s>"), "pad_token": ("[PAD]", "<pad>"),
                    "unk_token": ("[UNK]", "<unk>"), "mask_token": ("[MASK]", "<mask>")}


def _token_name(value, default: str) -> str:
    """A special token from tokenizer_config.json: a string or an AddedToken dict ({"content": ...})."""
    if isinstance(value, dict):
        return value.get("content", default)
    return value or default


@dataclass
class WordPiece:
    """A checkpoint's WordPiece tokeniser (``tokenizers.BertWordPieceTokenizer``) and the fairseq symbols
    of its special tokens."""
    tokenizer: BertWordPieceTokenizer
    fairseq_specials: Dict[str, str]  # "[SEP]" -> "</s>", ...

    def tokenize(self, lines: List[str]) -> List[List[str]]:
        """WordPieces of each line (no [CLS]/[SEP] added), by the Rust tokeniser's batch encoding."""
        return [e.tokens for e in self.tokenizer.encode_batch(list(lines), add_special_tokens=False)]

    def fairseq_pieces(self, lines: List[str]) -> List[List[str]]:
        """:meth:`tokenize` with BERT's special tokens renamed to fairseq's (see the module docstring)."""
        return [[self.fairseq_specials.get(p, p) for p in pieces] for pieces in self.tokenize(lines)]


def load_wordpiece(path: str) -> WordPiece:
    """The WordPiece tokeniser of a folder holding ``vocab.txt`` (and optionally ``tokenizer_config.json``),
    or of a ``vocab.txt`` itself (then uncased, BERT's default). Raises FileNotFoundError/ValueError
    naming the file."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    vocab_path = os.path.join(path, "vocab.txt") if os.path.isdir(path) else path
    if not os.path.isfile(vocab_path):
        raise FileNotFoundError(f"{vocab_path}: no WordPiece vocabulary (vocab.txt)")
    config: Dict = {}
    config_path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    if config.get("do_basic_tokenize", True) is False:
        raise ValueError(f"{config_path}: do_basic_tokenize false (WordPiece without BERT's basic "
                         "tokenisation) is not supported")
    specials = {key: _token_name(config.get(key), default) for key, (default, _) in FAIRSEQ_SPECIALS.items()}
    with open(vocab_path, encoding="utf-8") as f:
        vocab = {line.rstrip("\n") for line in f}
    missing = [t for t in specials.values() if t not in vocab]
    if missing:
        raise ValueError(f"{vocab_path}: lacks the special tokens {missing}")
    lowercase = config.get("do_lower_case", True)
    tokenizer = BertWordPieceTokenizer(
        vocab_path, lowercase=lowercase, strip_accents=config.get("strip_accents"),
        handle_chinese_chars=config.get("tokenize_chinese_chars", True), clean_text=True, **specials)
    return WordPiece(tokenizer, {specials[key]: symbol for key, (_, symbol) in FAIRSEQ_SPECIALS.items()})
