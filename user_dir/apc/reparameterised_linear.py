"""APC's reparameterised affine layer (APC paper, section 3.1, eqs 1-3, Figure 1).

The paper writes a layer as ``Y = X W + b`` with ``W`` of shape ``in x out``; torch's ``nn.Linear``
stores ``weight`` of shape ``out x in`` and computes ``x @ weight.T + bias``, so here
``W = linear.weight.T`` throughout. APC adds, for a compressed input size ``cmp_in`` and a
compressed output size ``cmp_out``,

* ``U``   (``cmp_in x in``):    maps the compressed input back up, ``X_hat = X~ U + b_U``;
* ``b_U`` (``in``):             its bias;
* ``D``   (``out x cmp_out``):  maps the layer's output down, ``Y~ = Y D + b_D``;
* ``b_D`` (``cmp_out``):        its bias;
* ``B``   (``cmp_in x cmp_out``): the corrective weight, ``Y~ += X~ B``;

so ``Y~ = X~ (U W D + B) + (D^T W^T b_U + D^T b + b_D)`` = ``X~ W~ + b~`` (eqs 1-2).

Choices the paper leaves open, and ours:

* The paper's text gives ``b_D in R^out``, but eq. 2 adds ``b_D`` to ``D^T b in R^cmp_out`` and eq. 3
  adds it after ``D``: ``b_D`` has ``cmp_out`` entries here.
* Either side may be uncompressed (``cmp_in=None``: ``U = I``, no ``b_U``; ``cmp_out=None``: ``D = I``,
  no ``b_D``); ``B`` then has the uncompressed size on that side (eq. 3's ``B = U B~`` for an
  uncompressed input). The feed-forward compression (eq. 12) uses one of each.
* Every reparameterised layer has its own ``B`` (eq. 1), zero at initialisation (section 4.2: "we
  set b_U, b_D and B to 0").
* The forward pass is the *unfolded* computation of Figure 1 (up-project, original layer,
  down-project, plus ``X~ B``), so the original ``W`` receives gradients when trainable and
  :func:`fold_linear` (eqs 1-2) is checked against it; ``finalize()`` returns the folded dense layer.
* ``W`` and ``b`` are frozen unless ``train_original=True`` (``--apc-train-original``), the paper's
  "Compr. only" vs "All Params" (Table 3).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

RANDOM_INIT_STD = 1e-3  # section 4.2: N(0, variance 1e-6)


def fold_linear(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    U: Optional[torch.Tensor] = None,
    b_U: Optional[torch.Tensor] = None,
    D: Optional[torch.Tensor] = None,
    b_D: Optional[torch.Tensor] = None,
    B: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eqs 1-2 in torch's convention: returns ``(weight~, bias~)`` of the dense compressed layer,
    ``weight~ = (U W D + B)^T`` of shape ``cmp_out x cmp_in`` and ``bias~ = D^T W^T b_U + D^T b + b_D``.

    ``weight`` is ``nn.Linear.weight`` (``out x in``), i.e. the paper's ``W^T``. Half-precision tensors
    (a model trained or loaded with ``--fp16``/``--bf16``) are folded in float32 and the result is cast
    back to ``weight``'s dtype once: folding ``U W D`` in bfloat16 rounds every intermediate product,
    and ``finalize_()`` of a half-precision model would then differ from ``apc_finalize`` (which
    folds in float32) on the same weights.
    """
    dtype = weight.dtype
    work = torch.promote_types(dtype, torch.float32)  # float64 stays float64
    weight, bias, U, b_U, D, b_D, B = (None if t is None else t.to(work) for t in (weight, bias, U, b_U, D, b_D, B))
    W = weight.t()  # paper's in x out
    b = bias if bias is not None else weight.new_zeros(weight.size(0))
    W_t = W
    c = b
    if U is not None:
        W_t = U @ W_t
        if b_U is not None:
            c = c + b_U @ W  # W^T b_U
    if D is not None:
        W_t = W_t @ D
        c = c @ D  # D^T (.)
        if b_D is not None:
            c = c + b_D
    if B is not None:
        W_t = W_t + B
    return W_t.t().contiguous().to(dtype), c.contiguous().to(dtype)


class APCLinear(nn.Module):
    """An ``nn.Linear`` reparameterised by APC (eqs 1-3); see the module docstring."""

    def __init__(self, linear: nn.Linear, cmp_in: Optional[int] = None, cmp_out: Optional[int] = None,
                 train_original: bool = False):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"APCLinear wraps an nn.Linear, got {type(linear).__name__} (quant-noise is not supported)")
        n_out, n_in = linear.weight.shape
        for name, size, full in (("cmp_in", cmp_in, n_in), ("cmp_out", cmp_out, n_out)):
            if size is not None and not 0 < size <= full:
                raise ValueError(f"{name}={size}: a compressed size must lie in 1..{full}")
        self.linear = linear
        self.in_features, self.out_features = cmp_in or n_in, cmp_out or n_out
        self.original_in, self.original_out = n_in, n_out
        factory = dict(device=linear.weight.device, dtype=linear.weight.dtype)
        self.U = nn.Parameter(torch.empty(cmp_in, n_in, **factory)) if cmp_in else None
        self.b_U = nn.Parameter(torch.zeros(n_in, **factory)) if cmp_in else None
        self.D = nn.Parameter(torch.empty(n_out, cmp_out, **factory)) if cmp_out else None
        self.b_D = nn.Parameter(torch.zeros(cmp_out, **factory)) if cmp_out else None
        self.B = nn.Parameter(torch.zeros(self.in_features, self.out_features, **factory))
        self.reset_compression_parameters()
        self.linear.requires_grad_(train_original)
        self.record = False  # when True, forward keeps the tensors the activation-KD loss needs
        self.recorded_full_output: Optional[torch.Tensor] = None
        self.recorded_reconstruction: Optional[torch.Tensor] = None

    def reset_compression_parameters(self) -> None:
        """The paper's random initialisation (section 4.2): U, D ~ N(0, 1e-6); b_U, b_D, B = 0."""
        with torch.no_grad():
            for p in (self.U, self.D):
                if p is not None:
                    p.normal_(0.0, RANDOM_INIT_STD)
            for p in (self.b_U, self.b_D, self.B):
                if p is not None:
                    p.zero_()

    def compression_parameters(self):
        return [p for p in (self.U, self.b_U, self.D, self.b_D, self.B) if p is not None]

    def effective_D(self) -> Optional[torch.Tensor]:
        """``D`` as the layer uses it (a subclass may constrain its structure)."""
        return self.D

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_hat = x @ self.U + self.b_U if self.U is not None else x
        y = F.linear(x_hat, self.linear.weight, self.linear.bias)
        if self.record:
            self.recorded_reconstruction = x_hat if self.U is not None else None
            self.recorded_full_output = y if self.D is not None else None
        if self.D is not None:
            y = y @ self.effective_D() + self.b_D
        return y + x @ self.B

    def folded(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return fold_linear(self.linear.weight, self.linear.bias, self.U, self.b_U, self.effective_D(), self.b_D,
                           self.B)

    @torch.no_grad()
    def finalize(self) -> nn.Linear:
        """The dense ``nn.Linear(cmp_in, cmp_out)`` computing the same function (eqs 1-2)."""
        weight, bias = self.folded()
        out = nn.Linear(self.in_features, self.out_features, device=weight.device, dtype=weight.dtype)
        out.weight.copy_(weight)
        out.bias.copy_(bias)
        return out

    def extra_repr(self) -> str:
        return (f"in={self.original_in}->{self.in_features}, out={self.original_out}->{self.out_features}, "
                f"train_original={self.linear.weight.requires_grad}")


class BlockDiagonalAPCLinear(APCLinear):
    """An output-compressed :class:`APCLinear` whose ``D`` is block diagonal, one ``d_head x cmp_head``
    block per attention head (APC section 3.2, "Attention Compression": D^Q, D^K, D^V). ``D`` is stored
    full (``out x cmp_out``) and multiplied by a fixed block mask, so entries outside the blocks stay
    zero and get no gradient; the folded weight is computed from the masked ``D``. Its input may be
    compressed too (``cmp_in``: embedding compression's outer upscaling ``U^Q``, ``U^K``, ``U^V``, a full
    matrix shared by the heads)."""

    def __init__(self, linear: nn.Linear, cmp_out: int, heads: int, train_original: bool = False,
                 cmp_in: Optional[int] = None):
        n_out = linear.weight.size(0)
        if n_out % heads or cmp_out % heads:
            raise ValueError(f"block-diagonal D: out={n_out} and cmp_out={cmp_out} must both be multiples of "
                             f"the {heads} heads")
        super().__init__(linear, cmp_in=cmp_in, cmp_out=cmp_out, train_original=train_original)
        d, c = n_out // heads, cmp_out // heads
        mask = torch.block_diag(*[torch.ones(d, c) for _ in range(heads)]).to(self.D)
        self.register_buffer("block_mask", mask, persistent=False)
        with torch.no_grad():
            self.D.mul_(mask)
        self.heads = heads

    def effective_D(self) -> torch.Tensor:
        return self.D * self.block_mask
