"""GhostBERT: ghost-module maths on hand-built tensors (the cheap shared form equals the per-head
form, softmax kernels, padding), importance against finite differences and pruning against masking
on a real trained model, and the whole path through the stock CLIs (ghost_prune, fairseq-train
distillation and resume, fairseq-generate), plus clear errors."""
import copy
import os
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import USER_DIR, run_cli

import user_dir  # noqa: F401  (registers the plug-in)
from user_dir.common.structured_pruning import transformer_encoder
from user_dir.common.teacher import FrozenTeacher, TeacherConfigError
from user_dir.ghost.distillation_criterion import GhostDistillCriterion
from user_dir.ghost.ghost_attention import GhostAttention
from user_dir.ghost.ghost_model import ghost_config, ghost_defaults, ghost_model_args, kept_widths, parse_positions
from user_dir.ghost.ghost_module import (GhostActivation, GhostConfig, GhostConfigError, GhostConv, GhostLinear,
                                         depthwise_conv_time, flops_outside_torch_counter)
from user_dir.ghost.importance import ImportanceMasks, accumulate_importance
from user_dir.ghost.rewiring import kept_counts, load_pruned, prune_plan


def randomise(module, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return module


def padding(lengths, T, left=False):
    mask = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]
    return mask.flip(1) if left else mask


# ---- the ghost module ------------------------------------------------------------------------------
def test_shifted_depthwise_conv_equals_torch_grouped_conv_with_gradients():
    torch.manual_seed(0)
    for T in (1, 2, 7):
        for k, O in ((1, 1), (3, 1), (5, 2), (9, 1)):
            C, B = 4, 3
            x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
            w = torch.randn(C, O, k, dtype=torch.float64, requires_grad=True)
            ours = depthwise_conv_time(x, w)
            ref = torch.nn.functional.conv1d(x.permute(1, 2, 0), w.reshape(C * O, 1, k), padding=k // 2,
                                             groups=C).view(B, C, O, T).permute(3, 0, 1, 2)
            assert torch.allclose(ours, ref, atol=1e-12), (T, k, O)
            probe = torch.randn_like(ref)
            for a, b in zip(torch.autograd.grad((ours * probe).sum(), (x, w)), torch.autograd.grad((ref * probe).sum(), (x, w))):
                assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("features", [1, 2])
def test_cheap_shared_form_equals_the_per_head_form(features):
    torch.manual_seed(0)
    T, B, M, dh, d = 6, 3, 4, 5, 8
    layer = randomise(GhostLinear(M * dh, d, M, GhostConfig(features=features)).double())
    x = torch.randn(T, B, M * dh, dtype=torch.float64)
    layer.padding_mask = padding([6, 4, 1], T, left=True)
    cheap = layer(x)
    per_head = layer.per_head_output(x)
    assert torch.allclose(cheap, per_head, atol=1e-12)
    # and the ghost part is not zero: the test compares something
    assert (cheap - torch.nn.functional.linear(x, layer.weight, layer.bias)).abs().max() > 1e-3


def test_unshared_modules_differ_per_head_and_reduce_to_shared_when_equal():
    torch.manual_seed(0)
    T, B, M, dh, d = 5, 2, 3, 4, 6
    unshared = randomise(GhostLinear(M * dh, d, M, GhostConfig(shared=False)).double())
    shared = GhostLinear(M * dh, d, M, GhostConfig()).double()
    shared.load_state_dict({"weight": unshared.weight, "bias": unshared.bias,
                            "ghost.weight": unshared.ghost.weight[:1]})
    x = torch.randn(T, B, M * dh, dtype=torch.float64)
    assert not torch.allclose(unshared(x), shared(x))
    with torch.no_grad():
        unshared.ghost.weight.copy_(unshared.ghost.weight[:1].expand_as(unshared.ghost.weight))
    assert torch.allclose(unshared(x), shared(x), atol=1e-12)
    assert unshared.ghost_parameter_count() == M * d * 3 and shared.ghost_parameter_count() == d * 3


def test_softmax_kernels_keep_the_input_scale_and_the_ablation_does_not():
    T, C = 9, 4
    x = torch.full((T, 1, 1, C), 2.5)
    for k in (1, 3, 5):
        conv = randomise(GhostConv(C, 1, GhostConfig(kernel_size=k)))
        y = conv(x)[:, :, 0]  # T x 1 x C
        inner = slice(k // 2, T - k // 2)  # positions whose window lies inside the sequence
        assert torch.allclose(y[inner], torch.full_like(y[inner], 2.5), atol=1e-6)
    raw = randomise(GhostConv(C, 1, GhostConfig(softmax=False)))
    assert not torch.allclose(raw(x)[4, 0, 0], torch.full((C,), 2.5))


def test_relu_ablation_lets_negative_ghost_features_through():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 12)
    relu = randomise(GhostLinear(12, 6, 2, GhostConfig()))
    linear = randomise(GhostLinear(12, 6, 2, GhostConfig(relu=False)))
    base = torch.nn.functional.linear(x, relu.weight, relu.bias)
    assert (relu(x) - base).min() >= 0
    assert (linear(x) - base).min() < 0


def hand_ghost(v, kernel, mask):
    """ReLU(DWConv(v)) by hand: out[t, b, c] = sum_m kernel[c, m] v[t - 1 + m, b, c] (k = 3, zeros outside the
    sequence), with v and the result zeroed where ``mask`` (B x T) marks padding."""
    keep = (~mask).t().unsqueeze(-1).to(v.dtype)
    padded = torch.nn.functional.pad(v * keep, (0, 0, 0, 0, 1, 1))
    return torch.relu(sum(kernel[:, m] * padded[m: m + v.size(0)] for m in range(3))) * keep


def test_ghost_after_ffn1_reads_the_intermediate_layer_after_its_activation():
    """After FFN1 (section 4.2, Figure 4(d)): with a hand-set kernel the module returns A + ReLU(conv(A)) for
    A = GELU(z), the intermediate layer's output, not the pre-activation placement GELU(z + ReLU(conv(z)));
    --ghost-unshared is refused there, naming the flag."""
    from fairseq.utils import get_activation_fn
    torch.manual_seed(0)
    T, B, C = 6, 2, 5
    gelu = get_activation_fn("gelu")
    module = GhostActivation(gelu, C, GhostConfig()).double()
    kernel = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]],
                          dtype=torch.float64)
    with torch.no_grad():
        module.ghost.weight.copy_(kernel.log().view(1, 1, C, 3))  # softmax over the taps gives the kernel back
    z = 2 * torch.randn(T, B, C, dtype=torch.float64)
    module.padding_mask = mask = padding([6, 4], T)
    a = gelu(z)
    assert torch.allclose(module(z), a + hand_ghost(a, kernel, mask), atol=1e-12)
    assert not torch.allclose(module(z), gelu(z + hand_ghost(z, kernel, mask)), atol=1e-3)
    assert module.ghost_parameter_count() == C * 3 and module.ghost_flops(T) == 2 * T * C * 3
    with pytest.raises(GhostConfigError, match="--ghost-unshared with --ghost-positions ffn1"):
        GhostActivation(gelu, C, GhostConfig(shared=False))


@pytest.mark.parametrize("conv", ["dwconv", "conv1d_s", "conv1d_f", "conv2d"])
def test_padding_never_reaches_real_tokens_and_ghost_flops_match_torch_counter(conv):
    torch.manual_seed(0)
    T, B, d = 7, 3, 6
    layer = randomise(GhostLinear(d, d, 2, GhostConfig(conv=conv, conv1d_f_length=9)))
    lengths = [7, 5, 2]
    mask = padding(lengths, T)
    x = torch.randn(T, B, d)
    noisy = x.clone()
    noisy[mask.t()] = 1e3
    layer.padding_mask = mask
    y, y_noisy = layer(x), layer(noisy)
    real = ~mask.t()
    assert torch.allclose(y[real], y_noisy[real], atol=1e-5)
    # a sentence alone (no padding) gives what it gives inside the padded batch
    layer.padding_mask = None
    alone = layer(x[:5, 1:2])
    assert torch.allclose(alone[:, 0], y[:5, 1], atol=1e-5)
    # FLOPs of the ghost part: analytic (Appendix B.4's convention) against PyTorch's counter, on torch's
    # grouped convolution for DWConv (ours runs as shifted multiply-adds, which the counter does not see)
    with FlopCounterMode(display=False) as counter:
        if conv == "dwconv":
            torch.nn.functional.conv1d(x[:, :1].permute(1, 2, 0), layer.ghost.weight.view(d, 1, 3), padding=1, groups=d)
        else:
            layer.ghost(x[:, :1].unsqueeze(2))
    assert counter.get_total_flops() == layer.ghost_flops(T)
    assert flops_outside_torch_counter(layer, T) == (layer.ghost_flops(T) if conv == "dwconv" else 0)


def test_conv1d_f_is_the_papers_equation_on_each_sentences_own_positions():
    """Section 4.1: O[i, c] = sum_j sum_m W[i, j, m] X[j, c - k//2 + m], W in R^{n x n x k} (softmax over
    each output channel's n x k weights), channel i = the i-th real token whatever the padding."""
    torch.manual_seed(0)
    n, k, C, T = 6, 3, 5, 4
    conv = randomise(GhostConv(C, 1, GhostConfig(conv="conv1d_f", conv1d_f_length=n)).double())
    assert conv.parameter_count() == n * n * k and conv.flops(n) == 2 * n * n * k * C
    x = torch.randn(T, C, dtype=torch.float64)
    W = torch.softmax(conv.weight[0].reshape(n, -1), -1).view(n, n, k)
    X = torch.nn.functional.pad(torch.cat([x, x.new_zeros(n - T, C)]), (k // 2, k // 2))  # padded to n, and in c
    expected = torch.stack([torch.stack([sum(W[i, j, m] * X[j, c + m] for j in range(n) for m in range(k))
                                         for c in range(C)]) for i in range(T)])
    alone = conv(x[:, None, None])[:, 0, 0]
    assert torch.allclose(alone, expected, atol=1e-12)
    # inside a batch, left- or right-padded with garbage-free zeros (the caller zeroes padding), the same
    for left in (True, False):
        mask = padding([T, T + 2], T + 2, left=left)
        batch = torch.zeros(T + 2, 2, 1, C, dtype=torch.float64)
        batch[~mask[0], 0, 0] = x
        batch[:, 1, 0] = torch.randn(T + 2, C, dtype=torch.float64)
        y = conv(batch, mask)[:, :, 0]
        assert torch.allclose(y[~mask[0], 0], expected, atol=1e-12)
    with pytest.raises(GhostConfigError, match="--ghost-conv1d-f-length 6"):
        conv(torch.zeros(n + 1, 1, 1, C, dtype=torch.float64))
    with pytest.raises(GhostConfigError, match="--ghost-conv1d-f-length"):
        GhostConfig(conv1d_f_length=0)


def fairseq_attention_with_copied_heads(ours, copies_of):
    """fairseq's own MultiheadAttention of all N_H heads whose projections named in ``copies_of`` are
    copies of our single kept head's, the others ours."""
    from fairseq.modules import MultiheadAttention
    H, dh = ours.total_heads, ours.head_dim
    ref = MultiheadAttention(ours.q_proj.in_features, H, self_attention=True).double().eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            src = getattr(ours, name)
            if name[0] in copies_of:
                getattr(ref, name).weight.copy_(src.weight.repeat(H, 1))
                getattr(ref, name).bias.copy_(src.bias.repeat(H))
            else:
                getattr(ref, name).load_state_dict(src.state_dict())
        ref.out_proj.load_state_dict(ours.out_proj.state_dict())
    return ref


@pytest.mark.parametrize("position", ["qk", "v"])
def test_attention_positions_match_fairseq_attention_counts_and_padding(position):
    """After QK / after V (section 4.2): with kernel size 1 (softmax -> the identity kernel), M = 1 and no
    ReLU, every ghost head's map (qk) / context (v) equals the kept head's, so the layer equals fairseq's
    MultiheadAttention with all heads copies of the kept one; parameter and FLOP counts equal closed forms;
    padding never reaches real tokens."""
    torch.manual_seed(0)
    d, H, T = 8, 4, 6
    dh = d // H
    x = torch.randn(T, 3, d, dtype=torch.float64)
    mask = padding([6, 4, 2], T, left=True)
    ours = randomise(GhostAttention(d, H, 1, position, GhostConfig(kernel_size=1, relu=False)).double().eval())
    ref = fairseq_attention_with_copied_heads(ours, "qk" if position == "qk" else "qkv")
    out, _ = ours(x, x, x, key_padding_mask=mask, need_weights=False)
    expected, _ = ref(x, x, x, key_padding_mask=mask, need_weights=False)
    real = ~mask.t()
    assert torch.allclose(out[real], expected[real], atol=1e-12)

    for M in (1, 3):
        k = 3
        layer = randomise(GhostAttention(d, H, M, position, GhostConfig(kernel_size=k)).double().eval(), seed=M)
        F_ = H - M
        ghost = F_ * M * k * k if position == "qk" else F_ * M * dh * k
        assert layer.ghost_parameter_count() == ghost
        shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
        assert shapes["q_proj.weight"] == shapes["k_proj.weight"] == (M * dh, d)
        assert shapes["v_proj.weight"] == ((H if position == "qk" else M) * dh, d) and shapes["out_proj.weight"] == (d, H * dh)
        # FLOPs of one sequence: torch's counter + the DWConv counted analytically = the closed form
        one = x[:, :1]
        with FlopCounterMode(display=False) as counter:
            layer(one, one, one)
        v_heads = H if position == "qk" else M
        ghost_flops = 2 * F_ * M * k * k * T * T if position == "qk" else 2 * T * F_ * M * dh * k
        closed = (2 * T * d * dh * (2 * M + v_heads) + 2 * M * T * T * dh + 2 * v_heads * T * T * dh
                  + 2 * T * H * dh * d + ghost_flops)  # projections Q, K, V; scores; contexts; O (all H heads); ghost
        assert counter.get_total_flops() + flops_outside_torch_counter(layer, T) == closed
        assert layer.ghost_flops(T) == ghost_flops
        # padding: garbage at padding positions changes nothing on real tokens, and a sentence alone
        # gives what it gives in the padded batch
        noisy = x.clone()
        noisy[mask.t()] = 1e3
        y, _ = layer(x, x, x, key_padding_mask=mask)
        y_noisy, _ = layer(noisy, noisy, noisy, key_padding_mask=mask)
        assert torch.allclose(y[real], y_noisy[real], atol=1e-10)
        alone_in = x[-2:, 2:3]
        alone, _ = layer(alone_in, alone_in, alone_in)
        assert torch.allclose(alone[:, 0], y[-2:, 2], atol=1e-12)
        # the ghost heads matter
        with torch.no_grad():
            layer.out_proj.weight[:, M * dh:] = 0
        assert not torch.allclose(layer(x, x, x, key_padding_mask=mask)[0][real], y[real], atol=1e-6)
    with pytest.raises(GhostConfigError, match="--ghost-heads"):
        GhostAttention(d, H, H, position, GhostConfig())


def test_bert_base_costs_of_conv1d_f_and_the_attention_positions_are_the_closed_forms_and_the_papers():
    """At BERT-base (L = 12, d = 768, N_H = 12, n = 128, k = 3): Conv1D_F adds n^2 k parameters and 2 n^2 k d
    FLOPs per module (Table 5: 47M / 7.6G against DWConv's 46M / 5.8G at m = 3/12, two modules a layer);
    after QK / after V at m = 1/12 add the unpruned V and O (O) and their ghost modules (Table 6: 45M and
    39M against 32M after O)."""
    from user_dir.common.structured_pruning import PrunedMultiheadAttention
    L, d, H, n, k, M = 12, 768, 12, 128, 3, 1
    dh, G = d // H, H - M
    conv1d_f = GhostLinear(d, d, H, GhostConfig(conv="conv1d_f"))
    assert conv1d_f.ghost_parameter_count() == n * n * k and conv1d_f.ghost_flops(n) == 2 * n * n * k * d
    assert round(2 * L * n * n * k / 1e6) == 47 - 46
    assert abs(2 * L * conv1d_f.ghost_flops(n) / 1e9 - (7.6 - 5.8)) < 0.05
    pruned = sum(p.numel() for p in PrunedMultiheadAttention(d, H, M).parameters())
    qk = sum(p.numel() for p in GhostAttention(d, H, M, "qk", GhostConfig()).parameters()) - pruned
    v = sum(p.numel() for p in GhostAttention(d, H, M, "v", GhostConfig()).parameters()) - pruned
    assert qk == 2 * G * dh * d + G * dh + G * M * k * k  # V rows + V bias + O columns, Conv2D kernels
    assert v == G * dh * d + G * M * dh * k  # O columns, DWConv kernels
    assert round(L * qk / 1e6) == 45 - 32 and round(L * v / 1e6) == 39 - 32


def test_bad_ghost_settings_name_their_flag():
    for k in (0, 2, -3):
        with pytest.raises(GhostConfigError, match="--ghost-kernel-size"):
            GhostConfig(kernel_size=k)
    with pytest.raises(GhostConfigError, match="--width-mult"):
        kept_counts("1/12", 4, 1024)  # floor(4/12) = 0 heads
    with pytest.raises(GhostConfigError, match="--width-mult"):
        kept_counts("3/2", 4, 1024)
    assert kept_counts("2/4", 4, 1024) == (2, 512) and kept_counts("3/12", 12, 1536) == (3, 384)

    class Args:
        pass
    args = Args()
    ghost_defaults(args)
    args.ghost_heads = 0
    with pytest.raises(GhostConfigError, match="--ghost-heads"):
        kept_widths(args, 4, 1024)
    args = Args()
    ghost_defaults(args)
    assert ghost_config(args) == GhostConfig()
    with pytest.raises(GhostConfigError, match="--ghost-positions"):
        parse_positions("qk,v")
    with pytest.raises(GhostConfigError, match="--ghost-positions"):
        parse_positions("o,after_v")
    assert parse_positions("qk,ffn2") == ("qk", "ffn2")


# ---- on a real trained model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(trained_tiny):
    from fairseq import checkpoint_utils
    path = os.path.join(trained_tiny["save_dir"], "checkpoint_last.pt")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": trained_tiny["data"]})
    task.load_dataset("valid")
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=400, seed=1).next_epoch_itr(shuffle=False)
    batches = [next(itr) for _ in range(3)]
    return {"path": path, "data": trained_tiny["data"], "model": models[0].double().eval(), "cfg": cfg, "task": task,
            "batches": batches}


def nll(model, sample):
    lprobs = torch.log_softmax(model(**sample["net_input"])[0], dim=-1)  # fairseq's would round to float32
    return torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                                        ignore_index=1, reduction="sum")


def test_importance_matches_finite_differences(tiny):
    model, batch = tiny["model"], tiny["batches"][0]
    heads, neurons = accumulate_importance(model, nll, [batch])
    eps = 1e-3  # fairseq's attention softmax runs in float32: a smaller step would measure its rounding
    with ImportanceMasks(model) as masks, torch.no_grad():
        def loss_at(mask, index, value):
            saved = mask[index].item()
            mask[index] = value
            loss = nll(model, batch).item()
            mask[index] = saved
            return loss
        for index in [(0, 0), (0, 1)]:
            fd = (loss_at(masks.head_mask, index, 1 + eps) - loss_at(masks.head_mask, index, 1 - eps)) / (2 * eps)
            assert abs(abs(fd) - heads[index].item()) < 2e-3 * max(1.0, abs(fd)), (index, fd, heads[index])
        for index in [(0, 0), (0, 17), (0, 127)]:
            fd = (loss_at(masks.neuron_mask, index, 1 + eps) - loss_at(masks.neuron_mask, index, 1 - eps)) / (2 * eps)
            assert abs(abs(fd) - neurons[index].item()) < 2e-3 * max(1.0, abs(fd)), (index, fd, neurons[index])
    # accumulation is a sum over batches of |grad|
    h2, _ = accumulate_importance(model, nll, tiny["batches"][:2])
    h_b, _ = accumulate_importance(model, nll, tiny["batches"][1:2])
    assert torch.allclose(h2, heads + h_b)


def ghost_student(tiny, kept_heads, kept_ffn, positions, **flags):
    args = ghost_model_args(tiny["cfg"].model, ghost_heads=kept_heads, ghost_ffn_dim=kept_ffn,
                            ghost_positions=positions, **flags)
    return tiny["task"].build_model(args).double().eval()


# the Table 6 positions and Table 5's Conv1D_F, beside the paper's default
VARIANTS = {"o,ffn2": {}, "qk": {}, "v,ffn2": {}, "o,ffn1 conv1d_f": {"ghost_conv": "conv1d_f"}}


def test_pruning_keeps_the_top_units_and_equals_the_masked_original(tiny):
    model = tiny["model"]
    heads, neurons = accumulate_importance(model, nll, tiny["batches"])
    plan = prune_plan(heads, neurons, 1, 64)
    kept_heads, kept_neurons = plan[0]
    assert kept_heads == [int(heads[0].argmax())]
    assert set(kept_neurons) == set(neurons[0].topk(64).indices.tolist())
    assert kept_neurons == sorted(kept_neurons, key=lambda i: -float(neurons[0, i]))  # rewired: most important first
    student = ghost_student(tiny, 1, 64, "none")
    assert load_pruned(student, model, plan) == []
    layer = transformer_encoder(student).layers[0]
    assert (layer.self_attn.q_proj.weight.shape, layer.self_attn.out_proj.weight.shape, layer.fc1.weight.shape,
            layer.fc2.weight.shape) == ((32, 64), (64, 32), (64, 64), (64, 64))
    batch = tiny["batches"][0]
    with torch.no_grad():
        pruned = student(**batch["net_input"])[0]
        with ImportanceMasks(model) as masks:
            masks.head_mask.zero_()
            masks.head_mask[0, kept_heads] = 1
            masks.neuron_mask.zero_()
            masks.neuron_mask[0, kept_neurons] = 1
            masked = model(**batch["net_input"])[0]
        full = model(**batch["net_input"])[0]
    assert torch.allclose(pruned, masked, atol=1e-10)
    assert not torch.allclose(pruned, full, atol=1e-3)


@pytest.mark.parametrize("variant", VARIANTS)
def test_ghost_encoder_output_does_not_depend_on_padding(tiny, variant):
    student = ghost_student(tiny, 1, 64, variant.split()[0], **VARIANTS[variant])
    randomise(student, seed=3, scale=0.2)
    encoder = transformer_encoder(student)
    src = tiny["batches"][0]["net_input"]["src_tokens"]
    lengths = src.ne(1).sum(1)
    short = int(lengths.argmin())
    n = int(lengths[short])
    alone = src[short:short + 1, -n:]  # fairseq pads the source on the left
    with torch.no_grad():
        batch_out = encoder(src, src_lengths=lengths)["encoder_out"][0]
        alone_out = encoder(alone, src_lengths=lengths[short:short + 1])["encoder_out"][0]
    assert src.size(1) > n
    assert torch.allclose(batch_out[-n:, short], alone_out[:, 0], atol=1e-9)


@pytest.mark.parametrize("variant", ["qk", "v,ffn2", "o,ffn1 conv1d_f"])
def test_new_positions_and_conv1d_f_load_the_pruned_teacher_and_train(tiny, variant):
    """After QK / after V keep V and O (O) unpruned, kept heads first: with the ghost heads' O columns
    zeroed the student is the pruned-only model; one training step reaches the ghost parameters."""
    model = tiny["model"]
    plan = prune_plan(*accumulate_importance(model, nll, tiny["batches"][:1]), 1, 64)
    student = ghost_student(tiny, 1, 64, variant.split()[0], **VARIANTS[variant])
    fresh = load_pruned(student, model, plan)
    assert fresh and all(".ghost." in k for k in fresh)
    attn = transformer_encoder(student).layers[0].self_attn
    teacher_attn = transformer_encoder(model).layers[0].self_attn
    order = torch.cat([torch.arange(h * 32, (h + 1) * 32) for h in plan[0][0] + [1 - plan[0][0][0]]])
    if variant == "qk":
        assert torch.equal(attn.v_proj.weight, teacher_attn.v_proj.weight[order])
    if variant != "o,ffn1 conv1d_f":
        assert torch.equal(attn.out_proj.weight, teacher_attn.out_proj.weight[:, order])
        pruned = ghost_student(tiny, 1, 64, "ffn2" if variant == "v,ffn2" else "none")
        load_pruned(pruned, model, plan)
        pruned.load_state_dict({k: v for k, v in student.state_dict().items() if k in pruned.state_dict()
                                and v.shape == pruned.state_dict()[k].shape}, strict=False)
        batch = tiny["batches"][0]
        with torch.no_grad():
            with_ghost = student(**batch["net_input"])[0]
            attn.out_proj.weight[:, 32:] = 0
            assert not torch.allclose(student(**batch["net_input"])[0], with_ghost, atol=1e-6)
            assert torch.allclose(student(**batch["net_input"])[0], pruned(**batch["net_input"])[0], atol=1e-10)
    student = ghost_student(tiny, 1, 64, variant.split()[0], **VARIANTS[variant])
    load_pruned(student, model, plan)
    student.train()
    ghosts = {n: p for n, p in student.named_parameters() if ".ghost." in n}
    before = {n: p.detach().clone() for n, p in ghosts.items()}
    optimizer = torch.optim.SGD(student.parameters(), lr=1.0)
    nll(student, tiny["batches"][0]).backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in ghosts.values()), variant
    optimizer.step()
    assert all(not torch.equal(p, before[n]) for n, p in ghosts.items())


def test_ffn1_ghost_sits_between_the_activation_and_fc2_of_every_layer(tiny):
    """In a ghost_transformer encoder (ReLU), what fc2 reads is A + ReLU(conv(A)) with A = ReLU(fc1(x)) and the
    batch's padding mask; fc1 and fc2 stay plain Linear layers at the kept width; counts: 64 x 3 per layer;
    --ghost-unshared with ffn1 is refused when the model is built."""
    student = randomise(ghost_student(tiny, 1, 64, "ffn1"), seed=5, scale=0.3)
    layer = transformer_encoder(student).layers[0]
    assert type(layer.fc1) is type(layer.fc2) is torch.nn.Linear and layer.fc2.in_features == 64
    seen = {}
    layer.fc1.register_forward_hook(lambda m, i, o: seen.update(z=o))
    layer.fc2.register_forward_pre_hook(lambda m, i: seen.update(fc2_in=i[0]))
    sample = tiny["batches"][0]["net_input"]
    with torch.no_grad():
        student(**sample)
    kernel = torch.softmax(layer.activation_fn.ghost.weight[0, 0], -1)
    a = torch.relu(seen["z"])
    ghost = hand_ghost(a, kernel, sample["src_tokens"].eq(1))
    assert ghost.abs().max() > 1e-2 and (seen["z"] < 0).any()
    assert torch.allclose(seen["fc2_in"], a + ghost, atol=1e-10)
    layers = len(transformer_encoder(student).layers)
    assert sum(p.numel() for n, p in student.named_parameters() if ".ghost." in n) == layers * 64 * 3
    assert flops_outside_torch_counter(student, 10) == layers * 2 * 10 * 64 * 3
    with pytest.raises(GhostConfigError, match="--ghost-unshared with --ghost-positions ffn1"):
        ghost_student(tiny, 1, 64, "o,ffn1", ghost_unshared=True)


def test_attention_positions_refuse_what_they_cannot_build(tiny):
    with pytest.raises(GhostConfigError, match="--ghost-heads"):  # unpruned: no pruned head to generate
        ghost_student(tiny, 2, 128, "qk")
    for flags in ({"ghost_conv": "conv1d_s"}, {"ghost_features": 2}, {"ghost_unshared": True}):
        with pytest.raises(GhostConfigError, match="--ghost-conv / --ghost-features / --ghost-unshared"):
            ghost_student(tiny, 1, 64, "v", **flags)
    ghost_student(tiny, 1, 64, "v,o", ghost_features=2)  # they configure the module after O


def test_a_teacher_of_another_shape_is_refused(tiny):
    student_encoder = transformer_encoder(ghost_student(tiny, 1, 64, "o,ffn2"))
    other = type(student_encoder.layers)(list(student_encoder.layers) * 2)  # two layers
    criterion = GhostDistillCriterion.__new__(GhostDistillCriterion)
    criterion.teacher = FrozenTeacher(torch.nn.Linear(1, 1), "teacher-2-layers.pt")

    class Encoder:
        layers = other
    with pytest.raises(TeacherConfigError, match="--teacher-path teacher-2-layers.pt"):
        criterion._check_teacher(student_encoder, Encoder)


# ---- the stock commands ---------------------------------------------------------------------------
def test_prune_distill_resume_finetune_and_generate_through_the_stock_clis(tiny, tmp_path):
    """ghost_prune, distillation through stock fairseq-train, its resume, cross-entropy fine-tuning, and one
    fairseq-generate that loads both the pruned init and the fine-tuned checkpoint (an ensemble: each is built from
    its own checkpoint's cfg and decodes)."""
    data, teacher = tiny["data"], tiny["path"]
    init = tmp_path / "init.pt"
    run_cli("user_dir.ghost.tools.prune", data, "--path", teacher, "--width-mult", "1/2", "--out", init,
            "--max-batches", "2", "--cpu")
    flags = open(str(init) + ".flags").read().split()
    assert flags[:2] == ["--arch", "ghost_transformer"] and "--ghost-heads" in flags
    common = [data, "--user-dir", USER_DIR, *flags, "--optimizer", "adam", "--lr", "1e-4", "--max-tokens", "1024",
              "--no-progress-bar", "--log-format", "simple", "--log-interval", "1", "--num-workers", "0", "--cpu",
              "--seed", "1", "--no-epoch-checkpoints", "--disable-validation"]
    distill = tmp_path / "distill"
    cmd = common + ["--criterion", "ghost_distill", "--teacher-path", teacher, "--finetune-from-model", init,
                    "--save-dir", distill, "--clip-norm", "1"]
    out = run_cli("fairseq_cli.train", *cmd, "--max-update", "2").stdout
    assert "l_mha" in out and "l_emb" in out
    out = run_cli("fairseq_cli.train", *cmd, "--max-update", "3").stdout  # resumes from checkpoint_last
    assert "@ 2 updates)" in out and "num_updates 3" in out  # resumed, not restarted from init.pt
    state = torch.load(distill / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("teacher") for k in state["model"])
    assert any(".ghost.weight" in k for k in state["model"])
    finetune = tmp_path / "finetune"
    run_cli("fairseq_cli.train", *common, "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--finetune-from-model", distill / "checkpoint_last.pt", "--save-dir", finetune, "--max-update", "1")
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path",
                  f"{init}:{finetune / 'checkpoint_last.pt'}", "--gen-subset", "valid", "--beam", "2", "--max-len-b",
                  "5", "--batch-size", "256", "--cpu").stdout
    assert "BLEU" in gen.splitlines()[-1]


@pytest.mark.parametrize("positions,extra", [("qk,ffn2", ["--ghost-conv", "conv1d_f", "--ghost-conv1d-f-length", "64"]),
                                             ("v", [])])
def test_new_positions_save_train_and_generate_through_the_stock_clis(tiny, tmp_path, positions, extra):
    data, teacher = tiny["data"], tiny["path"]
    init = tmp_path / "init.pt"
    run_cli("user_dir.ghost.tools.prune", data, "--path", teacher, "--width-mult", "1/2", "--out", init,
            "--ghost-positions", positions, *extra, "--max-batches", "2", "--cpu")
    flags = open(str(init) + ".flags").read().split()
    assert "--ghost-positions" in flags and all(f in flags for f in extra)
    final = init
    if positions.startswith("qk"):
        save = tmp_path / "distill"
        run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *flags, "--optimizer", "adam", "--lr", "1e-4",
                "--max-tokens", "1024", "--no-progress-bar", "--num-workers", "0", "--cpu", "--seed", "1",
                "--criterion", "ghost_distill", "--teacher-path", teacher, "--finetune-from-model", init,
                "--save-dir", save, "--max-update", "1", "--no-epoch-checkpoints", "--disable-validation")
        final = save / "checkpoint_last.pt"
        trained = torch.load(final, map_location="cpu", weights_only=True)["model"]
        start = torch.load(init, map_location="cpu", weights_only=True)["model"]
        key = "encoder.layers.0.self_attn.ghost.weight"
        assert trained[key].shape == (1, 1, 3, 3) and not torch.equal(trained[key], start[key])
        assert trained["encoder.layers.0.fc2.ghost.weight"].shape == (1, 64, 64, 3)
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", final, "--gen-subset", "valid",
                  "--beam", "2", "--max-len-b", "5", "--batch-size", "256", "--cpu").stdout
    assert "BLEU" in gen.splitlines()[-1]


# ---- the GLUE encoders (hf_bert) -------------------------------------------------------------------
def test_hf_bert_encoder_prunes_to_the_masked_original_and_distils(tmp_path, tiny_glue_teacher):
    from fairseq import checkpoint_utils

    data, teacher, common = tiny_glue_teacher["data"], tiny_glue_teacher["teacher"], tiny_glue_teacher["common"]
    init = tmp_path / "init.pt"
    run_cli("user_dir.ghost.tools.prune", data, "--path", teacher, "--width-mult", "2/4", "--ghost-positions", "none",
            "--out", init, "--batch-size", "16", "--cpu")
    flags = open(str(init) + ".flags").read().split()
    assert flags[:2] == ["--arch", "ghost_hf_bert"]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(teacher), str(init)],
                                                                     arg_overrides={"data": str(data)})
    full, pruned = (m.double().eval() for m in models)
    plan = torch.load(init, map_location="cpu", weights_only=True)["extra_state"]["ghost_prune"]
    assert [len(h) for h in plan["kept_heads"]] == [2, 2] and [len(n) for n in plan["kept_neurons"]] == [32, 32]
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(dataset=task.dataset("valid"), max_sentences=8).next_epoch_itr(shuffle=False))
    head = "sentence_classification_head"
    with torch.no_grad():
        with ImportanceMasks(full) as masks:
            masks.head_mask.zero_()
            masks.neuron_mask.zero_()
            for i, (heads, neurons) in enumerate(zip(plan["kept_heads"], plan["kept_neurons"])):
                masks.head_mask[i, heads] = 1
                masks.neuron_mask[i, neurons] = 1
            masked = full(**sample["net_input"], classification_head_name=head)[0]
        ours = pruned(**sample["net_input"], classification_head_name=head)[0]
    assert torch.allclose(ours, masked, atol=1e-9)
    # distillation from the teacher through stock fairseq-train; validation reports accuracy
    out = run_cli("fairseq_cli.train", *common, *flags, "--criterion", "ghost_distill", "--teacher-path", teacher,
                  "--finetune-from-model", init, "--max-update", "2", "--save-dir", tmp_path / "distill").stdout
    assert re.search(r"valid on 'valid' subset .*\| l_mha [\d.]+ .*\| accuracy [\d.]+", out), out[-2000:]


@pytest.mark.parametrize("positions", ["qk", "v,ffn2"])
def test_hf_bert_attention_positions_distil_and_do_not_depend_on_padding(tmp_path, tiny_glue_teacher, positions):
    """Table 6's positions inside the attention on an imported GLUE encoder: ghost_prune writes them, stock
    fairseq-train distils them, and a sentence's logits do not change when the batch pads it more (BERT
    pads on the right)."""
    from fairseq import checkpoint_utils

    data, teacher, common = tiny_glue_teacher["data"], tiny_glue_teacher["teacher"], tiny_glue_teacher["common"]
    init = tmp_path / "init.pt"
    run_cli("user_dir.ghost.tools.prune", data, "--path", teacher, "--width-mult", "1/4", "--ghost-positions",
            positions, "--out", init, "--batch-size", "16", "--cpu")
    flags = open(str(init) + ".flags").read().split()
    assert flags[flags.index("--ghost-positions") + 1] == positions
    save = tmp_path / "distill"
    run_cli("fairseq_cli.train", *common, *flags, "--criterion", "ghost_distill", "--teacher-path", teacher,
            "--finetune-from-model", init, "--max-update", "2", "--save-dir", save, "--disable-validation")
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(save / "checkpoint_last.pt")],
                                                                     arg_overrides={"data": str(data)})
    model = models[0].double().eval()
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(dataset=task.dataset("valid"), max_sentences=8).next_epoch_itr(shuffle=False))
    tokens = sample["net_input"]["src_tokens"]
    pad = task.source_dictionary.pad()
    lengths = tokens.ne(pad).sum(1)
    short = int(lengths.argmin())
    n = int(lengths[short])
    head = "sentence_classification_head"
    with torch.no_grad():
        batch = model(tokens, features_only=True, classification_head_name=head)[0][short]
        alone = model(tokens[short:short + 1, :n], features_only=True, classification_head_name=head)[0][0]
    assert tokens.size(1) > n and torch.allclose(batch, alone, atol=1e-9)


def test_distillation_of_an_identical_student_is_zero_and_embedding_dropout_is_not_distilled(tiny):
    import copy
    model = tiny["model"]
    student = ghost_student(tiny, 2, 128, "none")  # unpruned, no ghost module: the teacher's function
    assert load_pruned(student, model, [([0, 1], list(range(128)))]) == []
    criterion = GhostDistillCriterion.__new__(GhostDistillCriterion)
    torch.nn.Module.__init__(criterion)
    criterion.teacher = FrozenTeacher(copy.deepcopy(model), "teacher.pt")
    criterion.lambda_pred, criterion.lambda_hidden, criterion.lambda_emb, criterion._checked = 0.0, 1.0, 1.0, False
    sample = tiny["batches"][0]
    student.eval()
    _, _, log = criterion(student, sample)
    assert log["l_emb"] == 0 and log["l_mha"] < 1e-20 and log["l_ffn"] < 1e-20
    student.train()  # dropout inside the layers changes M_l and F_l, never E (taken before the embedding dropout)
    _, _, log = criterion(student, sample)
    assert log["l_emb"] == 0 and log["l_mha"] > 1e-4 and log["l_ffn"] > 1e-4
    # a dropped layer has no hidden states to distil: layerdrop is refused by name, before any loss is computed
    criterion._checked = False
    transformer_encoder(student).encoder_layerdrop = 0.1
    with pytest.raises(ValueError, match="--encoder-layerdrop 0.1 with --criterion ghost_distill"):
        criterion(student, sample)


def test_a_model_built_with_layerdrop_prunes_and_ghosts_every_layer(tiny):
    """A freshly built model is in training mode, where a LayerDropModuleList's iteration skips layers:
    building must still prune and ghost every layer (the flag then works in the cross-entropy stage)."""
    args = ghost_model_args(tiny["cfg"].model, ghost_heads=1, ghost_ffn_dim=64)
    args.encoder_layerdrop = 0.99
    torch.manual_seed(0)
    model = tiny["task"].build_model(args)
    layers = transformer_encoder(model).layers
    assert type(layers).__name__ == "LayerDropModuleList"  # (task.build_model's --eval-bleu generator then set eval)
    assert all(layers[i].fc1.out_features == 64 and isinstance(layers[i].fc2, GhostLinear)
               and isinstance(layers[i].self_attn.out_proj, GhostLinear) for i in range(len(layers)))
    sample = tiny["batches"][0]
    nll(model.double(), sample).backward()  # trains with layers dropped


def test_activation_checkpointing_computes_the_same_loss_and_gradients(tiny):
    """--checkpoint-activations wraps every layer before the ghost modules go in: the ghost model must
    compute the same loss and gradients with it (it only trades memory for recomputation)."""
    grads = []
    for checkpointing in (False, True):
        args = ghost_model_args(tiny["cfg"].model, ghost_heads=1, ghost_ffn_dim=64)
        args.checkpoint_activations = checkpointing
        args.dropout = args.attention_dropout = args.activation_dropout = 0.0
        torch.manual_seed(0)
        model = tiny["task"].build_model(args).double().train()
        assert hasattr(transformer_encoder(model).layers[0], "precheckpoint_forward") == checkpointing  # wrapped
        loss = nll(model, tiny["batches"][0])
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss0, g0), (loss1, g1) = grads
    assert torch.allclose(loss0, loss1) and g0.keys() == g1.keys()
    assert any("ghost" in n for n in g1) and all(torch.allclose(g0[n], g1[n]) for n in g0)


def test_dropping_encoder_layers_is_refused_naming_the_flag(tiny):
    args = ghost_model_args(tiny["cfg"].model, ghost_heads=1, ghost_ffn_dim=64)
    args.encoder_layers_to_keep = "0"
    with pytest.raises(GhostConfigError, match="--encoder-layers-to-keep is not supported by the ghost_"):
        tiny["task"].build_model(args)


# ---- --ghost-zero-init (issue 32: the paper does not say how ghost modules start) -----------------------
def test_zero_init_starts_as_the_pruned_model_then_trains_the_kernel(tiny):
    model = tiny["model"]
    plan = prune_plan(*accumulate_importance(model, nll, tiny["batches"][:1]), 1, 64)
    pruned = ghost_student(tiny, 1, 64, "none")
    zero = ghost_student(tiny, 1, 64, "o,ffn1,ffn2", ghost_zero_init=True)
    plain = ghost_student(tiny, 1, 64, "o,ffn1,ffn2")
    for student in (pruned, zero, plain):
        load_pruned(student, model, plan)
    sample = tiny["batches"][0]
    with torch.no_grad():
        reference = pruned(**sample["net_input"])[0]
        assert torch.equal(zero(**sample["net_input"])[0], reference)  # exactly the pruned model (inference path)
        assert not torch.allclose(plain(**sample["net_input"])[0], reference)  # xavier-initialised modules perturb it
    scales = [m.scale for m in zero.modules() if isinstance(m, GhostConv)]
    kernels = [m.weight for m in zero.modules() if isinstance(m, GhostConv)]
    assert len(scales) == 3 and all(float(s) == 0 for s in scales)
    zero.train()
    nll(zero, sample).backward()
    assert all(s.grad is not None and float(s.grad.abs()) > 0 for s in scales)  # the scales move first ...
    assert all(float(w.grad.abs().sum()) == 0 for w in kernels)  # ... the kernels once a scale is not 0
    with torch.no_grad():
        for s in scales:
            s.fill_(0.5)
    zero.zero_grad()
    nll(zero, sample).backward()
    assert all(float(w.grad.abs().sum()) > 0 for w in kernels)
    # counts: one scalar per module; after QK / V is refused, naming the flag
    layer = transformer_encoder(zero).layers[0]
    assert layer.fc2.ghost_parameter_count() == layer.fc2.ghost.weight.numel() + 1
    with pytest.raises(GhostConfigError, match="--ghost-zero-init"):
        ghost_student(tiny, 1, 64, "v,ffn2", ghost_zero_init=True)


def test_zero_init_scale_on_the_fast_path_equals_the_reference_form():
    torch.manual_seed(0)
    T, B, C = 7, 3, 16
    cfg = GhostConfig(zero_init=True)
    fast = GhostLinear(C, C, 1, cfg).double()
    with torch.no_grad():
        fast.ghost.scale.fill_(-0.7)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, 5:] = True
    fast.padding_mask = mask
    x = torch.randn(T, B, C, dtype=torch.double, requires_grad=True)
    y_fast = fast(x)
    y_ref = torch.nn.functional.linear(x, fast.weight, fast.bias)
    y_ref = y_ref + fast._ghost(fast.ghost(fast._masked(y_ref).unsqueeze(2), mask))
    torch.testing.assert_close(y_fast, y_ref)
    g_fast = torch.autograd.grad(y_fast.sum(), [x, fast.ghost.scale, fast.ghost.weight])
    g_ref = torch.autograd.grad(y_ref.sum(), [x, fast.ghost.scale, fast.ghost.weight])
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # the in-place inference path
        torch.testing.assert_close(fast(x), y_ref)


class Copy(torch.nn.Module):
    def forward(self, x):
        return x.clone()


def test_compiled_ghost_modules_equal_the_eager_form_ignore_padding_and_leave_training_alone(tiny):
    """--ghost-compile (issue 35): at inference every module after O / FFN1 / FFN2 runs as one torch.compile'd
    kernel, with the eager form's values on a real batch (left-padded), padding-invariant; under autograd
    (training) the eager form runs; the attention positions and other conv types refuse the flag by name."""
    import user_dir.ghost.ghost_module as gm

    eager = ghost_student(tiny, 2, 64, "o,ffn1,ffn2", ghost_zero_init=True)
    randomise(eager, seed=5, scale=0.2)
    with torch.no_grad():  # a non-zero ghost scale, so a kernel that dropped it (or the ReLU, or keep) would differ
        for m in eager.modules():
            if isinstance(m, GhostConv):
                m.scale.fill_(0.8)
    compiled = ghost_student(tiny, 2, 64, "o,ffn1,ffn2", ghost_zero_init=True, ghost_compile=True)
    compiled.load_state_dict(eager.state_dict())
    ghosts = [m for m in compiled.modules() if isinstance(m, (GhostLinear, GhostActivation))]
    assert len(ghosts) == 3 * len(transformer_encoder(compiled).layers) and all(m.cfg.compiled for m in ghosts)
    src = tiny["batches"][0]["net_input"]["src_tokens"]
    lengths = src.ne(1).sum(1)
    assert src.size(1) > int(lengths.min())  # the batch has padding
    calls = []
    original = gm.shifted_ghost_graph
    gm.shifted_ghost_graph = lambda *a, **k: calls.append(1) or original(*a, **k)  # traced once per compile
    minimum = gm.COMPILE_MIN_ELEMENTS
    try:
        gm._COMPILED.clear()
        with torch.no_grad():
            want = transformer_encoder(eager)(src, src_lengths=lengths)["encoder_out"][0]
            gm.COMPILE_MIN_ELEMENTS = src.numel() * 10 ** 6  # a CPU runs small activations eagerly: no compile
            small = transformer_encoder(compiled)(src, src_lengths=lengths)["encoder_out"][0]
            assert not calls and "fn" not in gm._COMPILED
            torch.testing.assert_close(small, want, rtol=1e-9, atol=1e-9)
            gm.COMPILE_MIN_ELEMENTS = 0  # the tiny model's activations compiled
            got = transformer_encoder(compiled)(src, src_lengths=lengths)["encoder_out"][0]
            short = int(lengths.argmin())
            n = int(lengths[short])
            alone = transformer_encoder(compiled)(src[short:short + 1, -n:],
                                                  src_lengths=lengths[short:short + 1])["encoder_out"][0]
    finally:
        gm.shifted_ghost_graph = original
        gm.COMPILE_MIN_ELEMENTS = minimum
    assert "failed" not in gm._COMPILED and calls, "torch.compile did not run (is a C++ compiler installed?)"
    # the modules after O and FFN2 ran fused with their layer's residual add, the one after FFN1 alone
    assert "fn_residual" in gm._COMPILED and "fn" in gm._COMPILED
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(alone[:, 0], got[-n:, short], rtol=1e-9, atol=1e-9)
    # a deep copy (fairseq's EMA) keeps its own padding masks and residual adds: the same values on the padded batch
    copied = copy.deepcopy(compiled)
    layer = transformer_encoder(copied).layers[0]
    assert layer.residual_connection.__self__ is layer
    gm.COMPILE_MIN_ELEMENTS = 0
    try:
        with torch.no_grad():
            torch.testing.assert_close(transformer_encoder(copied)(src, src_lengths=lengths)["encoder_out"][0], want,
                                       rtol=1e-9, atol=1e-9)
            # an operation between the projection and the add (fairseq's layer changed): an error, not a lost module
            layer.dropout_module = Copy()
            with pytest.raises(RuntimeError, match="residual add"):
                transformer_encoder(copied)(src, src_lengths=lengths)
    finally:
        gm.COMPILE_MIN_ELEMENTS = minimum
    # training: the eager form, with its gradients (the compiled function is never called under autograd)
    compiled.train()
    torch.manual_seed(0)
    kernel = gm.compiled_shifted_ghost
    gm.compiled_shifted_ghost = None  # calling it would raise
    try:
        loss = transformer_encoder(compiled)(src, src_lengths=lengths)["encoder_out"][0].pow(2).sum()
    finally:
        gm.compiled_shifted_ghost = kernel
    loss.backward()
    assert ghosts[0].ghost.weight.grad is not None and ghosts[0].ghost.weight.grad.abs().sum() > 0
    # refusals, naming the flag
    with pytest.raises(GhostConfigError, match="--ghost-compile"):
        GhostConfig(conv="conv2d", compiled=True)
    with pytest.raises(GhostConfigError, match="--ghost-compile"):
        ghost_student(tiny, 2, 64, "qk", ghost_compile=True)
    # a checkpoint trained without the flag: turned on after loading, as --model-overrides does at load
    assert all(m.cfg.compiled for m in gm.compile_ghost_modules(eager).modules()
               if isinstance(m, (GhostLinear, GhostActivation)))
