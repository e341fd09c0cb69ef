"""PET's warm-up (simplified task, Table 5, eqs 2-4) and word-level KD criteria."""
import math
import os

import pytest
import torch

from conftest import OPTIM_FLAGS, TEACHER, TEACHER_DIR, USER_DIR, needs_teacher, run_cli

import user_dir  # noqa: F401
from user_dir.pet.simplified_task import log1mexp, student_class_lprobs, teacher_labels

TINY_PET = ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "32", "--decoder-embed-dim", "24",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]


def _lprobs(rows):
    return torch.log(torch.tensor(rows, dtype=torch.float32))


def test_teacher_labels_follow_table_5():
    teacher = _lprobs([[0.9, 0.05, 0.05],   # argmax 0 = y, 0.9 >= eps1      -> confidently correct (0)
                       [0.4, 0.3, 0.3],     # argmax 0 = y, 0.4 < eps1       -> correct, not confident (1)
                       [0.8, 0.1, 0.1],     # argmax 0 != y=1, 0.8 >= eps2   -> confidently wrong (2)
                       [0.35, 0.33, 0.32],  # argmax 0 != y=2, 0.35 < eps2   -> wrong, not confident (3)
                       [0.6, 0.2, 0.2]])    # exactly eps1 counts as confident (0)
    target = torch.tensor([0, 0, 1, 2, 0])
    assert teacher_labels(teacher, target, eps1=0.6, eps2=0.5).tolist() == [0, 1, 2, 3, 0]
    # eps2 governs only wrong predictions: raising it flips row 3 alone
    assert teacher_labels(teacher, target, eps1=0.6, eps2=0.85).tolist() == [0, 1, 3, 3, 0]
    with pytest.raises(ValueError, match="--eps1"):
        teacher_labels(teacher, target, eps1=1.5, eps2=0.5)


def test_student_class_probabilities_follow_eq_4_and_sum_to_one():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]])
    target = torch.tensor([1, 1])
    probs = student_class_lprobs(torch.log(p), target).exp()
    conf, corr = torch.tensor([0.7, 0.5]), torch.tensor([0.2, 0.5])
    expected = torch.stack([conf * corr, (1 - conf) * corr, conf * (1 - corr), (1 - conf) * (1 - corr)], -1)
    assert torch.allclose(probs, expected, atol=1e-6)
    assert torch.allclose(probs.sum(-1), torch.ones(2), atol=1e-6)
    # random vocabularies, in bf16 and fp16, and a one-hot (p = 1) distribution: finite and normalised
    logits = torch.randn(3, 5, 1000) * 8
    logits[0, 0] = torch.tensor([0.0] + [-1e4] * 999)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        lp = torch.log_softmax(logits.float(), -1).to(dtype)
        cls = student_class_lprobs(lp, torch.randint(0, 1000, (3, 5)))
        assert torch.isfinite(cls).all() and cls.dtype == torch.float32
        assert torch.allclose(torch.logsumexp(cls, -1), torch.zeros(3, 5), atol=1e-4 if dtype == torch.float32 else 2e-2)


def test_log1mexp_has_finite_gradients_up_to_zero():
    """torch.where differentiates both branches: log1p(-exp(x)) at x within rounding of 0 is -inf
    and its NaN gradient leaked through the branch not taken. Values and gradients against the
    closed form d/dx log(1 - e^x) = -e^x / (1 - e^x), and finite at the edge in bf16/fp16."""
    x = torch.tensor([-1e-8, -1e-3, -0.5, -math.log(2.0), -0.9, -5.0, -30.0], dtype=torch.float64)
    for dtype, rtol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-2)):
        xd = x[x < -torch.finfo(dtype).tiny].to(dtype).requires_grad_()  # (-1e-8 is 0 in fp16: an edge below)
        y = log1mexp(xd)
        y.sum().backward()
        xs = xd.detach().double()
        assert torch.allclose(y.double(), torch.log(-torch.expm1(xs)), rtol=rtol), (dtype, y)
        assert torch.allclose(xd.grad.double(), -xs.exp() / -torch.expm1(xs), rtol=rtol), (dtype, xd.grad)
        edge = torch.tensor([0.0, -0.0, -1e-8, -torch.finfo(dtype).tiny], dtype=dtype, requires_grad=True)
        log1mexp(edge).sum().backward()
        assert torch.isfinite(edge.grad).all() and torch.isfinite(log1mexp(edge.detach())).all(), (dtype, edge.grad)
    # through eq 4: a one-hot student (max prob exactly 1) in bf16 backpropagates finite gradients
    logits = torch.randn(2, 3, 50)
    logits[0, 0] = torch.tensor([0.0] + [-1e4] * 49)
    lprobs = torch.log_softmax(logits, -1).to(torch.bfloat16).requires_grad_()
    student_class_lprobs(lprobs, torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    assert torch.isfinite(lprobs.grad).all()


def _args():
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), [
        os.path.join(TEACHER_DIR, "data-bin"), "--task", "translation", "-s", "de", "-t", "en", *TINY_PET])


def _reference_task():
    from fairseq import tasks

    return tasks.setup_task(_args())


def _student_and_sample(task):
    torch.manual_seed(0)
    model = task.build_model(_args())
    task.load_dataset("valid")
    ds = task.dataset("valid")
    return model, ds.collater([ds[i] for i in range(6)])


@needs_teacher
@pytest.mark.parametrize("mapping", ["pet", "output-layer", "projection"])
def test_warmup_gradients_reach_the_student_only(mapping):
    from user_dir.pet.warmup_criterion import PETWarmupConfig, PETWarmupCriterion

    task = _reference_task()
    model, sample = _student_and_sample(task)
    cfg = PETWarmupConfig(teacher_path=TEACHER, warmup_mapping=mapping, decoder_embed_dim=24, sentence_avg=False)
    criterion = PETWarmupCriterion(cfg, task)
    model.train()
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    assert math.isfinite(loss.item()) and sample_size == sample["ntokens"]
    assert sum(log[f"cls{c}"] for c in range(4)) == log["n_labels"] == int(sample["target"].ne(1).sum())
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    if mapping == "output-layer":  # the vocabulary projection (tied to the target embedding) is bypassed
        missing = [n for n in missing if "embed_tokens" not in n]
    assert not missing, missing
    assert all(p.grad is None for p in criterion.teacher.model.parameters())
    if mapping != "pet":
        assert criterion.head.weight.grad is not None  # the naive mapping's extra layer trains too
    else:
        assert not list(criterion.parameters())  # PET adds no parameter


@needs_teacher
def test_kd_loss_is_the_stated_mix_and_validation_reports_the_task_loss():
    """On a real padded batch: (1 - alpha) * label-smoothed CE + alpha * T^2 * KL(teacher^T || student^T)
    over non-padding tokens, computed here from the logits (fairseq's own label_smoothed_nll_loss
    for the CE); in validation the label-smoothed CE alone."""
    import torch.nn.functional as F
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    from user_dir.common.word_kd_criterion import WordKDCriterion

    task = _reference_task()
    model, sample = _student_and_sample(task)
    alpha, temperature, smoothing = 0.3, 2.0, 0.1
    crit = WordKDCriterion(task, False, smoothing, teacher_path=TEACHER, kd_alpha=alpha, kd_temperature=temperature)
    target, pad_idx = sample["target"], task.target_dictionary.pad()
    pad = target.eq(pad_idx)
    assert pad.any() and (~pad).any()  # a batch with padding, so the mask matters

    def expected():
        student = model(**sample["net_input"])[0].float()
        with torch.no_grad():
            teacher = crit.teacher.model(**sample["net_input"])[0].float()
        lprobs = F.log_softmax(student, -1)
        ce, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), smoothing, ignore_index=pad_idx)
        t_lprobs, s_lprobs = F.log_softmax(teacher / temperature, -1), F.log_softmax(student / temperature, -1)
        kl = (t_lprobs.exp() * (t_lprobs - s_lprobs)).sum(-1)  # per position
        return ce, kl[~pad].sum(), kl[pad].sum()

    model.eval()
    with torch.no_grad():
        val_loss, _, val_log = crit(model, sample)
        ce, _, _ = expected()
    assert torch.allclose(val_loss, ce, rtol=1e-5) and "kd_loss" not in val_log  # validation: the task loss alone
    model.train()  # dropout on: the same seed gives the criterion's forward and ours the same masks
    torch.manual_seed(0)
    train_loss, sample_size, log = crit(model, sample)
    torch.manual_seed(0)
    ce, kl, kl_on_padding = expected()
    assert sample_size == sample["ntokens"]
    assert torch.allclose(log["kd_loss"], temperature ** 2 * kl, rtol=1e-5), (log["kd_loss"], kl)
    assert torch.allclose(train_loss, (1 - alpha) * ce + alpha * temperature ** 2 * kl, rtol=1e-5)
    assert kl_on_padding > 1e-3 * kl  # summing over padding too would have changed the loss measurably
    with pytest.raises(ValueError, match="--kd-alpha"):
        WordKDCriterion(task, False, 0.1, teacher_path=TEACHER, kd_alpha=2.0)


def _teacher_run_flags(multi30k_slice, tmp_path):
    return [multi30k_slice, "--user-dir", USER_DIR, *TINY_PET, *OPTIM_FLAGS, "--max-update", "1", "--cpu",
            "--save-dir", tmp_path]


def test_missing_teacher_fails_at_start_naming_the_flag(multi30k_slice, tmp_path):
    missing = run_cli("fairseq_cli.train", *_teacher_run_flags(multi30k_slice, tmp_path), "--criterion", "pet_warmup",
                      "--teacher-path", tmp_path / "none.pt", check=False)
    assert missing.returncode != 0 and "--teacher-path" in missing.stderr and "no such checkpoint" in missing.stderr
    assert "num_updates" not in missing.stdout + missing.stderr


@needs_teacher
def test_teacher_of_another_vocabulary_fails_at_start_naming_the_flag(multi30k_slice, tmp_path):
    # the slice's own BPE dictionary differs from the reference teacher's
    other = run_cli("fairseq_cli.train", *_teacher_run_flags(multi30k_slice, tmp_path), "--criterion", "kd",
                    "--teacher-path", TEACHER, check=False)
    assert other.returncode != 0 and re_search(r"--teacher-path .*vocabulary has 7896 entries", other.stderr)
    assert "num_updates" not in other.stdout + other.stderr


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


@needs_teacher
def test_warmup_then_kd_from_the_warmed_checkpoint_keeps_sharing(tmp_path):
    from fairseq import checkpoint_utils

    data = os.path.join(TEACHER_DIR, "data-bin")
    warm = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_PET, *OPTIM_FLAGS, "--max-update", "2",
                   "--criterion", "pet_warmup", "--teacher-path", TEACHER, "--save-dir", tmp_path / "warm", "--cpu")
    assert re_search(r"cls0=[\d.]+, cls1=[\d.]+, cls2=[\d.]+, cls3=[\d.]+", warm.stdout + warm.stderr)
    kd = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_PET, *OPTIM_FLAGS, "--max-update", "2",
                 "--criterion", "kd", "--teacher-path", TEACHER, "--label-smoothing", "0.1",
                 "--finetune-from-model", tmp_path / "warm" / "checkpoint_last.pt", "--save-dir", tmp_path / "kd", "--cpu")
    log = kd.stdout + kd.stderr
    assert re_search(r"kd_loss=[\d.]+", log) and "loaded checkpoint" in log.lower()
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "kd" / "checkpoint_last.pt")])
    enc = models[0].encoder.layers
    assert enc[3].self_attn.k_proj.weight is enc[1].self_attn.q_proj.weight
