"""Text steps of translation preparation: Moses tokenisation, cleaning, subword-nmt BPE, sentencepiece.

The Moses steps follow fairseq's ``examples/translation/prepare-iwslt14.sh`` with sacremoses in
place of the Perl scripts (tokenizer.perl, clean-corpus-n.perl, lowercase.perl).
"""
import functools
import io
import os
from typing import List, Sequence, Tuple

from .textio import DataError, log, progress


@functools.lru_cache(maxsize=None)
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=16)
def _load(kind: str, path: str, size: int, mtime_ns: int):  # size and mtime in the key: a rewritten file loads afresh
    if kind == "bpe":
        from subword_nmt.apply_bpe import BPE

        with open(path, encoding="utf-8") as f:
            return BPE(f)
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=path)


def _loaded(kind: str, path: str):
    """The subword-nmt codes (``kind`` "bpe") or sentencepiece model at ``path``, read once per version of the
    file (a server tokenising each request reuses them)."""
    stat = os.stat(path)
    return _load(kind, os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def moses_tokenize(lines: Sequence[str], lang: str, lowercase: bool, escape: bool, what: str = "",
                   quiet: bool = False) -> List[str]:
    """sacremoses ``MosesTokenizer(lang).tokenize(line, escape=escape)``, then optional lowercasing.

    ``escape=True`` matches tokenizer.perl's default (``&`` -> ``&amp;`` ...), as in prepare-iwslt14.sh.
    ``quiet``: no progress line (a server's per-request call).
    """
    tokenizer = _moses(lang)
    out = []
    for line in (lines if quiet else progress(lines, f"tokenising {what or lang}")):
        tok = tokenizer.tokenize(line, escape=escape, return_str=True)
        out.append(tok.lower() if lowercase else tok)
    return out


def clean_corpus(src: Sequence[str], tgt: Sequence[str], min_len: int = 1, max_len: int = 175,
                 ratio: float = 1.5) -> Tuple[List[str], List[str]]:
    """Moses clean-corpus-n.perl: drop pairs with a side outside [min_len, max_len] tokens or a
    length ratio above ``ratio``; whitespace is normalised as the Perl script does."""
    kept_src, kept_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = " ".join(s.split()), " ".join(t.split())
        ns, nt = len(s.split()), len(t.split())
        if ns < min_len or nt < min_len or ns > max_len or nt > max_len:
            continue
        if ratio and (ns / nt > ratio or nt / ns > ratio):
            continue
        kept_src.append(s)
        kept_tgt.append(t)
    return kept_src, kept_tgt


def learn_bpe(texts: Sequence[Sequence[str]], codes_path: str, merges: int) -> None:
    """``subword-nmt learn-bpe -s merges`` on the concatenation of ``texts`` (joint BPE)."""
    from subword_nmt.learn_bpe import learn_bpe as _learn

    log(f"learning {merges} BPE merges -> {codes_path}")
    joined = io.StringIO("".join(line + "\n" for text in texts for line in text))
    with open(codes_path, "w", encoding="utf-8") as out:
        _learn(joined, out, merges)


def apply_bpe(codes_path: str, lines: Sequence[str], what: str = "", quiet: bool = False) -> List[str]:
    """``subword-nmt apply-bpe -c codes`` (separator ``@@``), line by line (``quiet``: no progress line)."""
    if not os.path.isfile(codes_path):
        raise DataError(f"{codes_path}: no such BPE codes file")
    bpe = _loaded("bpe", codes_path)
    return [bpe.process_line(line + "\n").rstrip("\n")
            for line in (lines if quiet else progress(lines, f"applying BPE {what}"))]


def train_sentencepiece(texts: Sequence[Sequence[str]], model_prefix: str, vocab_size: int,
                        model_type: str = "bpe", character_coverage: float = 1.0) -> str:
    """Train one joint sentencepiece model on ``texts``; returns the ``.model`` path."""
    import sentencepiece as spm

    log(f"training sentencepiece ({model_type}, {vocab_size} pieces) -> {model_prefix}.model")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for text in texts for line in text]),
        model_prefix=model_prefix, vocab_size=vocab_size, model_type=model_type,
        character_coverage=character_coverage, input_sentence_size=2_000_000,
        shuffle_input_sentence=True, bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
    )
    return model_prefix + ".model"


def encode_sentencepiece(model_path: str, lines: Sequence[str]) -> List[str]:
    return [" ".join(pieces) for pieces in _loaded("spm", model_path).encode(list(lines), out_type=str)]
