"""``fc-export-onnx CKPT --out DIR``: a fine-tuned GLUE encoder as an ONNX model that ONNX Runtime runs on
the exported BERT tokenizer's ``input_ids`` and ``attention_mask``, plus its int8 dynamic quantization.

    fc-export-onnx work/ghost/.../checkpoint_best.pt --out deploy/ghost-onnx
    # -> DIR/model.onnx, DIR/model.int8.onnx, tokenizer.json, tokenizer_config.json, export.json

    import onnxruntime, transformers
    tok = transformers.AutoTokenizer.from_pretrained(DIR)
    session = onnxruntime.InferenceSession(f"{DIR}/model.onnx", providers=["CPUExecutionProvider"])
    logits = session.run(None, dict(tok(a, b, truncation=True, return_tensors="np",
                                        return_token_type_ids=False)))[0]

The graph is the fairseq model itself, traced by torch.onnx's TorchScript exporter (``dynamo=False``:
fairseq's encoder branches on Python values, e.g. whether a batch has padding, which the dynamo
exporter cannot trace; the trace is made on a padded batch, so the padding path is the one recorded,
and it is exact for unpadded input too, checked below), behind a lookup from BERT's token ids to the
fairseq dictionary's (user_dir/deploy/export_hf.py's vocabulary map). So it holds what the checkpoint
computes, whatever transformers can express: pruned heads at their count, per-layer FFN widths,
GhostBERT's ghost convolutions (eval form, ghost_module.py), APC-finalized layers of any width
(embedding compression included), mean-pooling heads.

Verified before DIR is written: ONNX Runtime (CPU) on the first ``--check-examples`` valid examples,
from raw text through the exported tokenizer (ids equal to prepare_glue.py's), as one padded batch
and the first few one by one (unpadded), equals fairseq's logits within ``--atol`` (1e-4); otherwise
nothing is written. The int8 model (onnxruntime.quantization.quantize_dynamic: int8 weights of the
matrix products, activations quantized per batch at run time) is not expected to be equal. It is scored
against the float32 model on the first ``--int8-check-examples`` (1000) valid examples with their gold labels:
the task metric of each (accuracy for classes; Pearson's r for a regression head, in percent, as
user_dir/common/glue_metrics.py scores GLUE) and the drop in points; how the predictions differ (the share of
equal predicted classes; for regression the mean and largest absolute difference and Pearson's r between the
two models' scores). All of it goes into export.json's ``int8``; a drop above ``--int8-max-drop`` (1.0 point)
refuses the export (nothing written), or with ``--int8-warn-only`` writes it with a warning. The drop is
measured, so it is noisy: with 5% of 1000 predictions changed by int8, its standard deviation is about 0.7 points
(results/archive/deploy_glue.md: int8 changed 3-6.5% of the dev predictions of MiniLM-L6 teachers and students, and
lost -0.7 to 2.2 points of accuracy).

Measured (:func:`measure`, scripts/experiments/ladder.py's GLUE engines): the graph on fc-measure's batches of a
subset, in fc-measure's worker process (user_dir/tools/measure.py), with the exported tokenizer first checked on the
raw text of every example of the subset (:func:`subset_checked`).

Refused: Variator models, data not tokenised with WordPiece, RoBERTa-style pairs (as fc-export-hf),
and GhostBERT's Conv1D_F (its channels are the batch's token positions: the length of the longest
sentence becomes a Python number while tracing).
"""
import argparse
import functools
import os
import resource
import sys
import time
from typing import List, Optional, Sequence

import torch
import torch.nn as nn

from user_dir.deploy.export_hf import (HEAD, ExportHFError, check_bert_layout, check_examples, fairseq_logits,
                                      hf_tokenizer, label_names, load_classifier, prepared_settings, read_vocab,
                                      staged_directory, vocabulary_map, wordpiece, write_summary)

OPSET = 17  # LayerNormalization is an ONNX operator from opset 17 on


class BertIdsClassifier(nn.Module):
    """The fairseq classifier reading BERT's token ids (the exported tokenizer's) and attention mask:
    ids mapped to the fairseq dictionary's, masked positions set to fairseq's padding index."""

    def __init__(self, model: nn.Module, to_fairseq: torch.Tensor, pad: int, head: str):
        super().__init__()
        self.model, self.pad, self.head = model, pad, head
        self.register_buffer("to_fairseq", to_fairseq.clone())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        src = self.to_fairseq[input_ids].masked_fill(attention_mask.eq(0), self.pad)
        logits, _ = self.model(src, features_only=True, classification_head_name=self.head)
        return logits


def check_traceable(model: nn.Module) -> None:
    from user_dir.ghost.ghost_module import GhostConv

    for name, module in model.named_modules():
        if isinstance(module, GhostConv) and module.cfg.conv == "conv1d_f":
            raise ExportHFError(f"{name}: --ghost-conv conv1d_f: its channels are the batch's token positions (the "
                                "longest sentence's length is a Python number while tracing), so one ONNX graph "
                                "cannot serve every length; dwconv, conv1d_s and conv2d export")


def session(path: str, threads: int = 1):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads (and one inter-op thread)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def run_session(sess, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    feed = {"input_ids": input_ids.numpy().astype("int64"), "attention_mask": attention_mask.numpy().astype("int64")}
    return torch.from_numpy(sess.run(None, feed)[0]).float()


def quantize_int8(fp32: str, int8: str) -> None:
    """ONNX Runtime's dynamic int8 quantization (weights int8, activations quantized at run time)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the quantizer logs a line per tensor at INFO
    try:
        quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def gold_labels(data: str, task, n: int, regression: bool, subset: str = "valid") -> List:
    """The first ``n`` gold labels of ``subset`` as fairseq's sentence_prediction reads them: class indices (the
    binarised label less the label dictionary's specials) or, for regression, the floats of ``label/SUBSET.label``."""
    from fairseq.data import data_utils

    prefix = os.path.join(data, "label", subset)
    if regression:
        if not os.path.isfile(prefix + ".label"):
            raise ExportHFError(f"--data {data}: no {prefix}.label (the {subset} split's scores) to score the int8 "
                                "model on; --no-int8 exports without it")
        with open(prefix + ".label", encoding="utf-8") as f:
            return [float(line.split()[0]) for _, line in zip(range(n), f)]
    labels = data_utils.load_indexed_dataset(prefix, task.label_dictionary)
    if labels is None:
        raise ExportHFError(f"--data {data}: no {prefix}.bin (the {subset} split's labels) to score the int8 model "
                            "on; --no-int8 exports without it")
    return [int(labels[i][0]) - task.label_dictionary.nspecial for i in range(min(n, len(labels)))]


def int8_loss(reference: torch.Tensor, int8: torch.Tensor, labels: Sequence, regression: bool) -> dict:
    """What the int8 model loses against float32 (``reference``: fairseq's logits) on examples with gold ``labels``:
    the task metric of each (accuracy, or Pearson's r for a regression head; percent, glue_metrics.py) and the drop
    in points, and how the predictions differ: the share of equal predicted classes or, for regression, Pearson's r
    between the two models' scores (also in percent) beside the mean and largest absolute logit difference."""
    from user_dir.common.glue_metrics import accuracy, pearson

    diff = (int8 - reference).abs()
    out = {"examples": len(labels), "max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item()}
    if regression:
        ours, theirs = reference[:, 0].tolist(), int8[:, 0].tolist()
        out.update(metric="pearson", fp32=pearson(ours, labels), int8=pearson(theirs, labels),
                   prediction_pearson=pearson(theirs, ours))
    else:
        ours, theirs = reference.argmax(-1), int8.argmax(-1)
        out.update(metric="accuracy", fp32=accuracy(ours.tolist(), labels), int8=accuracy(theirs.tolist(), labels),
                   prediction_agreement=ours.eq(theirs).double().mean().item())
    out["drop"] = out["fp32"] - out["int8"]
    return out


def in_batches(function, ids: torch.Tensor, mask: torch.Tensor, size: int = 32) -> torch.Tensor:
    """``function(ids, mask)`` on batches of ``size`` examples, each cut to its longest example (right padding)."""
    outputs = []
    for i in range(0, ids.size(0), size):
        width = int(mask[i: i + size].sum(1).max())
        outputs.append(function(ids[i: i + size, :width], mask[i: i + size, :width]))
    return torch.cat(outputs)


def export_onnx(path: str, out: str, data: Optional[str] = None, head: str = HEAD, int8: bool = True,
                atol: float = 1e-4, n_check: int = 64, opset: int = OPSET, int8_max_drop: float = 1.0,
                int8_warn_only: bool = False, int8_examples: int = 1000) -> dict:
    """Write ``path``'s classifier as DIR/model.onnx (+ model.int8.onnx) with its tokenizer; returns the summary.
    The int8 model is refused (ExportHFError, nothing written) when it loses more than ``int8_max_drop`` points of
    the task metric on ``int8_examples`` valid examples, unless ``int8_warn_only``."""
    import onnx

    if int8 and not int8_max_drop >= 0:
        raise ExportHFError(f"--int8-max-drop {int8_max_drop}: the points of the task metric int8 may lose, >= 0")
    if int8 and int8_examples < 1:
        raise ExportHFError(f"--int8-check-examples {int8_examples}: at least 1")
    model, cfg, task, data = load_classifier(path, data)
    settings = prepared_settings(data)
    check_bert_layout(task, path)
    if head not in model.classification_heads:
        raise ExportHFError(f"--head {head}: the model has the heads {sorted(model.classification_heads)}")
    check_traceable(model)
    to_fairseq = vocabulary_map(task.source_dictionary, read_vocab(settings), wordpiece(settings).fairseq_specials)
    num_outputs = model.classification_heads[head].out_proj.out_features
    id2label, regression = label_names(task, data, num_outputs)
    tokenizer = hf_tokenizer(settings)
    batch, from_text = check_examples(data, task, settings, tokenizer, to_fairseq, n_check)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if bool(mask.all()):
        raise ExportHFError(f"--check-examples {n_check}: the examples are all of one length; the trace needs a padded "
                            "batch (give more examples)")
    pad = task.source_dictionary.pad()
    reference = fairseq_logits(model, ids, mask, to_fairseq, pad, head)
    alone = min(4, ids.size(0))
    lengths = mask.sum(1).tolist()
    reference_alone = [fairseq_logits(model, ids[i: i + 1, : lengths[i]], mask[i: i + 1, : lengths[i]], to_fairseq,
                                      pad, head) for i in range(alone)]

    wrapper = BertIdsClassifier(model, to_fairseq, pad, head).eval()
    if hasattr(model, "prepare_for_onnx_export_"):
        model.prepare_for_onnx_export_()  # fairseq's own switch: the traceable code paths
    with staged_directory(out, ".fc-export-onnx-") as staging:
        fp32 = os.path.join(staging, "model.onnx")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values (see the module docstring)
            torch.onnx.export(wrapper, (ids, mask), fp32, dynamo=False, opset_version=opset,
                              input_names=["input_ids", "attention_mask"], output_names=["logits"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                            "attention_mask": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}})
        onnx.checker.check_model(fp32)
        sess = session(fp32)
        diffs = [(run_session(sess, ids, mask) - reference).abs().max().item()]
        diffs += [(run_session(sess, ids[i: i + 1, : lengths[i]], mask[i: i + 1, : lengths[i]]) - r).abs().max().item()
                  for i, r in enumerate(reference_alone)]
        diff = max(diffs)
        if not diff <= atol:
            raise ExportHFError(f"{path}: ONNX Runtime's logits differ from fairseq's by {diff:.3g} (> --atol {atol}); "
                                "nothing written")
        summary = {"checkpoint": os.path.abspath(path), "data": os.path.abspath(data), "head": head,
                   "arch": cfg.model.arch, "labels": {str(k): v for k, v in id2label.items()}, "regression": regression,
                   "max_length": settings.get("max_length"), "inputs": ["input_ids", "attention_mask"],
                   "outputs": ["logits"], "opset": opset, "checked_examples": int(ids.size(0)),
                   "checked_alone": alone, "checked_from_raw_text": from_text, "max_abs_diff": diff, "atol": atol,
                   "bytes": os.path.getsize(fp32)}
        if int8:
            q8 = os.path.join(staging, "model.int8.onnx")
            quantize_int8(fp32, q8)
            labels = gold_labels(data, task, int8_examples, regression)
            scored, _ = check_examples(data, task, settings, tokenizer, to_fairseq, len(labels))
            ids8, mask8 = scored["input_ids"], scored["attention_mask"]
            sess8 = session(q8, threads=torch.get_num_threads())
            loss = int8_loss(in_batches(lambda i, m: fairseq_logits(model, i, m, to_fairseq, pad, head), ids8, mask8),
                             in_batches(lambda i, m: run_session(sess8, i, m), ids8, mask8), labels, regression)
            loss.update(max_drop=int8_max_drop, within_bound=loss["drop"] <= int8_max_drop)
            summary["int8"] = {"file": "model.int8.onnx", "bytes": os.path.getsize(q8), **loss}
            if not loss["within_bound"]:
                message = (f"the int8 model's {loss['metric']} is {loss['int8']:.2f} against float32's "
                           f"{loss['fp32']:.2f} on the first {loss['examples']} valid examples: {loss['drop']:.2f} "
                           f"points lost, more than --int8-max-drop {int8_max_drop:g}")
                if not int8_warn_only:
                    raise ExportHFError(f"{path}: {message}; nothing written (--no-int8 exports float32 alone, "
                                        "--int8-warn-only writes it anyway, --int8-max-drop sets the bound)")
                print(f"fc-export-onnx: warning: {message} (written: --int8-warn-only)", file=sys.stderr)
        tokenizer.save_pretrained(staging)
        write_summary(staging, summary)
    return summary


# ----------------------------------------------------------------------------------------------
# measured as fc-measure measures a fairseq classifier
# ----------------------------------------------------------------------------------------------
def _bert_ids(path: str, data: str):
    """(model, task, prepare_glue.py's settings, the map from BERT's ids to the dictionary's) of the checkpoint."""
    model, _, task, data = load_classifier(path, data)
    settings = prepared_settings(data)
    return model, task, settings, vocabulary_map(task.source_dictionary, read_vocab(settings),
                                                 wordpiece(settings).fairseq_specials)


@functools.lru_cache(maxsize=16)
def subset_checked(path: str, data: str, subset: str) -> int:
    """The number of examples of ``subset`` whose raw text the exported tokenizer encodes as prepare_glue.py
    binarised it for the checkpoint ``path``: all of them, or ExportHFError naming the first that differs."""
    from fairseq.data import data_utils

    _, task, settings, to_fairseq = _bert_ids(path, data)
    column = data_utils.load_indexed_dataset(os.path.join(data, "input0", subset), task.source_dictionary)
    if column is None:
        raise ExportHFError(f"--data {data}: no {subset} split")
    check_examples(data, task, settings, hf_tokenizer(settings), to_fairseq, len(column), subset)
    return len(column)


@functools.lru_cache(maxsize=16)
def measured_batches(path: str, data: str, subset: str, batch_size: int, max_sentences: Optional[int] = None):
    """fc-measure's batches of ``subset`` for the checkpoint ``path`` (measure.batched_samples: the examples, order and
    sizes its fairseq worker times) as the exported graph reads them: BERT's ids and the attention mask, with each
    example's id and label."""
    from user_dir.tools.measure import batched_samples

    model, task, _, to_fairseq = _bert_ids(path, data)
    to_bert = torch.empty(len(to_fairseq), dtype=torch.long)
    to_bert[to_fairseq] = torch.arange(len(to_fairseq))
    out = []
    for sample in batched_samples(task, model, subset, batch_size, max_sentences):
        src = sample["net_input"]["src_tokens"]
        out.append({"ids": sample["id"].tolist(), "input_ids": to_bert[src].tolist(),
                    "attention_mask": src.ne(task.source_dictionary.pad()).long().tolist(),
                    "labels": sample["target"].view(-1).tolist()})
    return out


def measure(spec: dict) -> dict:
    """fc-measure's worker result (user_dir/tools/measure.py) for ``spec["path"]``, a graph this module exported
    (model.onnx or model.int8.onnx) from the checkpoint ``spec["checkpoint"]``: the batches of :func:`measured_batches`
    (spec's data, subset, batch_size, max_sentences), run in a worker process by :func:`timed_run`."""
    from user_dir.tools import measure as fc_measure

    batches = measured_batches(spec["checkpoint"], spec["data"], spec["subset"], spec["batch_size"],
                               spec.get("max_sentences"))
    return fc_measure._run_worker(dict(spec, engine="onnx", batches=batches))


def timed_run(spec: dict) -> dict:
    """In the worker: a fresh ONNX Runtime session of ``spec["threads"]`` intra-op threads runs ``spec["batches"]``,
    the first once untimed; the predicted classes (a regression head: scores) and labels by example id, as fc-measure's
    fairseq worker returns them."""
    import numpy as np

    sess = session(spec["path"], spec.get("threads") or 0)
    feeds = [{k: np.asarray(b[k], dtype=np.int64) for k in ("input_ids", "attention_mask")} for b in spec["batches"]]
    sess.run(None, feeds[0])  # warm-up, not timed
    start = time.perf_counter()
    logits = [sess.run(None, feed)[0] for feed in feeds]
    elapsed = time.perf_counter() - start
    by_id = {}
    for batch, out in zip(spec["batches"], logits):
        predictions = out[:, 0].tolist() if out.shape[-1] == 1 else out.argmax(-1).tolist()
        by_id.update((i, (p, label)) for i, p, label in zip(batch["ids"], predictions, batch["labels"]))
    ids = sorted(by_id)
    size = os.path.getsize(spec["path"])
    return {"ids": ids, "outputs": [by_id[i][0] for i in ids], "references": [by_id[i][1] for i in ids],
            "seconds": elapsed, "sentences": len(ids), "tokens": int(sum(f["attention_mask"].sum() for f in feeds)),
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "memory_kind": "peak RSS of the process", "device": "cpu", "threads": spec.get("threads"),
            "is_translation": False, "params": None, "non_embedding_params": None, "weights_bytes": size,
            "checkpoint_bytes": size}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fc-export-onnx", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a fine-tuned sentence_prediction checkpoint (hf_bert, ghost_hf_bert, apc_hf_bert)")
    p.add_argument("--out", required=True, help="the folder to write (model.onnx, model.int8.onnx, tokenizer, "
                                                "export.json; replaced if it exists)")
    p.add_argument("--data", default=None, help="the GLUE data-bin the model was trained on (default: the "
                                                 "checkpoint's own --data)")
    p.add_argument("--head", default=HEAD, help=f"the classification head to export (default {HEAD})")
    p.add_argument("--no-int8", action="store_true", help="do not write the int8 dynamically quantized model")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="largest logit difference to fairseq accepted by the check (default 1e-4)")
    p.add_argument("--check-examples", type=int, default=64,
                   help="valid examples the check runs, from raw text through the exported tokenizer (default 64)")
    p.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET}: LayerNormalization)")
    p.add_argument("--int8-max-drop", type=float, default=1.0,
                   help="points of the task metric (accuracy; Pearson's r x 100 for regression) the int8 model may "
                        "lose against float32 on the int8 check examples before the export is refused (default 1.0: "
                        "no paper sets it; int8 lost -0.7 to 2.2 points on MiniLM-L6 GLUE dev sets, "
                        "results/archive/deploy_glue.md)")
    p.add_argument("--int8-warn-only", action="store_true",
                   help="write the int8 model with a warning when it loses more than --int8-max-drop")
    p.add_argument("--int8-check-examples", type=int, default=1000,
                   help="valid examples (with their gold labels) the int8 model is scored on against float32 "
                        "(default 1000: all of RTE's, MRPC's and SST-2's dev examples; the drop's standard deviation "
                        "is then about 0.7 points where int8 changes 5%% of the predictions)")
    return p


def main(argv=None) -> dict:
    args = get_parser().parse_args(argv)
    try:
        summary = export_onnx(args.checkpoint, args.out, args.data, args.head, not args.no_int8, args.atol,
                              args.check_examples, args.opset, args.int8_max_drop, args.int8_warn_only,
                              args.int8_check_examples)
    except ExportHFError as e:
        raise SystemExit(f"fc-export-onnx: {e}")
    line = (f"fc-export-onnx: {summary['arch']} -> {args.out}/model.onnx ({summary['bytes'] / 2**20:.1f} MB); ONNX "
            f"Runtime equals fairseq's logits to {summary['max_abs_diff']:.1e} on {summary['checked_examples']} valid "
            "examples")
    if "int8" in summary:
        q = summary["int8"]
        same = (f"scores' Pearson r with float32 {q['prediction_pearson']:.2f}%" if summary["regression"] else
                f"predictions agree on {100 * q['prediction_agreement']:.1f}%")
        line += (f"; int8: {q['bytes'] / 2**20:.1f} MB, logits within {q['max_abs_diff']:.2g}, {same} of "
                 f"{q['examples']} valid examples, {q['metric']} {q['int8']:.2f} against {q['fp32']:.2f} (drop "
                 f"{q['drop']:.2f}, bound {q['max_drop']:g})")
    print(line, file=sys.stderr)
    return summary


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
