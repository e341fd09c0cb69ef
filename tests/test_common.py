"""Shared pieces: KD losses, parameter counting, the frozen-teacher loader, checkpoint averaging."""
import math
import os
from argparse import Namespace

import pytest
import torch
import torch.nn as nn

from conftest import TEACHER, needs_teacher

from user_dir.common.counting import compression_rate, count_parameters, state_dict_bytes
from user_dir.common.kd_losses import interpolated_kd_loss, normalized_hidden_mse, word_kd_loss
from user_dir.common.teacher import TeacherConfigError, load_frozen_teacher


# ---- KD losses ------------------------------------------------------------------------------------
def test_word_kd_is_zero_for_identical_distributions_and_positive_otherwise():
    logits = torch.randn(2, 5, 11)
    assert word_kd_loss(logits, logits.clone(), temperature=2.0).item() == pytest.approx(0.0, abs=1e-5)
    assert word_kd_loss(torch.randn(2, 5, 11), logits, temperature=2.0).item() > 0


def test_word_kd_matches_hand_computed_value_with_t_squared_and_padding_masked():
    s = torch.tensor([[[0.0, 1.0, 2.0], [5.0, 5.0, 5.0]]])
    t = torch.tensor([[[2.0, 1.0, 0.0], [9.0, -9.0, 0.0]]])
    pad = torch.tensor([[False, True]])  # the second position is padding and must not count
    T = 2.0
    p_t = torch.softmax(t[0, 0] / T, -1)
    expected = T ** 2 * (p_t * (torch.log_softmax(t[0, 0] / T, -1) - torch.log_softmax(s[0, 0] / T, -1))).sum()
    assert word_kd_loss(s, t, T, pad).item() == pytest.approx(expected.item(), rel=1e-5)


def test_word_kd_trains_the_student_through_a_frozen_teacher_and_works_in_bf16():
    """The student's KD loss backpropagates through its own outputs only: the teacher, wrapped as
    every criterion wraps it (FrozenTeacher, built from a module that starts trainable), gets no
    gradient and keeps its weights; the student's gradient is KD's closed form, T * (p_s - p_t)."""
    from user_dir.common.teacher import FrozenTeacher

    torch.manual_seed(0)
    teacher_net, student = nn.Linear(6, 7), nn.Linear(6, 7)
    before = [p.detach().clone() for p in teacher_net.parameters()]
    teacher = FrozenTeacher(teacher_net, "teacher.pt")
    x, T = torch.randn(3, 4, 6), 2.0
    s_logits = student(x)
    s_logits.retain_grad()
    t_logits = teacher(student.weight, x)  # no torch.no_grad() here: the wrapper must cut the graph
    loss = word_kd_loss(s_logits, t_logits, T)
    loss.backward()
    assert all(p.grad is None for p in teacher_net.parameters()) and not t_logits.requires_grad
    expected = T * (torch.softmax(s_logits.detach() / T, -1) - torch.softmax(t_logits / T, -1))
    assert torch.allclose(s_logits.grad, expected, atol=1e-6)
    assert student.weight.grad is not None and student.weight.grad.abs().sum() > 0
    torch.optim.SGD(list(student.parameters()) + list(teacher_net.parameters()), lr=1.0).step()
    assert all(torch.equal(a, b) for a, b in zip(before, teacher_net.parameters()))
    loss = word_kd_loss(s_logits.detach().bfloat16(), t_logits.bfloat16(), 1.0)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    assert loss.item() == pytest.approx(word_kd_loss(s_logits.detach().bfloat16().float(),
                                                     t_logits.bfloat16().float(), 1.0).item(), rel=1e-5)


def test_kd_argument_errors():
    with pytest.raises(ValueError, match="temperature"):
        word_kd_loss(torch.randn(2, 3), torch.randn(2, 3), temperature=0)
    with pytest.raises(ValueError, match="share one target dictionary"):
        word_kd_loss(torch.randn(2, 3), torch.randn(2, 4))
    with pytest.raises(ValueError, match="alpha"):
        interpolated_kd_loss(torch.tensor(1.0), torch.tensor(1.0), 1.5)
    assert interpolated_kd_loss(torch.tensor(2.0), torch.tensor(4.0), 0.25).item() == pytest.approx(2.5)


def test_normalized_hidden_mse():
    h = torch.randn(4, 3, 8)
    assert normalized_hidden_mse(h, 3 * h).item() == pytest.approx(0.0, abs=1e-5)  # scale-invariant
    pad = torch.zeros(4, 3, dtype=torch.bool)
    pad[:, -1] = True
    other = h.clone()
    other[:, -1] = -h[:, -1]  # differs only at padding
    assert normalized_hidden_mse(h, other, pad).item() == pytest.approx(0.0, abs=1e-5)
    assert normalized_hidden_mse(h, -h).item() == pytest.approx(4 * 3 * 4.0, rel=1e-5)


# ---- counting --------------------------------------------------------------------------------------
class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(100, 8)
        self.layer = nn.Linear(8, 8)
        self.shared_again = self.layer  # the same module reachable twice
        self.output_projection = nn.Linear(8, 100, bias=False)
        self.output_projection.weight = self.embed_tokens.weight


def test_count_parameters_counts_shared_tensors_once():
    c = count_parameters(_Tied())
    assert c.total == 100 * 8 + 8 * 8 + 8
    assert c.embedding == 100 * 8 and c.non_embedding == 72
    ref = count_parameters(nn.Sequential(nn.Linear(8, 16)))
    assert compression_rate(c, ref) == pytest.approx(100 * 72 / (8 * 16 + 16))
    assert state_dict_bytes(_Tied()) < state_dict_bytes(nn.Sequential(nn.Embedding(100, 8), nn.Embedding(100, 8)))


@needs_teacher
def test_reference_teacher_parameter_count_matches_closed_form():
    from fairseq import checkpoint_utils

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([TEACHER], arg_overrides={
        "data": os.path.join(os.path.dirname(TEACHER), "data-bin")})
    c = count_parameters(models[0])
    d, f, V, L = 256, 1024, 7896, 3
    attn = 4 * (d * d + d)
    enc_layer = attn + (d * f + f) + (f * d + d) + 2 * 2 * d
    dec_layer = 2 * attn + (d * f + f) + (f * d + d) + 3 * 2 * d
    assert c.non_embedding == L * enc_layer + L * dec_layer
    assert c.total == 7_550_976 and c.embedding == V * d  # shared source/target/output embedding once


# ---- teacher loading -------------------------------------------------------------------------------
def _translation_task(data):
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    return TranslationTask.setup_task(TranslationConfig(data=data, source_lang="de", target_lang="en"))


def test_teacher_path_errors_name_the_flag(multi30k_slice, tmp_path):
    task = _translation_task(multi30k_slice)
    with pytest.raises(TeacherConfigError, match="--teacher-path is required"):
        load_frozen_teacher(None, task)
    with pytest.raises(TeacherConfigError, match=r"--teacher-path .*nope\.pt: no such checkpoint file"):
        load_frozen_teacher(str(tmp_path / "nope.pt"), task)


@needs_teacher
def test_teacher_with_another_dictionary_is_refused(multi30k_slice):
    # the slice learned its own 2,000-merge BPE: another vocabulary than the reference teacher's
    with pytest.raises(TeacherConfigError, match=r"--teacher-path .*vocabulary has 7896 entries"):
        load_frozen_teacher(TEACHER, _translation_task(multi30k_slice))


@needs_teacher
def test_teacher_is_frozen_and_follows_the_student_dtype():
    task = _translation_task(os.path.join(os.path.dirname(TEACHER), "data-bin"))
    teacher = load_frozen_teacher(TEACHER, task)
    assert not teacher.model.training
    assert not isinstance(teacher, nn.Module)  # never saved into, or optimised with, the student
    student_weight = torch.zeros(1, dtype=torch.bfloat16)
    src = torch.tensor([[5, 6, 7, 2]])
    out, _ = teacher(student_weight, src, torch.tensor([4]), torch.tensor([[2, 5, 6]]))
    assert out.dtype == torch.bfloat16 and not out.requires_grad
    assert all(p.grad is None for p in teacher.model.parameters())
    teacher.model.train()
    teacher.match(student_weight)
    assert not teacher.model.training


@needs_teacher
def test_teacher_runs_the_kernels_of_a_trainable_model():
    """The frozen teacher's forward runs the same kernels as the model as loaded: with its weights at
    requires_grad=False, torch's matmul sends the decoder's non-contiguous output-projection input to a batched
    matmul of the expanded weight instead of one GEMM (20% slower teacher forwards on the CPU)."""
    from fairseq import checkpoint_utils
    from torch.profiler import ProfilerActivity, profile

    task = _translation_task(os.path.join(os.path.dirname(TEACHER), "data-bin"))
    teacher = load_frozen_teacher(TEACHER, task)
    reference = checkpoint_utils.load_model_ensemble([TEACHER], task=task)[0][0].eval()
    src, lengths, prev = torch.tensor([[5, 6, 7, 8, 2]] * 3), torch.tensor([5] * 3), torch.tensor([[2, 5, 6, 7]] * 3)

    def kernels(forward):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            forward()
        return sorted((e.key, e.count) for e in prof.key_averages() if e.key in ("aten::mm", "aten::bmm", "aten::addmm"))

    with torch.no_grad():
        expected = kernels(lambda: reference(src, lengths, prev))
        reference.requires_grad_(False)  # what FrozenTeacher used to do: other kernels (more batched matmuls)
        frozen = kernels(lambda: reference(src, lengths, prev))
    assert frozen != expected and dict(frozen)["aten::bmm"] > dict(expected)["aten::bmm"], (frozen, expected)
    assert kernels(lambda: teacher(torch.zeros(1), src, lengths, prev)) == expected


# ---- checkpoint averaging --------------------------------------------------------------------------
def test_average_checkpoints(tmp_path):
    from user_dir.tools.average_checkpoints import AverageError, main

    for i, value in enumerate([1.0, 2.0, 6.0], start=1):
        state = {"args": Namespace(arch="x"), "model": {"w": torch.full((2, 2), value), "version": torch.tensor([3])},
                 "last_optimizer_state": {"big": torch.zeros(10)}}
        torch.save(state, tmp_path / f"checkpoint{i}.pt")
    main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "2", "--output", str(tmp_path / "avg.pt")])
    avg = torch.load(tmp_path / "avg.pt")
    assert torch.allclose(avg["model"]["w"], torch.full((2, 2), 4.0)) and "last_optimizer_state" not in avg
    assert avg["model"]["w"].dtype == torch.float32 and avg["model"]["version"].item() == 3
    with pytest.raises(AverageError, match="asked for 5"):
        main(["--inputs", str(tmp_path), "--num-epoch-checkpoints", "5", "--output", str(tmp_path / "x.pt")])


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_word_kd_loss_gradient_equals_autograd_through_the_explicit_formula(temperature):
    """word_kd_loss forms its gradient in the forward pass: value and gradient equal autograd through
    T^2 sum_keep KL(softmax(t/T) || softmax(s/T)), padding excluded, also in half precision."""
    torch.manual_seed(0)
    s = torch.randn(3, 7, 13, requires_grad=True)
    t = torch.randn(3, 7, 13)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = pad[2, 3:] = True
    keep = ~pad
    lp_s = torch.log_softmax(s[keep] / temperature, -1)
    lp_t = torch.log_softmax(t[keep] / temperature, -1)
    explicit = (lp_t.exp() * (lp_t - lp_s)).sum() * temperature ** 2
    (g_explicit,) = torch.autograd.grad(explicit * 0.7, s)
    s2 = s.detach().clone().requires_grad_(True)
    fused = word_kd_loss(s2, t, temperature, pad)
    (fused * 0.7).backward()
    assert fused.item() == pytest.approx(explicit.item(), rel=1e-5)
    assert torch.allclose(s2.grad, g_explicit, atol=1e-6)
    assert s2.grad[pad].abs().max() == 0  # no gradient reaches padding
    half = s.detach().half().requires_grad_(True)
    word_kd_loss(half, t.half(), temperature, pad).backward()
    assert half.grad.dtype == torch.float16 and torch.allclose(half.grad.float(), g_explicit / 0.7, atol=2e-3)
