#!/usr/bin/env python
"""Why BLEU (tok) and sacreBLEU of one model's translations differ (issue 44): both scorings of one
fairseq-generate log, and what separates them.

    python scripts/bench/bleu_tokenisation.py GENERATE_LOG [--raw-references test.en.gz]

BLEU (tok) is fc-measure's and fairseq-generate's: the BPE-removed output against the binarised references
(``tokenize=none``); sacreBLEU scores the Moses-detokenised output against the raw references with its 13a
tokeniser. The two count tokens differently where detokenising joins them: a degenerate hypothesis that
repeats ``'s`` a hundred times (``woman 's 's 's ...``) is a hundred unmatched tokens to BLEU (tok), while the
Moses detokeniser glues the repeats onto the word (``woman's's's...``), one token to 13a. The script prints both
scores, the tokens detokenising loses (the top ones), the hypotheses repeating a token 5 or more times in a row,
and both scores without those hypotheses: when the gap closes, they are the story. It also counts the tokens 13a
splits (a BPE piece left before punctuation comes out of ``--remove-bpe`` glued, ``word.``).
"""
import argparse
import collections
import gzip
import itertools
import os
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
from sacremoses import MosesDetokenizer

from benchlib import SHARED  # noqa: E402  (scripts/bench/ is on sys.path when this runs as a script)


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
    detok, split13a = MosesDetokenizer(lang="en"), Tokenizer13a()
    detokenised = [detok.detokenize(h.split()) for h in hyps]

    def both(keep):
        return (sacrebleu.corpus_bleu([hyps[i] for i in keep], [[refs[i] for i in keep]], tokenize="none", force=True),
                sacrebleu.corpus_bleu([detokenised[i] for i in keep], [[raw[i] for i in keep]]))

    tok, sacre = both(range(len(ids)))
    print(f"sentences {len(ids)}")
    print(f"BLEU (tok)  {tok.score:.2f}  ({tok})")
    print(f"sacreBLEU   {sacre.score:.2f}  ({sacre})")
    lost = (collections.Counter(w for h in hyps for w in h.split())
            - collections.Counter(w for d in detokenised for w in split13a(d).split()))
    print(f"tokens detokenising loses: {sum(lost.values())}, most: {lost.most_common(5)}")
    glued = [w for h in hyps for w in h.split() if len(split13a(w).split()) > 1 and w not in ("'s", "n't")]
    print(f"hypothesis tokens 13a splits: {len(glued)}, e.g. {glued[:5]}")
    repeats = [i for i, h in enumerate(hyps) if max_run(h.split()) >= 5]
    print(f"hypotheses repeating a token 5+ times in a row: {len(repeats)} (sentence ids "
          f"{[ids[i] for i in repeats][:10]})")
    if repeats:
        tok_rest, sacre_rest = both([i for i in range(len(ids)) if i not in set(repeats)])
        print(f"without them: BLEU (tok) {tok_rest.score:.2f}, sacreBLEU {sacre_rest.score:.2f} (gap "
              f"{sacre_rest.score - tok_rest.score:+.2f}, was {sacre.score - tok.score:+.2f})")


def max_run(words):
    """The longest run of one token repeated in a row."""
    return max((len(list(run)) for _, run in itertools.groupby(words)), default=0)


if __name__ == "__main__":
    main()
