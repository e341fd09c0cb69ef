"""Measure checkpoints side by side: quality, size and speed in one table.

For one or more fairseq checkpoints on one test set, prints and writes (``--out``, Markdown, plus
``--json``) a table with
* quality: tokenised BLEU (sacrebleu ``tokenize=none`` on the BPE-removed output, as
  fairseq-generate's BLEU4) and sacreBLEU on Moses-detokenised output against the raw references
  (``--raw-reference``), for translation; the GLUE metrics (``--glue-task``) for sentence prediction;
* total and non-embedding parameters (shared tensors once) and the compression rate (non-embedding
  parameters in % of the ``--reference`` model, default the first);
* size: the model's weights as ``torch.save`` writes them, and the checkpoint file;
* speed: sentences/s and tokens/s of generation (beam ``--beam``, fixed ``--batch-size``, batches in
  fairseq's length-sorted order), one warm-up batch excluded, median over ``--runs`` runs; the models
  are measured in turn within each run (A B A B ...) so a drifting machine affects all alike;
* peak memory: the worker process's maximum resident set size (CPU) or CUDA peak allocation.

Each measurement runs in its own worker process, so one model's memory does not count to another's: a process
forked from a server process that imported the plug-in once and ran nothing (multiprocessing's forkserver), so a
table of N models pays one import of torch and fairseq beside the command's own, not N.

Two engines (``--engine``, one per ``--path`` or one for all; default ``auto``): a checkpoint file is
measured in fairseq, a CTranslate2 model directory (``model.bin``, made by ``fc-ct2 convert``) in
CTranslate2 (``user_dir/deploy/ct2_engine.py``: the same batches, beam settings and scoring, decoding in
a process that imports only ``ctranslate2``), so both engines sit in one table. A CTranslate2 model has
no parameter count here (its weights are a converted file): those cells read ``-``. scripts/experiments/ladder.py
also times fc-export-onnx's graphs of GLUE classifiers in this worker (user_dir/deploy/export_onnx.py's measure).

    python -m user_dir.tools.measure data-bin/multi30k.de-en --path teacher.pt student.pt \\
        --names teacher student --raw-reference data-bin/multi30k.de-en/text/test.raw.en \\
        --out results/table.md
    python -m user_dir.tools.measure DATA --path teacher.pt work/teacher-ct2-int8 --names fairseq ct2-int8
"""
import argparse
import json
import multiprocessing
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from typing import List, Optional

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository's root


def shown_path(path) -> str:
    """A path as the table, the JSON and the command they record show it: relative to the repository's root when it
    lies inside it (the drivers run their commands from there), otherwise as given -- never this machine's
    absolute folder of the checkout."""
    path = str(path)
    if os.path.isabs(path):
        relative = os.path.relpath(path, CHECKOUT)
        if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
            return relative
    return path


# ----------------------------------------------------------------------------------------------
# worker: one model, one run
# ----------------------------------------------------------------------------------------------
def _time_parts(model, sync) -> dict:
    """Time spent in the model's encoder and decoder forwards, accumulated in the returned dict (``spec["profile"]``:
    the rest of a translation's time is the beam search around them). The forwards are wrapped on the instance, so
    fairseq's generator calls them as before."""
    spent = {"encoder": 0.0, "decoder": 0.0}
    for part in ("encoder", "decoder"):
        module = getattr(model, part)
        forward = module.forward

        def timed(*args, _forward=forward, _part=part, **kwargs):
            sync()
            began = time.perf_counter()
            out = _forward(*args, **kwargs)
            sync()
            spent[_part] += time.perf_counter() - began
            return out
        module.forward = timed
    return spent


def batched_samples(task, model, subset: str, batch_size: int, max_sentences: Optional[int] = None) -> list:
    """The batches a worker times: the examples of ``subset`` with ids below ``max_sentences`` (all by default), in
    fairseq's length-sorted order, ``batch_size`` per batch, those longer than the model takes left out, collated."""
    import numpy as np
    from fairseq import utils

    task.load_dataset(subset)
    dataset = task.dataset(subset)
    n = len(dataset) if max_sentences is None else min(len(dataset), max_sentences)
    indices = dataset.ordered_indices()
    indices = indices[indices < n]
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    indices, _ = dataset.filter_indices_by_size(indices, max_positions)
    batches = dataset.batch_by_size(np.asarray(indices, dtype=np.int64), max_sentences=batch_size)
    return [dataset.collater([dataset[i] for i in batch]) for batch in batches]


def _worker(spec: dict) -> dict:
    if spec.get("engine") == "onnx":  # an exported GLUE classifier on the batches export_onnx.measure made
        from user_dir.deploy.export_onnx import timed_run

        return timed_run(spec)
    import torch

    import user_dir  # noqa: F401  (registers the plug-in and the checkpoint-loading fix)
    from fairseq import checkpoint_utils, utils

    from user_dir.common.counting import count_parameters, state_dict_bytes

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    use_cuda = torch.cuda.is_available() and not spec["cpu"]
    device = torch.device("cuda" if use_cuda else "cpu")
    overrides = {"data": spec["data"]}
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([spec["path"]], arg_overrides=overrides)
    model = models[0]
    counts = count_parameters(model)
    result = {"params": counts.total, "non_embedding_params": counts.non_embedding,
              "weights_bytes": state_dict_bytes(model), "checkpoint_bytes": os.path.getsize(spec["path"])}
    if spec["fp16"]:
        model.half()
    model.to(device)
    model.eval()
    samples = batched_samples(task, model, spec["subset"], spec["batch_size"], spec["max_sentences"])
    samples = [utils.apply_to_sample(lambda t: t.to(device), s) for s in samples]
    is_translation = hasattr(task, "build_generator") and getattr(task, "target_dictionary", None) is not None \
        and not hasattr(task, "label_dictionary")

    def sync():
        if use_cuda:
            torch.cuda.synchronize()

    if is_translation:
        from fairseq.dataclass.configs import GenerationConfig

        gen_cfg = GenerationConfig(beam=spec["beam"], lenpen=spec["lenpen"], max_len_a=spec["max_len_a"],
                                   max_len_b=spec["max_len_b"])
        generator = task.build_generator([model], gen_cfg)

        def step(sample):
            return task.inference_step(generator, [model], sample)
    else:
        head = spec["classification_head"]

        def step(sample):
            logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=head)
            return logits

    spent = _time_parts(model, sync) if spec.get("profile") and is_translation else None
    with torch.no_grad():
        step(samples[0])  # warm-up, not timed
        sync()
        if use_cuda:
            torch.cuda.reset_peak_memory_stats()
        if spent:
            spent.update(encoder=0.0, decoder=0.0)
        outputs, start = [], time.perf_counter()
        for sample in samples:
            outputs.append(step(sample))
        sync()
        elapsed = time.perf_counter() - start
    if spent:  # where the time went: the encoder, the decoder's steps, and the search around them
        result["time_parts"] = {"encoder": spent["encoder"] / elapsed, "decoder": spent["decoder"] / elapsed,
                                "search": max(0.0, 1 - (spent["encoder"] + spent["decoder"]) / elapsed)}

    by_id, n_tokens = {}, 0
    if is_translation:
        tgt_dict = task.target_dictionary
        extra = generator.symbols_to_strip_from_output if hasattr(generator, "symbols_to_strip_from_output") else None
        for sample, hypos in zip(samples, outputs):
            for i, sid in enumerate(sample["id"].tolist()):
                best = hypos[i][0]
                n_tokens += best["tokens"].numel()
                hyp = tgt_dict.string(best["tokens"].int().cpu(), spec["post_process"], extra_symbols_to_ignore=extra)
                ref = tgt_dict.string(utils.strip_pad(sample["target"][i], tgt_dict.pad()).int().cpu(),
                                      spec["post_process"], escape_unk=True, extra_symbols_to_ignore=extra)
                by_id[sid] = (hyp, ref)
    else:
        for sample, logits in zip(samples, outputs):
            if logits.size(-1) == 1:
                preds = logits.view(-1).float().cpu().tolist()
                labels = sample["target"].view(-1).float().cpu().tolist()
            else:
                preds = logits.argmax(-1).cpu().tolist()
                labels = sample["target"].view(-1).cpu().tolist()
            n_tokens += int(sample["ntokens"])
            for sid, p, l in zip(sample["id"].tolist(), preds, labels):
                by_id[sid] = (p, l)
    ids = sorted(by_id)
    result.update({
        "ids": ids, "outputs": [by_id[i][0] for i in ids], "references": [by_id[i][1] for i in ids],
        "seconds": elapsed, "sentences": len(ids), "tokens": n_tokens,
        "peak_memory_mb": (torch.cuda.max_memory_allocated() / 2**20) if use_cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "memory_kind": "CUDA peak allocated" if use_cuda else "peak RSS of the process",
        "device": torch.cuda.get_device_name() if use_cuda else "cpu",
        "threads": torch.get_num_threads(),
        "is_translation": is_translation,
        "target_lang": getattr(getattr(task, "cfg", None), "target_lang", None),
    })
    return result


# ----------------------------------------------------------------------------------------------
# scoring and reporting
# ----------------------------------------------------------------------------------------------
def _reference_lines(path: str, flag: str, ids: List[int]) -> List[str]:
    from preprocess.textio import read_lines

    lines = read_lines(path, allow_empty=True)
    if max(ids) >= len(lines):
        raise SystemExit(f"{flag} {path} has {len(lines)} lines but the test set has "
                         f"sentence id {max(ids)}: it is not this test set's reference")
    return [lines[i] for i in ids]


def detokenise(lines: List[str], lang: Optional[str]) -> List[str]:
    """Moses-detokenised lines, as sacreBLEU is scored here (the outputs fc-measure --outputs-dir keeps are tokenised)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang or "en")
    return [detok.detokenize(line.split()) for line in lines]


def translation_scores(outputs: List[str], references: List[str], ids: List[int], target_lang: str,
                       raw_reference: Optional[str], tokenized_reference: Optional[str] = None) -> dict:
    import sacrebleu

    if tokenized_reference:  # the text itself: no <unk> where a reference word is outside the dictionary
        references = _reference_lines(tokenized_reference, "--tokenized-reference", ids)
    scores = {"bleu_tok": sacrebleu.corpus_bleu(outputs, [references], tokenize="none", force=True).score}
    hyps = detokenise(outputs, target_lang)
    if raw_reference:
        refs = _reference_lines(raw_reference, "--raw-reference", ids)
    else:
        refs = detokenise(references, target_lang)
    scores["sacrebleu"] = sacrebleu.corpus_bleu(hyps, [refs]).score
    return scores


def cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return cpu


def machine_description() -> str:
    cpu = cpu_name()
    import torch

    return (f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}")


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="fairseq data-bin folder holding the test subset")
    p.add_argument("--path", nargs="+", required=True, help="checkpoints to measure")
    p.add_argument("--names", nargs="+", default=None, help="a name per checkpoint (default: file names)")
    p.add_argument("--reference", default=None, help="name of the model compression rates refer to (default: the first)")
    p.add_argument("--gen-subset", default="test", help="subset to score (default: test)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default: 5, as the papers)")
    p.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default: 1)")
    p.add_argument("--max-len-a", type=float, default=0, help="max length = a*src_len + b (fairseq default a=0)")
    p.add_argument("--max-len-b", type=int, default=200, help="max length = a*src_len + b (fairseq default b=200)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per batch, fixed (default: 128)")
    p.add_argument("--post-process", default="subword_nmt",
                   help="subword removal, as fairseq's --post-process: subword_nmt, sentencepiece, none")
    p.add_argument("--raw-reference", default=None,
                   help="untokenised reference file for sacreBLEU (line i = sentence id i); default: detokenised targets")
    p.add_argument("--tokenized-reference", default=None,
                   help="tokenised reference text, one line per test sentence, for BLEU (tok) (default: the "
                        "binarised references, where words outside the dictionary read <unk>)")
    p.add_argument("--glue-task", default=None, help="GLUE task for sentence-prediction checkpoints (metric choice)")
    p.add_argument("--classification-head", default="sentence_classification_head", help="head name (GLUE)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per model; the median is reported (default 3)")
    p.add_argument("--max-sentences", type=int, default=None, help="score only sentence ids below N (quick checks)")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (default: torch's choice)")
    p.add_argument("--cpu", action="store_true", help="measure on the CPU even if CUDA is available")
    p.add_argument("--fp16", action="store_true", help="run the models in half precision")
    p.add_argument("--out", default=None, help="write the Markdown table here")
    p.add_argument("--json", default=None, help="write every figure, per run, as JSON here")
    p.add_argument("--outputs-dir", default=None,
                   help="write each model's per-example outputs (hypotheses, or predictions) to DIR/NAME.txt, one "
                        "line per example in id order, from its first run (what the paired tests resample), and the "
                        "references (GLUE: the labels) to DIR/references.txt")
    p.add_argument("--engine", nargs="+", default=["auto"], choices=ENGINES,
                   help="inference engine, one for all --path or one per path: fairseq (a checkpoint file), "
                        "ctranslate2 (a directory converted by fc-ct2 convert), auto (by what the path is; default)")
    p.add_argument("--ct2-compute-type", default="default",
                   help="CTranslate2 compute_type of the ctranslate2 rows (default: the type the model was "
                        "converted to, e.g. int8 or float32)")
    return p


ENGINES = ("auto", "fairseq", "ctranslate2")


def resolve_engines(paths: List[str], engines: List[str]) -> List[str]:
    """The engine of each path: ``--engine`` given once applies to all; ``auto`` reads a directory
    holding ``model.bin`` as CTranslate2 and a file as a fairseq checkpoint."""
    if len(engines) not in (1, len(paths)):
        raise SystemExit(f"--engine gives {len(engines)} engines for {len(paths)} --path models (give one, or one per path)")
    engines = engines * len(paths) if len(engines) == 1 else engines
    resolved = []
    for path, engine in zip(paths, engines):
        is_ct2 = os.path.isfile(os.path.join(path, "model.bin"))
        if engine == "auto":
            engine = "ctranslate2" if is_ct2 else "fairseq"
        if engine == "ctranslate2" and not is_ct2:
            raise SystemExit(f"--path {path}: --engine ctranslate2 needs a CTranslate2 model directory (with model.bin; "
                             "make one with fc-ct2 convert)")
        if engine == "fairseq" and not os.path.isfile(path):
            raise SystemExit(f"--path {path}: no such checkpoint" + (" (a CTranslate2 model directory: --engine "
                                                                      "ctranslate2 or auto)" if is_ct2 else ""))
        resolved.append(engine)
    return resolved


def _worker_process(spec_path: str) -> None:
    """A worker's body (in a process forked from the server): its output into the spec's log, its result into the
    spec's out file."""
    with open(spec_path) as f:
        spec = json.load(f)
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    result = _worker(spec)
    with open(spec["out"], "w") as f:
        json.dump(result, f)


_WORKERS = None


def _workers():
    """The forkserver start method, its server importing this module (and so torch, fairseq and the plug-in) once,
    before any model is loaded: each worker is a fork of that clean process."""
    global _WORKERS
    if _WORKERS is None:
        _WORKERS = multiprocessing.get_context("forkserver")
        _WORKERS.set_forkserver_preload([__spec__.name if __spec__ else "user_dir.tools.measure"])
    return _WORKERS


def _run_worker(spec: dict) -> dict:
    if spec.get("engine") == "ctranslate2":  # ct2_engine decodes in its own fresh process
        from user_dir.deploy.ct2_engine import CT2Error, measure

        try:
            return dict(measure(spec), params=None, non_embedding_params=None)
        except CT2Error as e:
            raise SystemExit(f"measuring {spec['path']}: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path, log_path = (os.path.join(tmp, name) for name in ("spec.json", "out.json", "worker.log"))
        with open(spec_path, "w") as f:
            json.dump(dict(spec, out=out_path, log=log_path), f)
        process = _workers().Process(target=_worker_process, args=(spec_path,))
        process.start()
        process.join()
        if process.exitcode != 0 or not os.path.isfile(out_path):
            if os.path.isfile(log_path):
                with open(log_path, errors="replace") as f:
                    sys.stderr.write(f.read()[-4000:])
            raise SystemExit(f"measuring {spec['path']} failed (exit code {process.exitcode}); its error is above")
        with open(out_path) as f:
            return json.load(f)


def main(argv=None) -> List[dict]:
    args = get_parser().parse_args(argv)
    names = args.names or [os.path.splitext(os.path.basename(p))[0] for p in args.path]
    if len(names) != len(args.path):
        raise SystemExit(f"--names gives {len(names)} names for {len(args.path)} --path checkpoints")
    if len(set(names)) != len(names):
        raise SystemExit(f"--names must be distinct: {names}")
    engines = resolve_engines(args.path, args.engine)
    if "ctranslate2" in engines:
        if args.glue_task:
            raise SystemExit("--engine ctranslate2 measures translation models; --glue-task models run in fairseq")
        if args.fp16:
            raise SystemExit("--fp16 applies to fairseq rows; a CTranslate2 model's type is --ct2-compute-type "
                             "(e.g. float16 on a GPU)")
    if not os.path.isdir(args.data):
        raise SystemExit(f"data folder {args.data}: no such directory")
    for flag, path in (("--raw-reference", args.raw_reference), ("--tokenized-reference", args.tokenized_reference)):
        if path and not os.path.isfile(path):
            raise SystemExit(f"{flag} {path}: no such file")
    reference = args.reference or names[0]
    if reference not in names:
        raise SystemExit(f"--reference {reference} is not one of --names {names}")
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")

    runs = {name: [] for name in names}
    for r in range(args.runs):
        for name, path, engine in zip(names, args.path, engines):
            print(f"[measure] run {r + 1}/{args.runs}: {name}", file=sys.stderr, flush=True)
            spec = {"path": os.path.abspath(path), "data": os.path.abspath(args.data), "subset": args.gen_subset,
                    "beam": args.beam, "lenpen": args.lenpen, "max_len_a": args.max_len_a,
                    "max_len_b": args.max_len_b, "batch_size": args.batch_size, "post_process": args.post_process,
                    "classification_head": args.classification_head, "max_sentences": args.max_sentences,
                    "threads": args.threads, "cpu": args.cpu, "fp16": args.fp16, "engine": engine,
                    "compute_type": args.ct2_compute_type}
            runs[name].append(_run_worker(spec))

    rows = []
    for name in names:
        first = runs[name][0]
        if first["is_translation"]:
            quality = translation_scores(first["outputs"], first["references"], first["ids"],
                                         first["target_lang"], args.raw_reference,
                                         args.tokenized_reference)
        else:
            from user_dir.common.glue_metrics import glue_score

            if not args.glue_task:
                raise SystemExit("--glue-task is required for sentence-prediction checkpoints")
            quality = glue_score(args.glue_task, first["outputs"], first["references"])
        rows.append({
            "name": name, "path": shown_path(args.path[names.index(name)]), "engine": engines[names.index(name)],
            **quality,
            "params": first["params"], "non_embedding_params": first["non_embedding_params"],
            "weights_mb": first["weights_bytes"] / 2**20, "checkpoint_mb": first["checkpoint_bytes"] / 2**20,
            "sentences": first["sentences"],
            "sentences_per_s": statistics.median(r["sentences"] / r["seconds"] for r in runs[name]),
            "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in runs[name]),
            "sentences_per_s_runs": [r["sentences"] / r["seconds"] for r in runs[name]],
            "peak_memory_mb": statistics.median(r["peak_memory_mb"] for r in runs[name]),
            "memory_kind": first["memory_kind"], "device": first["device"], "threads": first.get("threads"),
            "outputs_identical_across_runs": all(r["outputs"] == first["outputs"] for r in runs[name]),
        })
    ref = next(r for r in rows if r["name"] == reference)
    for row in rows:
        row["compression_rate"] = (None if row["non_embedding_params"] is None or ref["non_embedding_params"] is None
                                   else 100.0 * row["non_embedding_params"] / ref["non_embedding_params"])
        row["speedup"] = row["sentences_per_s"] / ref["sentences_per_s"]

    if args.outputs_dir:
        os.makedirs(args.outputs_dir, exist_ok=True)
        for name in names:
            with open(os.path.join(args.outputs_dir, name + ".txt"), "w") as f:
                f.writelines(f"{output}\n" for output in runs[name][0]["outputs"])
        with open(os.path.join(args.outputs_dir, "references.txt"), "w") as f:  # the labels, or tokenised references
            f.writelines(f"{reference}\n" for reference in runs[names[0]][0]["references"])
    table = format_table(rows, args, reference)
    print(table)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": _command(), "machine": machine_description(), "cpu": cpu_name(),
                       "date": time.strftime("%Y-%m-%d"),
                       "rows": rows}, f, indent=1)
    return rows


def _command() -> str:
    return "python -m user_dir.tools.measure " + " ".join(shlex.quote(shown_path(a)) for a in sys.argv[1:])


def format_table(rows: List[dict], args, reference: str) -> str:
    translation = "bleu_tok" in rows[0]
    metric_cols = ["BLEU (tok)", "sacreBLEU"] if translation else [m for m in rows[0] if m in
                                                                    ("accuracy", "f1", "mcc", "pearson", "spearman")]
    engines = sorted({r.get("engine", "fairseq") for r in rows})
    head = (["model"] + (["engine"] if engines != ["fairseq"] else []) + metric_cols + ["params", "non-emb params", f"compression vs {reference}", "weights MB",
                                       "checkpoint MB", "sent/s", "tok/s", "speed-up", "peak MB"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def counted(value, form):  # a CTranslate2 row has no parameter count
        return "-" if value is None else format(value, form)

    for r in rows:
        metrics = [r["bleu_tok"], r["sacrebleu"]] if translation else [r[m] for m in metric_cols]
        cells = ([r["name"]] + ([r.get("engine", "fairseq")] if engines != ["fairseq"] else []) +
                 [f"{m:.2f}" for m in metrics] +
                 [counted(r["params"], ","), counted(r["non_embedding_params"], ","),
                  counted(r["compression_rate"], ".2f") + ("%" if r["compression_rate"] is not None else ""),
                  f"{r['weights_mb']:.1f}", f"{r['checkpoint_mb']:.1f}", f"{r['sentences_per_s']:.1f}",
                  f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x", f"{r['peak_memory_mb']:.0f}"])
        lines.append("| " + " | ".join(cells) + " |")
    what = f"beam {args.beam}" if translation else "forward pass"
    notes = [
        "",
        f"Subset `{args.gen_subset}` of `{shown_path(args.data)}`, {rows[0]['sentences']} sentences, {what}, batch "
        f"{args.batch_size} sentences; speed is the median of {args.runs} runs (one warm-up batch excluded), "
        f"models measured in turn within each run; peak MB is the {rows[0]['memory_kind']}.",
        "Parameters count each shared tensor once; non-embedding excludes token/position embeddings and the "
        "vocabulary projection. Weights MB: the state dict as torch.save writes it.",
    ]
    if "ctranslate2" in engines:
        notes.append("CTranslate2 rows: the converted model directory (weights MB: model.bin; checkpoint MB: the "
                     f"directory), compute type `{args.ct2_compute_type}`, decoded in a process importing only "
                     "ctranslate2 (peak MB is that process's), threads = CTranslate2 intra_threads; parameters are "
                     "not counted (-).")
    if translation:
        notes.append("BLEU (tok): sacrebleu `tokenize=none` on the tokenised, BPE-removed output (fairseq-generate's "
                     "BLEU4) against " + (f"`{shown_path(args.tokenized_reference)}`" if args.tokenized_reference else
                                          "the binarised references") + "; sacreBLEU: Moses-detokenised output against "
                     + (f"`{shown_path(args.raw_reference)}`." if args.raw_reference else "the detokenised references."))
    if not all(r["outputs_identical_across_runs"] for r in rows):
        notes.append("WARNING: some model's outputs differed between runs.")
    threads = sorted({r.get("threads") for r in rows if r.get("threads")})
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    notes += ["", f"Machine: {machine_description()}; device: {rows[0]['device']}"
              + (f"; {'/'.join(map(str, threads))} torch thread(s) per fairseq worker" if threads else "")
              + (f"; load average (1, 5, 15 min) at the end: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}" if load else "")
              + ".",
              f"Date: {time.strftime('%Y-%m-%d')}.", "", "Command:", "```", _command(), "```", ""]
    return "\n".join(lines + notes)


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
