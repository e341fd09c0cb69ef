"""Real activations for APC's data-driven initialisations and its reconstruction error (APC paper,
section 4.2: "a randomly sampled batch of training data of size 5000"; eq. 4).

:func:`sample_batches` draws shuffled training batches; :func:`collect_ffn_inputs` runs the
*uncompressed* model (the teacher, eval mode: no dropout) on them, teacher-forced, and keeps the input
``X^l`` of every FFN (what its ``fc1`` receives) at ``n`` randomly chosen non-padding token positions,
per side (encoder positions for encoder layers, target positions for decoder layers). The model is a
fairseq Transformer (layers named ``encoder.layers.i`` / ``decoder.layers.i``) or a RoBERTa-family
encoder such as ``hf_bert`` (``encoder.sentence_encoder.layers.i``, run for its hidden states only).

Choices the paper leaves open: the 5,000 samples are *token positions* (the rows of ``X``), drawn
uniformly without replacement from the non-padding positions of shuffled training batches; every
layer of a side sees the same positions; the activations are those of the uncompressed network (each
layer is initialised on its own, not on the outputs of already-compressed earlier layers).
"""
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from ..common.layer_lists import every_layer


def sample_batches(task, split: str, max_tokens: int, seed: int) -> Iterator[dict]:
    """Shuffled batches of ``split`` (loaded if needed), as fairseq's trainer would draw them."""
    if split not in task.datasets:
        task.load_dataset(split)
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, seed=seed, num_workers=0,
                                  max_positions=None, ignore_invalid_inputs=True)
    return itr.next_epoch_itr(shuffle=True)


def layer_stacks(model) -> Dict[str, torch.nn.ModuleList]:
    """The layer lists of ``model`` by module name: ``{"encoder.layers": .., "decoder.layers": ..}`` for a
    fairseq Transformer, ``{"encoder.sentence_encoder.layers": ..}`` for a RoBERTa-family encoder."""
    sentence_encoder = getattr(getattr(model, "encoder", None), "sentence_encoder", None)
    if sentence_encoder is not None:
        return {"encoder.sentence_encoder.layers": sentence_encoder.layers}
    return {f"{side}.layers": getattr(model, side).layers for side in ("encoder", "decoder")
            if getattr(model, side, None) is not None}


def ffn_layers(model) -> Dict[str, torch.nn.Module]:
    """``{"encoder.layers.0": layer, ...}``: every layer of ``model`` by module name."""
    return {f"{prefix}.{i}": layer for prefix, layers in layer_stacks(model).items()
            for i, layer in enumerate(every_layer(layers))}


def side_of(name: str) -> str:
    """``"encoder"`` or ``"decoder"``: which token positions a layer or attention named ``name`` sees."""
    return name.split(".")[0]


def pad_masks(sample, pad: int) -> Dict[str, torch.Tensor]:
    """``{side: (T, B) non-padding mask}`` of the sides a sample feeds (no decoder for sentence tasks)."""
    net = sample["net_input"]
    masks = {"encoder": net["src_tokens"].ne(pad).t()}
    if "prev_output_tokens" in net:
        masks["decoder"] = net["prev_output_tokens"].ne(pad).t()
    return masks


def run_model(model, sample):
    """The model's forward on a sample: teacher-forced for translation; an encoder's hidden states
    (``features_only``: no LM head) for sentence tasks."""
    net = sample["net_input"]
    if "prev_output_tokens" in net:
        return model(**net)
    return model(**net, features_only=True)


def collect_ffn_inputs(model, batches, n: int, pad: int, seed: int = 1) -> Dict[str, torch.Tensor]:
    """``{"encoder.layers.i": X (n x embed)}`` for every layer of ``model`` (:func:`ffn_layers`): what its
    ``fc1`` receives. Stops drawing batches once every side holds at least ``n`` positions; raises if the
    data run out."""
    names = {f"{name}.fc1": name for name in ffn_layers(model)}
    X = collect_activations(model, batches, n, pad, inputs=list(names), seed=seed)
    return {names[k]: v for k, v in X.items()}


@torch.no_grad()
def collect_activations(model, batches, n: int, pad: int, inputs: List[str] = (), outputs: List[str] = (),
                        seed: int = 1) -> Dict[str, torch.Tensor]:
    """``{module name: (n x width)}``: the first input of every module named in ``inputs`` (e.g.
    ``"decoder.layers.1.fc1"``, or an attention's query, ``"decoder.layers.1.encoder_attn"``: fairseq's fused
    attention path never calls its ``q_proj`` module) and the (first) output of every module in ``outputs``
    (e.g. a layer, ``"encoder.layers.2"``), at ``n`` random non-padding positions of the module's side; every
    module of a side sees the same positions (eval mode, teacher-forced)."""
    model.eval()
    modules = dict(model.named_modules())
    missing = [name for name in (*inputs, *outputs) if name not in modules]
    if missing:
        raise ValueError(f"no module {missing} in the model")
    seen: Dict[str, List[torch.Tensor]] = {name: [] for name in (*inputs, *outputs)}
    current = {}

    def keep(name, x):
        current[name] = x[0] if isinstance(x, tuple) else x
    def first_input(name):
        def hook(module, args, kwargs):  # fairseq calls attentions with query=..., layers with x positional
            keep(name, args[0] if args else kwargs["query"] if "query" in kwargs else kwargs["x"])
        return hook
    hooks = [modules[name].register_forward_pre_hook(first_input(name), with_kwargs=True) for name in inputs]
    hooks += [modules[name].register_forward_hook(lambda m, inp, out, name=name: keep(name, out)) for name in outputs]
    counts = {}  # positions seen per side the data feed (both for translation)
    try:
        for sample in batches:
            current.clear()
            run_model(model, sample)
            masks = pad_masks(sample, pad)
            for name, x in current.items():
                seen[name].append(x[masks[side_of(name)]].float().cpu())
            for side in masks:
                counts[side] = counts.get(side, 0) + int(masks[side].sum())
            if min(counts.values()) >= n:
                break
    finally:
        for h in hooks:
            h.remove()
    if not counts or min(counts.values()) < n:
        raise ValueError(f"the data hold only {counts} non-padding positions; {n} activations were asked for")
    gen = torch.Generator().manual_seed(seed)
    picks = {side: torch.randperm(counts[side], generator=gen)[:n] for side in counts}
    return {name: torch.cat(xs)[picks[side_of(name)]] for name, xs in seen.items()}


@torch.no_grad()
def collect_attention_inputs(model, batches, n: int, pad: int, names: List[str]
                             ) -> Dict[str, Tuple[List[torch.Tensor], Optional[List[torch.Tensor]]]]:
    """``{name: (queries, keys)}`` for every attention module of ``model`` in ``names`` (e.g.
    ``"encoder.layers.0.self_attn"``, ``"decoder.layers.1.encoder_attn"``): ``queries`` holds its query
    input, one tensor of non-padding positions per sentence (source positions for the encoder, target
    positions for the decoder); ``keys`` the matching source positions of its key input for
    encoder-decoder attention, ``None`` for self-attention. Whole batches are drawn until both sides
    hold at least ``n`` positions (teacher-forced, eval mode)."""
    model.eval()
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        raise ValueError(f"no attention {missing} in the model")
    out = {name: ([], [] if name.endswith("encoder_attn") else None) for name in names}
    current = {}

    def hook(name):
        def capture(module, args, kwargs):
            current[name] = (kwargs["query"] if "query" in kwargs else args[0],
                             kwargs["key"] if "key" in kwargs else args[1])
        return capture
    hooks = [modules[name].register_forward_pre_hook(hook(name), with_kwargs=True) for name in names]
    counts = {}  # positions seen per side the data feed (both for translation)
    try:
        for sample in batches:
            current.clear()
            run_model(model, sample)
            masks = {side: m.t() for side, m in pad_masks(sample, pad).items()}  # (B, T)
            for name, (query, key) in current.items():
                side = side_of(name)
                out[name][0].extend(query[masks[side][b], b].float().cpu() for b in range(query.size(1)))
                if out[name][1] is not None:
                    out[name][1].extend(key[masks["encoder"][b], b].float().cpu() for b in range(key.size(1)))
            for side in masks:
                counts[side] = counts.get(side, 0) + int(masks[side].sum())
            if min(counts.values()) >= n:
                break
    finally:
        for h in hooks:
            h.remove()
    if not counts or min(counts.values()) < n:
        raise ValueError(f"the data hold only {counts} non-padding positions; {n} were asked for")
    return out
