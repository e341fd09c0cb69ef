"""``--task variator_translation`` / ``variator_sentence_prediction``: fairseq's translation and
sentence-prediction tasks whose model carries Variator compression plugins (plugged_encoder.py).

Training (``fairseq-train``): ``--variator-backbone`` names the fine-tuned model to accelerate; its
weights are loaded and frozen, a fresh plugin of ratio ``--variator-ratio`` is added (or one from
``--variator-plugins`` continues training: plugin pre-training, then task adaptation), and only
that plugin's parameters reach the optimizer. Give the backbone's architecture flags as you
trained it (``--arch`` and dims); a mismatch stops at start, naming ``--variator-backbone``.

Inference (``fairseq-generate`` / ``fairseq-interactive``): ``--path`` is the backbone itself;
``--variator-plugins a.pt,b.pt`` attaches several plugins and ``--variator-ratio K`` picks one
(0: the backbone alone). ``fairseq-validate`` builds the task stored in the checkpoint, so give it
a checkpoint of a Variator training run and pick the plugin with the same flag.
"""
from dataclasses import dataclass, field
from typing import Optional

from fairseq import checkpoint_utils
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..common.distributed_support import check_ddp_backend, check_tpu
from .compression_plugin import PluginConfig
from .plugged_encoder import VariatorError, attach_plugin_files, parse_layers


@dataclass
class VariatorConfig:
    variator_backbone: Optional[str] = field(default=None, metadata={
        "help": "training: the fine-tuned fairseq checkpoint to accelerate; its weights are loaded and frozen"})
    variator_plugins: Optional[str] = field(default=None, metadata={
        "help": "comma-separated plugin files (or Variator training checkpoints) to attach; in training, a "
                "plugin of --variator-ratio among them is the initialisation (pre-trained plugin -> adaptation)"})
    variator_ratio: int = field(default=4, metadata={
        "help": "compression ratio k of the active plugin: k hidden vectors merged into one (paper: 4; "
                "Fig 3: 2..32); 0 runs the backbone alone"})
    variator_layers: str = field(default="all", metadata={
        "help": "encoder layers (1-based, comma-separated) that get a plugin (paper: all)"})
    variator_place: str = field(default="ffn", metadata={
        "help": "'ffn': around each feed-forward network (paper's main setting); 'att-kv': merge only the "
                "keys and values of self-attention (section 4.7)"})
    variator_bottleneck: int = field(default=64, metadata={
        "help": "bottleneck r of the decompression adapter (paper: 64)"})
    variator_compression: str = field(default="learned", metadata={
        "help": "'learned': softmax(W_c concat(g) + b_c) merge (paper); 'mean': mean pooling (Table 2, w/o Com)"})
    variator_decompression: str = field(default="adapter", metadata={
        "help": "'adapter': copy + adapter of concat(merged output, token input) (paper); 'copy': copy only "
                "(Table 2, w/o DeCom)"})
    variator_adapter_activation: str = field(default="none", metadata={
        "help": "non-linearity between the adapter's two linears: 'none' as in the paper's equation; the "
                "authors' code uses 'tanh'"})


def plug_model(model, cfg: VariatorConfig, from_checkpoint: bool, model_cfg=None):
    """Freeze ``model``, attach the plugins ``cfg`` names, and select the active one."""
    check_ddp_backend(getattr(model_cfg, "ddp_backend", None), "the Variator tasks")
    if not from_checkpoint:  # a model loaded for inference is not trained by this run's Trainer
        check_tpu(getattr(model_cfg, "tpu", None), getattr(model_cfg, "bf16", None), "the Variator tasks", cfg)
    training = bool(cfg.variator_backbone) and not from_checkpoint
    if training:
        load_backbone(model, cfg.variator_backbone)
    elif not from_checkpoint:
        raise VariatorError("--variator-backbone is required to train plugins: the fine-tuned checkpoint whose "
                            "frozen weights they accelerate")
    # frozen for the optimiser only: a model loaded to decode stays as built (frozen, it decoded at 0.44x-0.46x the
    # teacher's throughput in scripts/bench/bench_methods.py on a CPU; as built, 0.99x-1.06x: a frozen weight sends
    # the decoder's non-contiguous input to a batched matmul instead of one GEMM, see user_dir/common/teacher.py)
    if training:
        model.requires_grad_(False)
    attach_plugin_files(model, cfg.variator_plugins)
    k = cfg.variator_ratio
    if k and model.variator.key(k) not in model.variator.plugins:
        config = PluginConfig(ratio=k, layers=parse_layers(cfg.variator_layers, model.variator.signature["layers"]),
                              place=cfg.variator_place, bottleneck=cfg.variator_bottleneck,
                              compression=cfg.variator_compression, decompression=cfg.variator_decompression,
                              adapter_activation=cfg.variator_adapter_activation)
        # outside training the weights must come from the checkpoint being loaded (checked on loading)
        model.variator.add(config, placeholder=not training)
    model.variator.use(k)
    if training:
        if not k:
            raise VariatorError("--variator-ratio 0 trains nothing: give the ratio k of the plugin to train")
        model.variator.plugins[model.variator.key(k)].requires_grad_(True)
    return model


def load_backbone(model, path: str) -> None:
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except FileNotFoundError:
        raise VariatorError(f"--variator-backbone {path}: no such checkpoint file") from None
    try:
        model.load_state_dict(state["model"], strict=True)
    except RuntimeError as e:
        raise VariatorError(
            f"--variator-backbone {path}: its weights do not fit the model built from this command's "
            f"--arch and dimension flags; give the backbone's own architecture flags.\n{e}") from None


@dataclass
class VariatorTranslationConfig(TranslationConfig, VariatorConfig):
    pass


@register_task("variator_translation", dataclass=VariatorTranslationConfig)
class VariatorTranslationTask(TranslationTask):
    """Translation with a frozen model accelerated by Variator plugins on its encoder."""

    def build_model(self, cfg, from_checkpoint=False):
        return plug_model(super().build_model(cfg, from_checkpoint), self.cfg, from_checkpoint, cfg)


@dataclass
class VariatorSentencePredictionConfig(SentencePredictionConfig, VariatorConfig):
    pass


@register_task("variator_sentence_prediction", dataclass=VariatorSentencePredictionConfig)
class VariatorSentencePredictionTask(SentencePredictionTask):
    """GLUE-style sentence(-pair) classification with a frozen encoder accelerated by Variator plugins."""

    def build_model(self, cfg, from_checkpoint=False):
        return plug_model(super().build_model(cfg, from_checkpoint), self.cfg, from_checkpoint, cfg)


def active_plugin_parameters(model) -> int:
    """Parameters of the active plugin (what a plugin file holds)."""
    container = getattr(model, "variator", None)
    if container is None or container.active is None:
        return 0
    return sum(p.numel() for p in container.plugins[container.active].parameters())

