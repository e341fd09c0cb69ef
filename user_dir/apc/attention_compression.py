"""The closed-form initialisation of APC's attention compression for D^Q, D^K (APC paper, section 3.2
"Attention Compression", eqs 10-11, Appendix B).

Per head ``i``, with ``A1 = X W_i^Q`` and ``A2 = X W_i^K`` (``n x d_head``), APC pairs the block-diagonal
downscalings ``D_i^Q, D_i^K`` (``d_head x cmp``) and minimises the upper bound (eq. 11)

    || A1 (I - D^Q (D^K)^T) A2^T ||_F

whose optimum (Appendix B, eq. 14) is ``D^Q = A1^+ L^``, ``D^K = A2^+ R^`` with ``L^, R^`` the first
``cmp`` columns of ``L Sigma^{1/2}`` and ``R Sigma^{1/2}`` for the SVD ``A1 A2^T = L Sigma R^T``.

Implementation: ``A1 A2^T`` is ``n x n``; with thin QR factors ``A1 = Q1 R1``, ``A2 = Q2 R2`` its SVD is
``Q1 P . S . (Q2 V)^T`` for the SVD ``R1 R2^T = P S V^T`` of a ``d_head x d_head`` matrix, so nothing of
size ``n x n`` is ever formed. Our choices where the paper is silent: ``A1``/``A2`` are the actual
per-head queries and keys, i.e. fairseq's ``q_proj``/``k_proj`` outputs *including their biases*; the
expectation over inputs ``X`` is replaced by one matrix of sampled token positions stacked together
(so the objective also covers query-key pairs across sentences); the per-head size is ``cmp^a / H``.
Only this initialisation is implemented here; the block-diagonal attention compression module
itself (eqs 5-9) is not built yet.
"""
from typing import Tuple

import torch


def qk_svd_solution(A1: torch.Tensor, A2: torch.Tensor, cmp: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(D^Q, D^K)``, each ``d_head x cmp`` (float64), minimising eq. 11 on the stacked samples."""
    A1, A2 = A1.double(), A2.double()
    n, d = A1.shape
    if A2.shape != (n, d):
        raise ValueError(f"queries {tuple(A1.shape)} and keys {tuple(A2.shape)} must have one shape")
    if not 0 < cmp <= d:
        raise ValueError(f"cmp={cmp} must lie in 1..{d} (the head dimension)")
    if n < d:
        raise ValueError(f"{n} samples for a head dimension of {d}: Appendix B needs n >= d (maximal rank)")
    Q1, R1 = torch.linalg.qr(A1)
    Q2, R2 = torch.linalg.qr(A2)
    P, S, Vh = torch.linalg.svd(R1 @ R2.t())
    root = S[:cmp].sqrt()
    L_hat = Q1 @ (P[:, :cmp] * root)
    R_hat = Q2 @ (Vh[:cmp].t() * root)
    DQ = torch.linalg.lstsq(A1, L_hat).solution
    DK = torch.linalg.lstsq(A2, R_hat).solution
    return DQ, DK


def qk_objective(A1: torch.Tensor, A2: torch.Tensor, DQ: torch.Tensor, DK: torch.Tensor) -> float:
    """Eq. 11 for one input: ``|| A1 (I - D^Q D^K^T) A2^T ||_F``."""
    A1, A2 = A1.double(), A2.double()
    eye = torch.eye(A1.size(1), dtype=torch.float64)
    return (A1 @ (eye - DQ.double() @ DK.double().t()) @ A2.t()).norm().item()
