"""Analytic FLOPs of a fairseq Transformer encoder, with or without Variator plugins.

Convention (that of ``torch.utils.flop_counter.FlopCounterMode``, which the tests check this
against on real batches): FLOPs = 2 x multiply-adds of the matrix products (linear layers,
attention scores and weighted sums). Element-wise work (LayerNorm, softmax, activations, residual
additions) is not counted; it is a few percent of an encoder layer at these widths.

Per encoder layer, sequence length T (padded batch length), width d, FFN width f:
* self-attention: Q, K, V, output projections 4*T*d*d; scores and weighted sum 2*T*S*d, with
  S = T keys (S = ceil(T/k) merged keys for an Att-KV plugin, whose K/V projections then run on S);
* FFN: 2*T*d*f, on ceil(T/k) merged vectors when an FFN plugin is active;
* plugin (Variator section 3.4): compression k*d + d per position; decompression adapter 2*d*r + r*d
  per position (the paper's 3*r*d), less here because the merged vector's half of W_u1 runs once
  per group (G*d*r) instead of once per position; positions counted over the padded length G*k.
"""
import math
from typing import Dict, Optional


def encoder_layer_macs(T: int, d: int, f: int, plugin: Optional[dict] = None) -> Dict[str, int]:
    """Multiply-adds of one encoder layer on one sequence of (padded) length T, by part."""
    k = plugin["ratio"] if plugin else 1
    place = plugin["place"] if plugin else None
    G = math.ceil(T / k)
    padded = G * k
    parts = {"attention_projections": 4 * T * d * d, "attention_scores": 2 * T * T * d, "ffn": 2 * T * d * f,
             "plugin": 0}
    if place == "ffn":
        parts["ffn"] = 2 * G * d * f
    elif place == "att-kv":
        parts["attention_projections"] = 2 * T * d * d + 2 * G * d * d
        parts["attention_scores"] = 2 * T * G * d
    if plugin:
        merge = (k * d if plugin.get("compression", "learned") == "learned" else 0) + d
        parts["plugin"] = padded * merge
        if place == "ffn" and plugin.get("decompression", "adapter") == "adapter":
            r = plugin["bottleneck"]
            parts["plugin"] += padded * 2 * d * r + G * d * r
    return parts


def encoder_flops(batch: int, T: int, layers: int, d: int, f: int, plugin: Optional[dict] = None,
                  plugged_layers: Optional[set] = None) -> Dict[str, int]:
    """FLOPs of the encoder layers on a batch of ``batch`` sequences of padded length ``T``.

    ``plugin`` is a plugin config (dict with ratio, place, bottleneck, compression, decompression),
    applied to ``plugged_layers`` (0-based; default: every layer).
    """
    plugged = set(range(layers)) if plugged_layers is None else set(plugged_layers)
    total: Dict[str, int] = {}
    for i in range(layers):
        for part, macs in encoder_layer_macs(T, d, f, plugin if i in plugged else None).items():
            total[part] = total.get(part, 0) + 2 * batch * macs
    total["total"] = sum(total.values())
    return total
