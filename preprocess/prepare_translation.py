"""Prepare the papers' translation corpora for fairseq, in either direction.

Corpora (``--corpus``):
* ``iwslt14.de-en`` — exactly fairseq's ``examples/translation/prepare-iwslt14.sh``: Moses
  tokenisation (sacremoses, escaping as tokenizer.perl), clean-corpus-n (1-175 tokens, ratio 1.5)
  on train, lowercasing, every 23rd training pair held out as valid, test = dev2010 + TEDX.dev2012
  + tst2010-2012, joint subword-nmt BPE with 10,000 merges, then ``fairseq-preprocess``.
* ``iwslt14.en-es``, ``iwslt17.en-fr`` (WIT3 archives) and ``wmt17.en-fi``, ``wmt17.en-lv``
  (data.statmt.org's preprocessed WMT'17 corpora; the newstest2017 test set through sacrebleu):
  one joint sentencepiece model (``--spm-vocab``, 8,000 for IWSLT, 32,000 for WMT by default),
  then ``fairseq-preprocess --joined-dictionary``.

``--raw-dir`` points at an already-unpacked release instead of downloading; the archive layout is
the official one. Idempotent: a destination prepared with the same options is left alone.

    python -m preprocess.prepare_translation --corpus iwslt14.de-en --dest data-bin/iwslt14.de-en
    python -m preprocess.prepare_translation --corpus wmt17.en-lv --src lv --tgt en --dest data-bin/wmt17.lv-en
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .download import download, extract
from .iwslt_xml import read_train_tags, read_xml_segments
from .textio import (DataError, main_or_exit, atomic_directory, binarise_splits, is_prepared, log, read_lines,
                     write_lines)
from .translation_text import (apply_bpe, clean_corpus, encode_sentencepiece, learn_bpe, moses_tokenize,
                               train_sentencepiece)


@dataclass
class Corpus:
    langs: Tuple[str, str]
    urls: List[str]
    kind: str  # "iwslt" (WIT3 tags/xml files) or "wmt" (plain parallel text)
    valid: List[str] = field(default_factory=list)  # xml set names (iwslt) or file stems (wmt)
    test: List[str] = field(default_factory=list)
    subword: str = "spm"  # "bpe" (Moses + subword-nmt, prepare-iwslt14.sh) or "spm"
    spm_vocab: int = 8000
    valid_every: int = 0  # hold out every n-th training pair as valid (prepare-iwslt14.sh: 23)
    sacrebleu_test: Optional[str] = None


CORPORA: Dict[str, Corpus] = {
    "iwslt14.de-en": Corpus(
        langs=("de", "en"), kind="iwslt", subword="bpe", valid_every=23,
        urls=["http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz"],
        test=["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
              "IWSLT14.TED.tst2012"],
    ),
    "iwslt14.en-es": Corpus(
        langs=("en", "es"), kind="iwslt", urls=["https://wit3.fbk.eu/archive/2014-01/texts/en/es/en-es.tgz"],
        valid=["IWSLT14.TED.dev2010"], test=["IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012"],
    ),
    "iwslt17.en-fr": Corpus(
        langs=("en", "fr"), kind="iwslt", urls=["https://wit3.fbk.eu/archive/2017-01-trnted/texts/en/fr/en-fr.tgz"],
        valid=["IWSLT17.TED.dev2010"],
        test=["IWSLT17.TED.tst2010", "IWSLT17.TED.tst2011", "IWSLT17.TED.tst2012", "IWSLT17.TED.tst2013",
              "IWSLT17.TED.tst2014", "IWSLT17.TED.tst2015"],
    ),
    "wmt17.en-fi": Corpus(
        langs=("en", "fi"), kind="wmt", spm_vocab=32000, sacrebleu_test="wmt17",
        urls=["https://data.statmt.org/wmt17/translation-task/preprocessed/fi-en/corpus.tc.en.gz",
              "https://data.statmt.org/wmt17/translation-task/preprocessed/fi-en/corpus.tc.fi.gz",
              "https://data.statmt.org/wmt17/translation-task/preprocessed/fi-en/dev.tgz"],
        valid=["newstest2016-fien-{src}.tc.{l}", "newstest2016-enfi-{src}.tc.{l}"],
    ),
    "wmt17.en-lv": Corpus(
        langs=("en", "lv"), kind="wmt", spm_vocab=32000, sacrebleu_test="wmt17",
        urls=["https://data.statmt.org/wmt17/translation-task/preprocessed/lv-en/corpus.tc.en.gz",
              "https://data.statmt.org/wmt17/translation-task/preprocessed/lv-en/corpus.tc.lv.gz",
              "https://data.statmt.org/wmt17/translation-task/preprocessed/lv-en/dev.tgz"],
        valid=["newsdev2017-lven-{src}.tc.{l}", "newsdev2017-enlv-{src}.tc.{l}"],
    ),
}


def _find(raw_dir: str, pattern: str) -> str:
    hits = sorted(glob.glob(os.path.join(raw_dir, "**", pattern), recursive=True))
    if not hits:
        raise DataError(f"{raw_dir}: no file matching {pattern} (is this the unpacked official release?)")
    return hits[0]


def _pair_name(corpus: Corpus) -> str:
    return f"{corpus.langs[0]}-{corpus.langs[1]}"


def read_iwslt(corpus: Corpus, raw_dir: str, src: str, tgt: str) -> Dict[str, Dict[str, List[str]]]:
    pair = _pair_name(corpus)
    data = {"train": {l: read_train_tags(_find(raw_dir, f"train.tags.{pair}.{l}")) for l in (src, tgt)}}
    if len(data["train"][src]) != len(data["train"][tgt]):
        raise DataError(f"{raw_dir}: train.tags.{pair}.{src} and .{tgt} are not aligned "
                        f"({len(data['train'][src])} vs {len(data['train'][tgt])} lines)")
    for split in ("valid", "test"):
        sets = getattr(corpus, split)
        data[split] = {l: [s for name in sets for s in read_xml_segments(_find(raw_dir, f"{name}.{pair}.{l}.xml"))]
                       for l in (src, tgt)}
    return data


def read_wmt(corpus: Corpus, raw_dir: str, src: str, tgt: str) -> Dict[str, Dict[str, List[str]]]:
    data = {"train": {l: read_lines(_find(raw_dir, f"corpus.tc.{l}*"), allow_empty=True) for l in (src, tgt)}}
    valid = {}
    for pattern in corpus.valid:
        try:
            valid = {l: read_lines(_find(raw_dir, pattern.format(src=src, l=l))) for l in (src, tgt)}
            break
        except DataError:
            continue
    if not valid:
        raise DataError(f"{raw_dir}: no WMT dev set found (looked for {corpus.valid})")
    data["valid"] = valid
    pair = f"{src}-{tgt}"
    log(f"fetching the {corpus.sacrebleu_test} {pair} test set through sacrebleu")
    data["test"] = {}
    for side, l in (("src", src), ("ref", tgt)):
        out = subprocess.run([sys.executable, "-m", "sacrebleu", "-t", corpus.sacrebleu_test, "-l", pair, "--echo", side],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise DataError(f"sacrebleu could not provide {corpus.sacrebleu_test} {pair}: {out.stderr.strip()}")
        data["test"][l] = out.stdout.rstrip("\n").split("\n")
    return data


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, choices=sorted(CORPORA), help="which corpus")
    p.add_argument("--src", default=None, help="source language (default: the corpus' first language)")
    p.add_argument("--tgt", default=None, help="target language (default: the corpus' second language)")
    p.add_argument("--dest", required=True, help="output folder (fairseq data-bin, with text/ and the subword model)")
    p.add_argument("--raw-dir", default=None, help="unpacked official release; default: download into --download-dir")
    p.add_argument("--download-dir", default="downloads", help="where archives are downloaded and unpacked")
    p.add_argument("--bpe-merges", type=int, default=10000, help="subword-nmt merges (prepare-iwslt14.sh: 10000)")
    p.add_argument("--spm-vocab", type=int, default=None, help="sentencepiece vocabulary (default: 8000 IWSLT, 32000 WMT)")
    p.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers")
    p.add_argument("--force", action="store_true", help="redo even if --dest is already prepared")
    return p


def main(argv=None) -> str:
    args = get_parser().parse_args(argv)
    corpus = CORPORA[args.corpus]
    src = args.src or corpus.langs[0]
    tgt = args.tgt or corpus.langs[1]
    if {src, tgt} != set(corpus.langs):
        raise DataError(f"--src {src} --tgt {tgt}: {args.corpus} holds {corpus.langs[0]} and {corpus.langs[1]}")
    config = {"corpus": args.corpus, "src": src, "tgt": tgt, "bpe_merges": args.bpe_merges,
              "spm_vocab": args.spm_vocab or corpus.spm_vocab}
    if not args.force and is_prepared(args.dest, config):
        log(f"{args.dest} is already prepared with these options (use --force to redo)")
        return args.dest
    raw_dir = args.raw_dir
    if raw_dir is None:
        raw_dir = os.path.join(args.download_dir, args.corpus)
        for url in corpus.urls:
            path = download(url, args.download_dir)
            if path.endswith((".tgz", ".tar.gz", ".zip")):
                extract(path, raw_dir)
            else:
                os.makedirs(raw_dir, exist_ok=True)
                target = os.path.join(raw_dir, os.path.basename(path))
                if not os.path.exists(target):
                    shutil.copyfile(path, target)
    elif not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir}: no such folder")

    data = (read_iwslt if corpus.kind == "iwslt" else read_wmt)(corpus, raw_dir, src, tgt)
    with atomic_directory(args.dest, config) as out:
        text = os.path.join(out, "text")
        os.makedirs(text)
        if corpus.subword == "bpe":
            data = {split: {l: moses_tokenize(lines, l, lowercase=False, escape=True, what=f"{split}.{l}")
                            for l, lines in sides.items()} for split, sides in data.items()}
            train_src, train_tgt = clean_corpus(data["train"][src], data["train"][tgt], 1, 175, 1.5)
            data["train"] = {src: [s.lower() for s in train_src], tgt: [t.lower() for t in train_tgt]}
            for split in ("valid", "test"):
                data[split] = {l: [s.lower() for s in lines] for l, lines in data[split].items()}
            if corpus.valid_every:
                n = corpus.valid_every  # awk '{if (NR%23 == 0) print > valid; else print > train}'
                train = data["train"]
                held = {l: [s for i, s in enumerate(train[l], 1) if i % n == 0] for l in (src, tgt)}
                data["train"] = {l: [s for i, s in enumerate(train[l], 1) if i % n != 0] for l in (src, tgt)}
                data["valid"] = held
            codes = os.path.join(out, "code")
            learn_bpe([data["train"][tgt], data["train"][src]], codes, args.bpe_merges)
            segment = lambda lines, what: apply_bpe(codes, lines, what)  # noqa: E731
        else:
            model = train_sentencepiece([data["train"][src], data["train"][tgt]], os.path.join(out, "spm"),
                                        config["spm_vocab"])
            segment = lambda lines, what: encode_sentencepiece(model, lines)  # noqa: E731
        for split, sides in data.items():
            for l, lines in sides.items():
                write_lines(os.path.join(text, f"{split}.{l}"), lines)
                write_lines(os.path.join(text, f"{split}.sub.{l}"), segment(lines, f"{split}.{l}"))
        binarise_splits(out, text, ".sub", src, tgt, workers=args.workers)
    log(f"done: {args.dest}")
    return args.dest


def cli_main():
    main_or_exit(main)


if __name__ == "__main__":
    cli_main()
