"""The plug-in registers, and every stock command opens fairseq checkpoints under torch >= 2.6
with weights-only loading kept on and no environment variable (issue: install, section 1)."""
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import (REFERENCE_TEACHER, TINY_TRANSFORMER, TRAIN_FLAGS, USER_DIR, clean_env, needs_reference_teacher,
                      run_cli)

from user_dir.common.safe_checkpoint_loading import fairseq_checkpoint_globals


# what the README and the recipes use, by registry; every other @register_* in user_dir/ is checked too
DOCUMENTED = {"criterion": {"kd", "patient_kd", "pet_warmup", "glue_sentence_prediction", "variator_distill"},
              "task": {"variator_translation", "variator_sentence_prediction"},
              "arch": {"pet_transformer_iwslt", "pet_transformer_wmt", "can_transformer_iwslt", "hf_bert"}}
REGISTRATION = re.compile(r'@register_(criterion|task|model_architecture)\((?:"[^"]+", )?"([^"]+)"')


def test_plugin_registers_its_components():
    """Importing the plug-in registers every criterion, task and architecture its modules declare
    (a module __init__.py forgot to import would be missing), each bound to the plug-in's own class."""
    import user_dir  # noqa: F401
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    declared = {"criterion": set(), "task": set(), "arch": set()}
    for folder, _, files in os.walk(USER_DIR):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    for kind, registered in REGISTRATION.findall(f.read()):
                        declared["arch" if kind == "model_architecture" else kind].add(registered)
    registries = {"criterion": CRITERION_REGISTRY, "task": TASK_REGISTRY, "arch": ARCH_MODEL_REGISTRY}
    for kind, names in declared.items():
        assert DOCUMENTED[kind] <= names, f"{kind}s documented but not declared: {DOCUMENTED[kind] - names}"
        for registered in names:
            assert registered in registries[kind], f"{kind} {registered} is declared but not registered"
            cls = registries[kind][registered]
            assert cls.__module__.startswith("user_dir."), f"{kind} {registered} is fairseq's {cls.__module__}"


def _load_in_fresh_process(path, import_plugin):
    """Load ``path`` with torch.load's default (weights-only under torch >= 2.6) in a fresh process and
    print, for each model tensor, its name and whether it equals a trusted full unpickling."""
    code = ("import torch\n" + ("import user_dir\n" if import_plugin else "") +
            f"state = torch.load({path!r}, map_location='cpu')\n"
            f"trusted = torch.load({path!r}, map_location='cpu', weights_only=False)\n"
            "print(sorted(state))\n"
            "for k, v in state['model'].items():\n"
            "    print(k, torch.equal(v, trusted['model'][k]))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())


def test_checkpoints_need_the_fix_and_get_it(trained_tiny):
    last = os.path.join(trained_tiny["save_dir"], "checkpoint_last.pt")
    without = _load_in_fresh_process(last, import_plugin=False)
    if torch.__version__ >= "2.6":
        assert without.returncode != 0 and "weights_only" in without.stderr
    with_plugin = _load_in_fresh_process(last, import_plugin=True)
    assert with_plugin.returncode == 0, with_plugin.stderr
    lines = with_plugin.stdout.splitlines()
    trusted = torch.load(last, map_location="cpu", weights_only=False)
    assert lines[0] == str(sorted(trusted))  # every top-level entry: model, cfg, optimizer state, ...
    # every weight loads, each equal to the trusted unpickling's
    assert lines[1:] == [f"{name} True" for name in trusted["model"]]


def test_allow_list_covers_every_global_of_real_checkpoints(trained_tiny):
    get_unsafe = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if get_unsafe is None:
        pytest.skip("torch < 2.5 has no get_unsafe_globals_in_checkpoint")
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in fairseq_checkpoint_globals()}
    from fairseq import checkpoint_utils

    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        path = os.path.join(trained_tiny["save_dir"], name)
        needed = set(get_unsafe(path))
        assert needed <= allowed, f"{name} needs {needed - allowed}"
        # what rank 0 broadcasts to the other ranks: the loaded state, cfg turned into omegaconf
        broadcast = os.path.join(trained_tiny["save_dir"], "broadcast.pt")
        torch.save(checkpoint_utils.load_checkpoint_to_cpu(path), broadcast)
        needed = set(get_unsafe(broadcast))
        assert needed <= allowed, f"the broadcast state of {name} needs {needed - allowed}"


def test_generate_validate_interactive_and_resume(trained_tiny, tmp_path):
    data, save_dir = trained_tiny["data"], trained_tiny["save_dir"]
    ckpt = os.path.join(save_dir, "checkpoint_last.pt")
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", "test",
                  "--beam", "2", "--batch-size", "128", "--max-len-b", "5", "--remove-bpe", "--cpu")
    assert "Translated 1,000 sentences" in gen.stdout + gen.stderr
    assert len(re.findall(r"^H-\d+", gen.stdout, flags=re.M)) == 1000
    assert 0 <= float(re.search(r"BLEU4 = ([\d.]+)", gen.stdout).group(1)) <= 100
    val = run_cli("fairseq_cli.validate", data, "--task", "translation", "--user-dir", USER_DIR, "--path", ckpt,
                  "--valid-subset", "valid",
                  "--max-tokens", "4096", "--cpu")
    # the loaded checkpoint is the trained model: fairseq-validate gives the validation losses that training
    # logged for it after its last update (other batches, the same sums)
    losses = r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+)"
    logged = re.findall(losses, trained_tiny["log"])[-1]
    assert re.search(losses, val.stdout + val.stderr).groups() == logged
    inter = run_cli("fairseq_cli.interactive", data, "--user-dir", USER_DIR, "--path", ckpt, "--beam", "2",
                    "--source-lang", "de", "--target-lang", "en", "--tokenizer", "moses", "--bpe", "subword_nmt",
                    "--bpe-codes", os.path.join(data, "code"), "--max-len-b", "20", "--cpu",
                    input="ein mann fährt fahrrad .\nzwei hunde spielen im schnee .\n")
    assert len(re.findall(r"^H-\d", inter.stdout, flags=re.M)) == 2
    # resume: a second fairseq-train continues from checkpoint_last.pt instead of starting over
    resumed = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS,
                      "--max-update", "10", "--save-dir", save_dir, "--cpu")
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 8 updates\)", log), log[-3000:]
    assert "num_updates 10" in log or "num_updates=10" in log


@needs_reference_teacher
def test_reference_teacher_loads_with_the_plugin():
    """The original file (its cfg holds argparse Namespaces): torch's weights-only loading needs the plug-in."""
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401

    state = checkpoint_utils.load_checkpoint_to_cpu(REFERENCE_TEACHER)
    assert state["model"]["encoder.embed_tokens.weight"].shape[0] == 7896


def test_importing_the_plugin_sets_no_environment_variable():
    code = "import os, user_dir; print([k for k in os.environ if 'WEIGHTS_ONLY' in k])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_fairseq_drops_the_last_batch_and_the_plugin_keeps_it():
    """fairseq 0.12's batch_by_size drops a last batch whose size is not a multiple of
    --required-batch-size-multiple (fairseq issue #5036); the plug-in gives it back, unchanged otherwise."""
    import numpy as np
    from fairseq.data import data_utils

    import user_dir  # noqa: F401

    patched = data_utils.batch_by_size
    fairseq_own = patched.fairseq_batch_by_size
    indices, sizes = np.arange(21, dtype=np.int64), np.full(21, 5, dtype=np.int64)
    for max_tokens, max_sentences in ((None, 16), (80, None)):  # by sentences (GLUE) and by tokens (translation)
        kw = dict(num_tokens_vec=sizes, max_tokens=max_tokens, max_sentences=max_sentences,
                  required_batch_size_multiple=8)
        dropped = fairseq_own(indices, None, **kw)
        assert [len(b) for b in dropped] == [16], "fairseq no longer drops the last batch: the fix can go"
        kept = patched(indices, None, **kw)
        assert [b.tolist() for b in kept] == [list(range(16)), list(range(16, 21))]
        # an iterator of indices is read once
        assert [len(b) for b in patched(iter(indices.tolist()), None, **kw)] == [16, 5]
    # multiples of 8 and --required-batch-size-multiple 1 were never cut: identical to fairseq's
    kw = dict(num_tokens_vec=sizes[:16], max_sentences=8, required_batch_size_multiple=8)
    assert [b.tolist() for b in patched(indices[:16], None, **kw)] == [b.tolist() for b in fairseq_own(indices[:16], None, **kw)]
    kw = dict(num_tokens_vec=sizes, max_sentences=16, required_batch_size_multiple=1)
    assert [b.tolist() for b in patched(indices, None, **kw)] == [b.tolist() for b in fairseq_own(indices, None, **kw)]


def test_generate_translates_every_sentence_of_a_set_not_a_multiple_of_8(trained_tiny):
    """Multi30k's valid set has 1,014 sentences (126 x 8 + 6): stock fairseq-generate with the
    plug-in translates all of them, in batches of 16 (fairseq alone stops at 1,008)."""
    from fairseq.data import data_utils

    data, save_dir = trained_tiny["data"], trained_tiny["save_dir"]
    n = len(data_utils.load_indexed_dataset(os.path.join(data, "valid.de-en.de"), None))
    assert n % 8 != 0
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path",
                  os.path.join(save_dir, "checkpoint_last.pt"), "--gen-subset", "valid", "--beam", "1",
                  "--batch-size", "16", "--max-len-b", "2", "--cpu")
    assert f"Translated {n:,} sentences" in gen.stdout + gen.stderr
    assert len(re.findall(r"^H-\d+", gen.stdout, flags=re.M)) == n
