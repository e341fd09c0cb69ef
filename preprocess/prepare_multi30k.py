"""Prepare Multi30k (task 1) for fairseq, in either direction: the project's CPU-scale corpus.

A thin user of :mod:`preprocess.prepare_parallel` (any aligned text files): the Multi30k file names,
lowercasing and the reference teacher's BPE settings. Steps (those of the reference teacher,
checkpoints/multi30k.de-en/README.md):
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

from . import prepare_parallel
from .textio import DataError, main_or_exit

EMBEDDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "multi30k.de-en")
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
LANGS = ("de", "en", "fr", "cs")  # the embedded copy holds de and en; fr and cs need --raw-dir (the Multi30k release)


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
    argv = ["-s", args.src, "-t", args.tgt, "--dest", args.dest, "--lowercase", "--bpe-merges", str(args.bpe_merges),
            "--workers", str(args.workers)]
    for split, stem in SPLITS.items():
        argv += [f"--{split}-prefix", os.path.join(args.raw_dir, stem)]
    for flag, value in (("--bpe-codes", args.bpe_codes), ("--srcdict", args.srcdict), ("--train-lines", args.train_lines)):
        if value:
            argv += [flag, str(value)]
    if args.force:
        argv.append("--force")
    return prepare_parallel.main(argv)


def cli_main():
    main_or_exit(main)


if __name__ == "__main__":
    cli_main()
