"""CTranslate2 as a second inference engine: convert a stock fairseq translation checkpoint with
CTranslate2's own fairseq converter, translate a fairseq binarised test set with
``ctranslate2.Translator``, and score it exactly as ``user_dir.tools.measure`` scores fairseq.

``pip install 'fairseq-compress[ct2]'`` (the ``ctranslate2`` package).

* ``convert``: ``ctranslate2.converters.FairseqConverter`` (not reimplemented here) on a stock
  checkpoint: a plug-in student goes through ``fc-export`` first (export.py). The converter reads
  the model's options as an ``argparse.Namespace`` under ``checkpoint["args"]``; fc-export writes
  ``cfg`` as a plain dict (so stock fairseq loads it under ``weights_only``), so the converter gets a
  temporary copy with the Namespace, opened with only ``argparse.Namespace`` allow-listed. Where the
  converter refuses a configuration (unequal encoder/decoder attention heads, encoder and decoder
  pre-/post-norm differing, an activation it lacks, a model it does not know) the error names the
  checkpoint and the converter's reason.
* ``generate``: ``fairseq-generate``'s output format (``S-``, ``T-``, ``H-``, ``D-`` lines; scores in
  base 2) so the two engines' outputs diff line by line; the source tokens are the binarised test
  set's, so no tokenizer or BPE is re-run.
* :func:`measure`: the fields of measure.py's worker result for a CTranslate2 model (same batches:
  fairseq's length-sorted order cut into ``batch_size`` sentences; one warm-up batch excluded;
  hypotheses turned to text by the target dictionary's ``string`` with the same ``post_process``),
  so ``measure.translation_scores`` scores both engines alike. Decoding runs in a fresh process that
  imports only ``ctranslate2`` (this file run as a script), so its peak memory is what a server
  running CTranslate2 needs, without torch or fairseq.

Beam search settings map one to one: ``--beam`` -> ``beam_size``, ``--lenpen`` -> ``length_penalty``,
fairseq's ``max_len_a * src_len + max_len_b`` (src_len counting the end-of-sentence token, the longest
of the batch) -> ``max_decoding_length``, fairseq's ``--min-len`` 1 -> ``min_decoding_length`` 1.

    python -m user_dir.deploy.ct2_engine convert pet_plain.pt --data DATA --out pet_ct2 --quantization int8
    python -m user_dir.deploy.ct2_engine generate pet_ct2 DATA --beam 5 > pet_ct2.out
"""
import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16", "int8_float16",
                 "int8_bfloat16")


class CT2Error(ValueError):
    """A model or input the CTranslate2 path cannot handle; the message says why."""


# ----------------------------------------------------------------------------------------------
# conversion
# ----------------------------------------------------------------------------------------------
def _model_namespace(path: str) -> tuple:
    """(model options as a Namespace, model state) of a fairseq checkpoint, refusing plug-in models."""
    import user_dir  # noqa: F401  (allow-lists fairseq's checkpoint globals: also reads non-exported checkpoints)
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
    from omegaconf import DictConfig, OmegaConf

    from user_dir.deploy.export import _from_plugin

    if not os.path.isfile(path):
        raise CT2Error(f"{path}: no such checkpoint")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    model = state["args"] if state.get("args") is not None else state["cfg"]["model"]
    if isinstance(model, DictConfig):
        model = argparse.Namespace(**OmegaConf.to_container(model, resolve=True))
    arch = getattr(model, "arch", None) or getattr(model, "_name", None)
    if arch in ARCH_MODEL_REGISTRY and _from_plugin(ARCH_MODEL_REGISTRY[arch]):
        raise CT2Error(f"{path}: --arch {arch} is a plug-in model ({ARCH_MODEL_NAME_REGISTRY[arch]}); CTranslate2 "
                       "converts stock fairseq models: run fc-export on it first")
    return model, state["model"]


def convert(path: str, data: str, out: str, quantization: str = "float32", force: bool = True) -> str:
    """Convert the stock fairseq checkpoint ``path`` (dictionaries in ``data``) into the
    CTranslate2 model directory ``out`` with weights in ``quantization``."""
    import torch
    from ctranslate2.converters import FairseqConverter

    if quantization not in QUANTIZATIONS:
        raise CT2Error(f"--quantization {quantization}: expected one of {', '.join(QUANTIZATIONS)}")
    if not os.path.isdir(data):
        raise CT2Error(f"--data {data}: no such directory (the converter reads the dictionaries from it)")
    args, model_state = _model_namespace(path)
    args.user_dir = None
    with tempfile.TemporaryDirectory() as tmp:
        staged = os.path.join(tmp, "model.pt")
        torch.save({"args": args, "cfg": None, "model": model_state}, staged)
        # (torch's safe_globals context removes the names on exit even where they were allowed before)
        allowed = argparse.Namespace in torch.serialization.get_safe_globals()
        try:
            with contextlib.nullcontext() if allowed else torch.serialization.safe_globals([argparse.Namespace]):
                return FairseqConverter(staged, data).convert(out, quantization=quantization, force=force)
        except (ValueError, NotImplementedError) as e:
            raise CT2Error(f"{path}: CTranslate2's fairseq converter refuses this model: {e}") from e


def model_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


# ----------------------------------------------------------------------------------------------
# the test set, batched as measure.py batches it
# ----------------------------------------------------------------------------------------------
def load_batches(data: str, subset: str, batch_size: int, max_sentences: Optional[int] = None):
    """(task, batches): each batch a list of (sentence id, source tokens without </s>, target ids)
    in fairseq's length-sorted order, ``batch_size`` sentences per batch (as measure.py)."""
    import numpy as np
    from fairseq import options, tasks, utils

    parser = options.get_generation_parser(default_task="translation")
    task = tasks.setup_task(options.parse_args_and_arch(parser, [data, "--task", "translation"]))
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    n = len(dataset) if max_sentences is None else min(len(dataset), max_sentences)
    indices = dataset.ordered_indices()
    indices = indices[indices < n]
    indices, _ = dataset.filter_indices_by_size(indices, utils.resolve_max_positions(task.max_positions()))
    batches = dataset.batch_by_size(np.asarray(indices, dtype=np.int64), max_sentences=batch_size)
    src_dict = task.source_dictionary
    out = []
    for batch in batches:
        rows = []
        for i in batch:
            item = dataset[int(i)]
            source = item["source"].tolist()
            if source and source[-1] == src_dict.eos():
                source = source[:-1]  # CTranslate2 appends </s> itself (the converter sets add_source_eos)
            rows.append((int(i), [src_dict[t] for t in source], item["target"]))
        out.append(rows)
    return task, out


def _max_lengths(batches, max_len_a: float, max_len_b: int) -> List[int]:
    """fairseq's ``max_len_a * src_len + max_len_b`` per batch (src_len with </s>, the batch's longest)."""
    return [int(max_len_a * max(len(src) + 1 for _, src, _ in batch) + max_len_b) for batch in batches]


# ----------------------------------------------------------------------------------------------
# decoding in a process that imports only ctranslate2
# ----------------------------------------------------------------------------------------------
def _decode_worker(spec: dict) -> dict:
    import ctranslate2

    translator = ctranslate2.Translator(spec["model"], device=spec["device"], compute_type=spec["compute_type"],
                                        inter_threads=1, intra_threads=spec["threads"])
    options = dict(beam_size=spec["beam"], length_penalty=spec["lenpen"], min_decoding_length=1,
                   return_scores=True, max_batch_size=0)
    batches, max_lengths = spec["batches"], spec["max_lengths"]
    translator.translate_batch(batches[0], max_decoding_length=max_lengths[0], **options)  # warm-up, not timed
    start = time.perf_counter()
    results = [translator.translate_batch(b, max_decoding_length=m, **options) for b, m in zip(batches, max_lengths)]
    elapsed = time.perf_counter() - start
    return {"hypotheses": [[r.hypotheses[0] for r in batch] for batch in results],
            "scores": [[r.scores[0] for r in batch] for batch in results], "seconds": elapsed,
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "ctranslate2": ctranslate2.__version__}


def decode(model_dir: str, batches, max_lengths: List[int], beam: int = 5, lenpen: float = 1.0, threads: int = 0,
           compute_type: str = "default", device: str = "cpu") -> dict:
    """Translate token batches with ``ctranslate2.Translator`` in a fresh process."""
    if not os.path.isfile(os.path.join(model_dir, "model.bin")):
        raise CT2Error(f"{model_dir}: not a CTranslate2 model directory (no model.bin); convert a checkpoint first")
    spec = {"model": os.path.abspath(model_dir), "batches": [[src for _, src, _ in b] for b in batches],
            "max_lengths": max_lengths, "beam": beam, "lenpen": lenpen, "threads": threads,
            "compute_type": compute_type, "device": device}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(dict(spec, out=out_path), f)
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the worker needs ctranslate2 only
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--decode-worker", spec_path],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not os.path.isfile(out_path):
            raise CT2Error(f"CTranslate2 decoding of {model_dir} failed (exit code {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
        with open(out_path) as f:
            return json.load(f)


def measure(spec: dict) -> dict:
    """measure.py's worker result for a CTranslate2 model directory ``spec["path"]``; the spec
    keys are measure.py's (data, subset, beam, lenpen, max_len_a, max_len_b, batch_size,
    post_process, max_sentences, threads) plus ``compute_type`` (default: as converted)."""
    task, batches = load_batches(spec["data"], spec["subset"], spec["batch_size"], spec.get("max_sentences"))
    decoded = decode(spec["path"], batches, _max_lengths(batches, spec["max_len_a"], spec["max_len_b"]),
                     beam=spec["beam"], lenpen=spec["lenpen"], threads=spec.get("threads") or 0,
                     compute_type=spec.get("compute_type") or "default")
    rows = hypotheses_as_text(task, batches, decoded, spec["post_process"])
    rows.sort(key=lambda r: r["id"])
    return {"ids": [r["id"] for r in rows], "outputs": [r["hypothesis"] for r in rows],
            "references": [r["reference"] for r in rows], "scores": [r["score"] for r in rows],
            "seconds": decoded["seconds"], "sentences": len(rows), "tokens": sum(r["tokens"] for r in rows),
            "peak_memory_mb": decoded["peak_memory_mb"], "memory_kind": "peak RSS of the process",
            "device": "cpu", "is_translation": True, "target_lang": task.cfg.target_lang,
            "weights_bytes": os.path.getsize(os.path.join(spec["path"], "model.bin")),
            "checkpoint_bytes": model_bytes(spec["path"]), "engine": f"ctranslate2 {decoded['ctranslate2']}"}


def hypotheses_as_text(task, batches, decoded: dict, post_process: Optional[str]) -> List[dict]:
    """Each hypothesis through the target dictionary's ``string`` (fairseq-generate's and
    measure.py's path): BPE removed by ``post_process``, score in base e as CTranslate2 gives it."""
    import torch

    tgt_dict, src_dict = task.target_dictionary, task.source_dictionary
    rows = []
    for batch, hyps, scores in zip(batches, decoded["hypotheses"], decoded["scores"]):
        for (sid, src, target), hyp, score in zip(batch, hyps, scores):
            ids = torch.tensor([tgt_dict.index(t) for t in hyp] + [tgt_dict.eos()], dtype=torch.int)
            rows.append({
                "id": sid, "tokens": len(hyp) + 1, "score": score,  # tokens counted with </s>, as fairseq's
                "source": src_dict.string(torch.tensor([src_dict.index(t) for t in src], dtype=torch.int),
                                          post_process),
                "hypothesis": tgt_dict.string(ids, post_process, extra_symbols_to_ignore={tgt_dict.eos()}),
                "reference": tgt_dict.string(target.int(), post_process, escape_unk=True,
                                             extra_symbols_to_ignore={tgt_dict.eos()}),
            })
    return rows


def write_generate_format(rows: List[dict], out) -> None:
    """fairseq-generate's lines (S, T, H, D; scores in base 2); with no --tokenizer, D = H."""
    import math

    for r in rows:
        score = r["score"] / math.log(2)
        print(f"S-{r['id']}\t{r['source']}", file=out)
        print(f"T-{r['id']}\t{r['reference']}", file=out)
        print(f"H-{r['id']}\t{score}\t{r['hypothesis']}", file=out)
        print(f"D-{r['id']}\t{score}\t{r['hypothesis']}", file=out)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------
def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="fairseq checkpoint -> CTranslate2 model directory (CTranslate2's converter)")
    c.add_argument("checkpoint", help="a stock fairseq transformer checkpoint (fc-export's output, or a teacher)")
    c.add_argument("--data", required=True, help="the data-bin folder with the dictionaries the model was trained on")
    c.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    c.add_argument("--quantization", default="float32", choices=QUANTIZATIONS,
                   help="weight type of the converted model (default float32; int8 for CPU serving)")
    g = sub.add_parser("generate", help="translate a binarised subset; fairseq-generate's output format")
    g.add_argument("model", help="CTranslate2 model directory")
    g.add_argument("data", help="fairseq data-bin folder")
    g.add_argument("--gen-subset", default="test", help="subset to translate (default: test)")
    g.add_argument("--beam", type=int, default=5, help="beam size (default 5, as fairseq-generate)")
    g.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1, as fairseq)")
    g.add_argument("--max-len-a", type=float, default=0, help="max length = a*src_len + b (fairseq default a=0)")
    g.add_argument("--max-len-b", type=int, default=200, help="max length = a*src_len + b (fairseq default b=200)")
    g.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default 128)")
    g.add_argument("--post-process", "--remove-bpe", dest="post_process", nargs="?", const="subword_nmt",
                   default="subword_nmt", help="subword removal as fairseq's --post-process (default subword_nmt)")
    g.add_argument("--threads", type=int, default=0, help="CTranslate2 intra_threads (0: its default)")
    g.add_argument("--compute-type", default="default", help="CTranslate2 compute_type (default: as converted)")
    p.add_argument("--decode-worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--decode-worker"]:
        with open(argv[1]) as f:
            spec = json.load(f)
        result = _decode_worker(spec)
        with open(spec["out"], "w") as f:
            json.dump(result, f)
        return result
    args = get_parser().parse_args(argv)
    try:
        if args.command == "convert":
            out = convert(args.checkpoint, args.data, args.out, args.quantization)
            print(f"ct2_engine: {args.checkpoint} -> {out} ({args.quantization}, {model_bytes(out) / 2**20:.1f} MB)",
                  file=sys.stderr)
            return out
        task, batches = load_batches(args.data, args.gen_subset, args.batch_size)
        decoded = decode(args.model, batches, _max_lengths(batches, args.max_len_a, args.max_len_b), beam=args.beam,
                         lenpen=args.lenpen, threads=args.threads, compute_type=args.compute_type)
        rows = hypotheses_as_text(task, batches, decoded, args.post_process)
        write_generate_format(rows, sys.stdout)
        n = len(rows)
        print(f"ct2_engine: translated {n:,} sentences in {decoded['seconds']:.1f}s "
              f"({n / decoded['seconds']:.2f} sentences/s, first batch excluded)", file=sys.stderr)
        return rows
    except CT2Error as e:
        raise SystemExit(f"ct2_engine: {e}")


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
