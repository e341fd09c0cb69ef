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

The module (eqs 5-9), :class:`CompressedSelfAttention`, replaces an *encoder* self-attention:
``q_proj``, ``k_proj``, ``v_proj`` become :class:`BlockDiagonalAPCLinear` (per-head blocks of
``D^Q, D^K, D^V``, with their ``b_D`` and corrective ``B``) and ``out_proj`` an input-compressed
:class:`APCLinear` (``U^O`` with ``b_U`` and ``B``); the heads attend in ``cmp^a / H`` dimensions with
the original scaling ``1/sqrt(d_K)`` (eq. 8). ``U^O`` is a full ``cmp^a x embed`` matrix (the paper
calls only the D's block diagonal). Finalized, the four projections are dense layers of the
compressed width: no stock fairseq architecture has attention narrower than the embedding, so such a
model stays ``apc_transformer --apc-finalized``. Decoder attention (self and encoder-decoder, with
their incremental states for beam search) is not compressed here.

Initialisation (:func:`init_attention_svd`): ``D^Q, D^K`` per head by eq. 11's closed form;
``D^V`` (paired with ``U^O``, error ``||SA(X) - SA(X) D^V U^O||``, eq. 9) per head by the top
``cmp^a/H`` right singular vectors of that head's sampled outputs ``Y_i`` (a PCA without centring),
then ``U^O`` by least squares on the concatenated heads -- our choice, the paper only names the pair.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .reparameterised_linear import APCLinear, BlockDiagonalAPCLinear


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


class CompressedSelfAttention(nn.Module):
    """Encoder self-attention with APC attention compression (eqs 5-9); see the module docstring."""

    def __init__(self, mha: nn.Module, cmp_a: int, train_original: bool = False, finalized: bool = False,
                 flag: str = "--apc-encoder-attn-dims"):
        super().__init__()
        heads, embed = mha.num_heads, mha.embed_dim
        if cmp_a % heads:
            raise ValueError(f"{flag}: cmp^a={cmp_a} must be a multiple of the {heads} attention heads")
        if getattr(mha, "bias_k", None) is not None or getattr(mha, "add_zero_attn", False):
            raise ValueError(f"{flag}: attention with --add-bias-kv / --add-zero-attn is not supported")
        self.num_heads, self.embed_dim, self.cmp_a = heads, embed, cmp_a
        self.scaling = mha.head_dim ** -0.5  # the original d_K (eq. 8)
        self.dropout_module = mha.dropout_module
        if finalized:
            factory = dict(device=mha.q_proj.weight.device, dtype=mha.q_proj.weight.dtype)
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed, cmp_a, **factory) for _ in range(3))
            self.out_proj = nn.Linear(cmp_a, embed, **factory)
        else:
            self.q_proj, self.k_proj, self.v_proj = (
                BlockDiagonalAPCLinear(lin, cmp_a, heads, train_original) for lin in (mha.q_proj, mha.k_proj, mha.v_proj))
            self.out_proj = APCLinear(mha.out_proj, cmp_in=cmp_a, train_original=train_original)

    def forward(self, query, key=None, value=None, key_padding_mask: Optional[torch.Tensor] = None,
                need_weights: bool = False, attn_mask: Optional[torch.Tensor] = None, **unused):
        if unused.get("incremental_state") is not None:
            raise RuntimeError("APC attention compression supports encoder self-attention only")
        tgt_len, bsz, _ = query.shape
        heads, c = self.num_heads, self.cmp_a // self.num_heads
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(query), self.v_proj(query)
        q, k, v = (t.contiguous().view(tgt_len, bsz * heads, c).transpose(0, 1) for t in (q, k, v))
        scores = torch.bmm(q, k.transpose(1, 2))  # (bsz*heads, tgt, src)
        if attn_mask is not None:
            scores = scores + attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            scores = scores.view(bsz, heads, tgt_len, tgt_len).masked_fill(
                key_padding_mask.bool()[:, None, None, :], float("-inf")).view(bsz * heads, tgt_len, tgt_len)
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = torch.bmm(self.dropout_module(probs), v)  # (bsz*heads, tgt, c)
        out = out.transpose(0, 1).contiguous().view(tgt_len, bsz, heads * c)
        weights = probs.view(bsz, heads, tgt_len, tgt_len).mean(1) if need_weights else None
        return self.out_proj(out), weights

    def compression_parameters(self):
        return [p for m in (self.q_proj, self.k_proj, self.v_proj, self.out_proj) if isinstance(m, APCLinear)
                for p in m.compression_parameters()]

    @torch.no_grad()
    def finalize_(self) -> None:
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            m = getattr(self, name)
            if isinstance(m, APCLinear):
                setattr(self, name, m.finalize())


def head_blocks(t: torch.Tensor, heads: int) -> List[torch.Tensor]:
    """Split the last dimension into ``heads`` equal blocks."""
    return list(t.view(*t.shape[:-1], heads, -1).unbind(-2))


@torch.no_grad()
def init_attention_svd(attn: CompressedSelfAttention, sentences: List[torch.Tensor]) -> None:
    """Initialise ``D^Q, D^K`` (eq. 11) and ``D^V, U^O`` (eq. 9, see the module docstring) from the
    uncompressed projections (``attn.*_proj.linear``) on real inputs, one ``(T_s, embed)`` tensor of
    non-padding positions per sentence; ``b_D``, ``b_U`` and ``B`` are set to 0 (section 4.2)."""
    heads, c = attn.num_heads, attn.cmp_a // attn.num_heads
    lin = {n: getattr(attn, n).linear for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    X = torch.cat(sentences).double()
    Q, K = (F.linear(X, lin[n].weight.double(), lin[n].bias.double()) for n in ("q_proj", "k_proj"))
    Y = []  # per-sentence attention outputs of all heads before out_proj, (T_s, embed)
    for x in sentences:
        x = x.double()
        q, k, v = (F.linear(x, lin[n].weight.double(), lin[n].bias.double()) for n in ("q_proj", "k_proj", "v_proj"))
        per_head = [torch.softmax(qh @ kh.t() * attn.scaling, -1) @ vh
                    for qh, kh, vh in zip(head_blocks(q, heads), head_blocks(k, heads), head_blocks(v, heads))]
        Y.append(torch.cat(per_head, -1))
    Y = torch.cat(Y)
    DQ, DK, DV = (torch.zeros_like(getattr(attn, n).D, dtype=torch.float64) for n in ("q_proj", "k_proj", "v_proj"))
    d = attn.embed_dim // heads
    for i, (qh, kh, yh) in enumerate(zip(head_blocks(Q, heads), head_blocks(K, heads), head_blocks(Y, heads))):
        dq, dk = qk_svd_solution(qh, kh, c)
        DQ[i * d:(i + 1) * d, i * c:(i + 1) * c] = dq
        DK[i * d:(i + 1) * d, i * c:(i + 1) * c] = dk
        DV[i * d:(i + 1) * d, i * c:(i + 1) * c] = torch.linalg.svd(yh, full_matrices=False)[2][:c].t()
    UO = torch.linalg.lstsq(Y @ DV, Y, driver="gelsd" if Y.device.type == "cpu" else None).solution
    for name, D in (("q_proj", DQ), ("k_proj", DK), ("v_proj", DV)):
        m = getattr(attn, name)
        m.reset_compression_parameters()
        m.D.copy_(D)
    attn.out_proj.reset_compression_parameters()
    attn.out_proj.U.copy_(UO)
