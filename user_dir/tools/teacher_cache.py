"""Build a teacher cache for word-level KD: the teacher's output log-probabilities on a data subset.

    python -m user_dir.tools.teacher_cache DATA --path TEACHER --dest DIR [--subset train] [--max-tokens 4096]
        [--cpu | --fp16] [--source-lang de --target-lang en] [--overwrite]
    fairseq-train DATA ... --criterion kd --teacher-path TEACHER --teacher-cache DIR

The teacher (eval mode: no dropout) runs with teacher forcing over every example of ``--subset``, loaded as
fairseq-train loads its training subset (the translation task, shards combined), in length-sorted batches of
``--max-tokens``; per target token it stores ``log_softmax`` of its logits at T = 1 in float16, which serves KD at
every ``--kd-temperature`` (log-probabilities differ from the logits by a constant per position, which a softmax
ignores; why not the logits: user_dir/common/teacher_cache.py). The folder's format and the checks that refuse a
stale cache are described there too. Multi30k's training set (433,677 target tokens x 7,896 types) takes 6.85 GB,
built in 2 min 14 s on one shared CPU thread (--max-tokens 4096).

Atomic and resumable: rows go to ``logprobs.npy.partial`` and a progress file records the finished examples (written
after the rows are flushed, every ``--save-interval`` seconds); an interrupted build resumes where it stopped when
run again with the same teacher and data; ``header.json`` is written last, by renaming, so a reader never sees an
unfinished cache. A finished cache of the same teacher and data is left alone; one of another teacher or data is
refused unless ``--overwrite``. ``--fp16`` runs the teacher in float16 on a GPU (as an online teacher of an
``--fp16`` student runs); otherwise it runs in float32, on the GPU when there is one, unless ``--cpu``.
"""
import argparse
import json
import logging
import os
import shutil
import sys
import time

import numpy as np

logger = logging.getLogger("user_dir.tools.teacher_cache")


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="fairseq data-bin folder (binarised with the teacher's dictionaries)")
    p.add_argument("--path", required=True, help="the teacher's fairseq checkpoint (the --teacher-path of KD)")
    p.add_argument("--dest", required=True, help="folder of the cache (created; the --teacher-cache of KD)")
    p.add_argument("--subset", default="train", help="data subset to run the teacher on (default: train, "
                                                      "fairseq-train's --train-subset)")
    p.add_argument("--source-lang", default=None, help="source language (default: read off the data's file names)")
    p.add_argument("--target-lang", default=None, help="target language (default: read off the data's file names)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per teacher batch (default 4096); any value "
                                                                "gives the same cache up to float rounding")
    device = p.add_mutually_exclusive_group()
    device.add_argument("--cpu", action="store_true", help="run the teacher on the CPU even if a GPU is present")
    device.add_argument("--fp16", action="store_true", help="run the teacher in float16 (needs a GPU)")
    p.add_argument("--save-interval", type=float, default=60.0,
                   help="seconds between progress records of a build (what a resumed build skips; default 60)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished cache of another teacher or data")
    return p


def load_task(args):
    """fairseq's translation task on ``args.data``, set up as fairseq-train sets it up from these flags."""
    from fairseq import options, tasks

    from user_dir import PLUGIN_DIR

    flags = [args.data, "--task", "translation", "--user-dir", PLUGIN_DIR, "--train-subset", args.subset]
    for flag, value in (("--source-lang", args.source_lang), ("--target-lang", args.target_lang)):
        if value:
            flags += [flag, value]
    parser = options.get_generation_parser(default_task="translation")
    return tasks.setup_task(options.parse_args_and_arch(parser, flags))


def _write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def build(args) -> dict:
    import torch
    import torch.nn.functional as F
    from fairseq import utils

    from user_dir.common.teacher import load_frozen_teacher
    from user_dir.common.teacher_cache import (DTYPE, HEADER, INDEX, LOGPROBS, OFFSET, SRC_LEN, TGT_LEN,
                                               fingerprint, mismatches, target_checksums, task_data)

    use_cuda = torch.cuda.is_available() and not args.cpu
    if args.fp16 and not use_cuda:
        raise SystemExit("--fp16: needs a GPU (none is visible); build in float32 without --fp16")
    device = torch.device("cuda" if use_cuda else "cpu")
    task = load_task(args)
    data_dir, split, src, tgt = task_data(task, "DATA")
    dest = args.dest
    os.makedirs(dest, exist_ok=True)
    expected = fingerprint(args.path, data_dir, split, src, tgt, len(task.target_dictionary))
    header_path = os.path.join(dest, HEADER)
    if os.path.isfile(header_path):
        with open(header_path, encoding="utf-8") as f:
            found = json.load(f)
        problems = mismatches(expected, found)
        if not problems:
            logger.info("%s: a finished cache of this teacher and data; nothing to do", dest)
            return found
        if not args.overwrite:
            raise SystemExit(f"--dest {dest}: holds a cache of another teacher or data ({'; '.join(problems)}); "
                             "pass --overwrite to replace it")
        os.remove(header_path)  # first, so the folder reads as unfinished from now on
        for name in (LOGPROBS, INDEX):
            if os.path.exists(os.path.join(dest, name)):
                os.remove(os.path.join(dest, name))

    task.load_dataset(split, combine=True, epoch=1)  # as fairseq-train loads --train-subset
    dataset = task.dataset(split)
    teacher = load_frozen_teacher(args.path, task, flag="--path")
    reference = torch.empty(0, device=device, dtype=torch.float16 if args.fp16 else torch.float32)
    pad, vocab = task.target_dictionary.pad(), len(task.target_dictionary)

    n = len(dataset)
    tgt_sizes = np.asarray(dataset.tgt_sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(tgt_sizes)[:-1]]).astype(np.int64)
    tokens = int(tgt_sizes.sum())
    partial, progress_path = os.path.join(dest, LOGPROBS + ".partial"), os.path.join(dest, "progress.npz")
    build_path = os.path.join(dest, "build.json")
    resumed = False
    if os.path.isfile(partial) and os.path.isfile(progress_path) and os.path.isfile(build_path):
        with open(build_path, encoding="utf-8") as f:
            started = json.load(f)
        if not mismatches(expected, started) and started.get("tokens") == tokens:
            resumed = True
    if resumed:
        logprobs = np.lib.format.open_memmap(partial, mode="r+")
        progress = np.load(progress_path)
        index = progress["index"]
    else:
        need, free = tokens * vocab * np.dtype(DTYPE).itemsize, shutil.disk_usage(dest).free
        if need > free:
            raise SystemExit(f"--dest {dest}: the cache needs {need / 1e9:.2f} GB, the disk has {free / 1e9:.2f} GB "
                             "free")
        _write_json(build_path, dict(expected, tokens=tokens))
        logprobs = np.lib.format.open_memmap(partial, mode="w+", dtype=DTYPE, shape=(tokens, vocab))
        index = np.full((n, 4), -1, dtype=np.int64)
    done = index[:, OFFSET] >= 0

    max_positions = utils.resolve_max_positions(task.max_positions(), teacher.model.max_positions())
    order = dataset.ordered_indices()
    order, skipped = dataset.filter_indices_by_size(order, max_positions)
    order = np.asarray([i for i in order if not done[i]], dtype=np.int64)
    batches = dataset.batch_by_size(order, max_tokens=args.max_tokens)
    logger.info("%s: %d examples, %d target tokens x %d types (%.2f GB float16) -> %s; %s%d to run, %d batches, "
                "%d too long for the teacher", split, n, tokens, vocab, tokens * vocab * 2 / 1e9, dest,
                "resuming: " if resumed else "", len(order), len(batches), len(skipped))

    def save_progress():
        logprobs.flush()
        np.savez(progress_path + ".tmp.npz", index=index)
        os.replace(progress_path + ".tmp.npz", progress_path)

    start = last_save = time.time()
    done_tokens = 0
    for b, batch in enumerate(batches):
        sample = dataset.collater([dataset[int(i)] for i in batch])
        if use_cuda:
            sample = utils.move_to_cuda(sample)
        with torch.no_grad():
            logits = teacher(reference, **sample["net_input"])[0]
            lp = F.log_softmax(logits.float(), dim=-1)
            lp = lp.clamp(min=float(np.finfo(DTYPE).min)).to(torch.float16).cpu().numpy()
        target = sample["target"]
        lengths = target.ne(pad).sum(1).cpu().numpy()
        sums = target_checksums(target, pad).cpu().numpy()
        src_lengths = sample["net_input"]["src_lengths"].cpu().numpy()
        for i, ex in enumerate(sample["id"].cpu().numpy()):
            length, offset = int(lengths[i]), int(offsets[ex])
            assert length == tgt_sizes[ex], (ex, length, tgt_sizes[ex])
            logprobs[offset:offset + length] = lp[i, :length]
            index[ex] = (offset, length, src_lengths[i], sums[i])
            done_tokens += length
        if time.time() - last_save > args.save_interval:
            save_progress()
            last_save = time.time()
            elapsed = last_save - start
            logger.info("batch %d/%d, %d tokens in %.0f s (%.0f tokens/s)", b + 1, len(batches), done_tokens,
                        elapsed, done_tokens / max(elapsed, 1e-9))
    logprobs.flush()
    del logprobs
    for ex in skipped:  # never cached: their lengths still let a reader say why
        index[ex, TGT_LEN], index[ex, SRC_LEN] = tgt_sizes[ex], dataset.src_sizes[ex]
    np.save(os.path.join(dest, INDEX + ".tmp.npy"), index)
    os.replace(os.path.join(dest, INDEX + ".tmp.npy"), os.path.join(dest, INDEX))
    os.replace(partial, os.path.join(dest, LOGPROBS))
    seconds = time.time() - start
    header = dict(expected, tokens=tokens, examples=n, teacher_path=os.path.abspath(args.path),
                  data_dir=os.path.abspath(data_dir), skipped=[int(i) for i in skipped],
                  built={"seconds_this_run": round(seconds, 1), "max_tokens": args.max_tokens,
                         "device": device.type, "teacher_dtype": "float16" if args.fp16 else "float32",
                         "torch_threads": torch.get_num_threads(), "resumed": resumed,
                         "bytes": os.path.getsize(os.path.join(dest, LOGPROBS))})
    _write_json(header_path, header)
    for path in (progress_path, build_path):
        if os.path.exists(path):
            os.remove(path)
    logger.info("wrote %s: %d examples, %d tokens x %d (%.2f GB) in %.0f s", dest, n, tokens, vocab,
                header["built"]["bytes"] / 1e9, seconds)
    return header


def main(argv=None) -> dict:
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
                        stream=sys.stderr)
    return build(get_parser().parse_args(argv))


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
