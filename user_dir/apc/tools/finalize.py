"""Finalize an APC checkpoint: fold every compressed FFN and attention into dense layers (APC paper,
eqs 1-2; section 4.4 "finalize the model by replacing all W, b with W~, b~").

    python -m user_dir.apc.tools.finalize checkpoints/apc/checkpoint_best.pt --out apc_final.pt

Works on the state dict alone (no data needed). When every layer of a side has one FFN width (all
compressed to the same ``cmp^f``, or that side left alone) and no attention is compressed, the result
is a checkpoint of the stock ``transformer`` architecture with ``--encoder-ffn-embed-dim`` /
``--decoder-ffn-embed-dim`` set to those widths (an ``apc_hf_bert`` encoder becomes a plain ``hf_bert``
of that ``--encoder-ffn-embed-dim``, the plug-in's BERT home; otherwise it stays ``apc_hf_bert
--apc-finalized``, e.g. the APC-50-ff analogue, whose first layer keeps its FFN). Compressed attentions (of any of the three kinds) are
narrower than any stock fairseq attention: by default the model stays ``apc_transformer
--apc-finalized`` (dense layers of the per-layer widths; needs ``--user-dir user_dir``), as it does
for per-layer FFN widths. ``--pad-attention`` instead zero-pads every compressed head back to the
original head size (attention_compression.pad_attention_state: the same function, since eq. 8 keeps
the original ``sqrt(d_K)``), so that with uniform FFN widths the model is a stock ``transformer``:
portable (stock fairseq, CTranslate2) but with the original attention's parameters and FLOPs.
Embedding compression (per-block widths between a pre- and a post-scaling) has no stock form: such a
model always stays ``--apc-finalized``, its ``D^PS``/``U^PS`` plain dense layers.

A stock result is written by fc-export's writer (tools/export.py: its cfg is plain Python, its task
``translation``, its criterion ``label_smoothed_cross_entropy``, and the stock model's output is checked
against the folded one before writing): stock ``fairseq-generate`` loads it without ``--user-dir`` and
with torch's default weights-only loading, no environment variable. Optimizer state is dropped.
"""
import argparse
import os
import re
import tempfile

import torch

import user_dir  # noqa: F401  allows loading fairseq checkpoints under torch >= 2.6
from user_dir.apc.reparameterised_linear import fold_linear

_APC_KEYS = ("U", "b_U", "D", "b_D", "B")


_ATTENTION = re.compile(r"^(encoder|decoder)(\.sentence_encoder)?\.layers\.\d+\.(self_attn|encoder_attn)")
# (side, attention module, the apc_* option of its per-layer sizes)
ATTENTIONS = (("encoder", "self_attn", "apc_encoder_attn_dims"), ("decoder", "self_attn", "apc_decoder_attn_dims"),
              ("decoder", "encoder_attn", "apc_cross_attn_dims"))
# per APC model: the stock architecture a uniform finalized model becomes, and where each side's layers live
MODELS = {"apc_transformer": ("transformer", {"encoder": "encoder", "decoder": "decoder"}),
          "apc_hf_bert": ("hf_bert", {"encoder": "encoder.sentence_encoder"})}


def _heads_of(heads, prefix: str) -> int:
    """``heads`` is one count for every attention or ``{"encoder": n, "decoder": m}``."""
    n = heads.get(prefix.split(".")[0]) if isinstance(heads, dict) else heads
    if not n:
        raise ValueError(f"{prefix}: a compressed attention projection needs the number of heads")
    return n


def finalize_state_dict(sd: dict, heads=None) -> dict:
    """Fold every ``*.linear.weight`` + APC parameters into ``*.weight/bias``. The ``D`` of a compressed
    attention's ``{q,k,v}_proj`` is block diagonal: its block mask (``heads`` blocks; an int, or a count
    per side) is applied first."""
    out = {}
    prefixes = sorted({k[: -len(".linear.weight")] for k in sd if k.endswith(".linear.weight")})
    consumed = set()
    for prefix in prefixes:
        parts = {name: sd.get(f"{prefix}.{name}") for name in _APC_KEYS}
        if _ATTENTION.match(prefix) and re.search(r"\.[qkv]_proj$", prefix) and parts["D"] is not None:
            n = _heads_of(heads, prefix)
            D = parts["D"]
            mask = torch.block_diag(*[torch.ones(D.size(0) // n, D.size(1) // n)] * n).to(D)
            parts["D"] = D * mask
        weight, bias = sd[f"{prefix}.linear.weight"], sd.get(f"{prefix}.linear.bias")
        w, b = fold_linear(weight.float(), None if bias is None else bias.float(),
                           **{k: (None if v is None else v.float()) for k, v in parts.items()})
        out[f"{prefix}.weight"], out[f"{prefix}.bias"] = w.to(weight.dtype), b.to(weight.dtype)
        consumed |= {f"{prefix}.linear.weight", f"{prefix}.linear.bias"} | {f"{prefix}.{n}" for n in _APC_KEYS}
    for k, v in sd.items():
        if k not in consumed:
            out[k] = v
    return out


def ffn_widths(sd: dict, side: str, module: str = "fc1") -> list:
    """The output width of ``module`` in every layer under ``side`` (e.g. ``encoder`` or
    ``encoder.sentence_encoder``), in layer order."""
    widths = {}
    for k, v in sd.items():
        m = re.match(rf"{re.escape(side)}\.layers\.(\d+)\.{module}\.weight$", k)
        if m:
            widths[int(m.group(1))] = v.size(0)
    return [widths[i] for i in sorted(widths)]


def apc_model_of(model_args) -> str:
    """``apc_transformer`` or ``apc_hf_bert``: the APC model a checkpoint's arguments build."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY
    model = ARCH_MODEL_NAME_REGISTRY.get(getattr(model_args, "arch", None))
    if model not in MODELS:
        raise SystemExit(f"apc_finalize: the checkpoint's model is {getattr(model_args, 'arch', '?')}, not one of "
                         f"the APC models ({', '.join(MODELS)})")
    return model


def finalize_checkpoint(state: dict, pad_attention: bool = False) -> dict:
    model_args = state["cfg"]["model"] if state.get("cfg") else state["args"]
    stock_arch, stacks = MODELS[apc_model_of(model_args)]
    heads = {side: getattr(model_args, f"{side}_attention_heads", None) for side in stacks}
    sd = finalize_state_dict(state["model"], heads=heads)
    widths = {side: ffn_widths(sd, prefix) for side, prefix in stacks.items()}
    attentions = [(side, module, option) for side, module, option in ATTENTIONS if side in stacks]
    attn = {option: ffn_widths(sd, stacks[side], f"{module}.q_proj") for side, module, option in attentions}
    full = {option: getattr(model_args, f"{side}_embed_dim") for side, _, option in attentions}
    if pad_attention:
        from user_dir.apc.attention_compression import pad_attention_state
        for side, module, option in attentions:
            for i, n in enumerate(attn[option]):
                if n != full[option]:
                    pad_attention_state(sd, f"{stacks[side]}.layers.{i}.{module}", heads[side],
                                        full[option] // heads[side])
    attention_stock = pad_attention or all(n == full[o] for o, w in attn.items() for n in w)
    embedding = {side: getattr(model_args, f"apc_{side}_embed_dims", None) for side in stacks}
    stock = all(len(set(w)) == 1 for w in widths.values()) and attention_stock and not any(embedding.values())
    if stock:
        for side, w in widths.items():
            setattr(model_args, f"{side}_ffn_embed_dim", w[0])
        model_args.arch = model_args._name = stock_arch
        for name in [n for n in vars(model_args) if n.startswith("apc_")]:
            delattr(model_args, name)
    else:
        for side, w in widths.items():
            original = getattr(model_args, f"{side}_ffn_embed_dim")
            spec = ",".join(f"{i}:{n}" for i, n in enumerate(w) if n != original)
            setattr(model_args, f"apc_{side}_ffn_dims", spec or None)
        for option, w in attn.items():
            spec = "" if pad_attention else ",".join(f"{i}:{n}" for i, n in enumerate(w) if n != full[option])
            setattr(model_args, option, spec or None)
        model_args.apc_finalized, model_args.apc_train_original = True, False
    state["model"] = sd
    if state.get("cfg"):
        state["cfg"]["model"] = model_args
    state["args"] = None
    state["last_optimizer_state"] = None
    state.setdefault("extra_state", {})["apc_finalized"] = {
        "stock_transformer": stock and stock_arch == "transformer", "stock_arch": stock_arch if stock else None,
        "ffn_widths": widths, "attention_widths": attn, "attention_padded": pad_attention,
        "embedding_widths": {side: spec for side, spec in embedding.items() if spec}}
    return state


def write_stock_checkpoint(state: dict, out: str) -> dict:
    """Write a finalized state whose model is stock ``transformer`` through fc-export (tools/export.py),
    so its cfg holds only plain values (weights-only loadable); returns fc-export's summary."""
    from user_dir.deploy.export import ExportError, export

    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        staged = os.path.join(tmp, "finalized.pt")
        torch.save(state, staged)
        try:
            summary = export(staged, out + ".tmp")
        except ExportError as err:
            if os.path.exists(out + ".tmp"):
                os.remove(out + ".tmp")
            raise SystemExit(f"apc_finalize: {err}")
    os.replace(out + ".tmp", out)
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="an apc_transformer checkpoint (fairseq-train or apc_init output)")
    p.add_argument("--out", required=True, help="where to write the finalized checkpoint")
    p.add_argument("--pad-attention", action="store_true",
                   help="zero-pad compressed attention heads back to the original head size: the same function "
                        "(eq. 8 keeps sqrt(d_K)) as a stock transformer when FFN widths are uniform, but with the "
                        "original attention's size; default: keep the compressed widths (apc_transformer)")
    a = p.parse_args(argv)
    if not os.path.isfile(a.checkpoint):
        p.error(f"{a.checkpoint}: no such checkpoint file")
    state = finalize_checkpoint(torch.load(a.checkpoint, map_location="cpu"), pad_attention=a.pad_attention)
    info = state["extra_state"]["apc_finalized"]
    if info["stock_transformer"]:
        write_stock_checkpoint(state, a.out)
    else:  # the plug-in's archs: loaded with --user-dir, whose allow-list opens their cfg weights-only
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        torch.save(state, a.out + ".tmp")
        os.replace(a.out + ".tmp", a.out)
    model_args = state["cfg"]["model"] if state.get("cfg") else state["args"]
    kind = info["stock_arch"] or f"{model_args.arch} --apc-finalized"
    attention = {k: v for k, v in info["attention_widths"].items() if getattr(model_args, k, None)}
    widths = " ".join(f"{side} {w}" for side, w in info["ffn_widths"].items())
    print(f"wrote {a.out}: {kind}, FFN widths {widths}, attention widths {attention}"
          + (" (zero-padded to full heads)" if info["attention_padded"] else "")
          + (f", embedding widths {info['embedding_widths']}" if info["embedding_widths"] else ""))


if __name__ == "__main__":
    main()
