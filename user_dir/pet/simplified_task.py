"""PET's warm-up with a simplified task (Jeon et al. 2023, Table 5 and eqs 2-4), as pure functions.

The teacher labels each target token with one of four classes (Table 5):

| class | teacher's prediction for the token |
| --- | --- |
| 0 confidently correct | argmax = y and max prob >= eps1 |
| 1 correct, not confident | argmax = y and max prob < eps1 |
| 2 confidently wrong | argmax != y and max prob >= eps2 |
| 3 wrong, not confident | argmax != y and max prob < eps2 |

(Table 5 writes both boundaries with "<=" and ">="; a probability equal to the threshold counts as
confident here.) The student's probabilities for these classes come from its own vocabulary
distribution p (eqs 2-4), assuming confidence and correctness independent:
P(confident) = max p, P(correct) = p_y, and the four products
[P(conf)P(corr), P(not conf)P(corr), P(conf)P(not corr), P(not conf)P(not corr)], which sum to 1.
Everything is computed from log-probabilities, with log(1 - p) = log1mexp(log p), so it is exact
and finite in fp16/bf16 (the inputs are upcast to float32).
"""
import math

import torch

NUM_CLASSES = 4
CLASS_NAMES = ("confidently_correct", "correct_not_confident", "confidently_wrong", "wrong_not_confident")


def teacher_labels(teacher_lprobs: torch.Tensor, target: torch.Tensor, eps1: float, eps2: float) -> torch.Tensor:
    """Table 5 classes (0..3) of each position from the teacher's log-probabilities ``(..., V)``."""
    if not (0.0 <= eps1 <= 1.0 and 0.0 <= eps2 <= 1.0):
        raise ValueError(f"--eps1 {eps1} and --eps2 {eps2} are probabilities: they must lie in [0, 1]")
    max_lprob, argmax = teacher_lprobs.float().max(dim=-1)
    correct = argmax.eq(target)
    confident = torch.where(correct, max_lprob >= math.log(eps1) if eps1 > 0 else torch.ones_like(correct),
                            max_lprob >= math.log(eps2) if eps2 > 0 else torch.ones_like(correct))
    # class index = 2 * (not correct) + (not confident)
    return (~correct).long() * 2 + (~confident).long()


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Maechler 2012).

    Both branches are evaluated (and differentiated) by ``torch.where``, so each gets an input
    inside its own safe range: ``log1p(-exp(x))`` at x within rounding of 0 is -inf, and its
    gradient, multiplied by the branch's zero weight, would be NaN."""
    x = x.clamp(max=-torch.finfo(x.dtype).tiny)  # exp(x) < 1 strictly: keep log(1 - p) finite
    near_zero = x > -math.log(2.0)
    safe = torch.full_like(x, -1.0)  # inside both branches' safe ranges
    return torch.where(near_zero, torch.log(-torch.expm1(torch.where(near_zero, x, safe))),
                       torch.log1p(-torch.exp(torch.where(near_zero, safe, x))))


def student_class_lprobs(student_lprobs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq 4 in log space: ``(..., 4)`` log-probabilities of the four classes from ``(..., V)``."""
    lprobs = student_lprobs.float()
    log_conf = lprobs.max(dim=-1).values
    log_corr = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    log_not_conf, log_not_corr = log1mexp(log_conf), log1mexp(log_corr)
    return torch.stack([log_conf + log_corr, log_not_conf + log_corr,
                        log_conf + log_not_corr, log_not_conf + log_not_corr], dim=-1)
