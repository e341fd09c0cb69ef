"""APC's reconstruction error (APC paper, eq. 4; Table 5): ``E_X || X^{l+1} - X~^{l+1} ||_F`` for a
compressed FFN, with ``X^{l+1} = sigma(X W + b)`` and
``X~^{l+1} = sigma((X W + b) D + b_D + X B) U + b_U`` (eq. 3).

The paper does not say over what the expectation runs nor how large each ``X`` is. Ours: ``X`` is one
token's FFN input, so the error is the mean over sampled token positions of the Euclidean norm of the
difference (a per-token number, independent of how many samples are drawn). For the activation-KD
loss (apc_criterion.py) the Frobenius norm runs over a batch's non-padding positions instead.
"""
from typing import Callable, Optional

import torch


@torch.no_grad()
def ffn_reconstruction_error(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, D: torch.Tensor,
                             U: torch.Tensor, activation: Callable, b_D: Optional[torch.Tensor] = None,
                             b_U: Optional[torch.Tensor] = None, B: Optional[torch.Tensor] = None) -> float:
    X = X.double()
    Z = X @ weight.double().t() + bias.double()
    H = Z @ D.double()
    if b_D is not None:
        H = H + b_D.double()
    if B is not None:
        H = H + X @ B.double()
    approx = activation(H) @ U.double()
    if b_U is not None:
        approx = approx + b_U.double()
    return (activation(Z) - approx).norm(dim=-1).mean().item()
