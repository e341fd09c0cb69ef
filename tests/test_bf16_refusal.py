"""Stock ``fairseq-train --bf16`` without torch_xla is refused, naming the flag (common/distributed_support.py).

fairseq 0.12 turns ``--bf16`` into ``--tpu`` (``fairseq/options.py``), and its Trainer then asks torch_xla for a
device: ``AttributeError: 'NoneType' object has no attribute 'xla_device'`` on this CPU, as on every GPU machine.
Each model, criterion and task of the plug-in refuses that run before anything is built, and names ``--bf16`` and
``fc-train-bf16`` (user_dir/tools/train_bf16.py), the same command with the implication undone, which trains. What
must still run: that launcher, a caller that undoes the implication in the run's config after parsing (as
tests/test_mixed_precision.py does), ``fairseq-generate --bf16`` on the checkpoint it saved (``--tpu`` does nothing
there), and a real TPU run (torch_xla installed).
"""
import os
import re

import pytest

from conftest import TEACHER, TEACHER_DIR, TINY_TRANSFORMER, USER_DIR, needs_teacher, run_cli
from test_ddp_gradients import KD, TEACHER_ARCH, TINY_APC, TINY_CAN, TINY_PET
from test_distributed_equality import write_slice

import user_dir  # noqa: F401  (registers the plug-in)
from user_dir.common import distributed_support
from user_dir.common.distributed_support import check_tpu

DATA = os.path.join(TEACHER_DIR, "data-bin")
LS = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "512", "--max-update", "1", "--cpu", "--seed", "1",
         "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", "--log-interval", "1",
         "--disable-validation"]
TINY_GHOST = ["--arch", "ghost_transformer_iwslt_de_en", *TINY_TRANSFORMER[2:], "--ghost-heads", "1",
              "--ghost-ffn-dim", "64"]
VARIATOR = ["--task", "variator_translation", "--variator-backbone", TEACHER, "--variator-ratio", "2",
            "--variator-bottleneck", "8", "--arch", "transformer_iwslt_de_en", *TEACHER_ARCH,
            "--criterion", "variator_distill"]
# each place that refuses, with the words its message names it by: the models, then the criteria of a stock
# Transformer, then the Variator task around one
CASES = {
    "pet_transformer": ([*TINY_PET, *LS], "--arch pet_transformer_iwslt"),
    "can_transformer": ([*TINY_CAN, *LS], "--arch can_transformer_iwslt"),
    "apc_transformer": ([*TINY_APC, *LS], "--arch apc_transformer_iwslt_de_en"),
    "ghost_transformer": ([*TINY_GHOST, *LS], "--arch ghost_transformer_iwslt_de_en"),
    "hf_bert": (["--arch", "hf_bert", *LS], "--arch hf_bert"),
    "ghost_hf_bert": (["--arch", "ghost_hf_bert", *LS], "--arch ghost_hf_bert"),
    "kd": ([*TINY_TRANSFORMER, "--criterion", "kd", *KD], "a frozen teacher's criterion"),
    "patient_kd": ([*TINY_TRANSFORMER, "--criterion", "patient_kd", *KD], "a frozen teacher's criterion"),
    "pet_warmup": ([*TINY_TRANSFORMER, "--criterion", "pet_warmup", *KD], "--criterion pet_warmup"),
    "variator_translation": (VARIATOR, "the Variator tasks"),
}


def _build(argv, undo_tpu=False):
    """What fairseq_cli.train does before its Trainer: parse, set up the task, build the model and criterion.
    ``undo_tpu``: reset ``cfg.common.tpu`` after parsing, as tests/test_mixed_precision.py does."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       [DATA, "--user-dir", USER_DIR, *map(str, argv), "--bf16", "--cpu"])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.bf16 and cfg.common.tpu  # stock fairseq: --bf16 implies --tpu
    if undo_tpu:
        cfg.common.tpu = False
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), task.build_criterion(cfg.criterion)


# ---- the real command lines ---------------------------------------------------------------------------------
@needs_teacher
def test_stock_fairseq_train_bf16_is_refused_and_fc_train_bf16_trains_then_generate_bf16_runs(tmp_path):
    data = write_slice(tmp_path / "data-bin", {"train": ("train", 64), "valid": ("valid", 8)})  # real pairs
    pet = [data, "--user-dir", USER_DIR, *TINY_PET, "--criterion", "pet_warmup", *KD, *TRAIN, "--bf16"]
    kd = [data, "--user-dir", USER_DIR, *TINY_TRANSFORMER, "--criterion", "kd", *KD, *TRAIN, "--bf16"]
    for argv, what in ((pet, "--arch pet_transformer_iwslt"), (kd, "a frozen teacher's criterion (--teacher-path)")):
        stock = run_cli("fairseq_cli.train", *argv, "--no-save", check=False, timeout=120)
        assert stock.returncode != 0, stock.stdout[-2000:]
        assert f"ValueError: --bf16 with {what}: fairseq 0.12 turns --bf16 into --tpu" in stock.stderr, \
            stock.stderr[-3000:]
        assert "fc-train-bf16" in stock.stderr and "xla_device" not in stock.stdout + stock.stderr
        assert "num_updates" not in stock.stdout + stock.stderr  # refused before any training
    # the same command through the launcher that undoes the implication: one bf16 update, saved
    ours = run_cli("user_dir.tools.train_bf16", *pet, "--save-dir", tmp_path / "ours", "--no-epoch-checkpoints",
                   timeout=120)
    assert "num_updates 1" in ours.stdout + ours.stderr
    # fairseq-generate --bf16 (which sets --tpu too, and does nothing with it) on what it saved is not refused
    checkpoint = tmp_path / "ours" / "checkpoint_last.pt"
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", checkpoint, "--bf16", "--cpu",
                  "--gen-subset", "valid", "--batch-size", "8", "--beam", "1", "--max-len-a", "0", "--max-len-b", "3",
                  "--num-workers", "0", timeout=120)
    assert len(re.findall(r"^H-\d+\t", gen.stdout, re.M)) == 8, gen.stdout[-2000:] + gen.stderr[-2000:]


# ---- every model, criterion and task that refuses -----------------------------------------------------------
@needs_teacher
@pytest.mark.parametrize("case", CASES)
def test_each_model_criterion_and_task_refuses_stock_bf16_naming_the_flag(case):
    argv, what = CASES[case]
    with pytest.raises(ValueError, match="^--bf16 with ") as info:
        _build(argv)
    message = str(info.value)
    assert what in message and "fc-train-bf16 (user_dir/tools/train_bf16.py)" in message
    assert "python -m user_dir.tools.train_bf16" in message and "torch_xla is not installed" in message


@needs_teacher
@pytest.mark.parametrize("case", ["pet_warmup_on_pet", "kd_on_can", "variator_translation"])
def test_bf16_with_the_implied_tpu_undone_in_the_run_config_builds(case):
    """tests/test_mixed_precision.py resets ``cfg.common.tpu`` after parsing, where the model's flat args (and
    the criterion's fields) still hold the parser's ``tpu = True``: the run's config has the last word."""
    argv = {"pet_warmup_on_pet": [*TINY_PET, "--criterion", "pet_warmup", *KD],
            "kd_on_can": [*TINY_CAN, "--criterion", "kd", *KD], "variator_translation": VARIATOR}[case]
    model, criterion = _build(argv, undo_tpu=True)
    assert model is not None and criterion is not None


@needs_teacher
def test_with_torch_xla_installed_nothing_is_refused(monkeypatch):
    monkeypatch.setattr(distributed_support, "xla_installed", lambda: True)  # a TPU machine
    model, criterion = _build([*TINY_PET, "--criterion", "pet_warmup", *KD])
    assert type(model).__name__ == "PETTransformerModel" and type(criterion).__name__ == "PETWarmupCriterion"


def test_check_tpu_refuses_only_when_every_view_says_bf16_with_tpu():
    from omegaconf import OmegaConf

    assert not distributed_support.xla_installed()  # this machine; the test above fakes the other case

    def run(tpu, bf16):  # a run's config, and a task's config hanging in it (as fairseq's setup_task keeps it)
        return OmegaConf.create({"common": {"tpu": tpu, "bf16": bf16}, "task": {"data": "x"}}).task

    with pytest.raises(ValueError, match="^--bf16 with --arch x: fairseq 0.12 turns --bf16 into --tpu"):
        check_tpu(True, True, "--arch x")  # flat args alone (no run config reachable)
    with pytest.raises(ValueError, match="--bf16 with --arch x"):
        check_tpu(True, True, "--arch x", run(True, True))
    with pytest.raises(ValueError, match="--bf16 with --arch x"):
        check_tpu(None, None, "--arch x", run(True, True))  # no flat args (patient_kd's criterion): the run's
    check_tpu(True, True, "--arch x", run(False, True))  # the run undid the implication after parsing
    check_tpu(False, True, "--arch x", run(True, True))  # a model rebuilt from a checkpoint, run with --bf16
    check_tpu(True, False, "--arch x")  # --tpu alone: not --bf16's doing
    check_tpu(None, None, "--arch x")  # a Namespace without the attributes (hand-built in tests)
    check_tpu("${common.tpu}", "${common.bf16}", "--criterion x")  # a config dataclass built by hand
