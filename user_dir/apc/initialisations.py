"""APC's five initialisations of a compressed FFN (APC paper, section 4.2, Appendix C Algorithms 1-2).

Pure functions on tensors: given the FFN's first layer (``fc1.weight``, ``out x in`` in torch's
convention, i.e. the paper's ``W^T``; ``fc1.bias``), the activation ``sigma`` and, for the data-driven
ones, real inputs ``X`` (``n x in``, activation_sampling.py), each returns ``(D, U)`` with
``D`` of shape ``ffn x cmp`` and ``U`` of shape ``cmp x ffn``. ``b_U``, ``b_D`` and ``B`` are zero
for all of them (section 4.2).

* ``random``: ``U, D ~ N(0, 1e-6)`` (variance 1e-6, std 1e-3).
* ``reconstructive-random``: ``D`` as random, ``U`` by least squares minimising the reconstruction
  error of eq. 4, ``|| sigma(X W + b) - sigma((X W + b) D) U ||_F`` over the sampled ``X``.
* ``reconstructive-svd``: ``D`` = the right singular vectors of ``W`` (``in x ffn``) of the ``cmp``
  largest singular values, ``U`` by least squares as above. When ``cmp`` exceeds ``rank(W) <= in``
  the remaining columns come from the full SVD's orthonormal completion (our choice).
* ``neuron-pruning``: Algorithm 1 -- ``D[i, j] = 1`` for the ``j``-th kept neuron ``i`` (kept neurons
  in index order), ``U = D^T``: exactly the pruned network.
* ``kmeans``: Algorithm 2 -- scikit-learn's ``KMeans`` clusters the ``ffn`` columns of ``W`` (each a
  neuron's ``in`` input weights; the bias is not part of the feature, as the paper clusters "columns
  of W") into ``cmp`` clusters; ``D[j, i] = 1/|S_i|``, ``U[i, j] = 1`` for neuron ``j`` in cluster ``i``.
  Our choices: k-means++ seeding, ``n_init=1`` (scikit-learn's "auto" for k-means++), ``random_state``
  = the seed.

Least squares runs in float64 (``torch.linalg.lstsq``, the rank-revealing ``gelsd`` driver, since a
ReLU bottleneck may leave columns of zeros); ``U`` has no intercept because ``b_U`` stays 0.
"""
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from .reparameterised_linear import RANDOM_INIT_STD

INITIALISATIONS = ("random", "reconstructive-random", "reconstructive-svd", "neuron-pruning", "kmeans")


def random_init(ffn: int, cmp: int, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    D = torch.randn(ffn, cmp, generator=generator, dtype=torch.float64) * RANDOM_INIT_STD
    U = torch.randn(cmp, ffn, generator=generator, dtype=torch.float64) * RANDOM_INIT_STD
    return D, U


def least_squares_U(X: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, D: torch.Tensor,
                    activation: Callable) -> torch.Tensor:
    """``argmin_U || sigma(X W + b) - sigma((X W + b) D) U ||_F`` (eq. 4 with b_U = b_D = B = 0)."""
    Z = X.double() @ weight.double().t() + bias.double()
    target = activation(Z)
    A = activation(Z @ D.double())
    driver = "gelsd" if A.device.type == "cpu" else None
    return torch.linalg.lstsq(A, target, driver=driver).solution


def svd_D(weight: torch.Tensor, cmp: int) -> torch.Tensor:
    """The right singular vectors of the paper's ``W = weight^T`` for the ``cmp`` largest singular values."""
    _, _, Vh = torch.linalg.svd(weight.double().t(), full_matrices=True)
    return Vh[:cmp].t().contiguous()


def selection_D(keep: torch.Tensor, ffn: int) -> torch.Tensor:
    """Algorithm 1's ``D``: one 1 per kept neuron, kept neurons in index order."""
    keep = torch.sort(keep).values
    D = torch.zeros(ffn, keep.numel(), dtype=torch.float64)
    D[keep, torch.arange(keep.numel())] = 1.0
    return D


def top_neurons(scores: torch.Tensor, cmp: int) -> torch.Tensor:
    return torch.sort(torch.topk(scores, cmp).indices).values


def kmeans_clusters(weight: torch.Tensor, cmp: int, seed: int) -> np.ndarray:
    """Cluster label (0..cmp-1) of each of the ``ffn`` neurons (rows of ``fc1.weight``)."""
    from sklearn.cluster import KMeans

    points = weight.detach().double().cpu().numpy()
    if len(np.unique(points, axis=0)) < cmp:
        raise ValueError(f"k-means: only {len(np.unique(points, axis=0))} distinct neurons for {cmp} clusters")
    return KMeans(n_clusters=cmp, init="k-means++", n_init=1, random_state=seed).fit(points).labels_


def merge_D_U(labels: np.ndarray, cmp: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 2's ``D`` (cluster means) and ``U`` (cluster membership) from cluster labels."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    ffn = labels.numel()
    sizes = torch.bincount(labels, minlength=cmp).double()
    if (sizes == 0).any():
        raise ValueError(f"k-means left {(sizes == 0).sum().item()} of {cmp} clusters empty")
    D = torch.zeros(ffn, cmp, dtype=torch.float64)
    D[torch.arange(ffn), labels] = 1.0 / sizes[labels]
    U = torch.zeros(cmp, ffn, dtype=torch.float64)
    U[labels, torch.arange(ffn)] = 1.0
    return D, U


def initialise(method: str, weight: torch.Tensor, bias: torch.Tensor, cmp: int, activation: Callable,
               X: Optional[torch.Tensor] = None, scores: Optional[torch.Tensor] = None,
               seed: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(D, U)`` (float64) of one FFN by ``method`` (one of :data:`INITIALISATIONS`)."""
    ffn = weight.size(0)
    gen = torch.Generator().manual_seed(seed)
    weight, bias = weight.detach().cpu(), bias.detach().cpu()
    if method == "random":
        return random_init(ffn, cmp, gen)
    if method in ("reconstructive-random", "reconstructive-svd"):
        if X is None:
            raise ValueError(f"{method} needs sampled activations X")
        D = random_init(ffn, cmp, gen)[0] if method == "reconstructive-random" else svd_D(weight, cmp)
        return D, least_squares_U(X.cpu(), weight, bias, D, activation)
    if method == "neuron-pruning":
        if scores is None:
            raise ValueError("neuron-pruning needs neuron sensitivity scores")
        D = selection_D(top_neurons(scores, cmp), ffn)
        return D, D.t().clone()
    if method == "kmeans":
        return merge_D_U(kmeans_clusters(weight, cmp, seed), cmp)
    raise ValueError(f"unknown APC initialisation {method!r}; choose from {', '.join(INITIALISATIONS)}")
