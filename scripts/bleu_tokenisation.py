#!/usr/bin/env python
"""Why BLEU (tok) and sacreBLEU of one model's translations differ (issue 44): both scorings of one
fairseq-generate log, and what separates them.

    python scripts/bleu_tokenisation.py GENERATE_LOG [--raw-references test.en.gz]

BLEU (tok) is fc-measure's and fairseq-generate's: the BPE-removed output against the binarised references
(``tokenize=none``); sacreBLEU scores the Moses-detokenised output against the raw references with its 13a
tokeniser. The script prints both, then the hypothesis tokens that 13a splits (a BPE continuation left
before punctuation, ``word@@ .``, comes out of ``--remove-bpe`` glued as ``word.``, one token that BLEU
(tok) counts as a miss and 13a splits into ``word .``), and BLEU (tok) again with those tokens split: when
that closes the gap, the glued tokens are the whole story.
"""
import argparse
import gzip
import os
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacremoses import MosesDetokenizer

SHARED = os.environ.get("FAIRSEQ_COMPRESS_SHARED",
                        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared"))


def parse_generate(path):
    """(ids, hypotheses, references) of a fairseq-generate log (H- and T- lines), in sentence-id order."""
    hyps, refs = {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                i, _, h = line[2:].rstrip("\n").split("\t")
                hyps[int(i)] = h
            elif line.startswith("T-"):
                i, t = line[2:].rstrip("\n").split("\t")
                refs[int(i)] = t
    if not hyps or set(hyps) != set(refs):
        sys.exit(f"{path}: no H-/T- lines of the same sentences (a fairseq-generate log?)")
    ids = sorted(hyps)
    return ids, [hyps[i] for i in ids], [refs[i] for i in ids]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", help="a fairseq-generate log (--remove-bpe)")
    p.add_argument("--raw-references", default=os.path.join(SHARED, "data", "multi30k.de-en", "test_2016_flickr.en.gz"),
                   help="the raw references, one per sentence id, lowercased here as the teacher's data are "
                        "(default: the shared Multi30k test_2016_flickr)")
    args = p.parse_args(argv)
    ids, hyps, refs = parse_generate(args.log)
    opener = gzip.open if args.raw_references.endswith(".gz") else open
    with opener(args.raw_references, "rt", encoding="utf-8") as f:
        raw = [line.strip().lower() for line in f]
    raw = [raw[i] for i in ids]
    detok = MosesDetokenizer(lang="en")
    tok = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True)
    sacre = sacrebleu.corpus_bleu([detok.detokenize(h.split()) for h in hyps], [raw])
    split13a = Tokenizer13a()
    glued = [w for h in hyps for w in h.split() if len(split13a(w).split()) > 1 and w not in ("'s", "n't")]
    resplit = sacrebleu.corpus_bleu([split13a(h) for h in hyps], [refs], tokenize="none", force=True)
    print(f"sentences {len(ids)}")
    print(f"BLEU (tok)  {tok.score:.2f}  ({tok})")
    print(f"sacreBLEU   {sacre.score:.2f}  ({sacre})")
    print(f"hypothesis tokens 13a splits: {len(glued)}, e.g. {glued[:8]}")
    print(f"BLEU (tok) with them split: {resplit.score:.2f}  (gap to sacreBLEU {sacre.score - resplit.score:+.2f}, "
          f"was {sacre.score - tok.score:+.2f})")


if __name__ == "__main__":
    main()
