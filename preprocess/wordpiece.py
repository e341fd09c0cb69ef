"""BERT's WordPiece tokenisation (Devlin et al. 2019; Google's tokenization.py), giving the same
tokens as Hugging Face's ``BertTokenizer`` for a ``vocab.txt``, with no dependency.

1. basic tokenisation: drop NUL, U+FFFD and control characters, whitespace -> space, a space
   around every CJK ideograph, Unicode NFC; split on whitespace; lowercase and strip accents (NFD, drop
   combining marks) when the model is uncased; split off every punctuation character;
2. WordPiece: each word greedily into the longest vocabulary prefix, then ``##``-continuations;
   a word with no segmentation, or longer than 100 characters, becomes ``[UNK]``.

``lowercase`` follows the checkpoint's ``tokenizer_config.json`` (``do_lower_case``); accents are
stripped when lowercasing unless ``strip_accents`` says otherwise, as in BertTokenizer.
"""
import json
import os
import unicodedata
from typing import Dict, List, Optional


def _is_whitespace(ch: str) -> bool:
    return ch in (" ", "\t", "\n", "\r") or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True  # all non-letter/number ASCII, "^", "$", "`" included, as BERT does
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class WordPieceTokenizer:
    def __init__(self, vocab: List[str], lowercase: bool = True, strip_accents: Optional[bool] = None,
                 unk_token: str = "[UNK]", max_chars_per_word: int = 100):
        self.vocab: Dict[str, int] = {tok: i for i, tok in enumerate(vocab)}
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.unk_token = unk_token
        self.max_chars_per_word = max_chars_per_word
        self.never_split = {t for t in vocab if t.startswith("[") and t.endswith("]") and not t.startswith("[unused")}

    @classmethod
    def from_pretrained_dir(cls, path: str) -> "WordPieceTokenizer":
        """From a folder holding ``vocab.txt`` (and optionally ``tokenizer_config.json``), or a vocab.txt."""
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        vocab_path = os.path.join(path, "vocab.txt") if os.path.isdir(path) else path
        if not os.path.isfile(vocab_path):
            raise FileNotFoundError(f"{vocab_path}: no WordPiece vocabulary")
        with open(vocab_path, encoding="utf-8") as f:
            vocab = [line.rstrip("\n") for line in f]
        config = {}
        config_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.isfile(config_path):
            with open(config_path) as f:
                config = json.load(f)
        return cls(vocab, lowercase=config.get("do_lower_case", True), strip_accents=config.get("strip_accents"))

    def _clean(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(" " if _is_whitespace(ch) else ch)
        return "".join(out)

    def _split_punctuation(self, word: str) -> List[str]:
        if word in self.never_split:
            return [word]
        pieces, current = [], []
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(ch)
            else:
                current.append(ch)
        if current:
            pieces.append("".join(current))
        return pieces

    def basic_tokenize(self, text: str) -> List[str]:
        words = []
        for word in unicodedata.normalize("NFC", self._clean(text)).split():
            if word not in self.never_split:
                if self.lowercase:
                    word = word.lower()
                if self.strip_accents:
                    word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
            words.extend(self._split_punctuation(word))
        return words

    def wordpiece(self, word: str) -> List[str]:
        if len(word) > self.max_chars_per_word:
            return [self.unk_token]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> List[str]:
        return [piece for word in self.basic_tokenize(text) for piece in self.wordpiece(word)]
