"""Predictions of a fine-tuned sentence-prediction checkpoint in GLUE's submission format.

    python -m user_dir.tools.glue_predict data-bin/SST-2 --path checkpoints/sst2/checkpoint_best.pt \\
        --task SST-2 --subset test --out submission/SST-2.tsv

Writes ``index<TAB>prediction`` with a header, one row per example in the order of the task's
TSV (index = row number, as gluebenchmark.com expects), the prediction being the original label
string (``label/names.txt`` written by preprocess/prepare_glue.py: e.g. ``entailment`` for RTE) or,
for STS-B, the regression score. The subset needs no labels (GLUE's test sets have none); when it
has them (``valid``), the task's metric is printed too.
"""
import argparse
import ast
import os
import sys
from typing import Optional

import torch

SUBMISSION_NAMES = {"MNLI": {"test": "MNLI-m", "test1": "MNLI-mm"}}


def predict(data: str, path: str, subset: str, batch_size: int = 64, head: str = "sentence_classification_head",
            variator_plugins: str = "", variator_ratio: int = 0, model_overrides: Optional[dict] = None):
    """(ids, predictions as class indices or floats, labels or None, regression?) for ``subset``, in TSV order.

    ``variator_plugins`` (comma-separated plugin files) and ``variator_ratio`` run the model with a
    Variator plugin (user_dir/variator/); ``model_overrides`` replace model arguments at load, as fairseq's
    ``--model-overrides`` (e.g. ``{"ghost_compile": True}``)."""
    import user_dir  # noqa: F401  (registers the plug-in and the checkpoint-loading fix)
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={**(model_overrides or {}),
                                                                                          "data": data})
    model = models[0].eval()
    if variator_plugins or variator_ratio:
        from user_dir.variator.plugged_encoder import attach_plugin_files
        attach_plugin_files(model, variator_plugins).use(variator_ratio)
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    regression = bool(getattr(task.cfg, "regression_target", False))
    itr = task.get_batch_iterator(dataset, max_sentences=batch_size, ignore_invalid_inputs=False).next_epoch_itr(
        shuffle=False)
    results, labels = {}, {}
    with torch.no_grad():
        for sample in itr:
            logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=head)
            preds = logits.view(-1).tolist() if regression else logits.argmax(-1).tolist()
            for i, sid in enumerate(sample["id"].tolist()):
                results[sid] = preds[i]
                if "target" in sample:
                    labels[sid] = sample["target"].view(-1)[i].item()
    ids = sorted(results)
    if ids != list(range(len(dataset))):
        raise SystemExit(f"{subset}: predicted {len(ids)} of {len(dataset)} examples (too long for --max-positions?)")
    return ids, [results[i] for i in ids], ([labels[i] for i in ids] if labels else None), regression


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the task's data-bin (preprocess/prepare_glue.py output)")
    p.add_argument("--path", required=True, help="fine-tuned checkpoint")
    p.add_argument("--task", required=True, help="GLUE task name (for the metric and the file name)")
    p.add_argument("--subset", default="test", help="subset to predict (default: test)")
    p.add_argument("--out", default=None, help="output TSV (default: <TASK>.tsv, GLUE's file name, in the cwd)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch (default 64)")
    p.add_argument("--variator-plugins", default="", help="Variator plugin files to attach (comma-separated)")
    p.add_argument("--variator-ratio", type=int, default=0, help="the attached plugin to run (k; 0: none)")
    p.add_argument("--model-overrides", default="{}",
                   help="model arguments replaced at load, a Python dict as fairseq's flag of the same name, e.g. "
                        "\"{'ghost_compile': True}\" (GhostBERT's compiled ghost modules)")
    args = p.parse_args(argv)
    try:
        overrides = ast.literal_eval(args.model_overrides)
        if not isinstance(overrides, dict):
            raise ValueError
    except (ValueError, SyntaxError):
        raise SystemExit(f"--model-overrides {args.model_overrides!r}: a Python dict, e.g. \"{{'ghost_compile': True}}\"")
    if not os.path.isfile(args.path):
        raise SystemExit(f"--path {args.path}: no such checkpoint")
    names_path = os.path.join(args.data, "label", "names.txt")
    ids, preds, labels, regression = predict(args.data, args.path, args.subset, args.batch_size,
                                         variator_plugins=args.variator_plugins, variator_ratio=args.variator_ratio,
                                         model_overrides=overrides)
    if regression:
        shown = [f"{min(5.0, max(0.0, p)):.3f}" for p in preds]
    else:
        if not os.path.isfile(names_path):
            raise SystemExit(f"{names_path}: missing (written by preprocess/prepare_glue.py): needed to name the classes")
        with open(names_path, encoding="utf-8") as f:
            names = dict(line.rstrip("\n").split("\t", 1) for line in f if line.strip())
        shown = [names[str(p)] for p in preds]
    out = args.out or f"{SUBMISSION_NAMES.get(args.task, {}).get(args.subset, args.task)}.tsv"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        f.writelines(f"{i}\t{s}\n" for i, s in zip(ids, shown))
    print(f"{len(ids)} predictions -> {out}", file=sys.stderr)
    if labels is not None:
        from user_dir.common.glue_metrics import glue_score

        print(glue_score(args.task, preds, labels))


if __name__ == "__main__":
    main()
