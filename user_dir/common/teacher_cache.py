"""A cache of a frozen teacher's outputs on the training set, for word-level KD (``--teacher-cache``).

The teacher of word-level KD (Hinton et al. 2015; Kim & Rush 2016; kd_losses.word_kd_loss) is frozen and in eval
mode, so its outputs on a training example are the same in every epoch and in every KD run on the same data; yet its
forward is most of a KD update on a CPU. ``python -m user_dir.tools.teacher_cache`` runs it once over a subset and
writes, per target token, its log-probabilities over the target vocabulary; ``--criterion kd --teacher-cache DIR``
reads them back instead of running the teacher (common/word_kd_criterion.py).

What is stored: ``log_softmax(teacher logits)`` at T = 1, in float16. This loses nothing for other temperatures:
the log-probabilities differ from the logits by one constant per position (``logsumexp``), and a softmax ignores a
constant, so ``log_softmax(lp / T) == log_softmax(logits / T)`` for every ``--kd-temperature`` T; word_kd_loss takes
either as its ``teacher_logits``. Storing the logits instead would carry the same information with the same float16
cost; log-probabilities were chosen because (1) the probable tokens, which carry the KL, sit near 0, where float16
is finest (the shipped teacher's top log-probability has median -0.2, spacing 2^-13; its top logits are 11 to 16,
spacing 2^-7 to 2^-6), so at the default T = 1 the KL moves less (relative error 3e-6 against 9e-6 for float16
logits, 64 Multi30k training sentences, a perturbed student; at T = 2 and 4 both stay below 3e-6); (2) they are
bounded above by 0, so no teacher's logit scale can overflow float16; (3) they are a distribution as stored, which a
criterion that needs the teacher's probabilities (PET's warm-up labels) could read directly. Probabilities would
underflow float16.

A cache is a folder of three files:

* ``logprobs.npy``: float16, ``[target tokens, V]``, examples one after another in dataset order, memory-mapped on
  reading (numpy's ``.npy`` format, so ``np.load(..., mmap_mode="r")`` opens it);
* ``index.npy``: int64, ``[examples, 4]``: per dataset example id (fairseq's ``sample["id"]``) its first row in
  ``logprobs.npy``, its target length (with ``</s>``), its source length, and a checksum of its target tokens;
  the offset is -1 for an example the teacher could not take (longer than its maximum positions);
* ``header.json``: the sha256 of the teacher checkpoint, the sha256 of each of the data's dictionaries and index
  and binary files of the split, the split, the language pair, the vocabulary size and the dtype. It is written
  last: a folder without it is an unfinished build, which the tool resumes.

:class:`TeacherCache` opens a cache, :meth:`TeacherCache.check` refuses it (naming the flag and the file) for
another teacher or other data, and :meth:`TeacherCache.gather` returns a batch's ``[B, T, V]`` rows, refusing a
batch whose lengths or tokens are not those the cache was built on.
"""
import hashlib
import json
import os
import re
from typing import Dict, Optional

import numpy as np
import torch

from .teacher import TeacherConfigError

FORMAT = 1
HEADER, LOGPROBS, INDEX = "header.json", "logprobs.npy", "index.npy"
DTYPE = np.float16
# index columns
OFFSET, TGT_LEN, SRC_LEN, TGT_SUM = range(4)


class TeacherCacheError(TeacherConfigError):
    """A teacher cache that does not belong to this teacher, data or batch."""


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def data_files(data_dir: str, split: str, source_lang: str, target_lang: str) -> Dict[str, str]:
    """``{file name: sha256}`` of what fixes a split's examples: both dictionaries and the split's ``.idx``/``.bin``
    files, shards (``train1.de-en.de.bin``, ...) included."""
    langs = "|".join(map(re.escape, (source_lang, target_lang)))
    binarised = re.compile(rf"{re.escape(split)}\d*\.({langs})-({langs})\.({langs})\.(idx|bin)")
    names = [f"dict.{source_lang}.txt", f"dict.{target_lang}.txt"]
    names += sorted(n for n in os.listdir(data_dir) if binarised.fullmatch(n))
    return {n: sha256_file(os.path.join(data_dir, n)) for n in names if os.path.isfile(os.path.join(data_dir, n))}


def target_checksums(target: torch.Tensor, pad: int) -> torch.Tensor:
    """Per row of right-padded ``[B, T]`` targets, ``sum_t (t + 1) * token_t`` over non-padding tokens (int64)."""
    positions = torch.arange(1, target.size(1) + 1, device=target.device, dtype=torch.int64)
    return (target.long() * positions * target.ne(pad)).sum(1)


def task_data(task, flag: str = "--teacher-cache"):
    """``(data dir, split, source lang, target lang)`` of a translation task's training subset."""
    cfg = task.cfg
    if getattr(cfg, "source_lang", None) is None or getattr(cfg, "target_lang", None) is None:
        raise TeacherCacheError(f"{flag}: needs a translation task (a language pair); --task {cfg._name} has none")
    dirs = [d for d in str(cfg.data).split(os.pathsep) if d]
    if len(dirs) != 1:
        raise TeacherCacheError(f"{flag}: the data {cfg.data} is sharded over {len(dirs)} folders, whose epochs read "
                                "different examples under the same ids; a teacher cache needs one data folder")
    return dirs[0], getattr(cfg, "train_subset", "train"), cfg.source_lang, cfg.target_lang


def fingerprint(teacher_path: str, data_dir: str, split: str, source_lang: str, target_lang: str,
                vocab_size: int) -> dict:
    """What a cache must agree with to serve a run (the header's identifying part)."""
    return {"format": FORMAT, "teacher_sha256": sha256_file(teacher_path), "split": split,
            "source_lang": source_lang, "target_lang": target_lang,
            "data_files": data_files(data_dir, split, source_lang, target_lang),
            "vocab_size": int(vocab_size), "dtype": np.dtype(DTYPE).name,
            "values": "log_softmax of the teacher's logits at temperature 1"}


def mismatches(expected: dict, found: dict):
    """Human-readable differences between two fingerprints."""
    out = []
    if found.get("format") != expected["format"]:
        out.append(f"format {found.get('format')} (this code reads {expected['format']})")
    if found.get("teacher_sha256") != expected["teacher_sha256"]:
        out.append(f"another teacher (checkpoint sha256 {str(found.get('teacher_sha256'))[:12]}..., "
                   f"this one {expected['teacher_sha256'][:12]}...)")
    for key in ("split", "source_lang", "target_lang", "vocab_size", "dtype"):
        if found.get(key) != expected[key]:
            out.append(f"{key} {found.get(key)!r} (this run: {expected[key]!r})")
    theirs, ours = found.get("data_files", {}), expected["data_files"]
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            what = "missing here" if name not in ours else "not in the cache" if name not in theirs else "differs"
            out.append(f"other data: {name} {what}")
    return out


class TeacherCache:
    """A finished cache, opened for reading (the log-probabilities memory-mapped)."""

    def __init__(self, directory: str, flag: str = "--teacher-cache"):
        self.directory, self.flag = directory, flag
        header_path = os.path.join(directory, HEADER)
        if not os.path.isfile(header_path):
            unfinished = os.path.exists(os.path.join(directory, LOGPROBS + ".partial"))
            raise TeacherCacheError(
                f"{flag} {directory}: no {HEADER} -- " + ("an unfinished build; rerun python -m "
                                                         "user_dir.tools.teacher_cache to finish it" if unfinished else
                                                         "not a teacher cache (python -m user_dir.tools.teacher_cache "
                                                         "builds one)"))
        with open(header_path, encoding="utf-8") as f:
            self.header = json.load(f)
        self.logprobs = np.load(os.path.join(directory, LOGPROBS), mmap_mode="r")
        self.index = np.load(os.path.join(directory, INDEX))
        if self.logprobs.dtype != DTYPE or self.logprobs.shape != (self.header["tokens"], self.header["vocab_size"]):
            raise TeacherCacheError(f"{flag} {os.path.join(directory, LOGPROBS)}: shape {self.logprobs.shape} and "
                                    f"dtype {self.logprobs.dtype} disagree with {header_path}")

    def check(self, teacher_path: str, task, teacher_flag: str = "--teacher-path") -> None:
        """Refuse, before training, a cache of another teacher (``teacher_path``'s sha256) or of other data (the
        files of ``task``'s training subset, its language pair and target vocabulary)."""
        data_dir, split, src, tgt = task_data(task, self.flag)
        expected = fingerprint(teacher_path, data_dir, split, src, tgt, len(task.target_dictionary))
        problems = mismatches(expected, self.header)
        if problems:
            raise TeacherCacheError(
                f"{self.flag} {os.path.join(self.directory, HEADER)} was not built for {teacher_flag} {teacher_path} "
                f"on {data_dir} ({split}): " + "; ".join(problems) + ". Rebuild it (python -m "
                "user_dir.tools.teacher_cache ... --overwrite) or train without " + self.flag)

    def gather(self, ids: torch.Tensor, target: torch.Tensor, pad: int, like: torch.Tensor,
               src_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The cached log-probabilities of a batch as ``[B, T, V]`` on ``like``'s device and dtype (zeros at padding).

        ``ids``: fairseq's ``sample["id"]``; ``target``: the batch's right-padded ``[B, T]`` targets (as fairseq's
        LanguagePairDataset collates them); ``src_lengths``: ``net_input["src_lengths"]``, checked when given.
        """
        ids_np = ids.cpu().numpy()
        lengths = target.ne(pad).sum(1).cpu().numpy()
        sums = target_checksums(target, pad).cpu().numpy()
        if ids_np.size and (ids_np.min() < 0 or ids_np.max() >= len(self.index)):
            raise TeacherCacheError(f"{self.flag} {os.path.join(self.directory, INDEX)}: example id {ids_np.max()} "
                                    f"is beyond the cache's {len(self.index)} examples: another data set")
        rows = self.index[ids_np]
        checks = [("target length", rows[:, TGT_LEN], lengths), ("target tokens", rows[:, TGT_SUM], sums)]
        if src_lengths is not None:
            checks.append(("source length", rows[:, SRC_LEN], src_lengths.cpu().numpy()))
        if (rows[:, OFFSET] < 0).any():
            bad = int(ids_np[rows[:, OFFSET] < 0][0])
            raise TeacherCacheError(f"{self.flag} {os.path.join(self.directory, INDEX)}: example {bad} is not cached "
                                    "(the teacher could not take it: longer than its maximum positions)")
        for what, cached, batch in checks:
            wrong = np.flatnonzero(cached != batch)
            if wrong.size:
                i = wrong[0]
                raise TeacherCacheError(
                    f"{self.flag} {os.path.join(self.directory, INDEX)}: example {int(ids_np[i])} has {what} "
                    f"{int(batch[i])} in this batch but {int(cached[i])} in the cache: the cache was built on other "
                    "data or with other data options (--truncate-source, --train-subset, ...)")
        out = np.zeros((len(ids_np), target.size(1), self.logprobs.shape[1]), dtype=DTYPE)
        for i, (offset, length) in enumerate(zip(rows[:, OFFSET], rows[:, TGT_LEN])):
            out[i, :length] = self.logprobs[offset:offset + length]
        return torch.from_numpy(out).to(device=like.device, dtype=like.dtype)
