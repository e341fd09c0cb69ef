"""Prepare Multi30k (task 1) for fairseq, in either direction: the project's CPU-scale corpus.

Steps (those of the reference teacher in shared/teachers/multi30k.de-en/README.md):
1. each line lowercased, then tokenised with sacremoses ``MosesTokenizer(lang).tokenize(line, escape=False)``;
2. joint subword-nmt BPE (``--bpe-merges``, 8000) learned on train.src + train.tgt, or given codes;
3. ``fairseq-preprocess --joined-dictionary`` (or a given dictionary, to match a teacher).

Splits: train, val -> valid, test_2016_flickr -> test. The lowercased, untokenised test references
are kept as ``text/test.raw.<tgt>`` for sacrebleu. Idempotent: a finished destination prepared with
the same options is left alone (``--force`` redoes it).

    python -m preprocess.prepare_multi30k --dest data-bin/multi30k.de-en
    python -m preprocess.prepare_multi30k --src en --tgt de --dest data-bin/multi30k.en-de
"""
import argparse
import os
import shutil
import sys

from .textio import DataError, atomic_directory, main_or_exit, fairseq_preprocess, find_file, is_prepared, log, read_parallel, write_lines
from .translation_text import apply_bpe, learn_bpe, moses_tokenize

EMBEDDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "multi30k.de-en")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en")


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="de", choices=LANGS, help="source language (default: de)")
    p.add_argument("--tgt", default="en", choices=LANGS, help="target language (default: en)")
    p.add_argument("--raw-dir", default=EMBEDDED,
                   help="folder with {train,val,test_2016_flickr}.{de,en}[.gz] (default: the copy embedded in this repository)")
    p.add_argument("--dest", required=True, help="output folder (fairseq data-bin, plus text/ and code)")
    p.add_argument("--bpe-merges", type=int, default=8000, help="BPE merges to learn (default: 8000, as the reference teacher)")
    p.add_argument("--bpe-codes", default=None, help="apply these subword-nmt codes instead of learning new ones (e.g. a teacher's)")
    p.add_argument("--srcdict", default=None, help="fairseq dictionary to reuse for both sides (e.g. a teacher's dict.de.txt)")
    p.add_argument("--train-lines", type=int, default=None, help="use only the first N training pairs (quick runs)")
    p.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers")
    p.add_argument("--force", action="store_true", help="redo even if --dest is already prepared")
    return p


def main(argv=None) -> str:
    args = get_parser().parse_args(argv)
    if args.src == args.tgt:
        raise DataError(f"--src and --tgt are both '{args.src}': choose two different languages")
    for flag, path in (("--bpe-codes", args.bpe_codes), ("--srcdict", args.srcdict)):
        if path and not os.path.isfile(path):
            raise DataError(f"{flag} {path}: no such file")
    config = {k: (os.path.abspath(v) if k in ("raw_dir", "bpe_codes", "srcdict") and v else v)
              for k, v in vars(args).items() if k not in ("dest", "workers", "force")}
    if not args.force and is_prepared(args.dest, config):
        log(f"{args.dest} is already prepared with these options (use --force to redo)")
        return args.dest

    raw = {}
    for split, stem in SPLITS.items():
        src, tgt = read_parallel(find_file(args.raw_dir, f"{stem}.{args.src}"), find_file(args.raw_dir, f"{stem}.{args.tgt}"))
        if split == "train" and args.train_lines:
            src, tgt = src[: args.train_lines], tgt[: args.train_lines]
        raw[split] = {args.src: src, args.tgt: tgt}
        log(f"{split}: {len(src):,} sentence pairs")

    with atomic_directory(args.dest, config) as out:
        text = os.path.join(out, "text")
        os.makedirs(text)
        tok = {split: {lang: moses_tokenize([line.lower() for line in lines], lang, lowercase=False, escape=False,
                                            what=f"{split}.{lang}")
                       for lang, lines in raw[split].items()} for split in SPLITS}
        codes = os.path.join(out, "code")
        if args.bpe_codes:
            shutil.copyfile(args.bpe_codes, codes)
        else:
            learn_bpe([tok["train"][args.src], tok["train"][args.tgt]], codes, args.bpe_merges)
        for split in SPLITS:
            for lang in (args.src, args.tgt):
                write_lines(os.path.join(text, f"{split}.tok.{lang}"), tok[split][lang])
                write_lines(os.path.join(text, f"{split}.bpe.{lang}"), apply_bpe(codes, tok[split][lang], f"{split}.{lang}"))
        write_lines(os.path.join(text, f"test.raw.{args.tgt}"), [line.lower() for line in raw["test"][args.tgt]])
        prefix = lambda split: os.path.join(text, f"{split}.bpe")  # noqa: E731
        fairseq_preprocess(out, args.src, args.tgt, prefix("train"), prefix("valid"), prefix("test"),
                           joined_dictionary=True, srcdict=args.srcdict, tgtdict=args.srcdict, workers=args.workers)
    log(f"done: {args.dest}")
    return args.dest


def cli_main():
    main_or_exit(main)


if __name__ == "__main__":
    cli_main()
