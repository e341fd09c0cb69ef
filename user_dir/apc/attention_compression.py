"""APC's attention compression (APC paper, section 3.2 "Attention Compression", eqs 5-11, Appendix B)
on every multi-head attention of a fairseq Transformer: encoder self-attention, decoder self-attention
and the decoder's encoder-decoder attention.

The module (eqs 5-9), :class:`CompressedAttention`, is fairseq's own ``MultiheadAttention`` with its
projections reparameterised: ``q_proj``, ``k_proj``, ``v_proj`` become :class:`BlockDiagonalAPCLinear`
(per-head blocks of ``D^Q, D^K, D^V``, with their ``b_D`` and corrective ``B``) and ``out_proj`` an
input-compressed :class:`APCLinear` (``U^O`` with ``b_U`` and ``B``). The heads attend in ``cmp^a / H``
dimensions with the original scaling ``1/sqrt(d_K)`` (eq. 8). Everything else is fairseq's forward:
fairseq's head pruning already runs a ``MultiheadAttention`` whose inner width (``embed_dim``,
``head_dim``) is below the model's (``skip_embed_dim_check``), so the same settings give the compressed
attention fairseq's incremental decoding (the cached ``prev_key``/``prev_value`` per head are
``cmp^a / H`` wide), static encoder keys, beam reordering and attention weights for alignment, unchanged.
``U^O`` is a full ``cmp^a x embed`` matrix (the paper calls only the D's block diagonal). Finalized,
the four projections are dense layers of the compressed width. No stock fairseq attention is narrower
than its embedding, but eq. 8 keeps the original ``sqrt(d_K)``: padding every head's compressed
queries, keys and values with zeros back to ``d_K`` (:func:`pad_attention_state`) gives a stock
attention computing exactly the same function, at the original size.

Initialisation (:func:`init_attention_svd`): ``D^Q, D^K`` per head by eq. 11's closed form
(:func:`qk_svd_solution`). Per head ``i``, with ``A1 = X W_i^Q`` and ``A2 = X' W_i^K`` (``X' = X`` for
self-attention, the encoder output for encoder-decoder attention), APC minimises the upper bound
(eq. 11) ``|| A1 (I - D^Q (D^K)^T) A2^T ||_F``, whose optimum (Appendix B, eq. 14) is ``D^Q = A1^+ L^``,
``D^K = A2^+ R^`` with ``L^, R^`` the first ``cmp`` columns of ``L Sigma^{1/2}`` and ``R Sigma^{1/2}`` for
the SVD ``A1 A2^T = L Sigma R^T``. ``A1 A2^T`` is ``n1 x n2``; with thin QR factors ``A1 = Q1 R1``,
``A2 = Q2 R2`` its SVD is ``Q1 P . S . (Q2 V)^T`` for the SVD ``R1 R2^T = P S V^T`` of a
``d_head x d_head`` matrix, so nothing of size ``n1 x n2`` is ever formed (the proof of Appendix B
holds for ``n1 != n2``: it only needs ``L^`` in the column space of ``A1``, ``R^`` in that of ``A2``).
``D^V`` (paired with ``U^O``, error ``||SA(X) - SA(X) D^V U^O||``, eq. 9) per head by the top
``cmp^a/H`` right singular vectors of that head's sampled outputs ``Y_i`` (a PCA without centring),
then ``U^O`` by least squares on the concatenated heads.

Choices the paper leaves open (its model is an encoder, BERT), and ours:

* decoder self-attention and encoder-decoder attention are compressed like the encoder's, each with
  its own per-layer size flag (apc_transformer.py);
* ``A1``/``A2`` are the actual per-head queries and keys, i.e. fairseq's ``q_proj``/``k_proj`` outputs
  *including their biases*; the expectation over inputs is replaced by one matrix of sampled token
  positions stacked together (so the objective also covers query-key pairs across sentences; for
  encoder-decoder attention ``A1`` stacks target positions, ``A2`` source positions);
* the head outputs ``Y_i`` of decoder self-attention are computed with the causal mask, as the
  decoder computes them; the per-head size is ``cmp^a / H``; ``U^O`` is solved by least squares.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention

from .reparameterised_linear import APCLinear, BlockDiagonalAPCLinear


def qk_svd_solution(A1: torch.Tensor, A2: torch.Tensor, cmp: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(D^Q, D^K)``, each ``d_head x cmp`` (float64), minimising eq. 11 for queries ``A1`` (``n1 x d``)
    and keys ``A2`` (``n2 x d``), the stacked samples."""
    A1, A2 = A1.double(), A2.double()
    d = A1.size(1)
    if A2.size(1) != d:
        raise ValueError(f"queries {tuple(A1.shape)} and keys {tuple(A2.shape)} must have one head dimension")
    if not 0 < cmp <= d:
        raise ValueError(f"cmp={cmp} must lie in 1..{d} (the head dimension)")
    if min(A1.size(0), A2.size(0)) < d:
        raise ValueError(f"{A1.size(0)} query and {A2.size(0)} key samples for a head dimension of {d}: "
                         "Appendix B needs n >= d (maximal rank)")
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


class CompressedAttention(MultiheadAttention):
    """A fairseq ``MultiheadAttention`` with APC attention compression (eqs 5-9); see the module docstring.

    ``mha`` is the attention it replaces: its ``nn.Linear`` projections become the frozen (or, with
    ``train_original``, trainable) ``W`` of the reparameterised ones; with ``finalized`` they are
    replaced by dense layers of the compressed width (values come from a finalized state dict)."""

    def __init__(self, mha: MultiheadAttention, cmp_a: Optional[int], train_original: bool = False,
                 finalized: bool = False, flag: str = "--apc-encoder-attn-dims", cmp_e: Optional[int] = None):
        heads, embed = mha.num_heads, mha.embed_dim
        if cmp_a is not None and cmp_a % heads:
            raise ValueError(f"{flag}: cmp^a={cmp_a} must be a multiple of the {heads} attention heads")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(f"{flag}: attention with --add-bias-kv / --add-zero-attn is not supported")
        if getattr(mha, "use_xformers", False):
            raise ValueError(f"{flag}: attention with --xformers-att-config is not supported")
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            if type(getattr(mha, name)) is not nn.Linear:
                raise ValueError(f"{flag}: {name} is not a plain Linear (quant-noise is not supported)")
        super().__init__(embed, heads, kdim=mha.kdim, vdim=mha.vdim, dropout=mha.dropout_module.p,
                         self_attention=mha.self_attention, encoder_decoder_attention=mha.encoder_decoder_attention)
        self.dropout_module = mha.dropout_module  # its apply_during_inference / module name
        # cmp_a: the inner (per-head) compression, None = heads keep their width; cmp_e: the block's embedding
        # compression (embedding_compression.py), None = the block works at the model's width
        self.original_embed_dim, self.cmp_a, self.cmp_e = embed, cmp_a, cmp_e
        self.scaling = mha.head_dim ** -0.5  # the original d_K (eq. 8)
        # fairseq's convention for an attention narrower than the model (its head pruning): embed_dim and
        # head_dim are the inner widths, and the embed-dim check (with the fused fast path) is skipped
        if cmp_a is not None:
            self.embed_dim, self.head_dim = cmp_a, cmp_a // heads
        self.skip_embed_dim_check = True
        # inputs of each projection: the block's compressed stream (queries; keys and values of a
        # self-attention) or the full-width encoder output (keys and values of encoder-decoder attention)
        kv_in = cmp_e if mha.self_attention else None
        ins = {"q_proj": cmp_e, "k_proj": kv_in, "v_proj": kv_in}
        if finalized:
            factory = dict(device=mha.q_proj.weight.device, dtype=mha.q_proj.weight.dtype)
            for name, full_in in (("q_proj", embed), ("k_proj", self.kdim), ("v_proj", self.vdim)):
                setattr(self, name, nn.Linear(ins[name] or full_in, cmp_a or embed, **factory))
            self.out_proj = nn.Linear(cmp_a or embed, cmp_e or embed, **factory)
            return
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(mha, name)
            if cmp_a is not None:
                lin = BlockDiagonalAPCLinear(lin, cmp_a, heads, train_original, cmp_in=ins[name])
            elif ins[name] is not None:
                lin = APCLinear(lin, cmp_in=ins[name], train_original=train_original)
            setattr(self, name, lin)
        self.out_proj = APCLinear(mha.out_proj, cmp_in=cmp_a, cmp_out=cmp_e, train_original=train_original)

    def reset_parameters(self):
        """Nothing to do: the projections are the original attention's (or set by a loaded state dict)."""
        if not hasattr(self, "cmp_e"):
            super().reset_parameters()  # only while MultiheadAttention.__init__ builds its throw-away layers


def head_blocks(t: torch.Tensor, heads: int) -> List[torch.Tensor]:
    """Split the last dimension into ``heads`` equal blocks."""
    return list(t.view(*t.shape[:-1], heads, -1).unbind(-2))


def _project(x: torch.Tensor, lin: nn.Linear) -> torch.Tensor:
    return F.linear(x.double(), lin.weight.double(), None if lin.bias is None else lin.bias.double())


@torch.no_grad()
def init_attention_svd(attn: CompressedAttention, queries: List[torch.Tensor],
                       keys: Optional[List[torch.Tensor]] = None, causal: bool = False) -> None:
    """Initialise ``D^Q, D^K`` (eq. 11) and ``D^V, U^O`` (eq. 9, see the module docstring) from the
    uncompressed projections (``attn.*_proj.linear``) on real inputs: ``queries`` holds one ``(T_s, embed)``
    tensor of non-padding positions per sentence, ``keys`` the matching ``(S_s, kdim)`` encoder outputs for
    encoder-decoder attention (``None``: self-attention, keys = queries); ``causal`` masks future positions
    (decoder self-attention). ``b_D``, ``b_U`` and ``B`` are set to 0 (section 4.2)."""
    keys = queries if keys is None else keys
    if len(keys) != len(queries):
        raise ValueError(f"{len(queries)} query sentences but {len(keys)} key sentences")
    heads, c = attn.num_heads, attn.cmp_a // attn.num_heads
    lin = {n: getattr(attn, n).linear for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    Q, K = _project(torch.cat(queries), lin["q_proj"]), _project(torch.cat(keys), lin["k_proj"])
    Y = []  # per-sentence attention outputs of all heads before out_proj, (T_s, embed)
    for xq, xk in zip(queries, keys):
        q, k, v = _project(xq, lin["q_proj"]), _project(xk, lin["k_proj"]), _project(xk, lin["v_proj"])
        mask = None
        if causal:
            mask = torch.ones(q.size(0), k.size(0), dtype=torch.bool).triu(1)
        per_head = []
        for qh, kh, vh in zip(head_blocks(q, heads), head_blocks(k, heads), head_blocks(v, heads)):
            scores = qh @ kh.t() * attn.scaling
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            per_head.append(torch.softmax(scores, -1) @ vh)
        Y.append(torch.cat(per_head, -1))
    Y = torch.cat(Y)
    DQ, DK, DV = (torch.zeros_like(getattr(attn, n).D, dtype=torch.float64) for n in ("q_proj", "k_proj", "v_proj"))
    d = attn.original_embed_dim // heads
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


def pad_attention_state(sd: Dict[str, torch.Tensor], prefix: str, heads: int, head_dim: int) -> None:
    """Zero-pad a finalized compressed attention ``prefix`` (``q/k/v_proj`` of ``cmp^a`` outputs,
    ``out_proj`` of ``cmp^a`` inputs) in the state dict ``sd`` back to ``heads * head_dim``, in place:
    every head's compressed dimensions first, zeros after. The zero queries, keys and values add
    nothing to any score or output, and the scaling is the original ``1/sqrt(d_K)`` either way (eq. 8),
    so a stock ``MultiheadAttention`` computes the same function."""
    cmp = sd[f"{prefix}.q_proj.weight"].size(0)
    if cmp % heads:
        raise ValueError(f"{prefix}: compressed width {cmp} is not a multiple of its {heads} heads")
    c = cmp // heads
    rows = torch.cat([torch.arange(h * head_dim, h * head_dim + c) for h in range(heads)])
    for name in ("q_proj", "k_proj", "v_proj"):
        w, b = sd[f"{prefix}.{name}.weight"], sd[f"{prefix}.{name}.bias"]
        full_w = w.new_zeros(heads * head_dim, w.size(1))
        full_b = b.new_zeros(heads * head_dim)
        full_w[rows], full_b[rows] = w, b
        sd[f"{prefix}.{name}.weight"], sd[f"{prefix}.{name}.bias"] = full_w, full_b
    w = sd[f"{prefix}.out_proj.weight"]
    full = w.new_zeros(w.size(0), heads * head_dim)
    full[:, rows] = w
    sd[f"{prefix}.out_proj.weight"] = full
