"""Loading a frozen teacher for distillation, shared by every method.

The teacher is loaded once per process (each rank of distributed training loads its own copy),
built with the *student's* task so both use one dictionary, put in eval mode with gradients off,
and moved lazily to the student's device and dtype on first use (so ``--fp16``/``--bf16`` and CUDA
work without device literals). It is deliberately **not** an ``nn.Module`` attribute of the
criterion or the model: fairseq would otherwise save it into every student checkpoint, hand its
parameters to the optimizer's bookkeeping and wrap it in DistributedDataParallel.
"""
import logging
import os
from typing import Optional

import torch
import torch.nn as nn
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

logger = logging.getLogger(__name__)


class TeacherConfigError(ValueError):
    """Raised before training starts when the teacher cannot serve this student."""


def _task_dictionaries(task):
    dicts = []
    for side, attr in (("encoder", "source_dictionary"), ("decoder", "target_dictionary")):
        dictionary = getattr(task, attr, None)
        if isinstance(dictionary, Dictionary):
            dicts.append((side, dictionary))
    return dicts


def _teacher_data_dirs(state) -> list:
    cfg = state.get("cfg") or {}
    task_cfg = cfg.get("task") if hasattr(cfg, "get") else None
    data = task_cfg.get("data") if task_cfg is not None and hasattr(task_cfg, "get") else None
    if data is None and state.get("args") is not None:
        data = getattr(state["args"], "data", None)
    return [d for d in str(data).split(os.pathsep) if d] if data else []


def check_teacher_dictionaries(state: dict, task, path: str, flag: str = "--teacher-path") -> None:
    """Fail early, naming ``flag`` and ``path``, if teacher and student vocabularies differ.

    Sizes are read off the teacher's embedding tables; contents are compared with the teacher's own
    ``dict.*.txt`` files where the checkpoint's data directory is readable on this machine.
    """
    model_state = state["model"]
    for side, dictionary in _task_dictionaries(task):
        keys = [k for k in model_state if k.startswith(side + ".") and k.endswith("embed_tokens.weight")]
        if side == "decoder" and not keys:
            continue  # encoder-only teacher (RoBERTa): its encoder was checked against the source side
        if side == "encoder" and not keys:
            keys = [k for k in model_state if k.endswith("embed_tokens.weight")][:1]
        for key in keys:
            rows = model_state[key].size(0)
            if rows != len(dictionary):
                raise TeacherConfigError(
                    f"{flag} {path}: the teacher's {side} vocabulary has {rows} entries but the "
                    f"student's task dictionary has {len(dictionary)}. Teacher and student must be "
                    "trained on data binarised with the same dictionary (fairseq-preprocess "
                    "--srcdict/--tgtdict with the teacher's dict files)."
                )
    task_cfg = getattr(task, "cfg", None)
    langs = {"encoder": getattr(task_cfg, "source_lang", None), "decoder": getattr(task_cfg, "target_lang", None)}
    for data_dir in _teacher_data_dirs(state):
        for side, dictionary in _task_dictionaries(task):
            lang = langs.get(side)
            dict_path = os.path.join(data_dir, f"dict.{lang}.txt" if lang else "dict.txt")
            if not os.path.isfile(dict_path):
                continue
            teacher_dict = Dictionary.load(dict_path)
            if teacher_dict.symbols != dictionary.symbols:
                first = next(
                    (i for i, (a, b) in enumerate(zip(teacher_dict.symbols, dictionary.symbols)) if a != b),
                    min(len(teacher_dict), len(dictionary)),
                )
                raise TeacherConfigError(
                    f"{flag} {path}: the teacher's {side} dictionary ({dict_path}) differs from the "
                    f"student's at index {first}. Binarise the student's data with the teacher's "
                    "dictionary (fairseq-preprocess --srcdict/--tgtdict)."
                )


class FrozenTeacher:
    """A teacher model that never trains: eval mode, no gradients, follows the student's device.

    It never trains because it is no ``nn.Module`` (never registered in the student, so never optimised, saved or
    averaged by DDP) and every call runs under ``torch.no_grad()``. Its parameters keep ``requires_grad`` as
    loaded: with it off, torch's matmul does not fold a non-contiguous 3-D input into one 2-D GEMM (a weight that
    needs no gradient sends it to a batched matmul of the expanded weight, pytorch/pytorch#73115), and fairseq's
    decoder feeds its output projection exactly such an input (T x B x C transposed), so a frozen teacher's
    forward ran slower (tests/test_common.py checks the kernels it runs).
    """

    def __init__(self, model: nn.Module, path: str):
        self.model = model
        self.path = path
        self.model.eval()

    def match(self, reference: torch.Tensor) -> nn.Module:
        """Move the teacher to the device and floating dtype of ``reference`` (a student weight)."""
        p = next(self.model.parameters())
        if p.device != reference.device or p.dtype != reference.dtype:
            self.model.to(device=reference.device, dtype=reference.dtype)
        self.model.eval()  # stays in eval even if someone called .train() on it
        return self.model

    @torch.no_grad()
    def __call__(self, student_reference: torch.Tensor, *args, **kwargs):
        return self.match(student_reference)(*args, **kwargs)


def load_frozen_teacher(
    path: Optional[str], task, flag: str = "--teacher-path", arg_overrides: Optional[dict] = None
) -> FrozenTeacher:
    """Load the teacher checkpoint at ``path`` for the student's ``task``.

    Raises :class:`TeacherConfigError` naming ``flag`` when the path is empty or missing or the
    dictionaries do not match, before any training step runs.
    """
    if not path:
        raise TeacherConfigError(f"{flag} is required: the path of the teacher's fairseq checkpoint")
    if not os.path.isfile(path):
        raise TeacherConfigError(f"{flag} {path}: no such checkpoint file")
    state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=arg_overrides)
    check_teacher_dictionaries(state, task, path, flag)
    models, _ = checkpoint_utils.load_model_ensemble([path], arg_overrides=arg_overrides, task=task, state=state)
    logger.info("loaded frozen teacher %s (%s)", path, type(models[0]).__name__)
    return FrozenTeacher(models[0], path)
