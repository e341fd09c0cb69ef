"""Layer importance for choosing APC's per-layer compression sizes (APC paper, section 2.2 and
section 4.1, Figure 3): layer dropping, Fisher information and weight imprinting, each normalised to
sum to 1 over the layers (as Figure 3).

For a fairseq encoder-decoder Transformer on its translation task (teacher-forced, eval mode):

* **layer dropping** (Sajjad et al. 2023): the increase of the token NLL on the data when one layer is
  removed (its input passes straight to the next layer); negative increases count as 0.
* **Fisher information**: the mean over a layer's parameters of the squared gradient of the summed
  token NLL, averaged over batches (the empirical Fisher with per-batch rather than per-example
  gradients -- our choice, for speed).
* **weight imprinting** (Qi et al. 2018; Elkerdawy et al. 2020): after each decoder layer, a
  classifier whose weight for each target word is the mean of the L2-normalised hidden states that
  predict it (imprinted from ``fit`` batches); the importance of a layer is its gain in nearest-mean
  (cosine) accuracy on held-out positions over the previous layer's (the embeddings' for the first),
  clipped at 0. The paper imprints classes of a classification task; in translation the classes are
  the target words, defined only at decoder positions, so encoder layers get no imprinting score.
"""
from typing import Dict, List

import torch
import torch.nn.functional as F


def _layers(model) -> Dict[str, torch.nn.Module]:
    return {f"{side}.layers.{i}": layer for side in ("encoder", "decoder")
            for i, layer in enumerate(getattr(model, side).layers)}


def _nll(model, sample, pad: int) -> torch.Tensor:
    net_output = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True).float()
    return F.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1), ignore_index=pad, reduction="sum")


@torch.no_grad()
def mean_nll(model, batches: List[dict], pad: int) -> float:
    total, tokens = 0.0, 0
    for sample in batches:
        total += _nll(model, sample, pad).item()
        tokens += int(sample["target"].ne(pad).sum())
    return total / tokens


def _normalise(scores: Dict[str, float]) -> Dict[str, float]:
    total = sum(v for v in scores.values() if v is not None)
    return {k: (None if v is None else (v / total if total > 0 else 0.0)) for k, v in scores.items()}


@torch.no_grad()
def layer_dropping(model, batches: List[dict], pad: int) -> Dict[str, float]:
    model.eval()
    base = mean_nll(model, batches, pad)
    raw = {}
    for side in ("encoder", "decoder"):
        module = getattr(model, side)
        full = module.layers
        for i in range(len(full)):
            module.layers = torch.nn.ModuleList([layer for j, layer in enumerate(full) if j != i])
            module.num_layers = len(module.layers)
            try:
                raw[f"{side}.layers.{i}"] = max(0.0, mean_nll(model, batches, pad) - base)
            finally:
                module.layers, module.num_layers = full, len(full)
    return _normalise(raw)


def fisher_information(model, batches: List[dict], pad: int) -> Dict[str, float]:
    model.eval()
    layers = _layers(model)
    params = {name: [p for p in layer.parameters()] for name, layer in layers.items()}
    sums = {name: 0.0 for name in layers}
    for sample in batches:
        grads = torch.autograd.grad(_nll(model, sample, pad), [p for ps in params.values() for p in ps],
                                    allow_unused=True)
        it = iter(grads)
        for name, ps in params.items():
            g = [next(it) for _ in ps]
            sq = sum(float(x.double().pow(2).sum()) for x in g if x is not None)
            sums[name] += sq / sum(p.numel() for p in ps)
    return _normalise({k: v / len(batches) for k, v in sums.items()})


@torch.no_grad()
def weight_imprinting(model, fit: List[dict], held: List[dict], pad: int) -> Dict[str, float]:
    model.eval()
    n_dec = len(model.decoder.layers)

    def states(sample):
        _, extra = model(**sample["net_input"])
        keep = sample["target"].ne(pad)  # (B, T)
        return [h.transpose(0, 1)[keep].float() for h in extra["inner_states"]], sample["target"][keep]

    vocab = len(model.decoder.dictionary)
    sums = [None] * (n_dec + 1)
    counts = torch.zeros(vocab)
    for sample in fit:
        hs, y = states(sample)
        counts += torch.bincount(y.cpu(), minlength=vocab).float()
        for level, h in enumerate(hs):
            h = F.normalize(h, dim=-1).cpu()
            acc = torch.zeros(vocab, h.size(1)).index_add_(0, y.cpu(), h)
            sums[level] = acc if sums[level] is None else sums[level] + acc
    seen = counts > 0
    correct, total = torch.zeros(n_dec + 1), 0
    for sample in held:
        hs, y = states(sample)
        total += y.numel()
        for level, h in enumerate(hs):
            w = F.normalize(sums[level][seen], dim=-1)
            pred = torch.nonzero(seen).squeeze(1)[(F.normalize(h.cpu(), dim=-1) @ w.t()).argmax(-1)]
            correct[level] += (pred == y.cpu()).sum()
    accuracy = (correct / max(total, 1)).tolist()
    raw = {f"encoder.layers.{i}": None for i in range(len(model.encoder.layers))}
    raw.update({f"decoder.layers.{i}": max(0.0, accuracy[i + 1] - accuracy[i]) for i in range(n_dec)})
    out = _normalise(raw)
    out["_accuracy_after_embeddings_and_each_decoder_layer"] = accuracy
    return out
