"""Mixed precision (issue 31): every method trains in bfloat16 on real batches, and what needs float32
(softmax over kernels, KL and MSE sums, SVD and least squares, the folding of APC's matrices, means over
tokens) is computed in float32.

How the training tests run. GPU users train with ``fairseq-train --fp16 / --memory-efficient-fp16 / --bf16 /
--amp``; on this CPU-only machine stock fairseq 0.12.3.1 runs none of them as given:

* ``--bf16 --cpu``: ``fairseq/options.py`` turns every ``--bf16`` into ``--tpu``, and the Trainer then asks
  torch_xla for its device (``utils.get_tpu_device``): AttributeError, torch_xla is not installed;
* ``--fp16 --cpu``: FP16Optimizer flattens its float32 master weights on ``torch.cuda.current_device()``
  (AssertionError); with ``--fp16-no-flatten-grads`` (and with ``--memory-efficient-fp16``) it trains, but
  the first gradient overflow -- routine at the initial loss scale of 128: PET's projection warm-up and APC's
  activation KD (beta = 1e5) overflow at their first update -- reaches ``torch.tensor(0.0).cuda()`` in
  ``Trainer.train_step`` and ends the run, where a GPU would halve the scale and go on;
* ``--amp --cpu``: ``torch.cuda.amp.autocast`` in ``FairseqTask.train_step`` does nothing on a CPU (float32).

So each run here is ``fairseq_cli.train.main`` -- the code behind ``fairseq-train`` -- on a command line with
``--bf16 --cpu``, with one field reset after parsing: ``cfg.common.tpu = False``. The rest is what ``--bf16``
does on a GPU: the Trainer casts the model and the criterion to bfloat16 (``.to(dtype=torch.bfloat16)``) and
the batches' float tensors too, FP16Optimizer keeps float32 master weights (no loss scaling for bf16), and
the frozen teachers follow the student's dtype (common/teacher.py). Runs are in-process (``fairseq-train`` in
a subprocess would add ~5 s of imports to each) for 2 updates on the shipped teacher's Multi30k data (real
batches of up to 512 tokens) or on a tiny RTE slice, with a checkpoint after each update: the logged losses
and gradient norms must be finite (every number of every ``train_inner`` line), the saved weights finite,
the method's own parameters changed by the second update, and its frozen ones not.

The unit tests below check, on hand-built tensors, each dtype fix of the plug-in (each fails without it):
APC's ``fold_linear`` folds half-precision matrices in float32 (``finalize_()`` of a bf16 model then equals
``apc_finalize`` on the same weights), the mean-pooling head of ``hf_bert`` counts tokens in float32 (a
bfloat16 count is exact only up to 256), and a Variator plugin attached to a backbone already in half
precision takes the backbone's dtype (it stayed float32: "mat1 and mat2 must have the same dtype"); and
the paths that were already right and must stay so: KD and MSE losses reduce in float32, a group made
only of padding merges to a finite zero in bf16 and fp16, ghost modules and ghost attention give the
float32 result to half precision (bf16 and fp16) on a padded batch, and APC's initialisations run
SVD/QR/least squares in float64 whatever the dtype they are given.
"""
import copy
import json
import logging
import math
import os
import re

import pytest
import torch

from conftest import TEACHER, TEACHER_DIR, USER_DIR, needs_teacher
from test_baselines import PLAIN_STUDENT  # 2+2 layers, 32/24 wide, no dropout
from test_ddp_gradients import KD, TEACHER_ARCH, TINY_CAN, TINY_PET  # TEACHER_ARCH: the shipped teacher's shape

import user_dir  # noqa: F401  (registers the plug-in)

UPDATES = 2
DATA = os.path.join(TEACHER_DIR, "data-bin")
TINY_BERT = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "4"]  # tiny_glue_teacher's shape
GLUE_TASK = ["--num-classes", "2", "--init-token", "0", "--max-positions", "512", "--shorten-method", "truncate",
             "--batch-size", "16"]


# ---- fairseq-train --bf16, on this CPU ------------------------------------------------------------------
class Run:
    """What a bf16 training run left: its ``train_inner`` / ``valid`` log lines and its checkpoints."""

    def __init__(self, save_dir, train, valid):
        self.save_dir, self.train, self.valid = save_dir, train, valid

    def state(self, update=None):
        name = "checkpoint_last.pt" if update is None else f"checkpoint_1_{update}.pt"
        return torch.load(os.path.join(self.save_dir, name), map_location="cpu", weights_only=False)

    def changed(self, part="model"):
        """Tensors of ``part`` (``model`` or ``criterion``) that the last update changed."""
        before, after = self.state(UPDATES - 1)[part], self.state()[part]
        return {k for k, v in after.items() if v.is_floating_point() and not torch.equal(v, before[k])}


def train_bf16(caplog, save_dir, *argv, validate=False) -> Run:
    """``fairseq-train ARGV --bf16 --cpu`` for UPDATES updates (see the module docstring), checked: every
    logged number finite, a positive gradient norm at every update, a bf16 model (its saved weights are bf16
    values) with float32 master weights and Adam moments, all finite."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli.train import main

    flags = ["--optimizer", "adam", "--lr", "1e-3", "--bf16", "--cpu", "--max-update", str(UPDATES), "--seed", "1",
             "--save-dir", str(save_dir), "--save-interval-updates", "1", "--no-epoch-checkpoints",
             "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--num-workers", "0"]
    if not validate:
        flags.append("--disable-validation")
    args = options.parse_args_and_arch(options.get_training_parser(), [*map(str, argv), *flags])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.bf16 and cfg.common.tpu  # stock fairseq: --bf16 implies --tpu (this CPU has no XLA)
    cfg.common.tpu = False
    caplog.clear()
    with caplog.at_level(logging.INFO):
        main(cfg)
    lines = {name: [json.loads(r.getMessage()) for r in caplog.records if r.name == name]
             for name in ("train_inner", "valid")}
    run = Run(str(save_dir), lines["train_inner"], lines["valid"])
    assert len(run.train) == UPDATES, caplog.text[-3000:]
    for line in run.train + run.valid:
        numbers = {k: float(v) for k, v in line.items() if k not in ("epoch", "update")}
        assert all(math.isfinite(v) for v in numbers.values()), line
    assert all(float(line["gnorm"]) > 0 for line in run.train), run.train
    state = run.state()
    assert state["cfg"]["common"]["bf16"] and state["optimizer_history"][-1]["optimizer_name"] == "FP16Optimizer"
    for part in ("model", "criterion"):
        tensors = {k: v for k, v in (state.get(part) or {}).items() if v.is_floating_point()}
        bad = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
        assert not bad, (part, bad)
        # fairseq saves half-precision weights as float32; these are bf16 values: the model trained in bf16
        assert all(torch.equal(v, v.to(torch.bfloat16).float()) for v in tensors.values()), part
    moments = [t for s in state["last_optimizer_state"]["state"].values() for t in (s["exp_avg"], s["exp_avg_sq"])]
    assert moments and all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in moments)
    return run


@needs_teacher
def test_pet_warmup_then_kd_train_in_bfloat16(tmp_path, caplog):
    warm = train_bf16(caplog, tmp_path / "warm", DATA, "--user-dir", USER_DIR, *TINY_PET, "--max-tokens", "512",
                      "--criterion", "pet_warmup", *KD)
    shares = [sum(float(line[f"cls{c}"]) for c in range(4)) for line in warm.train]
    assert all(abs(s - 1) < 2e-3 for s in shares), warm.train  # Table 5's classes of every target token
    assert any(".self_attn.q_proj.weight" in k for k in warm.changed())
    kd = train_bf16(caplog, tmp_path / "kd", DATA, "--user-dir", USER_DIR, *TINY_PET, "--max-tokens", "512",
                    "--criterion", "kd", *KD, "--label-smoothing", "0.1",
                    "--finetune-from-model", tmp_path / "warm" / "checkpoint_last.pt")
    assert all(float(line["kd_loss"]) > 0 for line in kd.train)
    assert "encoder.layers.0.fc1.weight" in kd.changed()


@needs_teacher
def test_patient_kd_trains_in_bfloat16(tmp_path, caplog):
    run = train_bf16(caplog, tmp_path, DATA, "--user-dir", USER_DIR, *PLAIN_STUDENT, "--max-tokens", "512",
                     "--criterion", "patient_kd", *KD, "--label-smoothing", "0.1")
    assert all(float(line["pkd_loss"]) > 0 and float(line["kd_loss"]) > 0 for line in run.train)
    # the width maps (student 32/24 -> teacher 256) live in the criterion, train in bf16 with the student
    assert {"encoder_proj.weight", "decoder_proj.weight"} <= run.changed("criterion")
    assert "decoder.layers.1.fc2.weight" in run.changed()


@needs_teacher
def test_can_trains_with_kd_in_bfloat16(tmp_path, caplog):
    run = train_bf16(caplog, tmp_path, DATA, "--user-dir", USER_DIR, *TINY_CAN, "--max-tokens", "512",
                     "--criterion", "kd", *KD, "--label-smoothing", "0.1")
    # the joint attention over encoder and (future-masked, -inf) self keys: its own projections train
    assert {"decoder.layers.0.k_enc.weight", "decoder.layers.0.k_self.weight",
            "decoder.layers.0.v_self.weight"} <= run.changed()


@needs_teacher
@pytest.mark.parametrize("place", ["ffn", "att-kv"])
def test_variator_plugins_train_in_bfloat16(tmp_path, caplog, place):
    """Plugins around the FFN (merge, decompression adapter) and Att-KV (merged keys and values, groups made
    only of padding masked out of the attention); Att-KV with the translation task loss (Appendix B)."""
    extra = ["--variator-task-weight", "0.5"] if place == "att-kv" else []
    run = train_bf16(caplog, tmp_path, DATA, "--user-dir", USER_DIR, "--task", "variator_translation",
                     "--variator-backbone", TEACHER, "--variator-ratio", "4", "--variator-place", place,
                     "--variator-bottleneck", "8", *extra, "--arch", "transformer_iwslt_de_en", *TEACHER_ARCH,
                     "--max-tokens", "512", "--criterion", "variator_distill")
    assert all(float(line["mse"]) > 0 for line in run.train)
    changed = run.changed()
    assert changed and all(k.startswith("variator.plugins.k4.") for k in changed), changed  # the backbone is frozen


@needs_teacher
@pytest.mark.parametrize("ghost", [
    ["--ghost-positions", "qk,o,ffn1,ffn2", "--ghost-conv", "conv1d_f", "--ghost-conv1d-f-length", "128",
     "--ghost-lambda-pred", "1"],
    ["--ghost-positions", "v,o,ffn2", "--ghost-unshared", "--ghost-features", "2"],
], ids=["qk-o-ffn1-ffn2-conv1d_f-pred", "v-o-ffn2-dwconv-unshared"])
def test_ghost_modules_distil_in_bfloat16(tmp_path, caplog, ghost):
    """Every ghost position: after QK (Conv2D on -inf-masked attention maps), after V (DWConv), after O, FFN1,
    FFN2 with Conv1D_F or the per-head DWConv; eq 6 with the prediction loss. (Conv1D_S and Conv2D after O /
    FFN2 are the same GhostLinear with another kernel: bf16 on hand-built tensors below.)"""
    run = train_bf16(caplog, tmp_path, DATA, "--user-dir", USER_DIR, "--arch", "ghost_transformer_iwslt_de_en",
                     *TEACHER_ARCH, "--ghost-heads", "2", "--ghost-ffn-dim", "512", *ghost, "--max-tokens", "512",
                     "--criterion", "ghost_distill", *KD)
    assert all(float(line["l_mha"]) > 0 and float(line["l_ffn"]) > 0 for line in run.train)
    assert any(".ghost.weight" in k for k in run.changed())


@needs_teacher
def test_apc_activation_kd_trains_and_finalizes_in_bfloat16(tmp_path, caplog):
    """FFN, encoder/decoder/cross attention and embedding compression, APC's activation KD (eq 4 norms in
    float32); then the bf16 model folds (finalize_) into the same dense weights as apc_finalize computes."""
    from fairseq import checkpoint_utils

    from user_dir.apc.tools.finalize import finalize_state_dict

    run = train_bf16(caplog, tmp_path, DATA, "--user-dir", USER_DIR, "--arch", "apc_transformer", *TEACHER_ARCH,
                     "--apc-encoder-ffn-dims", "128", "--apc-decoder-ffn-dims", "0:128", "--apc-encoder-attn-dims",
                     "1:128", "--apc-decoder-attn-dims", "128", "--apc-cross-attn-dims", "64",
                     "--apc-encoder-embed-dims", "0:192,1:192", "--apc-decoder-embed-dims", "2:160",
                     "--max-tokens", "512", "--criterion", "apc_activation_kd")
    assert all(float(line["reconstruction"]) > 0 for line in run.train)
    changed = run.changed()
    assert {"encoder.layers.0.fc1.D", "encoder.layers.0.pre_scaling.weight", "decoder.layers.0.encoder_attn.q_proj.D",
            "decoder.layers.2.post_scaling.weight"} <= changed
    assert not any(k.endswith(".linear.weight") for k in changed)  # the original W: frozen ('Compr. only')
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(run.save_dir, "checkpoint_last.pt")], arg_overrides={"data": DATA})
    model = models[0].to(torch.bfloat16).eval()
    heads = {"encoder": 4, "decoder": 4}
    expected = finalize_state_dict({k: v.clone() for k, v in model.state_dict().items()}, heads=heads)
    task.load_dataset("valid")
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(8)])
    with torch.no_grad():
        unfolded = model(**sample["net_input"])[0].float()
        model.finalize_()
        folded = model(**sample["net_input"])[0].float()
    for k, v in model.state_dict().items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, expected[k]), k
    assert torch.isfinite(folded).all()
    assert (folded - unfolded).abs().max() < 0.05 * unfolded.abs().max()  # the same function, to bf16 rounding


@pytest.mark.parametrize("method", ["ghost", "apc", "variator"])
def test_glue_encoders_train_and_validate_in_bfloat16(tmp_path, caplog, tiny_glue_teacher, method):
    """The GLUE (hf_bert) side of each method, right-padded sentence batches: ghost modules after QK and FFN2
    with the prediction loss through a mean-pooling head, APC's FFN and attention compression, Variator
    plugins with the task loss; validation in bf16 reports a finite accuracy."""
    data, teacher = tiny_glue_teacher["data"], str(tiny_glue_teacher["teacher"])
    flags = {
        "ghost": ["--task", "sentence_prediction", "--arch", "ghost_hf_bert", *TINY_BERT, "--ghost-heads", "2",
                  "--ghost-ffn-dim", "32", "--ghost-positions", "qk,ffn2", "--classification-pooling", "mean",
                  "--criterion", "ghost_distill", "--teacher-path", teacher, "--ghost-lambda-pred", "1"],
        "apc": ["--task", "sentence_prediction", "--arch", "apc_hf_bert", *TINY_BERT, "--apc-encoder-ffn-dims", "1:16",
                "--apc-encoder-attn-dims", "16", "--criterion", "glue_sentence_prediction", "--glue-task", "RTE"],
        "variator": ["--task", "variator_sentence_prediction", "--variator-backbone", teacher, "--variator-ratio", "4",
                     "--variator-bottleneck", "8", "--variator-task-weight", "1", "--arch", "hf_bert", *TINY_BERT,
                     "--criterion", "variator_distill", "--glue-task", "RTE"],
    }[method]
    run = train_bf16(caplog, tmp_path, data, "--user-dir", USER_DIR, *GLUE_TASK, *flags, validate=True)
    assert run.valid and 0 <= float(run.valid[-1]["valid_accuracy"]) <= 100, run.valid
    assert run.changed()


# ---- the dtype fixes, on hand-built tensors --------------------------------------------------------------
def test_fold_linear_folds_half_precision_in_float32():
    """Eqs 1-2 of bf16 / fp16 matrices: the float32 fold rounded once (the bf16 chain U W D rounded every
    product: 0.03 off where float32 is 0.02 off the float64 fold); float64 stays float64."""
    from user_dir.apc.reparameterised_linear import fold_linear

    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(64, 32, generator=g), torch.randn(64, generator=g), 0.3 * torch.randn(16, 32, generator=g),
             torch.randn(32, generator=g), 0.3 * torch.randn(64, 8, generator=g), torch.randn(8, generator=g),
             0.1 * torch.randn(16, 8, generator=g)]  # weight, bias, U, b_U, D, b_D, B
    for dtype in (torch.bfloat16, torch.float16):
        half = [p.to(dtype) for p in parts]
        w, b = fold_linear(*half)
        w32, b32 = fold_linear(*(p.float() for p in half))
        assert w.dtype == b.dtype == dtype
        assert torch.equal(w, w32.to(dtype)) and torch.equal(b, b32.to(dtype)), dtype
    assert fold_linear(*(p.double() for p in parts))[0].dtype == torch.float64


def test_mean_pooling_counts_tokens_in_float32():
    """301 real tokens, one of them 2, the rest 1: the mean 302/301 rounds to 1 in bfloat16; counted in
    bfloat16, 301 tokens were 300 and the mean 302/300 rounded to 1.0078."""
    from user_dir.bert.hf_bert_model import MeanPoolClassificationHead

    head = MeanPoolClassificationHead(input_dim=4, inner_dim=4, num_classes=2, activation_fn="tanh",
                                      pooler_dropout=0.0)
    pooled = {}
    head.dense.register_forward_hook(lambda m, args, out: pooled.__setitem__("x", args[0]))
    head.to(torch.bfloat16)
    features = torch.ones(2, 400, 4, dtype=torch.bfloat16)
    features[:, 0] = 2.0
    padding = torch.zeros(2, 400, dtype=torch.bool)
    padding[0, 301:] = True
    padding[1, 1:] = True
    head(features, padding_mask=padding)
    assert pooled["x"].dtype == torch.bfloat16
    assert pooled["x"][0].tolist() == [1.0] * 4 and pooled["x"][1].tolist() == [2.0] * 4


@needs_teacher
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_plugin_attached_to_a_half_precision_backbone_runs_in_its_dtype(tmp_path, dtype):
    """A plugin file attached to a backbone already in half precision (model.half() before attaching): the
    plugin takes the backbone's dtype and the plugged model computes the float32 plugged model's output to
    half precision. It stayed float32 (the container took the dtype of its own parameters, none yet)."""
    from fairseq import checkpoint_utils

    from user_dir.variator.compression_plugin import PluginConfig
    from user_dir.variator.plugged_encoder import (VariatorPlugins, attach_plugin_files, backbone_signature,
                                                   write_plugin_file)

    def backbone():
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([TEACHER], arg_overrides={"data": DATA})
        return models[0].eval(), task

    model, task = backbone()
    torch.manual_seed(0)
    plugin_set = VariatorPlugins(model).add(PluginConfig(ratio=4, layers=(0, 1, 2), bottleneck=8))
    with torch.no_grad():
        for p in plugin_set.parameters():
            p.normal_(0, 0.05)
    path = str(tmp_path / "k4.pt")
    write_plugin_file(path, {"config": plugin_set.config.as_dict(), "backbone": backbone_signature(model),
                             "backbone_fingerprint": None, "state_dict": plugin_set.state_dict()})
    task.load_dataset("valid")
    sample = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(4)])
    net = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths", "prev_output_tokens")}
    outputs = {}
    for name, target in (("float32", torch.float32), ("half", dtype)):
        plugged, _ = backbone()
        plugged.to(target)
        attach_plugin_files(plugged, path).use(4)
        assert {p.dtype for p in plugged.variator.parameters()} == {target}
        with torch.no_grad():
            outputs[name] = plugged(**net)[0].float()
    assert torch.isfinite(outputs["half"]).all()
    scale = outputs["float32"].abs().max()
    assert (outputs["half"] - outputs["float32"]).abs().max() < 0.05 * scale


# ---- what was already right and must stay so ------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kd_and_hidden_state_losses_reduce_in_float32(dtype):
    """Word KD (KL over a 7,896-word vocabulary), Patient-KD's normalised MSE and GhostBERT's masked MSE on
    half-precision inputs: float32 results equal to the float32 computation on the same (upcast) values --
    a reduction in half precision is 1e-3 off -- and a sentence made only of padding adds nothing."""
    from user_dir.common.kd_losses import normalized_hidden_mse, word_kd_loss
    from user_dir.ghost.distillation_criterion import masked_mse

    g = torch.Generator().manual_seed(0)
    s, t = (4 * torch.randn(3, 9, 7896, generator=g)).to(dtype), (4 * torch.randn(3, 9, 7896, generator=g)).to(dtype)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1] = True  # a whole row of padding
    pad[2, 4:] = True
    kd = word_kd_loss(s, t, temperature=2.0, pad_mask=pad)
    assert kd.dtype == torch.float32 and torch.isfinite(kd)
    assert torch.allclose(kd, word_kd_loss(s.float(), t.float(), temperature=2.0, pad_mask=pad), rtol=1e-6)
    hs, ht = torch.randn(3, 9, 256, generator=g).to(dtype), torch.randn(3, 9, 256, generator=g).to(dtype)
    mse = normalized_hidden_mse(hs, ht, pad_mask=pad)
    assert mse.dtype == torch.float32
    assert torch.allclose(mse, normalized_hidden_mse(hs.float(), ht.float(), pad_mask=pad), rtol=1e-6)
    keep = (~pad).t().unsqueeze(-1).float()  # T x B x 1, as the criterion builds it
    hs_t, ht_t = hs.transpose(0, 1), ht.transpose(0, 1)
    ghost = masked_mse(hs_t, ht_t, keep)
    assert ghost.dtype == torch.float32
    assert torch.allclose(ghost, masked_mse(hs_t.float(), ht_t.float(), keep), rtol=1e-6)
    all_pad = torch.ones(3, 9, dtype=torch.bool)
    assert word_kd_loss(s, t, pad_mask=all_pad) == 0 and normalized_hidden_mse(hs, ht, pad_mask=all_pad) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_group_made_only_of_padding_merges_to_a_finite_zero(dtype):
    """Variator's merge softmax masks padding with -inf: a group with no real token gets weight 0 (not
    softmax of all -inf, NaN), in half precision, forward and backward; Att-KV masks it as a key."""
    from user_dir.variator.compression_plugin import CompressionPlugin, PluginConfig, group_padding_mask

    torch.manual_seed(0)
    C, k = 16, 4
    plugin = CompressionPlugin(C, PluginConfig(ratio=k, layers=(0,), bottleneck=4))
    with torch.no_grad():
        for p in plugin.parameters():
            p.normal_(0, 0.3)
    plugin.to(dtype)
    x = torch.randn(9, 2, C, dtype=dtype, requires_grad=True)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, :8] = True  # one real token (left-padded, as fairseq's sources): groups 1 and 2 hold only padding
    merged, groups = plugin.compression(x, pad)
    assert merged.dtype == dtype and torch.isfinite(merged).all()
    assert merged[1:, 1].abs().sum() == 0 and group_padding_mask(groups)[1].tolist() == [False, True, True]
    out = plugin.decompression(merged, groups)
    out.float().pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in plugin.parameters())
    alone, _ = plugin.compression(x[8:, 1:].detach(), None)  # the one token alone: its group is itself
    assert torch.equal(alone[0, 0], merged[0, 1].detach())


def test_ghost_modules_in_half_precision_compute_the_float32_result_with_padding():
    """Every ghost convolution (after O / FFN2 as GhostLinear, after FFN1 as GhostActivation, after QK and
    after V in GhostAttention with -inf key masks) in bf16 and fp16 on a right-padded batch (one sentence of
    a single token): finite values and gradients, the float32 module's output to half precision."""
    from dataclasses import replace

    from user_dir.ghost.ghost_attention import GhostAttention
    from user_dir.ghost.ghost_module import GhostActivation, GhostConfig, GhostLinear

    T, B, C = 7, 3, 16
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 1:] = True
    base = GhostConfig(conv1d_f_length=T)
    modules = {f"linear-{c}": GhostLinear(C, C, 2, replace(base, conv=c))
               for c in ("dwconv", "conv1d_s", "conv1d_f", "conv2d")}
    modules["linear-unshared"] = GhostLinear(C, C, 2, replace(base, shared=False, features=2))
    modules["ffn1"] = GhostActivation(torch.relu, C, base)
    modules["qk"] = GhostAttention(C, 4, 2, "qk", base)
    modules["v"] = GhostAttention(C, 4, 2, "v", base)
    torch.manual_seed(0)
    x32 = torch.randn(T, B, C)
    for name, m32 in modules.items():
        results = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            m = copy.deepcopy(m32).to(dtype)
            x = x32.detach().to(dtype).requires_grad_()
            if name in ("qk", "v"):
                out = m(x, x, x, key_padding_mask=pad)[0]
            else:
                m.padding_mask = pad
                out = m(x)
            out.float().pow(2).sum().backward()
            assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(x.grad).all(), (name, dtype)
            assert all(torch.isfinite(p.grad).all() for p in m.parameters()), (name, dtype)
            results[dtype] = out.detach().float()
        for dtype, tolerance in ((torch.bfloat16, 0.03), (torch.float16, 0.005)):
            diff = (results[dtype] - results[torch.float32]).abs().max()
            assert diff < tolerance * results[torch.float32].abs().max(), (name, dtype, diff)


def test_apc_initialisations_run_in_float64_whatever_they_are_given():
    """SVD, QR and least squares (eq. 11's D^Q/D^K, eq. 9's D^V/U^O, the SVD and least-squares FFN
    initialisations, the embedding basis and its U fit, compressed LayerNorms) take bf16 weights and
    activations -- torch.linalg has no bf16 kernels -- and give what they give on the same values in float64
    (to LAPACK's rounding); a compressed attention in bf16 gets the float64 solution, rounded once to bf16."""
    from fairseq.modules import MultiheadAttention

    from user_dir.apc.attention_compression import CompressedAttention, init_attention, qk_svd_solution
    from user_dir.apc.embedding_compression import compressed_norm, fit_U
    from user_dir.apc.initialisations import least_squares_U, svd_D

    g = torch.Generator().manual_seed(0)
    bf = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    A1, A2, W, b, X = bf(40, 8), bf(30, 8), bf(32, 16), bf(32), bf(50, 16)
    for got, want in ((qk_svd_solution(A1, A2, 4), qk_svd_solution(A1.double(), A2.double(), 4)),
                      (svd_D(W, 8), svd_D(W.double(), 8)),
                      (least_squares_U(X, W, b, svd_D(W, 8), torch.relu),
                       least_squares_U(X.double(), W.double(), b.double(), svd_D(W, 8), torch.relu)),
                      (fit_U(X, svd_D(W.t(), 8)), fit_U(X.double(), svd_D(W.t(), 8)))):
        for a, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert a.dtype == torch.float64 and torch.allclose(a, e, rtol=1e-9, atol=1e-12)  # LAPACK's rounding
    norm = torch.nn.LayerNorm(16).to(torch.bfloat16)
    assert all(t.dtype == torch.float64 for t in compressed_norm(norm, svd_D(W.t(), 8)))
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 2, self_attention=True)
    queries = [bf(9, 16), bf(6, 16)]
    for method in ("reconstructive-svd", "reconstructive-random"):  # eq. 11 by SVD / by least squares
        attns = {d: CompressedAttention(copy.deepcopy(mha).to(d), 8) for d in (torch.float64, torch.bfloat16)}
        attns[torch.float64].load_state_dict({k: v.double() for k, v in attns[torch.bfloat16].state_dict().items()})
        for dtype, attn in attns.items():
            init_attention(attn, method, [q.to(dtype) for q in queries], causal=True)
        for name in ("q_proj.D", "k_proj.D", "v_proj.D", "out_proj.U"):
            half, full = (attns[d].get_parameter(name) for d in (torch.bfloat16, torch.float64))
            assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
            assert torch.allclose(half.double(), full, rtol=2 ** -8, atol=1e-30), (method, name)  # one rounding


def test_fc_train_bf16_trains_where_stock_bf16_needs_a_tpu(multi30k_slice, tmp_path):
    """``fc-train-bf16`` is fairseq-train with --bf16's implied --tpu undone when torch_xla is absent."""
    from conftest import TINY_TRANSFORMER, TRAIN_FLAGS, USER_DIR, run_cli

    args = [multi30k_slice, "--user-dir", USER_DIR, *TINY_TRANSFORMER, *TRAIN_FLAGS, "--max-update", "2", "--bf16",
            "--cpu", "--no-save", "--disable-validation"]
    stock = run_cli("fairseq_cli.train", *args, "--save-dir", tmp_path / "stock", check=False)
    assert stock.returncode != 0 and "xla" in (stock.stdout + stock.stderr).lower()
    ours = run_cli("user_dir.tools.train_bf16", *args, "--save-dir", tmp_path / "ours")
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+) \|", ours.stdout + ours.stderr)]
    assert "num_updates 2" in ours.stdout + ours.stderr and losses and all(math.isfinite(x) for x in losses)
