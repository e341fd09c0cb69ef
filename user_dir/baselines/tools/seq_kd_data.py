"""Sequence-level KD data (Kim & Rush 2016): replace the targets of a binarised translation
training set by the teacher's beam-search outputs, keeping sources, dictionaries and the valid/test
sets, so that a student trained on the result with any criterion learns the teacher's sequences.

    python -m user_dir.baselines.tools.seq_kd_data data-bin/multi30k.de-en --path teacher.pt \\
        --dest data-bin/multi30k.de-en.seqkd [--beam 5] [--batch-size 128]
    fairseq-train data-bin/multi30k.de-en.seqkd --user-dir user_dir --arch ... --criterion kd ...

The teacher decodes the training subset with ``fairseq-generate`` (BPE kept, so outputs are in the
student's vocabulary); hypotheses are put back in corpus order; the new training pairs are
binarised with the original dictionaries (``--srcdict``/``--tgtdict``), and the other subsets'
binary files are copied unchanged, so validation still measures against the human references.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def _languages(data: str):
    matches = (re.match(r"train\.(\w+)-(\w+)\.\1\.idx$", os.path.basename(p))
               for p in glob.glob(os.path.join(data, "train.*-*.*.idx")))
    pairs = {(m.group(1), m.group(2)) for m in matches if m}
    if len(pairs) != 1:
        raise SystemExit(f"{data}: expected one binarised train.SRC-TGT.SRC.idx pair, found {sorted(pairs) or 'none'}")
    return pairs.pop()


def read_hypotheses(generate_output: str, n: int):
    """(sources, hypotheses) in corpus order from fairseq-generate's S-/H- lines; every id once."""
    src, hyp = {}, {}
    for line in generate_output.splitlines():
        if line.startswith(("S-", "H-")):
            tag, rest = line.split("-", 1)
            fields = rest.split("\t")
            idx = int(fields[0])
            (src if tag == "S" else hyp)[idx] = fields[-1]
    missing = sorted(set(range(n)) - set(hyp))
    if missing or len(src) != n:
        raise SystemExit(f"the teacher's output covers {len(hyp)} of {n} training pairs (first missing: {missing[:5]})")
    return [src[i] for i in range(n)], [hyp[i] for i in range(n)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="binarised translation data (fairseq-preprocess output) the teacher was trained on")
    p.add_argument("--path", required=True, help="teacher checkpoint")
    p.add_argument("--dest", required=True, help="output folder for the distilled data-bin")
    p.add_argument("--beam", type=int, default=5, help="teacher beam size (default 5, Kim & Rush 2016)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per generation batch (default 128)")
    p.add_argument("--max-len-a", type=float, default=1.2, help="max target length a*src+b (default 1.2)")
    p.add_argument("--max-len-b", type=int, default=10, help="max target length a*src+b (default 10)")
    p.add_argument("--cpu", action="store_true", help="decode on the CPU even if CUDA is available")
    args = p.parse_args(argv)
    if not os.path.isfile(args.path):
        raise SystemExit(f"--path {args.path}: no such checkpoint")
    if not os.path.isdir(args.data):
        raise SystemExit(f"{args.data}: no such data folder")
    src, tgt = _languages(args.data)
    from user_dir import PLUGIN_DIR as user_dir
    cmd = [sys.executable, "-m", "fairseq_cli.generate", args.data, "--user-dir", user_dir, "--path", args.path,
           "--gen-subset", "train", "-s", src, "-t", tgt, "--beam", str(args.beam), "--batch-size", str(args.batch_size),
           "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b), "--skip-invalid-size-inputs-valid-test"]
    if args.cpu:
        cmd.append("--cpu")
    print(f"[seq-kd] decoding the training set with the teacher: {' '.join(cmd)}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fairseq-generate failed:\n{out.stderr[-3000:]}")
    from fairseq.data import data_utils

    n = len(data_utils.load_indexed_dataset(os.path.join(args.data, f"train.{src}-{tgt}.{src}"), None))
    sources, hypotheses = read_hypotheses(out.stdout, n)

    sys.path.insert(0, os.path.dirname(user_dir))
    from preprocess.textio import fairseq_preprocess

    os.makedirs(args.dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dest) as tmp:
        for lang, lines in ((src, sources), (tgt, hypotheses)):
            with open(os.path.join(tmp, f"train.{lang}"), "w") as f:
                f.write("\n".join(lines) + "\n")
        fairseq_preprocess(os.path.join(tmp, "bin"), src, tgt, os.path.join(tmp, "train"),
                           srcdict=os.path.join(args.data, f"dict.{src}.txt"),
                           tgtdict=os.path.join(args.data, f"dict.{tgt}.txt"))
        for f in glob.glob(os.path.join(tmp, "bin", "train.*")):
            shutil.move(f, os.path.join(args.dest, os.path.basename(f)))
    for f in glob.glob(os.path.join(args.data, "*")):
        name = os.path.basename(f)
        if os.path.isfile(f) and not name.startswith("train."):
            shutil.copy(f, os.path.join(args.dest, name))
    print(f"[seq-kd] {n} training pairs with the teacher's targets -> {args.dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
