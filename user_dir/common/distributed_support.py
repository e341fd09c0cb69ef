"""Which ``--ddp-backend`` values the plug-in's models and criteria train with, and stock ``--bf16`` without torch_xla.

Supported and tested (tests/test_ddp_gradients.py, tests/test_distributed_equality.py):
``pytorch_ddp`` (fairseq's default on GPUs; ``c10d`` is its alias) and ``legacy_ddp`` (``no_c10d``).
Every criterion runs the student through the wrapper's forward (common/wrapped_forward.py), which is
what these need. Refused, naming the flag, before anything is built:

* ``fully_sharded``: fairseq's FSDP path needs fairscale (archived upstream; not a dependency of this
  package) and shards flattened parameters; nothing of PET's shared layers, Variator's frozen
  backbone beside trainable plugins, or the per-layer hooks of GhostBERT, APC and the distillation
  criteria has run under it;
* ``slowmo``: fairscale's SlowMo averages parameters every ``--localsgd-frequency`` updates instead
  of gradients every update (a different optimiser from the papers'), and needs fairscale too.

``--bf16`` of stock ``fairseq-train`` (and ``--memory-efficient-bf16``): fairseq 0.12 turns it into ``--tpu``
(``fairseq/options.py``: ``if args.bf16: args.tpu = True``), and its Trainer then asks torch_xla for a device --
``AttributeError: 'NoneType' object has no attribute 'xla_device'`` on every machine without torch_xla (every
GPU and CPU one). The same models, criteria and tasks refuse it there (``check_tpu``), before fairseq builds its
Trainer, naming the flag and ``fc-train-bf16`` (user_dir/tools/train_bf16.py): the same command with that one
implication undone, which trains in bfloat16 on a GPU or a CPU (tests/test_bf16_refusal.py). With torch_xla
installed (a TPU run) nothing is refused. Two views are read: the ``tpu``/``bf16`` values the caller was given (a
legacy model's flat ``args`` and a criterion's fields are copies of the command line made when it was parsed), and,
where the task's config hangs in the run's config (fairseq's dataclass tasks and ours), the run's own
``common.tpu``/``common.bf16``. Only when every view says ``--bf16`` with ``--tpu`` is the run refused: a caller that
undid the implication in the run's config after parsing (``cfg.common.tpu = False`` before
``fairseq_cli.train.main(cfg)``, as tests/test_mixed_precision.py does) is not, nor ``fairseq-generate --bf16``
(``--tpu`` does nothing there) on a checkpoint, whose model carries its training run's values. With more than one
GPU visible, fairseq's launcher (``distributed_utils.call_main``) imports torch_xla before any model is built, so
there stock ``--bf16`` fails earlier, on ``No module named 'torch_xla'``; ``fc-train-bf16`` avoids that too.
"""
import importlib.util

from omegaconf import OmegaConf

SUPPORTED = ("pytorch_ddp", "c10d", "legacy_ddp", "no_c10d")
REFUSED = {
    "fully_sharded": "it needs fairscale (archived upstream, not installed with this package) and shards flattened "
                     "parameters, under which PET's shared layers, Variator's frozen backbone and the per-layer "
                     "hooks of GhostBERT, APC and the distillation criteria have never run",
    "slowmo": "SlowMo averages parameters every --localsgd-frequency updates instead of gradients every update (a "
              "different optimiser from the papers') and needs fairscale (archived upstream)",
}


def check_ddp_backend(backend, what: str) -> None:
    """Raise a ValueError naming ``--ddp-backend`` when ``backend`` is one the plug-in refuses."""
    if backend in REFUSED:
        raise ValueError(f"--ddp-backend {backend} is not supported with {what}: {REFUSED[backend]}. Use "
                         "--ddp-backend pytorch_ddp (fairseq's default on GPUs) or legacy_ddp")


BF16_IMPLIES_TPU = ("fairseq 0.12 turns --bf16 into --tpu (fairseq/options.py) and torch_xla is not installed, so its "
                    "Trainer would fail asking torch_xla for a device; run the same command with fc-train-bf16 "
                    "(user_dir/tools/train_bf16.py), which undoes that one implication, or python -m "
                    "user_dir.tools.train_bf16")


def xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def _flag(value):
    """A bool, or None: an unresolved ``${common.tpu}`` (a config dataclass built by hand) says nothing."""
    return value if isinstance(value, bool) else None


def _run_common(task):
    """``(tpu, bf16)`` of the run's ``common`` config, reached from ``task`` (a task, or its config) when that
    config hangs in the run's (fairseq's ``setup_task`` keeps the parent, as its ``II`` interpolations need);
    else None."""
    node = task if OmegaConf.is_config(task) else getattr(task, "cfg", None)
    if not OmegaConf.is_config(node):
        return None
    root = node._get_root()  # OmegaConf's parent chain, which fairseq's II("common.tpu") fields resolve through
    if root is node or "common" not in root:
        return None
    common = root.common
    return _flag(common.get("tpu", None)), _flag(common.get("bf16", None))


def check_tpu(tpu, bf16, what: str, task=None) -> None:
    """Raise a ValueError naming ``--bf16`` and ``fc-train-bf16`` when the run is stock ``fairseq-train --bf16``
    (so ``--tpu``) and torch_xla is not installed. ``tpu``/``bf16``: the values the caller was given (a legacy
    model's ``args.tpu``/``args.bf16``, a criterion's fields; None when absent); ``task``: the task building it
    (or its config), through which the run's live ``common`` config is read where reachable. Refused only when
    every view that says anything says both."""
    views = [(_flag(tpu), _flag(bf16)), _run_common(task)]
    views = [v for v in views if v is not None and v[0] is not None]
    if views and all(t and b for t, b in views) and not xla_installed():
        raise ValueError(f"--bf16 with {what}: {BF16_IMPLIES_TPU}")
