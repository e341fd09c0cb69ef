"""``fc-significance``: is system A better than system B on the same test set? (common/significance.py)

    fc-significance bleu --refs test.en --a a.seed1.txt a.seed2.txt a.seed3.txt --b b.seed1.txt b.seed2.txt b.seed3.txt
    fc-significance glue --labels dev.labels --metric f1 --a a.seed1.txt ... --b b.seed1.txt ...

Files: one detokenised sentence or one label / score per line, in the order of the references;
seed i of A is paired with seed i of B (several files each: one per seed). A test example is one cluster
(all its seeds' outputs resampled and swapped together). Prints A, B, A - B pooled over the seeds, its 95%
cluster-bootstrap interval, the two-sided sign-flip p, each seed's own A - B, and the verdict (as JSON with
``--json``: ``low``, ``high``, ``p``, ``per_seed``, ...); with ``--margin M`` also the equivalence test (TOST).
"""
import argparse
import json
import sys

from ..common.significance import paired_bleu, paired_glue, verdict


def read_lines(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except OSError as e:
        sys.exit(f"{flag} {path}: {e.strerror}")


def as_numbers(lines, path, flag):
    try:
        return [int(x) if x.strip().lstrip("-").isdigit() else float(x) for x in lines]
    except ValueError:
        sys.exit(f"{flag} {path}: expected one label or score per line")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["bleu", "glue"])
    p.add_argument("--a", nargs="+", required=True, help="system A's outputs, one file per seed")
    p.add_argument("--b", nargs="+", required=True, help="system B's outputs, one file per seed (same seed order)")
    p.add_argument("--refs", help="bleu: the detokenised reference file")
    p.add_argument("--labels", help="glue: the gold labels (or scores for STS-B), one per line")
    p.add_argument("--metric", default="accuracy", help="glue: accuracy, f1, mcc, pearson or spearman")
    p.add_argument("--samples", type=int, default=None,
                   help="resamples of the bootstrap and of the sign-flip test (default: 2000 for bleu, 10000 for glue)")
    p.add_argument("--margin", type=float, default=None,
                   help="also test equivalence: A - B within +-MARGIN points (TOST, 90%% interval; no default: a "
                        "parity claim states its own margin)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    if len(args.a) != len(args.b):
        sys.exit(f"--a has {len(args.a)} files and --b {len(args.b)}: give one per seed for both, in the same order")
    if args.kind == "bleu":
        if not args.refs:
            sys.exit("bleu needs --refs")
        a = [read_lines(f, "--a") for f in args.a]
        b = [read_lines(f, "--b") for f in args.b]
        refs = read_lines(args.refs, "--refs")
        kwargs = {"n_samples": args.samples} if args.samples else {}
    else:
        if not args.labels:
            sys.exit("glue needs --labels")
        a = [as_numbers(read_lines(f, "--a"), f, "--a") for f in args.a]
        b = [as_numbers(read_lines(f, "--b"), f, "--b") for f in args.b]
        refs = as_numbers(read_lines(args.labels, "--labels"), args.labels, "--labels")
        kwargs = {"n_resamples": args.samples} if args.samples else {}
    try:
        result = (paired_bleu(a, b, refs, margin=args.margin, **kwargs) if args.kind == "bleu"
                  else paired_glue(a, b, refs, args.metric, margin=args.margin, **kwargs))
    except ValueError as e:
        sys.exit(str(e))
    result["verdict"] = verdict(result)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"A {result['a']:.2f}  B {result['b']:.2f}  A-B {result['diff']:+.2f} "
              f"[{result['low']:+.2f}, {result['high']:+.2f}]  p {result['p']:.4f}  ({result['n']} examples x "
              f"{result['seeds']} seeds; per seed " + ", ".join(f"{d:+.2f}" for d in result["per_seed"]) + "): "
              f"{result['verdict']}" + (f"; within +-{result['margin']:g}: {result['equivalent']} (TOST p "
                                        f"{result['tost_p']:.4f})" if "margin" in result else ""))


def cli_main():
    main()


if __name__ == "__main__":
    main()
