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

Initialisation (:func:`init_attention`): the five initialisations of section 4.2, chosen by
``apc_init --init`` as for the FFN (the paper reports all five on its APC-15/50/90-opt architectures,
which compress attention: Tables 6-8). Attention has two pairings (section 3.2): ``D^V`` with ``U^O``
(eq. 9, error ``||SA(X) - SA(X) D^V U^O||``), a D/U pair like the FFN's; and ``D^Q`` with ``D^K``
(eq. 11, ``|| A1 (I - D^Q (D^K)^T) A2^T ||_F`` per head ``i``, with ``A1 = X W_i^Q`` and ``A2 = X' W_i^K``,
``X' = X`` for self-attention, the encoder output for encoder-decoder attention), where ``D^Q`` plays
the FFN's ``D`` and ``(D^K)^T`` its ``U`` (``D^Q (D^K)^T`` is the ``D U`` that should be near ``I``). Per
head, with ``d = d_K`` and ``c = cmp^a / H``:

* ``random``: every block of ``D^Q, D^K, D^V`` and the full ``U^O`` ~ ``N(0, 1e-6)``.
* ``reconstructive-random``: ``D^Q`` and ``D^V`` random as above; ``D^K`` minimises eq. 11 for that
  ``D^Q`` (:func:`qk_regression_DK`: ``(D^K)^T = (A1 D^Q)^+ A1``, for ``A2`` of full column rank, the
  maximal rank Appendix B assumes), ``U^O`` by least squares (eq. 9).
* ``reconstructive-svd``: ``D^Q, D^K`` by eq. 11's closed form (:func:`qk_svd_solution`, section 3.2 and
  Appendix B: ``D^Q = A1^+ L^``, ``D^K = A2^+ R^`` with ``L^, R^`` the first ``c`` columns of ``L Sigma^{1/2}``
  and ``R Sigma^{1/2}`` for the SVD ``A1 A2^T = L Sigma R^T``); ``D^V`` the top ``c`` right singular vectors of
  the head's sampled outputs ``Y_i`` (a PCA without centring), ``U^O`` by least squares. Our reading: for
  attention the paper gives these SVD solutions of its pairing objectives (section 3.2) rather than the
  FFN's singular vectors of ``W``; eq. 11's is the optimum of the QK reconstruction error.
* ``neuron-pruning`` (Algorithm 1): the ``c`` dimensions of each head with the largest sensitivity
  (neuron_sensitivity.attention_sensitivity: ``|dL/dM|`` of a mask on the ``q_proj`` outputs for QK --
  masking ``q_j`` removes ``q_j k_j`` from every score -- and on the ``v_proj`` outputs for V), kept in
  index order: ``D^Q = D^K`` the selection, ``D^V`` the selection and ``U^O = (D^V)^T``: exactly the
  attention with the other query/key and value dimensions pruned.
* ``kmeans`` (Algorithm 2): the ``d`` dimensions of each head clustered into ``c`` by their weights (a
  query/key dimension by its ``W^Q`` and ``W^K`` rows together, a value dimension by its ``W^V`` row;
  biases left out as for the FFN): ``D^Q`` and ``D^V`` the cluster means (``1/|S|``), ``D^K`` and ``U^O``
  the memberships, so ``q~_i k~_i`` is the cluster's mean query times its summed key.

``A1 A2^T`` is ``n1 x n2``; with thin QR factors ``A1 = Q1 R1``, ``A2 = Q2 R2`` its SVD is
``Q1 P . S . (Q2 V)^T`` for the SVD ``R1 R2^T = P S V^T`` of a ``d x d`` matrix, so nothing of size
``n1 x n2`` is ever formed (the proof of Appendix B holds for ``n1 != n2``: it only needs ``L^`` in the
column space of ``A1``, ``R^`` in that of ``A2``).

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

from .initialisations import INITIALISATIONS, kmeans_clusters, merge_D_U, random_init, selection_D, top_neurons
from .reparameterised_linear import APCLinear, BlockDiagonalAPCLinear

# the initialisations that fit on sampled inputs of the attention
SAMPLED_INITIALISATIONS = ("reconstructive-random", "reconstructive-svd")


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


def qk_regression_DK(A1: torch.Tensor, DQ: torch.Tensor) -> torch.Tensor:
    """``D^K`` (``d_head x cmp``, float64) minimising eq. 11 for a fixed ``D^Q``: ``min || A1 A2^T - (A1 D^Q)
    (D^K)^T A2^T ||_F`` is solved by ``(D^K)^T = (A1 D^Q)^+ A1 (A2^T)(A2^T)^+ = (A1 D^Q)^+ A1`` for keys ``A2``
    of full column rank (Penrose's least-squares solution of ``P Y Q = M``), whatever the keys."""
    A1 = A1.double()
    P = A1 @ DQ.double()
    return torch.linalg.lstsq(P, A1, driver="gelsd" if P.device.type == "cpu" else None).solution.t()


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


def head_samples(attn: CompressedAttention, queries: List[torch.Tensor], keys: Optional[List[torch.Tensor]] = None,
                 causal: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Q, K, Y)`` of the uncompressed projections (``attn.*_proj.linear``) on real inputs, float64: the stacked
    queries and keys (``q_proj``/``k_proj`` outputs) and every head's outputs before ``out_proj`` (``(sum T_s,
    embed)``). ``queries`` holds one ``(T_s, embed)`` tensor of non-padding positions per sentence, ``keys`` the
    matching ``(S_s, kdim)`` encoder outputs for encoder-decoder attention (``None``: self-attention, keys =
    queries); ``causal`` masks future positions (decoder self-attention)."""
    keys = queries if keys is None else keys
    if len(keys) != len(queries):
        raise ValueError(f"{len(queries)} query sentences but {len(keys)} key sentences")
    heads = attn.num_heads
    lin = {n: getattr(attn, n).linear for n in ("q_proj", "k_proj", "v_proj")}
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
    return Q, K, torch.cat(Y)


@torch.no_grad()
def init_attention(attn: CompressedAttention, method: str, queries: Optional[List[torch.Tensor]] = None,
                   keys: Optional[List[torch.Tensor]] = None, causal: bool = False,
                   scores: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, seed: int = 1) -> None:
    """Initialise ``D^Q, D^K, D^V`` and ``U^O`` of ``attn`` by ``method`` (one of the five of section 4.2; see the
    module docstring) from the uncompressed projections. The reconstructive ones fit on real inputs
    (``queries``, ``keys``, ``causal``: :func:`head_samples`); ``neuron-pruning`` reads ``scores``, the
    sensitivities ``(query/key, value)`` of every output dimension of ``q_proj`` and ``v_proj`` (``(embed,)``
    each). ``b_D``, ``b_U`` and ``B`` are set to 0 (section 4.2)."""
    if method not in INITIALISATIONS:
        raise ValueError(f"unknown APC initialisation {method!r}; choose from {', '.join(INITIALISATIONS)}")
    heads, c = attn.num_heads, attn.cmp_a // attn.num_heads
    embed = attn.original_embed_dim
    d = embed // heads
    if method in SAMPLED_INITIALISATIONS:
        if queries is None:
            raise ValueError(f"{method} needs sampled attention inputs")
        Q, K, Y = head_samples(attn, queries, keys, causal)
    if method == "neuron-pruning" and scores is None:
        raise ValueError("neuron-pruning needs the attention's query/key and value sensitivities")
    weights = {n: getattr(attn, n).linear.weight.detach().double().cpu() for n in ("q_proj", "k_proj", "v_proj")}
    gen = torch.Generator().manual_seed(seed)
    DQ, DK, DV = (torch.zeros(embed, heads * c, dtype=torch.float64) for _ in range(3))
    UO_blocks = []  # per head c x d, for the selection and merging initialisations
    for i in range(heads):
        rows, cols = slice(i * d, (i + 1) * d), slice(i * c, (i + 1) * c)
        if method == "random":
            dq, dk, dv = (random_init(d, c, gen)[0] for _ in range(3))
        elif method == "reconstructive-random":
            dq, dv = random_init(d, c, gen)[0], random_init(d, c, gen)[0]
            dk = qk_regression_DK(Q[:, rows], dq)
        elif method == "reconstructive-svd":
            dq, dk = qk_svd_solution(Q[:, rows], K[:, rows], c)
            dv = torch.linalg.svd(Y[:, rows], full_matrices=False)[2][:c].t()
        elif method == "neuron-pruning":
            dq = dk = selection_D(top_neurons(scores[0].double().cpu()[rows], c), d)
            dv = selection_D(top_neurons(scores[1].double().cpu()[rows], c), d)
            UO_blocks.append(dv.t())
        else:  # kmeans
            qk_features = torch.cat([weights["q_proj"][rows], weights["k_proj"][rows]], dim=1)
            dq, u = merge_D_U(kmeans_clusters(qk_features, c, seed), c)
            dk = u.t()
            dv, uo = merge_D_U(kmeans_clusters(weights["v_proj"][rows], c, seed), c)
            UO_blocks.append(uo)
        DQ[rows, cols], DK[rows, cols], DV[rows, cols] = dq, dk, dv
    if method == "random":
        UO = random_init(embed, heads * c, gen)[1]
    elif method in SAMPLED_INITIALISATIONS:
        UO = torch.linalg.lstsq(Y @ DV, Y, driver="gelsd" if Y.device.type == "cpu" else None).solution
    else:
        UO = torch.block_diag(*UO_blocks)
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
