"""Prepare any parallel corpus for fairseq: aligned text files in, a fairseq data-bin out.

Input: for each split, one file per language, ``PREFIX.LANG`` (or ``PREFIX.LANG.gz``), UTF-8, one
sentence per line, line *i* of one language the translation of line *i* of the other. The three
splits may live anywhere (``--train-prefix``, ``--valid-prefix``, ``--test-prefix``).

Steps (Multi30k's, whose preparer is a thin user of this one):
1. optional lowercasing (``--lowercase``), then sacremoses ``MosesTokenizer(lang).tokenize(line,
   escape=...)`` per language (``--tokenizer none`` for text that is tokenised already);
2. subwords: joint subword-nmt BPE learned on train.src + train.tgt (``--bpe-merges``), or given
   codes (``--bpe-codes``, e.g. a teacher's), or one joint sentencepiece model (``--subword
   sentencepiece``, ``--spm-vocab``);
3. ``fairseq-preprocess --joined-dictionary`` (or a given ``--srcdict``, to match a teacher).

Checks, before anything is written: every file exists, is UTF-8 and has no empty line, and the two
languages of a split have the same number of lines; each error names the file (and line). The
tokenised and subword text are kept in ``DEST/text/``, the untokenised test references (lowercased
with ``--lowercase``) as ``DEST/text/test.raw.<tgt>`` for sacreBLEU. Idempotent: a destination
finished with the same options and the same input files (path, size, time stamp) is left alone
(``--force`` redoes it); an interrupted run leaves no half-written destination.

    python -m preprocess.prepare_parallel --train-prefix corpus/train --valid-prefix corpus/dev \\
        --test-prefix corpus/test -s de -t en --lowercase --dest data-bin/my.de-en
    python -m preprocess.prepare_parallel ... -s en -t de --subword sentencepiece --spm-vocab 8000 --dest ...
"""
import argparse
import os
import shutil

from .textio import (DataError, atomic_directory, binarise_splits, find_file, is_prepared, log, main_or_exit,
                     read_parallel, write_lines)
from .translation_text import apply_bpe, encode_sentencepiece, learn_bpe, moses_tokenize, train_sentencepiece

SPLITS = ("train", "valid", "test")


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for split in SPLITS:
        p.add_argument(f"--{split}-prefix", required=True,
                       help=f"{split} files are PREFIX.<lang> or PREFIX.<lang>.gz")
    p.add_argument("-s", "--source-lang", required=True, help="source language code (file suffix and Moses rules)")
    p.add_argument("-t", "--target-lang", required=True, help="target language code")
    p.add_argument("--dest", required=True, help="output folder (fairseq data-bin, plus text/ and the subword model)")
    p.add_argument("--lowercase", action="store_true", help="lowercase every line first (as Multi30k's teacher)")
    p.add_argument("--tokenizer", default="moses", choices=("moses", "none"),
                   help="moses: sacremoses per language (default); none: the text is tokenised already")
    p.add_argument("--moses-escape", action="store_true",
                   help="escape &<>'\"[]| as tokenizer.perl does by default (prepare-iwslt14.sh); "
                        "default: no escaping, as Multi30k's teacher")
    p.add_argument("--subword", default="bpe", choices=("bpe", "sentencepiece"),
                   help="bpe: joint subword-nmt (default); sentencepiece: one joint sentencepiece model")
    p.add_argument("--bpe-merges", type=int, default=8000, help="BPE merges to learn (default: 8000, as Multi30k's teacher)")
    p.add_argument("--bpe-codes", default=None, help="apply these subword-nmt codes instead of learning new ones")
    p.add_argument("--spm-vocab", type=int, default=8000, help="sentencepiece vocabulary size (default: 8000)")
    p.add_argument("--srcdict", default=None, help="fairseq dictionary to reuse for both sides (e.g. a teacher's)")
    p.add_argument("--train-lines", type=int, default=None, help="use only the first N training pairs (quick runs)")
    p.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers")
    p.add_argument("--force", action="store_true", help="redo even if --dest is already prepared")
    return p


def _stamp(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def main(argv=None) -> str:
    args = get_parser().parse_args(argv)
    src, tgt = args.source_lang, args.target_lang
    if src == tgt:
        raise DataError(f"--source-lang and --target-lang are both '{src}': choose two different languages")
    for flag, path in (("--bpe-codes", args.bpe_codes), ("--srcdict", args.srcdict)):
        if path and not os.path.isfile(path):
            raise DataError(f"{flag} {path}: no such file")
    if args.bpe_codes and args.subword != "bpe":
        raise DataError("--bpe-codes needs --subword bpe")
    files = {split: {lang: find_file(os.path.dirname(os.path.abspath(prefix)), f"{os.path.basename(prefix)}.{lang}")
                     for lang in (src, tgt)}
             for split, prefix in ((s, getattr(args, f"{s}_prefix")) for s in SPLITS)}
    config = {k: v for k, v in vars(args).items() if k not in ("dest", "workers", "force") and not k.endswith("_prefix")}
    config.update(bpe_codes=args.bpe_codes and os.path.abspath(args.bpe_codes),
                  srcdict=args.srcdict and os.path.abspath(args.srcdict),
                  inputs={split: [_stamp(files[split][lang]) for lang in (src, tgt)] for split in SPLITS})
    if not args.force and is_prepared(args.dest, config):
        log(f"{args.dest} is already prepared with these options (use --force to redo)")
        return args.dest

    raw = {}
    for split in SPLITS:
        lines = dict(zip((src, tgt), read_parallel(files[split][src], files[split][tgt])))
        if split == "train" and args.train_lines:
            lines = {lang: text[: args.train_lines] for lang, text in lines.items()}
        if args.lowercase:
            lines = {lang: [line.lower() for line in text] for lang, text in lines.items()}
        raw[split] = lines
        log(f"{split}: {len(lines[src]):,} sentence pairs")

    with atomic_directory(args.dest, config) as out:
        text = os.path.join(out, "text")
        os.makedirs(text)
        if args.tokenizer == "moses":
            tok = {split: {lang: moses_tokenize(lines, lang, lowercase=False, escape=args.moses_escape,
                                                what=f"{split}.{lang}")
                           for lang, lines in raw[split].items()} for split in SPLITS}
        else:
            tok = raw
        if args.subword == "bpe":
            codes = os.path.join(out, "code")
            if args.bpe_codes:
                shutil.copyfile(args.bpe_codes, codes)
            else:
                learn_bpe([tok["train"][src], tok["train"][tgt]], codes, args.bpe_merges)
            segment = lambda lines, what: apply_bpe(codes, lines, what)  # noqa: E731
        else:
            model = train_sentencepiece([tok["train"][src], tok["train"][tgt]], os.path.join(out, "spm"),
                                        args.spm_vocab)
            segment = lambda lines, what: encode_sentencepiece(model, lines)  # noqa: E731
        sub = "bpe" if args.subword == "bpe" else "spm"
        for split in SPLITS:
            for lang in (src, tgt):
                write_lines(os.path.join(text, f"{split}.tok.{lang}"), tok[split][lang])
                write_lines(os.path.join(text, f"{split}.{sub}.{lang}"), segment(tok[split][lang], f"{split}.{lang}"))
        write_lines(os.path.join(text, f"test.raw.{tgt}"), raw["test"][tgt])
        binarise_splits(out, text, f".{sub}", src, tgt, srcdict=args.srcdict, tgtdict=args.srcdict,
                        workers=args.workers)
    log(f"done: {args.dest}")
    return args.dest


def cli_main():
    main_or_exit(main)


if __name__ == "__main__":
    cli_main()
