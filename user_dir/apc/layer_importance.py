"""Layer importance for choosing APC's per-layer compression sizes (APC paper, section 2.2 and
section 4.1, Figure 3): layer dropping, Fisher information and weight imprinting, each normalised to
sum to 1 over the layers (as Figure 3).

For a fairseq encoder-decoder Transformer on its translation task (teacher-forced, eval mode), or an
encoder with a classification head (``hf_bert`` on a GLUE task, the paper's own setting: its Figure 3
scores BERT's layers on NSP and MLM), with the task loss of neuron_sensitivity.task_loss:

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
  the target words, defined only at decoder positions, so encoder layers get no imprinting score. For
  a sentence task the classes are the labels and the feature of a sentence after a layer is what the
  classification head reads (the [CLS] vector, or the mean over real tokens with
  ``--classification-pooling mean``); a regression task (one output) has no classes and no score.
"""
from typing import Dict, List

import torch
import torch.nn.functional as F

from ..common.layer_lists import every_layer
from .activation_sampling import ffn_layers, layer_stacks
from .neuron_sensitivity import task_loss


def _sentence_task(sample) -> bool:
    return "prev_output_tokens" not in sample["net_input"]


def _units(sample, pad: int) -> int:
    """What a loss is averaged over: target tokens (translation) or sentences (sentence tasks)."""
    return sample["target"].numel() if _sentence_task(sample) else int(sample["target"].ne(pad).sum())


@torch.no_grad()
def mean_nll(model, batches: List[dict], pad: int) -> float:
    total, units = 0.0, 0
    for sample in batches:
        total += task_loss(model, sample, pad).item()
        units += _units(sample, pad)
    return total / units


def _normalise(scores: Dict[str, float]) -> Dict[str, float]:
    total = sum(v for v in scores.values() if v is not None)
    return {k: (None if v is None else (v / total if total > 0 else 0.0)) for k, v in scores.items()}


@torch.no_grad()
def layer_dropping(model, batches: List[dict], pad: int) -> Dict[str, float]:
    model.eval()
    base = mean_nll(model, batches, pad)
    raw = {}
    for prefix, full in layer_stacks(model).items():
        module = model.get_submodule(prefix.rpartition(".")[0])
        for i in range(len(full)):
            module.layers = torch.nn.ModuleList([layer for j, layer in enumerate(every_layer(full)) if j != i])
            module.num_layers = len(module.layers)
            try:
                raw[f"{prefix}.{i}"] = max(0.0, mean_nll(model, batches, pad) - base)
            finally:
                module.layers, module.num_layers = full, len(full)
    return _normalise(raw)


def fisher_information(model, batches: List[dict], pad: int) -> Dict[str, float]:
    model.eval()
    layers = ffn_layers(model)
    params = {name: [p for p in layer.parameters()] for name, layer in layers.items()}
    sums = {name: 0.0 for name in layers}
    for sample in batches:
        grads = torch.autograd.grad(task_loss(model, sample, pad), [p for ps in params.values() for p in ps],
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
    if _sentence_task(fit[0]):
        return _sentence_imprinting(model, fit, held, pad)
    n_dec = len(model.decoder.layers)

    def states(sample):
        _, extra = model(**sample["net_input"])
        keep = sample["target"].ne(pad)  # (B, T)
        return [h.transpose(0, 1)[keep].float() for h in extra["inner_states"]], sample["target"][keep]

    vocab = len(model.decoder.dictionary)
    accuracy = _imprinted_accuracy(states, fit, held, vocab, n_dec + 1)
    raw = {f"encoder.layers.{i}": None for i in range(len(model.encoder.layers))}
    raw.update({f"decoder.layers.{i}": max(0.0, accuracy[i + 1] - accuracy[i]) for i in range(n_dec)})
    out = _normalise(raw)
    out["_accuracy_after_embeddings_and_each_decoder_layer"] = accuracy
    return out


def _sentence_imprinting(model, fit: List[dict], held: List[dict], pad: int) -> Dict[str, float]:
    """Imprinting on a sentence task: the labels are the classes, the feature after the embeddings and
    after each encoder layer is what the classification head would read there."""
    (prefix, layers), = layer_stacks(model).items()
    heads = model.classification_heads
    head = next(iter(heads.values()))
    classes = head.out_proj.out_features
    names = [f"{prefix}.{i}" for i in range(len(layers))]
    if classes == 1:  # regression: no classes to imprint
        return {**{name: None for name in names}, "_accuracy_after_embeddings_and_each_encoder_layer": None}
    mean_pool = getattr(model.args, "classification_pooling", "cls") == "mean"

    def states(sample):
        tokens = sample["net_input"]["src_tokens"]
        _, extra = model(**sample["net_input"], features_only=True, return_all_hiddens=True)
        feats = []
        for h in extra["inner_states"]:  # T x B x C
            h = h.transpose(0, 1).float()
            if mean_pool:
                keep = tokens.ne(pad).unsqueeze(-1).float()
                feats.append((h * keep).sum(1) / keep.sum(1).clamp(min=1))
            else:
                feats.append(h[:, 0])
        return feats, sample["target"].view(-1)

    accuracy = _imprinted_accuracy(states, fit, held, classes, len(layers) + 1)
    out = _normalise({name: max(0.0, accuracy[i + 1] - accuracy[i]) for i, name in enumerate(names)})
    out["_accuracy_after_embeddings_and_each_encoder_layer"] = accuracy
    return out


def _imprinted_accuracy(states, fit: List[dict], held: List[dict], classes: int, levels: int) -> List[float]:
    """Nearest-imprinted-mean (cosine) accuracy on ``held`` at each of ``levels`` hidden states, the class
    means imprinted from ``fit``; ``states(sample)`` gives (one feature matrix per level, labels)."""
    sums = [None] * levels
    counts = torch.zeros(classes)
    for sample in fit:
        hs, y = states(sample)
        counts += torch.bincount(y.cpu(), minlength=classes).float()
        for level, h in enumerate(hs):
            h = F.normalize(h, dim=-1).cpu()
            acc = torch.zeros(classes, h.size(1)).index_add_(0, y.cpu(), h)
            sums[level] = acc if sums[level] is None else sums[level] + acc
    seen = counts > 0
    correct, total = torch.zeros(levels), 0
    for sample in held:
        hs, y = states(sample)
        total += y.numel()
        for level, h in enumerate(hs):
            w = F.normalize(sums[level][seen], dim=-1)
            pred = torch.nonzero(seen).squeeze(1)[(F.normalize(h.cpu(), dim=-1) @ w.t()).argmax(-1)]
            correct[level] += (pred == y.cpu()).sum()
    return (correct / max(total, 1)).tolist()
