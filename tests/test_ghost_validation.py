"""GhostBERT at inference uses the weights the model has now (issue 43): the inference taps follow writes through
``p.data`` (as fairseq's optimisers make them), state-dict loads and dtype changes, on the eager and the compiled
path's taps; and a validation inside stock ``fairseq-train`` (fairseq's Adam, two validations) prints the loss that
``fairseq-validate`` gives on the checkpoint saved at that update."""
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import TEACHER, USER_DIR, needs_teacher, run_cli

from user_dir.ghost.ghost_module import GhostActivation, GhostConfig, GhostLinear, normalised_kernel


def autograd_output(module, x):
    """The module's output computed under autograd: the kernel normalised afresh from the weight, no cache."""
    with torch.enable_grad():
        return module(x).detach()


def current_taps(conv):
    return normalised_kernel(conv.weight.detach(), conv.cfg.softmax)[0].transpose(1, 2)


def check_inference_uses_current_weights(module, x):
    conv = module.ghost
    with torch.no_grad():
        out = module(x)
        taps = torch.stack([torch.stack(feature) for feature in conv.taps()])
        assert torch.equal(taps, current_taps(conv)) and torch.equal(conv.taps_tensor(), current_taps(conv))
        assert taps.dtype == conv.weight.dtype
    assert torch.equal(out, autograd_output(module, x))
    return out


@pytest.mark.parametrize("kind", ["linear", "activation"])
def test_inference_taps_follow_p_data_writes_loads_and_dtype_changes(kind):
    torch.manual_seed(0)
    cfg = GhostConfig(features=2 if kind == "activation" else 1)
    module = (GhostLinear(16, 12, 4, cfg) if kind == "linear" else GhostActivation(F.gelu, 12, cfg)).eval()
    conv = module.ghost
    x = torch.randn(6, 2, 16 if kind == "linear" else 12)
    first = check_inference_uses_current_weights(module, x)  # fills the inference cache
    # an optimiser step as fairseq's Adam makes it: through p.data, which changes neither the parameter's
    # version counter nor its storage (the key of the cache before issue 43)
    version, pointer = conv.weight._version, conv.weight.data_ptr()
    conv.weight.data.add_(torch.randn_like(conv.weight))
    assert (conv.weight._version, conv.weight.data_ptr()) == (version, pointer)
    stepped = check_inference_uses_current_weights(module, x)
    assert not torch.allclose(stepped, first)
    # a single value changed (e.g. a step that moved one tap): still noticed
    conv.weight.data[0, 0, 0, 0] += 1.0
    assert not torch.equal(check_inference_uses_current_weights(module, x), stepped)
    # a state-dict load (checkpoint loading, fairseq's EMA) back to the first weights
    other = (GhostLinear(16, 12, 4, cfg) if kind == "linear" else GhostActivation(F.gelu, 12, cfg))
    other.load_state_dict(module.state_dict())
    with torch.no_grad():
        other(x)
        other.ghost.weight.data.mul_(0.5)
    module.load_state_dict(other.state_dict())
    check_inference_uses_current_weights(module, x)
    # dtype changes (Module.half / double replace p.data): the taps follow, in the new dtype
    check_inference_uses_current_weights(module.double(), x.double())
    with torch.no_grad():  # weights exactly representable in float16: equal values, another dtype
        conv.weight.data.copy_(torch.randint(-4, 4, conv.weight.shape) / 4)
    check_inference_uses_current_weights(module, x.double())
    check_inference_uses_current_weights(module.half(), x.half())


def validation_scores(log):
    """{num_updates or None: {metric: value}} of the "valid on 'valid' subset" lines of a fairseq log."""
    found = {}
    for line in log.splitlines():
        if "valid on 'valid' subset" in line:
            stats = dict(re.findall(r"\| (\w+) ([\d.]+)(?= \||$)", line))
            found[int(stats["num_updates"]) if "num_updates" in stats else None] = {
                key: float(stats[key]) for key in ("loss", "l_mha", "l_ffn")}
    return found


@needs_teacher
def test_in_training_validation_scores_the_weights_of_its_update(tmp_path):
    """GhostBERT's distillation (eq 6) of the shipped teacher pruned to m = 1/4 with ghost modules after O, FFN1 and
    FFN2, stock fairseq-train with fairseq's Adam validating at updates 1 and 2: the second validation's losses (the
    MSE of the hidden states the ghost modules feed, printed to 5 decimals) equal fairseq-validate's on the checkpoint
    saved at update 2 (the first 100 valid sentences). Before issue 43 it scored update 1's ghost kernels: in-run
    loss 1.34269, l_ffn 0.73497 against fairseq-validate's 1.34222, 0.73464 (this test run against the old
    ghost_module.py; on the whole valid set 1.33215 against 1.33164)."""
    from test_distributed_equality import write_slice
    data = write_slice(tmp_path / "data", {"train": ("train", 400), "valid": ("valid", 100)})
    init = tmp_path / "init.pt"
    run_cli("user_dir.ghost.tools.prune", data, "--path", TEACHER, "--width-mult", "1/4", "--ghost-positions",
            "o,ffn1,ffn2", "--out", init, "--max-batches", "1", "--cpu")
    save = tmp_path / "distill"
    out = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *open(str(init) + ".flags").read().split(),
                  "--finetune-from-model", init, "--criterion", "ghost_distill", "--teacher-path", TEACHER,
                  "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "2048", "--log-format", "simple",
                  "--no-progress-bar", "--seed", "1", "--num-workers", "0", "--cpu", "--save-dir", save,
                  "--max-update", "2", "--validate-interval-updates", "1", "--save-interval-updates", "1",
                  "--no-epoch-checkpoints")
    in_run = validation_scores(out.stdout + out.stderr)
    assert sorted(in_run) == [1, 2], (out.stdout + out.stderr)[-3000:]
    assert abs(in_run[1]["loss"] - in_run[2]["loss"]) > 1e-3  # the model trained between the validations
    proc = run_cli("fairseq_cli.validate", data, "--user-dir", USER_DIR, "--task", "translation", "--path",
                   save / "checkpoint_1_2.pt", "--cpu", "--max-tokens", "2048", "--num-workers", "0")
    offline = validation_scores(proc.stdout + proc.stderr)
    assert list(offline) == [None], (proc.stdout + proc.stderr)[-3000:]
    for key, value in in_run[2].items():  # the same batches and model: equal but for the printed rounding
        assert abs(value - offline[None][key]) <= 1e-5, f"{key}: in-run {in_run[2]}, fairseq-validate {offline[None]}"
