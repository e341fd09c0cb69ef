"""Finalize an APC checkpoint: fold every compressed FFN into dense layers (APC paper, eqs 1-2;
section 4.4 "finalize the model by replacing all W, b with W~, b~").

    python -m user_dir.tools.apc_finalize checkpoints/apc/checkpoint_best.pt --out apc_final.pt

Works on the state dict alone (no data needed). When every layer of a side has one FFN width (all
compressed to the same ``cmp^f``, or that side left alone) and no attention is compressed, the result is a checkpoint of the stock
``transformer`` architecture with ``--encoder-ffn-embed-dim`` / ``--decoder-ffn-embed-dim`` set to
those widths, written by fc-export's writer (tools/export.py: its cfg is plain Python, its
task ``translation``, its criterion ``label_smoothed_cross_entropy``, and the stock model's output
is checked against the folded one before writing): stock ``fairseq-generate`` loads it without
``--user-dir`` and with torch's default weights-only loading, no environment variable. Otherwise it stays ``apc_transformer`` with ``--apc-finalized``
(dense layers of the per-layer widths; needs ``--user-dir user_dir``). Optimizer state is dropped.
"""
import argparse
import os
import re
import tempfile

import torch

import user_dir  # noqa: F401  allows loading fairseq checkpoints under torch >= 2.6
from user_dir.apc.reparameterised_linear import fold_linear

_APC_KEYS = ("U", "b_U", "D", "b_D", "B")


def finalize_state_dict(sd: dict, heads: int = None) -> dict:
    """Fold every ``*.linear.weight`` + APC parameters into ``*.weight/bias``. The ``D`` of a compressed
    ``self_attn.{q,k,v}_proj`` is block diagonal: its block mask (``heads`` blocks) is applied first."""
    out = {}
    prefixes = sorted({k[: -len(".linear.weight")] for k in sd if k.endswith(".linear.weight")})
    consumed = set()
    for prefix in prefixes:
        parts = {name: sd.get(f"{prefix}.{name}") for name in _APC_KEYS}
        if re.search(r"self_attn\.[qkv]_proj$", prefix) and parts["D"] is not None:
            if not heads:
                raise ValueError(f"{prefix}: a compressed attention projection needs the number of heads")
            D = parts["D"]
            mask = torch.block_diag(*[torch.ones(D.size(0) // heads, D.size(1) // heads)] * heads).to(D)
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
    widths = {}
    for k, v in sd.items():
        m = re.match(rf"{side}\.layers\.(\d+)\.{module}\.weight$", k)
        if m:
            widths[int(m.group(1))] = v.size(0)
    return [widths[i] for i in sorted(widths)]


def finalize_checkpoint(state: dict) -> dict:
    model_args = state["cfg"]["model"] if state.get("cfg") else state["args"]
    if getattr(model_args, "arch", None) is None or not str(model_args._name).startswith("apc_transformer"):
        raise SystemExit(f"apc_finalize: the checkpoint's model is {getattr(model_args, '_name', '?')}, "
                         "not apc_transformer")
    sd = finalize_state_dict(state["model"], heads=getattr(model_args, "encoder_attention_heads", None))
    widths = {side: ffn_widths(sd, side) for side in ("encoder", "decoder")}
    attn = ffn_widths(sd, "encoder", "self_attn.q_proj")
    stock = all(len(set(w)) == 1 for w in widths.values()) and all(n == model_args.encoder_embed_dim for n in attn)
    if stock:
        for side, w in widths.items():
            setattr(model_args, f"{side}_ffn_embed_dim", w[0])
        model_args.arch = model_args._name = "transformer"
        for name in [n for n in vars(model_args) if n.startswith("apc_")]:
            delattr(model_args, name)
    else:
        for side, w in widths.items():
            original = getattr(model_args, f"{side}_ffn_embed_dim")
            spec = ",".join(f"{i}:{n}" for i, n in enumerate(w) if n != original)
            setattr(model_args, f"apc_{side}_ffn_dims", spec or None)
        spec = ",".join(f"{i}:{n}" for i, n in enumerate(attn) if n != model_args.encoder_embed_dim)
        model_args.apc_encoder_attn_dims = spec or None
        model_args.apc_finalized, model_args.apc_train_original = True, False
    state["model"] = sd
    if state.get("cfg"):
        state["cfg"]["model"] = model_args
    state["args"] = None
    state["last_optimizer_state"] = None
    state.setdefault("extra_state", {})["apc_finalized"] = {"stock_transformer": stock, "ffn_widths": widths,
                                                            "encoder_attention_widths": attn}
    return state


def write_stock_checkpoint(state: dict, out: str) -> dict:
    """Write a finalized state whose model is stock ``transformer`` through fc-export (tools/export.py),
    so its cfg holds only plain values (weights-only loadable); returns fc-export's summary."""
    from user_dir.tools.export import ExportError, export

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
    a = p.parse_args(argv)
    if not os.path.isfile(a.checkpoint):
        p.error(f"{a.checkpoint}: no such checkpoint file")
    state = finalize_checkpoint(torch.load(a.checkpoint, map_location="cpu"))
    info = state["extra_state"]["apc_finalized"]
    if info["stock_transformer"]:
        write_stock_checkpoint(state, a.out)
    else:  # the plug-in's arch: loaded with --user-dir, whose allow-list opens its cfg weights-only
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        torch.save(state, a.out + ".tmp")
        os.replace(a.out + ".tmp", a.out)
    kind = "stock transformer" if info["stock_transformer"] else "apc_transformer --apc-finalized"
    print(f"wrote {a.out}: {kind}, FFN widths encoder {info['ffn_widths']['encoder']} "
          f"decoder {info['ffn_widths']['decoder']}")


if __name__ == "__main__":
    main()
