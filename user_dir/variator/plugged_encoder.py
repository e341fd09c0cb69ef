"""Plug-and-play: attaching several compression plugins to one frozen fairseq encoder, choosing one
(or none) at inference, and plugin files (Variator, section 3.1 and Figure 1).

The backbone is never modified: plugins live in a :class:`VariatorPlugins` module added to the
model as ``model.variator``, and enter the computation through PyTorch forward hooks on the
encoder layers (their FFN's ``fc1``/``fc2``, or ``self_attn`` for Att-KV). With no plugin active
every hook returns at once and the model computes exactly what the backbone computes.

Works for fairseq's translation encoder (``model.encoder``) and RoBERTa-style sentence encoders
(``model.encoder.sentence_encoder``), whose layers are both ``TransformerEncoderLayerBase``.

A plugin file holds only the plugin's tensors, its :class:`PluginConfig` and the signature of the
backbone it was trained for (encoder kind, layers, dims, heads); attaching it to a backbone with
another signature is refused, naming the file.
"""
import hashlib
import logging
import os
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from ..common.layer_lists import every_layer
from .compression_plugin import CompressionPlugin, PluginConfig, group_padding_mask

logger = logging.getLogger(__name__)

PLUGIN_FILE_FORMAT = "fairseq-compress/variator-plugin"
PREFIX = "variator.plugins."


class VariatorError(ValueError):
    """A Variator configuration or plugin file that cannot serve this model."""


def transformer_encoder(model: nn.Module) -> nn.Module:
    """The fairseq TransformerEncoder inside a translation or RoBERTa-style model."""
    encoder = getattr(model, "encoder", None)
    encoder = getattr(encoder, "sentence_encoder", encoder)
    if encoder is None or not hasattr(encoder, "layers"):
        raise VariatorError(f"{type(model).__name__} has no fairseq Transformer encoder to plug into")
    return encoder


def backbone_signature(model: nn.Module) -> dict:
    """What a plugin depends on: the encoder's kind, depth and widths."""
    encoder = transformer_encoder(model)
    layer = encoder.layers[0]
    return {"encoder": "sentence" if hasattr(model.encoder, "sentence_encoder") else "translation",
            "layers": len(encoder.layers), "embed_dim": layer.embed_dim,
            "ffn_dim": layer.fc1.out_features, "heads": layer.self_attn.num_heads}


def fingerprint(fc1_weight: torch.Tensor) -> str:
    """A digest of the encoder's first FFN weight: tells two backbones of one shape apart."""
    return hashlib.sha1(fc1_weight.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _encoder_prefix(model_state: dict) -> str:
    return "encoder.sentence_encoder." if any(k.startswith("encoder.sentence_encoder.") for k in model_state) \
        else "encoder."


def backbone_of_state(state: dict) -> tuple:
    """(signature, fingerprint) of the backbone held by a fairseq checkpoint ``state``."""
    model_state, prefix = state["model"], _encoder_prefix(state["model"])
    layers = {int(k[len(prefix) + 7:].split(".", 1)[0]) for k in model_state if k.startswith(prefix + "layers.")}
    fc1 = model_state[prefix + "layers.0.fc1.weight"]
    model_cfg = state["cfg"]["model"]
    heads = model_cfg.get("encoder_attention_heads") if hasattr(model_cfg, "get") else \
        getattr(model_cfg, "encoder_attention_heads", None)
    signature = {"encoder": "sentence" if "sentence_encoder" in prefix else "translation",
                 "layers": len(layers), "embed_dim": fc1.size(1), "ffn_dim": fc1.size(0), "heads": heads}
    return signature, fingerprint(fc1)


def parse_layers(spec: str, num_layers: int) -> tuple:
    """'all' or a comma-separated list of 1-based encoder layers -> sorted 0-based indices."""
    if spec.strip() == "all":
        return tuple(range(num_layers))
    try:
        layers = sorted({int(v) - 1 for v in spec.split(",") if v.strip()})
    except ValueError:
        raise VariatorError(f"--variator-layers {spec!r}: give 'all' or 1-based layer numbers like 1,2,3")
    if not layers or layers[0] < 0 or layers[-1] >= num_layers:
        raise VariatorError(f"--variator-layers {spec!r}: the encoder has layers 1..{num_layers}")
    return tuple(layers)


class PluginSet(nn.Module):
    """The plugins of one compression ratio: one :class:`CompressionPlugin` per chosen layer."""

    def __init__(self, embed_dim: int, config: PluginConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleDict({str(i): CompressionPlugin(embed_dim, config) for i in config.layers})


class VariatorPlugins(nn.Module):
    """All plugins attached to one backbone, keyed ``k<ratio>``; at most one is active."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.signature = backbone_signature(model)
        # a backbone weight (in a list: not registered, the backbone is not ours): a plugin attached later
        # takes its device and dtype, which model.half() / .to() change in place, so a plugin attached to a
        # model already in half precision runs in half precision too
        self._backbone_reference = [next(transformer_encoder(model).parameters())]
        self.plugins = nn.ModuleDict()
        self.active: Optional[str] = None
        self._placeholders = set()  # sets whose weights must come from the checkpoint being loaded
        self._fingerprints = {}  # key -> (backbone fingerprint recorded in its plugin file, file)
        self._install_hooks(transformer_encoder(model))

    # ---- which plugins exist, which one runs --------------------------------------------------
    @staticmethod
    def key(ratio: int) -> str:
        return f"k{ratio}"

    @property
    def ratios(self) -> List[int]:
        return sorted(int(k[1:]) for k in self.plugins)

    def add(self, config: PluginConfig, state_dict: Optional[Dict[str, torch.Tensor]] = None,
            placeholder: bool = False, source: Optional[tuple] = None) -> PluginSet:
        key = self.key(config.ratio)
        if key in self.plugins:
            raise VariatorError(f"two plugins with ratio k={config.ratio} attached; keep one (--variator-plugins)")
        if config.layers and config.layers[-1] >= self.signature["layers"]:
            raise VariatorError(f"plugin k={config.ratio} is for layers {[i + 1 for i in config.layers]} but the "
                                f"encoder has {self.signature['layers']}")
        plugin_set = PluginSet(self.signature["embed_dim"], config)
        if state_dict is not None:
            plugin_set.load_state_dict(state_dict, strict=True)
        reference = self._backbone_reference[0]
        plugin_set.to(device=reference.device, dtype=reference.dtype)
        self.plugins[key] = plugin_set
        if placeholder:
            self._placeholders.add(key)
        if source is not None:
            self._fingerprints[key] = source
        return plugin_set

    def use(self, ratio: Optional[int]) -> None:
        """Make the plugin of ratio ``ratio`` active; 0 or None runs the backbone alone."""
        if not ratio:
            self.active = None
            return
        if self.key(ratio) not in self.plugins:
            raise VariatorError(f"--variator-ratio {ratio}: no plugin with k={ratio} is attached "
                                f"(attached: {self.ratios or 'none'}; add its file to --variator-plugins)")
        self.active = self.key(ratio)

    @contextmanager
    def bypassed(self):
        """Run the backbone alone inside this block (the distillation teacher)."""
        saved, self.active = self.active, None
        try:
            yield
        finally:
            self.active = saved

    def _plugin_for(self, layer_index: int) -> Optional[CompressionPlugin]:
        if self.active is None:
            return None
        return self.plugins[self.active].layers[str(layer_index)] if str(layer_index) in \
            self.plugins[self.active].layers else None

    # ---- hooks: how plugins enter the frozen layers ---------------------------------------------
    def _install_hooks(self, encoder: nn.Module) -> None:
        for index, layer in enumerate(every_layer(encoder.layers)):
            state = {}  # per-layer scratch: the padding mask and the groups of the current forward

            def remember_mask(module, args, kwargs, state=state):
                state["mask"] = kwargs["encoder_padding_mask"] if "encoder_padding_mask" in kwargs else (
                    args[1] if len(args) > 1 else None)

            def compress_ffn_input(module, args, index=index, state=state):
                plugin = self._plugin_for(index)
                if plugin is None or plugin.decompression is None:
                    return None
                merged, state["groups"] = plugin.compression(args[0], state.get("mask"))
                return (merged,)

            def decompress_ffn_output(module, args, output, index=index, state=state):
                groups = state.pop("groups", None)
                if groups is None:
                    return None
                return self._plugin_for(index).decompression(output, groups)

            def compress_keys_values(module, args, kwargs, index=index, state=state):
                plugin = self._plugin_for(index)
                if plugin is None or plugin.decompression is not None:
                    return None
                if module.skip_embed_dim_check or kwargs.get("attn_mask") is not None:
                    raise VariatorError("Att-KV plugins need fairseq's standard self-attention path "
                                        "(no attention mask, no skipped dimension check)")
                x = kwargs["query"] if "query" in kwargs else args[0]
                merged, groups = plugin.compression(x, state.get("mask"))
                kwargs = dict(kwargs, query=x, key=merged, value=merged, key_padding_mask=group_padding_mask(groups))
                return (), kwargs

            layer.register_forward_pre_hook(remember_mask, with_kwargs=True)
            layer.fc1.register_forward_pre_hook(compress_ffn_input)
            layer.fc2.register_forward_hook(decompress_ffn_output)
            layer.self_attn.register_forward_pre_hook(compress_keys_values, with_kwargs=True)

    # ---- loading a backbone checkpoint into a plugged model -------------------------------------
    def upgrade_state_dict_named(self, state_dict: dict, name: str) -> None:
        """fairseq calls this before loading a checkpoint into the model.

        A backbone checkpoint has no plugin tensors: the attached plugins keep their own (from their
        files, or fresh for training). Plugin tensors of ratios not attached here are dropped with a
        warning. A placeholder (a plugin expected from the checkpoint) that the checkpoint lacks is
        an error: it would otherwise run with random weights.
        """
        prefix = f"{name}.plugins." if name else "plugins."
        present = {k[len(prefix):].split(".", 1)[0] for k in state_dict if k.startswith(prefix)}
        for key in list(present):
            if key not in self.plugins:
                logger.warning("the checkpoint holds a Variator plugin %s that is not attached; ignored", key)
                for k in [k for k in state_dict if k.startswith(prefix + key + ".")]:
                    del state_dict[k]
        for key in self._placeholders:
            if key not in present:
                attached = sorted(int(k[1:]) for k in self.plugins if k not in self._placeholders)
                raise VariatorError(
                    f"--variator-ratio {key[1:]}: no plugin with k={key[1:]}: the checkpoint holds none and the "
                    f"attached plugin files have k in {attached or 'none'}; add its file to --variator-plugins")
        backbone_fc1 = next((v for k, v in state_dict.items()
                             if k.endswith("layers.0.fc1.weight") and not k.startswith(prefix)), None)
        for key, (expected, path) in self._fingerprints.items():
            if backbone_fc1 is not None and expected and fingerprint(backbone_fc1) != expected:
                logger.warning("Variator plugin k=%s (%s) was trained on other backbone weights of the same "
                               "shape (expected when a pre-trained plugin initialises task adaptation)",
                               key[1:], path)
        for k, v in self.state_dict(prefix=f"{name}." if name else "").items():
            state_dict.setdefault(k, v)


# ---- plugin files -------------------------------------------------------------------------------
def write_plugin_file(path: str, payload: dict) -> None:
    payload = {"format": PLUGIN_FILE_FORMAT, "version": 1, **{k: payload[k] for k in
               ("config", "backbone", "backbone_fingerprint", "state_dict")}}
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def read_plugin_source(path: str) -> List[dict]:
    """Plugins in ``path``: a plugin file, or a fairseq checkpoint written by a Variator training run."""
    if not os.path.isfile(path):
        raise VariatorError(f"--variator-plugins {path}: no such file")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(payload, dict) and payload.get("format") == PLUGIN_FILE_FORMAT:
        return [dict(payload, source=path)]
    if isinstance(payload, dict) and "model" in payload and "cfg" in payload:
        return plugins_in_checkpoint(payload, path)
    raise VariatorError(f"--variator-plugins {path}: neither a Variator plugin file nor a fairseq checkpoint")


def plugins_in_checkpoint(state: dict, path: str) -> List[dict]:
    """Plugin payloads held by a fairseq checkpoint of a Variator training run."""
    task_cfg = state["cfg"]["task"]
    signature, backbone_fp = backbone_of_state(state)
    found = []
    for key in sorted({k[len(PREFIX):].split(".", 1)[0] for k in state["model"] if k.startswith(PREFIX)}):
        tensors = {k[len(PREFIX) + len(key) + 1:]: v for k, v in state["model"].items()
                   if k.startswith(PREFIX + key + ".")}
        layers = sorted({int(k.split(".")[1]) for k in tensors})
        config = PluginConfig(ratio=int(key[1:]), layers=tuple(layers), place=task_cfg.get("variator_place", "ffn"),
                              bottleneck=int(task_cfg.get("variator_bottleneck", 64)),
                              compression=task_cfg.get("variator_compression", "learned"),
                              decompression=task_cfg.get("variator_decompression", "adapter"),
                              adapter_activation=task_cfg.get("variator_adapter_activation", "none"))
        found.append({"config": config.as_dict(), "backbone": signature, "backbone_fingerprint": backbone_fp,
                      "state_dict": tensors, "source": path})
    if not found:
        raise VariatorError(f"--variator-plugins {path}: this checkpoint holds no Variator plugin")
    return found


def attach_plugin_files(model: nn.Module, paths: str) -> VariatorPlugins:
    """Give ``model`` a plugin container (once) and attach the comma-separated plugin files ``paths``."""
    if getattr(model, "variator", None) is None:
        model.variator = VariatorPlugins(model)
    for path in filter(None, (p.strip() for p in (paths or "").split(","))):
        for payload in read_plugin_source(path):
            attach_payload(model.variator, payload)
    return model.variator


def attach_payload(container: VariatorPlugins, payload: dict) -> PluginConfig:
    """Attach a plugin read by :func:`read_plugin_source`; refuse one made for another backbone shape."""
    path, expected = payload.get("source", "?"), payload.get("backbone")
    if expected is not None:
        differing = {k: (expected.get(k), v) for k, v in container.signature.items()
                     if expected.get(k) is not None and expected.get(k) != v}
        if differing:
            detail = ", ".join(f"{k} {a} (plugin) vs {b} (model)" for k, (a, b) in differing.items())
            raise VariatorError(f"--variator-plugins {path}: made for another backbone: {detail}")
    config = PluginConfig.from_dict(payload["config"])
    try:
        container.add(config, payload["state_dict"], source=(payload.get("backbone_fingerprint"), path))
    except RuntimeError as e:  # tensor shapes
        raise VariatorError(f"--variator-plugins {path}: does not fit this backbone ({e})") from None
    return config
