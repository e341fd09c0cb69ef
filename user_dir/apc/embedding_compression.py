"""APC's embedding compression (APC paper, section 3.2 "Embedding Compression", Figure 2 centre, Appendix A).

A block ``b`` compressed to ``cmp^e_b`` works at that width: the pre-scaling ``D^PS_b`` (``d -> cmp^e``)
maps its input down, the post-scaling ``U^PS_b`` (``cmp^e -> d``) maps its output back up, and inside it
the residual stream, its additions and its LayerNorms are ``cmp^e`` wide. Its projections read and write
that stream through APC's reparameterised layers (reparameterised_linear.py), each compression combining
with the feed-forward (ffn_compression.py) and attention (attention_compression.py) ones:

* the outer attention upscaling ``U^Q``, ``U^K``, ``U^V`` (one ``cmp^e x d`` matrix per projection, shared by
  the heads) on the inputs of ``q_proj``, ``k_proj``, ``v_proj``, and the downscaling ``D^O`` on the output
  of ``out_proj``;
* ``U^alpha`` on the input of ``fc1`` and ``D^beta`` on the output of ``fc2`` (the paper's text names
  "``U^alpha`` and ``U^beta``"; Appendix A pairs ``D^beta``, the one that fits the figure).

``J_b = U^PS_b D^PS_{b+1}`` links two blocks. Where consecutive blocks share one ``cmp^e`` we omit both
(the paper: "initializing these two matrices in a way that J_b is the identity matrix (or omitting them
entirely)"), so a *run* of equally compressed blocks has one ``D^PS`` before its first block and one
``U^PS`` after its last, and the stream between them stays compressed (:func:`runs_of`). Appendix A's
pairings follow: ``D^PS`` of a run pairs with every ``U^{Q,K,V}`` and ``U^alpha`` of the run, every
``D^O`` and ``D^beta`` with the ``U`` that next reads the stream, the last ``D^beta`` with ``U^PS``.

Choices the paper leaves open (its text gives no formulas for them), and ours:

* The LayerNorms of a compressed block normalise its ``cmp^e`` coordinates, with ``cmp^e`` gains and biases
  (the residual additions happen at that width, so the norms must too). They are new parameters and
  train with APC's in every mode. Their initial gain is ``diag(D^T diag(gamma) D) / diag(D^T D)`` and bias
  ``beta D`` for the teacher's ``gamma, beta`` and the run's basis ``D`` (below): for a coordinate selection
  exactly the kept gains and biases, for an orthonormal ``D`` the gains' energy-weighted mean per direction.
* ``D^PS`` and ``U^PS`` are plain affine maps (their biases are APC's ``b_D`` / ``b_U``; the corrective ``B``
  of each pairing lives in the reparameterised layer on the other side).
* The decoder's encoder-decoder attention reads the encoder output at full width: only its ``U^Q`` and
  ``D^O`` apply.
* One basis per run: every ``D`` of a run (``D^PS``, ``D^O``, ``D^beta``) starts as the same ``d x cmp^e``
  matrix ``D``, since their outputs are added in one residual stream; each ``U`` of the run is then fitted
  on its own input (eq. 4 for the pairing, ``|| X - X D U ||_F``, ``X`` the teacher's input of that
  projection, or the run's output for ``U^PS``). The five initialisations (section 4.2) choose ``D`` (and
  ``U``) as for the FFN, with the block's *reading weights* (``W^Q, W^K, W^V, W^alpha`` of every block
  of the run, the columns that read hidden dimension ``i`` being its feature vector) in place of the FFN's
  ``W``: ``random`` (``U, D ~ N(0, 1e-6)``), ``reconstructive-random`` (``D`` random, ``U`` by least squares;
  its columns scaled to norm 1, since the block's LayerNorms normalise the stream: a basis of norm
  ``1e-3 sqrt(d)`` would make every residual addition that much too small against the normalised stream),
  ``reconstructive-svd`` (``D`` the top left singular vectors of the reading weights, ``U`` by least
  squares), ``neuron-pruning`` (the ``cmp^e`` hidden dimensions whose mask on the blocks' inputs has the
  largest gradient, summed over the run, ``U = D^T``: exactly hidden-dimension pruning but for the
  LayerNorm statistics), ``kmeans`` (hidden dimensions clustered by their reading weights, Algorithm 2).
* The activation-KD reconstruction terms (activation_kd_criterion.py) stay those of the FFNs: an embedding
  pairing's target is the teacher's full-width stream, which the compressed forward never computes.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .initialisations import kmeans_clusters, merge_D_U, random_init, selection_D, top_neurons
from .reparameterised_linear import APCLinear

# the LayerNorms of a fairseq Transformer layer, each on the block's stream
LAYER_NORMS = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")


def runs_of(dims: Dict[int, int]) -> List[List[int]]:
    """The maximal runs of consecutive compressed blocks with one ``cmp^e`` (``{layer: cmp^e}``): inside a run
    every ``J_b`` is the identity and omitted."""
    out: List[List[int]] = []
    for idx in sorted(dims):
        if out and out[-1][-1] == idx - 1 and dims[out[-1][-1]] == dims[idx]:
            out[-1].append(idx)
        else:
            out.append([idx])
    return out


def _pre_scale(layer, args, kwargs):
    if layer.pre_scaling is None:
        return None
    if args:
        return (layer.pre_scaling(args[0]),) + tuple(args[1:]), kwargs
    return args, {**kwargs, "x": layer.pre_scaling(kwargs["x"])}


def _post_scale(layer, args, output):
    if layer.post_scaling is None:
        return None
    if isinstance(output, tuple):
        return (layer.post_scaling(output[0]),) + tuple(output[1:])
    return layer.post_scaling(output)


def compress_block_embedding(layer: nn.Module, cmp_e: int, pre: bool, post: bool) -> None:
    """Make ``layer`` (a fairseq Transformer layer whose projections already read and write ``cmp_e``) work at
    width ``cmp_e``, in place: its LayerNorms at that width, ``D^PS`` (``layer.pre_scaling``) before it when
    ``pre``, ``U^PS`` (``layer.post_scaling``) after it when ``post``."""
    d = layer.embed_dim
    ref = layer.final_layer_norm.weight
    factory = dict(device=ref.device, dtype=ref.dtype)
    for name in LAYER_NORMS:
        norm = getattr(layer, name, None)
        if norm is not None:
            setattr(layer, name, type(norm)(cmp_e, eps=norm.eps).to(**factory))
    layer.cmp_e = cmp_e
    layer.pre_scaling = nn.Linear(d, cmp_e, **factory) if pre else None
    layer.post_scaling = nn.Linear(cmp_e, d, **factory) if post else None
    layer.register_forward_pre_hook(_pre_scale, with_kwargs=True)
    layer.register_forward_hook(_post_scale)


def is_embedding_compressed(layer: nn.Module) -> bool:
    return getattr(layer, "cmp_e", None) is not None


def embedding_parameters(layer: nn.Module) -> List[nn.Parameter]:
    """The block's new parameters outside its reparameterised layers: ``D^PS``, ``U^PS`` and the ``cmp^e``-wide
    LayerNorms."""
    if not is_embedding_compressed(layer):
        return []
    modules = [layer.pre_scaling, layer.post_scaling] + [getattr(layer, n, None) for n in LAYER_NORMS]
    return [p for m in modules if m is not None for p in m.parameters()]


def compressed_norm_names(layers: Dict[str, nn.Module]) -> List[str]:
    """``["encoder.layers.0.final_layer_norm", ...]``: the LayerNorms of every embedding-compressed layer."""
    return [f"{name}.{n}" for name, layer in layers.items() if is_embedding_compressed(layer)
            for n in LAYER_NORMS if getattr(layer, n, None) is not None]


def group_runs(layers: Dict[str, nn.Module]) -> List[List[str]]:
    """The runs (:func:`runs_of`) of a model's embedding-compressed layers, by layer name (``layers`` in order)."""
    out: List[List[str]] = []
    for name, layer in layers.items():
        if not is_embedding_compressed(layer):
            continue
        if out and layer.pre_scaling is None:
            out[-1].append(name)
        else:
            out.append([name])
    return out


# --- initialisation (section 4.2, Appendix A) -----------------------------------------------------------

def reading_projections(layer: nn.Module) -> Dict[str, nn.Linear]:
    """``{key: nn.Linear}`` of an uncompressed (teacher) layer's projections that read the block's stream:
    ``self_attn`` (``q_proj``; ``k_proj``, ``v_proj`` read the same input), ``encoder_attn`` (its ``q_proj``) and
    ``fc1``."""
    out = {"self_attn": layer.self_attn.q_proj}
    if getattr(layer, "encoder_attn", None) is not None:
        out["encoder_attn"] = layer.encoder_attn.q_proj
    out["fc1"] = layer.fc1
    return out


def reading_features(layers: List[nn.Module]) -> torch.Tensor:
    """``d x F``: row ``i`` holds every weight of the run's blocks that reads hidden dimension ``i``."""
    cols = []
    for layer in layers:
        cols += [layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]
        if getattr(layer, "encoder_attn", None) is not None:
            cols.append(layer.encoder_attn.q_proj.weight)
        cols.append(layer.fc1.weight)
    return torch.cat([w.detach().double().cpu().t() for w in cols], dim=1)


def run_basis(method: str, features: torch.Tensor, cmp: int, scores: Optional[torch.Tensor], seed: int
              ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(D, U)`` of a run (``d x cmp``, ``cmp x d``; ``U = None``: fit each ``U`` by least squares)."""
    d = features.size(0)
    gen = torch.Generator().manual_seed(seed)
    if method == "random":
        return random_init(d, cmp, gen)
    if method == "reconstructive-random":  # unit-norm columns: see the module docstring
        D = random_init(d, cmp, gen)[0]
        return D / D.norm(dim=0, keepdim=True), None
    if method == "reconstructive-svd":
        return torch.linalg.svd(features, full_matrices=False)[0][:, :cmp].contiguous(), None
    if method == "neuron-pruning":
        if scores is None:
            raise ValueError("neuron-pruning needs hidden-dimension sensitivity scores")
        D = selection_D(top_neurons(scores, cmp), d)
        return D, D.t().clone()
    if method == "kmeans":
        return merge_D_U(kmeans_clusters(features, cmp, seed), cmp)
    raise ValueError(f"unknown APC initialisation {method!r}")


def fit_U(X: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """``argmin_U || X - X D U ||_F`` (eq. 4 for a pairing, b_U = b_D = B = 0), float64."""
    X = X.double()
    return torch.linalg.lstsq(X @ D, X, driver="gelsd" if X.device.type == "cpu" else None).solution


def _set(linear: APCLinear, U: Optional[torch.Tensor] = None, D: Optional[torch.Tensor] = None) -> None:
    if U is not None:
        linear.U.copy_(U)
        linear.b_U.zero_()
    if D is not None:
        linear.D.copy_(D)
        linear.b_D.zero_()
    linear.B.zero_()


@torch.no_grad()
def init_embedding_run(method: str, students: List[nn.Module], teachers: List[nn.Module],
                       X: Optional[List[Dict[str, torch.Tensor]]], X_out: Optional[torch.Tensor],
                       scores: Optional[torch.Tensor], seed: int = 1) -> torch.Tensor:
    """Initialise one run's ``D^PS``, ``U^{Q,K,V}``, ``D^O``, ``U^alpha``, ``D^beta``, ``U^PS`` and LayerNorms (see
    the module docstring) from the teacher's layers of the run. ``X[k]`` holds block ``k``'s sampled teacher
    inputs by :func:`reading_projections` key, ``X_out`` the run's sampled output (``None`` for the random and
    selection-type methods, which fit nothing); ``scores`` the hidden-dimension sensitivity summed over the
    run (neuron-pruning). Run after the FFN and attention initialisations (they reset their layers' APC
    parameters). Returns the run's basis ``D``."""
    cmp = students[0].cmp_e
    D, U_fixed = run_basis(method, reading_features(teachers), cmp, scores, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def U_for(x):
        if method == "random":  # every U drawn on its own
            return random_init(D.size(0), cmp, gen)[1]
        return U_fixed if U_fixed is not None else fit_U(x, D)
    if students[0].pre_scaling is not None:
        students[0].pre_scaling.weight.copy_(D.t())
        students[0].pre_scaling.bias.zero_()
    for k, (student, teacher) in enumerate(zip(students, teachers)):
        inputs = X[k] if X is not None else {}
        U_self = U_for(inputs.get("self_attn"))
        for proj in ("q_proj", "k_proj", "v_proj"):
            _set(getattr(student.self_attn, proj), U=U_self)
        _set(student.self_attn.out_proj, D=D)
        if getattr(student, "encoder_attn", None) is not None:
            _set(student.encoder_attn.q_proj, U=U_for(inputs.get("encoder_attn")))
            _set(student.encoder_attn.out_proj, D=D)
        _set(student.fc1, U=U_for(inputs.get("fc1")))
        _set(student.fc2, D=D)
        for name in LAYER_NORMS:
            norm = getattr(student, name, None)
            if norm is not None:
                gamma, beta = compressed_norm(getattr(teacher, name), D)
                norm.weight.copy_(gamma)
                norm.bias.copy_(beta)
    last = students[-1]
    if last.post_scaling is not None:
        last.post_scaling.weight.copy_(U_for(X_out).t())
        last.post_scaling.bias.zero_()
    return D


def compressed_norm(norm: nn.Module, D: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``cmp^e`` gain ``diag(D^T diag(gamma) D) / diag(D^T D)`` and bias ``beta D`` of a teacher LayerNorm."""
    gamma, beta = norm.weight.detach().double().cpu(), norm.bias.detach().double().cpu()
    D2 = D.double() ** 2
    return (gamma @ D2) / D2.sum(0).clamp_min(1e-30), beta @ D.double()
