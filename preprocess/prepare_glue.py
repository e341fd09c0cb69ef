"""Prepare GLUE tasks for fairseq's ``sentence_prediction`` task (input0/input1/label, binarised).

All nine tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI) from their original TSVs:
* columns are found by header name (CoLA's train/dev files have no header: fixed positions);
  the UTF-8 byte-order mark of MRPC's files is ignored;
* MRPC's canonical training split is rebuilt from ``msr_paraphrase_train.txt`` minus the pairs in
  ``dev_ids.tsv`` (3,668 pairs) when those files are present; ``train.tsv`` is used otherwise;
* labels are written as class indices ``0..C-1`` in the task's canonical order below (not fairseq's
  frequency order), with a fixed label dictionary, so class i means the same in every run and
  fairseq's F1/MCC reports (which parse labels as integers) work; ``label/names.txt`` maps
  index -> original label. The positive class of MRPC/QQP is 1. STS-B's
  scores are written as ``label/<split>.label`` floats for ``--regression-target``;
* choosing is kept apart from reporting: a fixed random slice of the training set (``--select-fraction``,
  10% of train and at most as many examples as dev has, drawn with ``--select-seed``) is held out as
  ``valid``, the subset fairseq-train validates on and every recipe chooses by (checkpoints, learning
  rates, GhostBERT's importance); GLUE's dev set is written as ``dev`` and only reports. The held-out
  rows are listed in ``text/valid.rows`` (0-based rows of the training set as read, after
  ``--train-rows``). ``--select-fraction 0`` is GLUE's usual layout instead: ``valid`` is the dev set
  itself (choosing and reporting on the same examples, as the papers did);
* MNLI: dev_matched -> dev, dev_mismatched -> dev1, test_matched -> test, test_mismatched -> test1;
* MRPC with ``msr_paraphrase_test.txt`` beside its TSVs (GLUE's download keeps it): ``devtest``, the dev set followed
  by the 1,725 labelled pairs of GLUE's test set (GLUE withholds their labels; the MSR corpus has them), 2,133 pairs
  that only report, for comparisons that 408 dev pairs cannot resolve (ours: the papers report dev).

Sentences are segmented by ``--tokenizer``: ``moses`` (sacremoses; ``--lowercase``), ``bpe``
(Moses, then subword-nmt ``--bpe-codes``), ``sentencepiece`` (``--spm-model``) or ``wordpiece`` (BERT's,
``--wordpiece-vocab``, for checkpoints imported by user_dir.bert.tools.import_hf; Hugging Face's
``tokenizers``), and binarised with
``--dict`` (e.g. a pretrained model's dictionary) or a dictionary built on the training inputs.

Examples are cut to the model's length here, as BERT prepares them (``--max-length``, special tokens
included): a single sentence loses its end, a pair is truncated longest first (tokens leave the longer
segment), so every pair keeps both sentences and fairseq's ``[CLS] a [SEP] b [SEP]`` ends with its
separator. fairseq-train then needs no ``--shorten-method``: its ``truncate`` cuts the joined pair
from the end (dropping the hypothesis and final separator of 10-15% of RTE's dev pairs at 128 tokens).

A malformed row (wrong column count, empty sentence, unknown label) stops the run with the file and
line, unless ``--skip-malformed`` (then the count of skipped rows is reported). Output is written
whole or not at all; a destination prepared with the same options is left alone.

    python -m preprocess.prepare_glue --task RTE --glue-dir ../shared/data/glue --dest data-bin/RTE \\
        --tokenizer sentencepiece --spm-model spm.model --dict dict.txt --pair-specials 4
    python -m preprocess.prepare_glue --task SST-2 --glue-dir ../shared/data/glue --dest data-bin/SST-2.minilm \
        --tokenizer wordpiece --wordpiece-vocab models/minilm --dict models/minilm/dict.txt --max-length 128
"""
import argparse
import csv
import os
import random
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .textio import DataError, atomic_directory, main_or_exit, fairseq_preprocess, is_prepared, log, write_lines

csv.field_size_limit(sys.maxsize)


@dataclass(frozen=True)
class GlueTask:
    inputs: Tuple[str, ...]  # header names of the sentence columns
    label: Optional[str]  # header name of the label column (None: regression label is `label`)
    labels: Tuple[str, ...]  # canonical class order; empty for regression
    splits: Dict[str, str]  # file stem -> fairseq split
    headerless: Optional[Dict[str, int]] = None  # CoLA train/dev: column positions

    @property
    def regression(self) -> bool:
        return not self.labels


_STD = {"train": "train", "dev": "dev", "test": "test"}
# the subset fairseq-train validates on and everything chooses by, and the subset every score is reported on
SELECTION_SUBSET, REPORT_SUBSET = "valid", "dev"
POOLED_SUBSET = "devtest"  # MRPC: dev + the labelled test pairs
TASKS: Dict[str, GlueTask] = {
    "CoLA": GlueTask(("sentence",), "label", ("0", "1"), _STD, headerless={"sentence": 3, "label": 1}),
    "SST-2": GlueTask(("sentence",), "label", ("0", "1"), _STD),
    "MRPC": GlueTask(("#1 String", "#2 String"), "Quality", ("0", "1"), _STD),
    "STS-B": GlueTask(("sentence1", "sentence2"), "score", (), _STD),
    "QQP": GlueTask(("question1", "question2"), "is_duplicate", ("0", "1"), _STD),
    "MNLI": GlueTask(("sentence1", "sentence2"), "gold_label", ("entailment", "neutral", "contradiction"),
                     {"train": "train", "dev_matched": "dev", "dev_mismatched": "dev1",
                      "test_matched": "test", "test_mismatched": "test1"}),
    "QNLI": GlueTask(("question", "sentence"), "label", ("entailment", "not_entailment"), _STD),
    "RTE": GlueTask(("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), _STD),
    "WNLI": GlueTask(("sentence1", "sentence2"), "label", ("0", "1"), _STD),
}


@dataclass
class Examples:
    inputs: List[List[str]]  # one list per input column
    labels: List[str]  # empty for unlabelled test files


def _read_tsv(path: str) -> List[Tuple[int, List[str]]]:
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    with open(path, encoding="utf-8-sig", newline="") as f:  # utf-8-sig drops MRPC's byte-order mark
        return [(i, row) for i, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), start=1)]


def read_split(task_name: str, path: str, stem: str, skip_malformed: bool) -> Examples:
    """Read one TSV; returns the sentence columns and (if present) the labels."""
    task = TASKS[task_name]
    rows = _read_tsv(path)
    if not rows:
        raise DataError(f"{path}: empty file")
    headerless = task.headerless is not None and not stem.startswith("test")
    if headerless:
        positions = {name: task.headerless["sentence"] for name in task.inputs}
        label_pos = task.headerless["label"]
        width = max(list(positions.values()) + [label_pos]) + 1
        body = rows
    else:
        lineno, header = rows[0]
        header = [h.strip() for h in header]
        missing = [name for name in task.inputs if name not in header]
        if missing:
            raise DataError(f"{path}:{lineno}: header lacks column(s) {missing} of {task_name} (header: {header})")
        positions = {name: header.index(name) for name in task.inputs}
        label_pos = header.index(task.label) if task.label in header else None
        if stem.startswith(("train", "dev")) and label_pos is None:
            raise DataError(f"{path}:{lineno}: header lacks the label column '{task.label}' of {task_name}")
        width = len(header)
        body = rows[1:]
    out = Examples(inputs=[[] for _ in task.inputs], labels=[])
    skipped = 0
    for lineno, row in body:
        problem = None
        if len(row) != width and not (headerless and len(row) >= width):
            problem = f"expected {width} tab-separated columns, found {len(row)}"
        else:
            sentences = [row[positions[name]].strip() for name in task.inputs]
            if any(not s for s in sentences):
                problem = "empty sentence"
            elif label_pos is not None:
                label = row[label_pos].strip()
                if task.regression:
                    try:
                        float(label)
                    except ValueError:
                        problem = f"label {label!r} is not a number"
                elif label not in task.labels:
                    problem = f"label {label!r} is not one of {list(task.labels)}"
        if problem:
            if not skip_malformed:
                raise DataError(f"{path}:{lineno}: {problem} (use --skip-malformed to drop such rows)")
            skipped += 1
            continue
        for column, sentence in zip(out.inputs, sentences):
            column.append(sentence)
        if label_pos is not None:
            out.labels.append(label)
    if skipped:
        log(f"  {path}: skipped {skipped} malformed row(s)")
    return out


def read_mrpc_canonical_train(glue_task_dir: str) -> Optional[Examples]:
    """msr_paraphrase_train.txt minus dev_ids.tsv: GLUE's canonical 3,668-pair MRPC training set."""
    source = os.path.join(glue_task_dir, "msr_paraphrase_train.txt")
    dev_ids_path = os.path.join(glue_task_dir, "dev_ids.tsv")
    if not (os.path.isfile(source) and os.path.isfile(dev_ids_path)):
        return None
    dev_ids = set()
    for lineno, row in _read_tsv(dev_ids_path):
        if len(row) != 2:
            raise DataError(f"{dev_ids_path}:{lineno}: expected two tab-separated ids, found {len(row)} columns")
        dev_ids.add((row[0].strip(), row[1].strip()))
    examples = read_split("MRPC", source, "train", skip_malformed=False)
    rows = _read_tsv(source)[1:]
    keep = [i for i, (_, row) in enumerate(rows) if (row[1].strip(), row[2].strip()) not in dev_ids]
    return Examples(inputs=[[col[i] for i in keep] for col in examples.inputs], labels=[examples.labels[i] for i in keep])


def read_mrpc_labelled_test(glue_task_dir: str, skip_malformed: bool) -> Optional[Examples]:
    """msr_paraphrase_test.txt: GLUE's 1,725 MRPC test pairs with their labels (dev.tsv's columns), if present."""
    path = os.path.join(glue_task_dir, "msr_paraphrase_test.txt")
    return read_split("MRPC", path, "dev", skip_malformed) if os.path.isfile(path) else None


# ------------------------------------------------------------------------------------------------
# tokenisers
# ------------------------------------------------------------------------------------------------
def make_tokenizer(args, quiet: bool = False):
    """A function list[str] -> list[str] (space-separated tokens), by ``--tokenizer`` (``quiet``: it logs no
    progress line, for a server's per-request calls)."""
    if args.tokenizer == "wordpiece":
        if not args.wordpiece_vocab or not os.path.exists(args.wordpiece_vocab):
            raise DataError(f"--wordpiece-vocab {args.wordpiece_vocab}: no such vocab.txt or model folder "
                            "(needed by --tokenizer wordpiece)")
        from .wordpiece import load_wordpiece

        try:
            wordpiece = load_wordpiece(args.wordpiece_vocab)
        except (OSError, ValueError) as e:
            raise DataError(f"--wordpiece-vocab {args.wordpiece_vocab}: {e}") from None
        return lambda lines: [" ".join(pieces) for pieces in wordpiece.fairseq_pieces(lines)]
    if args.tokenizer == "sentencepiece":
        if not args.spm_model or not os.path.isfile(args.spm_model):
            raise DataError(f"--spm-model {args.spm_model}: no such sentencepiece model (needed by --tokenizer sentencepiece)")
        from .translation_text import encode_sentencepiece

        return lambda lines: encode_sentencepiece(args.spm_model, [l.lower() if args.lowercase else l for l in lines])
    from .translation_text import apply_bpe, moses_tokenize

    if args.tokenizer == "bpe":
        if not args.bpe_codes or not os.path.isfile(args.bpe_codes):
            raise DataError(f"--bpe-codes {args.bpe_codes}: no such subword-nmt codes file (needed by --tokenizer bpe)")
        return lambda lines: apply_bpe(args.bpe_codes, moses_tokenize(lines, "en", args.lowercase, escape=False,
                                                                      quiet=quiet), quiet=quiet)
    return lambda lines: moses_tokenize(lines, "en", args.lowercase, escape=False, quiet=quiet)


# ------------------------------------------------------------------------------------------------
# BERT's truncation of an example to the model's length
# ------------------------------------------------------------------------------------------------
def truncate_longest_first(first: List[str], second: List[str], budget: int) -> Tuple[List[str], List[str]]:
    """Cut a pair's two token lists to at most ``budget`` tokens together, longest first, as BERT's
    ``_truncate_seq_pair`` (run_classifier.py) and Hugging Face's ``truncation="longest_first"`` do:
    tokens leave the end of the longer segment until both fit, so neither segment is dropped
    while the other is longer. Where both end at half the budget and it is odd, the extra token
    stays with the segment that was longer (with the second one on a tie), as the ``tokenizers``
    package does (tokenizers/src/utils/truncation.rs, ``TruncationStrategy::LongestFirst``), which
    tests/test_hf_import.py checks on every real RTE pair.

    Written out here (a few lines) because the ``tokenizers`` package truncates only inside its own
    encoding, and the Moses, subword-nmt and sentencepiece segmentations need the same rule."""
    if len(first) + len(second) <= budget:
        return first, second
    n_short, n_long = sorted((len(first), len(second)))
    n_long = n_short if n_short > budget else max(n_short, budget - n_short)
    if n_short + n_long > budget:
        n_short, n_long = budget // 2, budget // 2 + budget % 2
    if len(first) > len(second):
        return first[:n_long], second[:n_short]
    return first[:n_short], second[:n_long]


def truncate_examples(columns: List[List[str]], max_length: int, pair_specials: int) -> Tuple[List[List[str]], int]:
    """Each example (one line per column, tokens separated by spaces) cut to ``max_length`` tokens with
    its special tokens (2 for a single sentence, [CLS] a [SEP]; ``pair_specials`` for a pair); returns
    the columns and the number of examples cut. ``max_length`` 0 leaves every example whole."""
    if not max_length:
        return columns, 0
    tokens = [[line.split() for line in column] for column in columns]
    cut = 0
    if len(tokens) == 1:
        out = [[t[: max_length - 2] for t in tokens[0]]]
        cut = sum(len(t) > max_length - 2 for t in tokens[0])
    else:
        out = [[], []]
        for a, b in zip(*tokens):
            ta, tb = truncate_longest_first(a, b, max_length - pair_specials)
            cut += (len(ta), len(tb)) != (len(a), len(b))
            out[0].append(ta)
            out[1].append(tb)
    return [[" ".join(t) for t in column] for column in out], cut


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", required=True, choices=sorted(TASKS), help="GLUE task")
    p.add_argument("--glue-dir", required=True, help="folder holding <TASK>/train.tsv, dev.tsv, test.tsv")
    p.add_argument("--dest", required=True, help="output folder (input0/, input1/, label/)")
    p.add_argument("--tokenizer", default="moses", choices=("moses", "bpe", "sentencepiece", "wordpiece"),
                   help="segmentation (wordpiece: BERT's, as an imported checkpoint's tokenizer; see --wordpiece-vocab)")
    p.add_argument("--lowercase", action="store_true", help="lowercase before segmenting (uncased models)")
    p.add_argument("--bpe-codes", default=None, help="subword-nmt codes for --tokenizer bpe")
    p.add_argument("--spm-model", default=None, help="sentencepiece model for --tokenizer sentencepiece")
    p.add_argument("--wordpiece-vocab", default=None,
                   help="vocab.txt, or a folder with vocab.txt and tokenizer_config.json (its do_lower_case decides "
                        "lowercasing), for --tokenizer wordpiece; pair with --dict from user_dir.bert.tools.import_hf")
    p.add_argument("--max-length", type=int, default=512,
                   help="the most tokens the model reads per example, its special tokens included: a longer single "
                        "sentence is cut at the end to max-length - 2 ([CLS] a [SEP]), a longer pair longest first "
                        "(as BERT and Hugging Face tokenizers do), so fairseq-train needs no --shorten-method; set "
                        "it to the model's --max-positions (default 512: BERT's and RoBERTa's position table, "
                        "Devlin et al. 2019 §3; 0 keeps every example whole)")
    p.add_argument("--pair-specials", type=int, default=3,
                   help="special tokens of a pair, counted by --max-length (default 3: BERT's [CLS] a [SEP] b [SEP], "
                        "fairseq --init-token 0 without --separator-token; 4 for RoBERTa's <s> a </s></s> b </s>, "
                        "--separator-token 2)")
    p.add_argument("--dict", default=None, help="fairseq dictionary for the inputs (default: built on train)")
    p.add_argument("--select-fraction", type=float, default=0.1,
                   help="fraction of the training set held out as 'valid', the subset that chooses checkpoints, "
                        "learning rates and importance, capped at the dev set's size; dev ('dev') only reports "
                        "(default 0.1, ours: the papers chose and reported on dev; 0: 'valid' is the dev set, "
                        "GLUE's usual layout, choosing on the reported examples)")
    p.add_argument("--select-seed", type=int, default=1, help="seed of the held-out slice's draw (default 1)")
    p.add_argument("--train-rows", type=int, default=None, help="use only the first N training rows (quick runs)")
    p.add_argument("--skip-malformed", action="store_true", help="drop malformed rows instead of stopping")
    p.add_argument("--workers", type=int, default=2, help="fairseq-preprocess workers")
    p.add_argument("--force", action="store_true", help="redo even if --dest is already prepared")
    return p


def main(argv=None) -> str:
    args = get_parser().parse_args(argv)
    task = TASKS[args.task]
    task_dir = os.path.join(args.glue_dir, args.task)
    if not os.path.isdir(task_dir):
        raise DataError(f"--glue-dir {args.glue_dir}: no {args.task}/ folder in it")
    if args.dict and not os.path.isfile(args.dict):
        raise DataError(f"--dict {args.dict}: no such file")
    if args.max_length < 0 or 0 < args.max_length < max(args.pair_specials, 2) + 2:
        raise DataError(f"--max-length {args.max_length}: leaves no room for two tokens of text beside the "
                        f"{args.pair_specials} special tokens of a pair (0 keeps every example whole)")
    if not 0 <= args.select_fraction < 1:
        raise DataError(f"--select-fraction {args.select_fraction}: must be in [0, 1) (0: choose on dev itself)")
    if args.pair_specials < 0:
        raise DataError(f"--pair-specials {args.pair_specials}: must be 0 or more (BERT's pairs: 3)")
    tokenize = make_tokenizer(args)
    config = {k: v for k, v in vars(args).items() if k not in ("dest", "workers", "force")}
    config["glue_dir"] = os.path.abspath(args.glue_dir)
    labelled_test = read_mrpc_labelled_test(task_dir, args.skip_malformed) if args.task == "MRPC" else None
    if labelled_test is not None:
        config[POOLED_SUBSET] = "dev + msr_paraphrase_test.txt"
    if not args.force and is_prepared(args.dest, config):
        log(f"{args.dest} is already prepared with these options (use --force to redo)")
        return args.dest

    data: Dict[str, Examples] = {}
    for stem, split in task.splits.items():
        path = os.path.join(task_dir, stem + ".tsv")
        if stem == "train" and args.task == "MRPC":
            canonical = read_mrpc_canonical_train(task_dir)
            if canonical is not None:
                log("MRPC train: canonical split from msr_paraphrase_train.txt minus dev_ids.tsv")
                data[split] = canonical
                continue
        if stem.startswith("test") and not os.path.isfile(path):
            log(f"no {path}: skipping the {split} split")
            continue
        data[split] = read_split(args.task, path, stem, args.skip_malformed)
    if args.train_rows:
        train = data["train"]
        data["train"] = Examples([c[: args.train_rows] for c in train.inputs], train.labels[: args.train_rows])
    held_out = hold_out_selection(data, args.select_fraction, args.select_seed)
    if labelled_test is not None:
        dev = data[REPORT_SUBSET]
        data[POOLED_SUBSET] = Examples([a + b for a, b in zip(dev.inputs, labelled_test.inputs)],
                                       dev.labels + labelled_test.labels)
    for split, ex in data.items():
        log(f"{args.task} {split}: {len(ex.inputs[0]):,} examples" + ("" if ex.labels else " (unlabelled)"))

    with atomic_directory(args.dest, config) as out:
        text = os.path.join(out, "text")
        os.makedirs(text)
        for split, ex in data.items():
            columns, cut = truncate_examples([tokenize(column) for column in ex.inputs], args.max_length,
                                             args.pair_specials)
            if cut:
                log(f"  {split}: {cut:,} of {len(ex.inputs[0]):,} examples longer than --max-length "
                    f"{args.max_length} cut" + (" longest first" if len(columns) == 2 else " at the end"))
            for i, (raw, column) in enumerate(zip(ex.inputs, columns)):
                write_lines(os.path.join(text, f"{split}.raw.input{i}"), raw)
                write_lines(os.path.join(text, f"{split}.input{i}"), column)
            if ex.labels:
                write_lines(os.path.join(text, f"{split}.label"), ex.labels)
        if held_out is not None:
            write_lines(os.path.join(text, f"{SELECTION_SUBSET}.rows"), [str(i) for i in held_out])
        splits = list(data)
        input_dict = args.dict
        for i in range(len(task.inputs)):
            prefixes = {s: os.path.join(text, f"{s}.input{i}") for s in splits}
            _binarise(os.path.join(out, f"input{i}"), prefixes, input_dict, args.workers)
            input_dict = input_dict or os.path.join(out, "input0", "dict.txt")  # input1 shares input0's dictionary
        labelled = [s for s in splits if data[s].labels]
        if task.regression:
            os.makedirs(os.path.join(out, "label"))
            for s in labelled:
                write_lines(os.path.join(out, "label", f"{s}.label"), data[s].labels)
        else:
            label_dict = os.path.join(text, "label.dict.txt")
            write_lines(label_dict, [f"{i} 1" for i in range(len(task.labels))])
            for s in labelled:
                write_lines(os.path.join(text, f"{s}.label.id"), [str(task.labels.index(l)) for l in data[s].labels])
            _binarise(os.path.join(out, "label"), {s: os.path.join(text, f"{s}.label.id") for s in labelled},
                      label_dict, args.workers)
            write_lines(os.path.join(out, "label", "names.txt"), [f"{i}\t{l}" for i, l in enumerate(task.labels)])
    log(f"done: {args.dest} ({'regression' if task.regression else f'{len(task.labels)} classes: {list(task.labels)}'})")
    return args.dest


def hold_out_selection(data: Dict[str, Examples], fraction: float, seed: int) -> Optional[List[int]]:
    """Split data["train"] into train and the held-out selection set data["valid"] (see the module's docstring);
    returns the held-out rows, or None with fraction 0 (then valid is the dev set)."""
    train, dev = data["train"], data[REPORT_SUBSET]
    if fraction == 0:
        log(f"--select-fraction 0: '{SELECTION_SUBSET}' is the dev set: checkpoints and settings are chosen on "
            f"the examples the scores are reported on")
        data[SELECTION_SUBSET] = dev
        return None
    n = len(train.inputs[0])
    k = min(max(1, int(round(fraction * n))), len(dev.inputs[0]))
    if k >= n:
        raise DataError(f"--select-fraction {fraction}: holds out {k} of {n} training examples; it needs at least "
                        f"one and must leave some to train on")
    held = sorted(random.Random(seed).sample(range(n), k))
    kept = sorted(set(range(n)) - set(held))
    pick = lambda rows, values: [values[i] for i in rows]  # noqa: E731
    data[SELECTION_SUBSET] = Examples([pick(held, c) for c in train.inputs], pick(held, train.labels))
    data["train"] = Examples([pick(kept, c) for c in train.inputs], pick(kept, train.labels))
    log(f"selection: {k:,} training examples held out as '{SELECTION_SUBSET}' (seed {seed}); the dev set reports")
    return held


def _binarise(dest: str, prefixes: Dict[str, str], srcdict: Optional[str], workers: int) -> None:
    """fairseq-preprocess --only-source of each split: train/valid/test, the dev sets (dev, MNLI's dev1) and
    MNLI's test1. fairseq-preprocess names extra comma-separated prefixes valid1, valid2, ..., test1, ...: the
    dev sets go in as extra valid prefixes and are renamed after."""
    standard = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    extra, valid_more, test_more = [], [], []
    for split, prefix in prefixes.items():
        if split in standard:
            extra += [standard[split], prefix]
        elif split.startswith("dev"):
            valid_more.append((split, prefix))
        elif split.startswith("test"):
            test_more.append(prefix)
    if valid_more and "--validpref" not in extra:
        raise DataError(f"{dest}: dev sets {[s for s, _ in valid_more]} without a '{SELECTION_SUBSET}' split")
    extra = _merge_prefixes(extra, "--validpref", [prefix for _, prefix in valid_more])
    extra = _merge_prefixes(extra, "--testpref", test_more)
    if srcdict:
        extra += ["--srcdict", srcdict]
    fairseq_preprocess(dest, None, None, None, workers=workers, extra=extra)
    for j, (split, _) in enumerate(valid_more, start=1):
        for ext in (".bin", ".idx"):
            os.replace(os.path.join(dest, f"valid{j}{ext}"), os.path.join(dest, split + ext))


def _merge_prefixes(extra: List[str], flag: str, more: Sequence[str]) -> List[str]:
    if not more:
        return extra
    i = extra.index(flag)
    extra[i + 1] = ",".join([extra[i + 1]] + list(more))
    return extra


def cli_main():
    main_or_exit(main)


if __name__ == "__main__":
    cli_main()
