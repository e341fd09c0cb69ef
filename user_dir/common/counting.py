"""Counting what a compressed model costs: parameters (total and non-embedding) and bytes.

Conventions (shared by every method and the measurement command, so numbers compare):
* A tensor shared between modules (tied embeddings, PET's shared layers) counts once.
* "Embedding" parameters are the token embedding tables, learned positional embeddings and the
  vocabulary output projection (tied or not): everything whose size scales with the vocabulary or
  maximum length. "Non-embedding" is the rest; compression rates (PET Table 7) use it.
* Size on disk is the size of the model's state dict as ``torch.save`` writes it (shared storages
  written once), independent of optimizer state kept in training checkpoints.
"""
import io
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.nn as nn

# attribute names fairseq gives to vocabulary projections that are separate nn.Linear modules
_VOCAB_PROJECTION_NAMES = ("output_projection", "lm_head")


@dataclass
class ParameterCount:
    total: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def unique_parameters(params: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Yield each distinct parameter tensor once (shared tensors appear several times in modules)."""
    seen = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def _embedding_parameter_ids(model: nn.Module) -> set:
    ids = set()
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) or leaf in _VOCAB_PROJECTION_NAMES or leaf == "embed_positions":
            ids.update(id(p) for p in module.parameters())
    return ids


def count_parameters(model: nn.Module) -> ParameterCount:
    """Total and embedding parameter counts of ``model``, each distinct tensor once."""
    embedding_ids = _embedding_parameter_ids(model)
    total = embedding = 0
    for p in unique_parameters(model.parameters()):
        total += p.numel()
        if id(p) in embedding_ids:
            embedding += p.numel()
    return ParameterCount(total=total, embedding=embedding)


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes ``torch.save(model.state_dict())`` writes (shared storages stored once)."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def compression_rate(compressed: ParameterCount, reference: ParameterCount) -> float:
    """Non-embedding parameters of ``compressed`` as a percentage of ``reference``'s."""
    if reference.non_embedding == 0:
        raise ValueError("the reference model has no non-embedding parameters")
    return 100.0 * compressed.non_embedding / reference.non_embedding
