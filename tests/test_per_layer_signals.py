"""Per-layer signals on a multi-layer model, each against an independent computation (issue 32's
"tests with teeth"): a swapped list, a shifted layer index, |g| for g^2 or a sum for a mean fails.

The model is the reference teacher (3 + 3 layers, post-LN, width 256) in float64, on real batches of
its own validation data.
* GhostBERT's distillation losses (eq 6): E, M_l (after the MHA sub-layer's residual and LayerNorm)
  and F_l (the layer output) recomputed by an explicit loop over fairseq's sub-modules.
* GhostBERT's head and neuron importance on layers 2 and 3 against central finite differences.
* APC's Fisher information (mean over a layer's parameters of the squared gradient, averaged over
  batches, normalised) against the formula on gradients from ``loss.backward()``.
"""
import copy
import os

import pytest
import torch

from conftest import TEACHER, TEACHER_DIR, needs_teacher

pytestmark = needs_teacher


@pytest.fixture(scope="module")
def teacher():
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [TEACHER], arg_overrides={"data": os.path.join(TEACHER_DIR, "data-bin")})
    task.load_dataset("valid")
    itr = task.get_batch_iterator(dataset=task.dataset("valid"), max_sentences=6, seed=1, num_workers=0)
    it = itr.next_epoch_itr(shuffle=False)
    batches = [next(it) for _ in range(2)]
    return {"model": models[0].double().eval(), "task": task, "batches": batches}


def nll(model, sample):
    lprobs = torch.log_softmax(model(**sample["net_input"])[0], dim=-1)
    return torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                                        ignore_index=1, reduction="sum")


def explicit_states(model, src_tokens):
    """E (T x B x C, before the embedding dropout), [M_l], [F_l] of a post-LN fairseq encoder, by hand."""
    encoder = model.encoder
    pad = src_tokens.eq(encoder.padding_idx)
    x = encoder.embed_scale * encoder.embed_tokens(src_tokens) + encoder.embed_positions(src_tokens)
    if encoder.layernorm_embedding is not None:
        x = encoder.layernorm_embedding(x)
    x = x.transpose(0, 1)
    emb, mha, ffn = x, [], []
    for layer in encoder.layers:
        assert not layer.normalize_before
        attn, _ = layer.self_attn(query=x, key=x, value=x, key_padding_mask=pad, need_weights=False)
        x = layer.self_attn_layer_norm(x + attn)
        mha.append(x)
        x = layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))
        ffn.append(x)
    return emb, mha, ffn, (~pad).t().unsqueeze(-1).to(x.dtype)


def masked_mse(a, b, keep):
    return float((((a - b) ** 2).mean(-1, keepdim=True) * keep).sum() / keep.sum())


def test_ghost_distillation_losses_are_eq6_on_every_layer(teacher):
    from user_dir.common.teacher import FrozenTeacher
    from user_dir.ghost.distillation_criterion import GhostDistillCriterion

    model = teacher["model"]
    student = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():  # every layer (and the embeddings) of the student differs, each differently
        for p in student.encoder.parameters():
            p.add_(0.02 * torch.randn_like(p))
    criterion = GhostDistillCriterion.__new__(GhostDistillCriterion)
    torch.nn.Module.__init__(criterion)
    criterion.teacher = FrozenTeacher(copy.deepcopy(model), "teacher.pt")
    criterion.lambda_pred, criterion.lambda_hidden, criterion.lambda_emb, criterion._checked = 0.0, 1.0, 1.0, False
    sample = teacher["batches"][0]
    src = sample["net_input"]["src_tokens"]
    student.eval()
    loss, _, log = criterion(student, sample)
    with torch.no_grad():
        e_s, m_s, f_s, keep = explicit_states(student, src)
        e_t, m_t, f_t, _ = explicit_states(model, src)
    per_layer_mha = [masked_mse(s, t, keep) for s, t in zip(m_s, m_t)]
    per_layer_ffn = [masked_mse(s, t, keep) for s, t in zip(f_s, f_t)]
    assert len(per_layer_mha) == 3 and len(set(round(v, 8) for v in per_layer_mha + per_layer_ffn)) == 6
    assert float(log["l_emb"]) == pytest.approx(masked_mse(e_s, e_t, keep), rel=1e-5)
    assert float(log["l_mha"]) == pytest.approx(sum(per_layer_mha), rel=1e-5)
    assert float(log["l_ffn"]) == pytest.approx(sum(per_layer_ffn), rel=1e-5)
    assert float(loss) == pytest.approx(float(log["l_emb"] + log["l_mha"] + log["l_ffn"]), rel=1e-5)
    # the mutations the reviews named give other values: swapped lists, a shifted layer, pre-LayerNorm states
    shifted = sum(masked_mse(s, t, keep) for s, t in zip(m_s[1:], m_t[:-1]))
    assert abs(shifted - sum(per_layer_mha)) > 1e-3 * sum(per_layer_mha)
    assert abs(sum(per_layer_ffn) - sum(per_layer_mha)) > 1e-3 * sum(per_layer_mha)


def test_ghost_importance_on_deeper_layers_matches_finite_differences(teacher):
    from user_dir.ghost.importance import ImportanceMasks, accumulate_importance

    model, batch = teacher["model"], teacher["batches"][0]
    heads, neurons = accumulate_importance(model, nll, [batch])
    assert heads.shape == (3, 4) and neurons.shape == (3, 1024)
    eps = 1e-2  # fairseq's attention softmax runs in float32: the loss (a sum over ~100 tokens) is rounded at ~1e-5
    with ImportanceMasks(model) as masks, torch.no_grad():
        def derivative(mask, index):
            saved = mask[index].item()
            values = []
            for v in (saved + eps, saved - eps):
                mask[index] = v
                values.append(nll(model, batch).item())
            mask[index] = saved
            return (values[0] - values[1]) / (2 * eps)

        for index in [(1, 2), (2, 0), (2, 3)]:
            fd = derivative(masks.head_mask, index)
            assert abs(abs(fd) - heads[index].item()) < 5e-3 * max(1.0, abs(fd)), (index, fd, heads[index])
        for index in [(1, 5), (2, 700)]:
            fd = derivative(masks.neuron_mask, index)
            assert abs(abs(fd) - neurons[index].item()) < 5e-3 * max(1.0, abs(fd)), (index, fd, neurons[index])
    # the layers' importances differ (a shifted layer index would be caught above)
    assert not torch.allclose(heads[1], heads[2])


def test_fisher_information_is_the_mean_squared_gradient_per_layer(teacher):
    from user_dir.apc.activation_sampling import ffn_layers
    from user_dir.apc.layer_importance import fisher_information

    model, batches = teacher["model"], teacher["batches"]
    got = fisher_information(model, batches, pad=1)
    layers = ffn_layers(model)
    assert list(got) == list(layers) and len(got) == 6
    raw = {name: 0.0 for name in layers}
    for sample in batches:
        model.zero_grad()
        nll(model, sample).backward()
        for name, layer in layers.items():
            grads = [p.grad for p in layer.parameters()]
            raw[name] += sum(float((g ** 2).sum()) for g in grads) / sum(g.numel() for g in grads) / len(batches)
    model.zero_grad()
    total = sum(raw.values())
    for name in layers:
        assert got[name] == pytest.approx(raw[name] / total, rel=1e-6), name
    # a sum instead of a mean over parameters would change the normalised values: the layers' sizes differ
    assert len({sum(p.numel() for p in layer.parameters()) for layer in layers.values()}) > 1
