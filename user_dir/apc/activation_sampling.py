"""Real activations for APC's data-driven initialisations and its reconstruction error (APC paper,
section 4.2: "a randomly sampled batch of training data of size 5000"; eq. 4).

:func:`sample_batches` draws shuffled training batches; :func:`collect_ffn_inputs` runs the
*uncompressed* model (the teacher, eval mode: no dropout) on them, teacher-forced, and keeps the input
``X^l`` of every FFN (what its ``fc1`` receives) at ``n`` randomly chosen non-padding token positions,
per side (encoder positions for encoder layers, target positions for decoder layers).

Choices the paper leaves open: the 5,000 samples are *token positions* (the rows of ``X``), drawn
uniformly without replacement from the non-padding positions of shuffled training batches; every
layer of a side sees the same positions; the activations are those of the uncompressed network (each
layer is initialised on its own, not on the outputs of already-compressed earlier layers).
"""
from typing import Dict, Iterator, List

import torch


def sample_batches(task, split: str, max_tokens: int, seed: int) -> Iterator[dict]:
    """Shuffled batches of ``split`` (loaded if needed), as fairseq's trainer would draw them."""
    if split not in task.datasets:
        task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, seed=seed, num_workers=0,
                                  max_positions=None, ignore_invalid_inputs=True)
    return itr.next_epoch_itr(shuffle=True)


def _pad_masks(sample, pad: int) -> Dict[str, torch.Tensor]:
    net = sample["net_input"]
    return {"encoder": net["src_tokens"].ne(pad).t(), "decoder": net["prev_output_tokens"].ne(pad).t()}


@torch.no_grad()
def collect_ffn_inputs(model, batches, n: int, pad: int, seed: int = 1) -> Dict[str, torch.Tensor]:
    """``{"encoder.layers.i": X (n x embed)}`` for every layer of ``model`` (a fairseq Transformer).

    Stops drawing batches once both sides hold at least ``n`` positions; raises if the data run out.
    """
    model.eval()
    layers = {f"{side}.layers.{i}": layer for side in ("encoder", "decoder")
              for i, layer in enumerate(getattr(model, side).layers)}
    seen: Dict[str, List[torch.Tensor]] = {name: [] for name in layers}
    current = {}
    hooks = [layer.fc1.register_forward_pre_hook(lambda m, inp, name=name: current.__setitem__(name, inp[0]))
             for name, layer in layers.items()]
    counts = {"encoder": 0, "decoder": 0}
    try:
        for sample in batches:
            current.clear()
            model(**sample["net_input"])
            masks = _pad_masks(sample, pad)
            for name, x in current.items():
                seen[name].append(x[masks[name.split(".")[0]]].float().cpu())
            for side in counts:
                counts[side] += int(masks[side].sum())
            if min(counts.values()) >= n:
                break
    finally:
        for h in hooks:
            h.remove()
    if min(counts.values()) < n:
        raise ValueError(f"the data hold only {counts} non-padding positions; {n} activations were asked for")
    gen = torch.Generator().manual_seed(seed)
    picks = {side: torch.randperm(counts[side], generator=gen)[:n] for side in counts}
    return {name: torch.cat(xs)[picks[name.split(".")[0]]] for name, xs in seen.items()}


@torch.no_grad()
def collect_attention_inputs(model, batches, n: int, pad: int) -> Dict[str, List[torch.Tensor]]:
    """``{"encoder.layers.i": [X_s (T_s x embed), ...]}``: the input of every encoder self-attention, one
    tensor of non-padding positions per sentence, from whole sentences until at least ``n`` positions."""
    model.eval()
    layers = {f"encoder.layers.{i}": layer for i, layer in enumerate(model.encoder.layers)}
    out: Dict[str, List[torch.Tensor]] = {name: [] for name in layers}
    current = {}

    def hook(name):
        def capture(module, args, kwargs):
            current[name] = kwargs["query"] if "query" in kwargs else args[0]
        return capture
    hooks = [layer.self_attn.register_forward_pre_hook(hook(name), with_kwargs=True) for name, layer in layers.items()]
    count = 0
    try:
        for sample in batches:
            current.clear()
            model(**sample["net_input"])
            keep = sample["net_input"]["src_tokens"].ne(pad)  # (B, T)
            for name, x in current.items():
                out[name] += [x[keep[b], b].float().cpu() for b in range(keep.size(0))]
            count += int(keep.sum())
            if count >= n:
                break
    finally:
        for h in hooks:
            h.remove()
    if count < n:
        raise ValueError(f"the data hold only {count} non-padding source positions; {n} were asked for")
    return out
