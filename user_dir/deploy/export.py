"""``fc-export STUDENT.pt --out PLAIN.pt``: a trained student as a checkpoint of stock fairseq's
``transformer``, which ``fairseq-generate`` / ``-interactive`` and CTranslate2's fairseq converter
load with no ``--user-dir``.

* PET students (``pet_transformer``, pet/): each logical layer's weights are written out as an
  ordinary layer. A PET model's state dict already names every logical layer, each name bound to
  the physical tensor that layer computes with (the Q<->K role swap of the encoder's second layer
  of a pair, Q_self = Q_ed in the decoder, pet/replaceable_pairs.py); the export loads that state
  into a stock Transformer of the same shape, whose layers own separate tensors, and checks on
  random input that both models give the same output before anything is written.
* Plain students (``transformer``: word-KD, Patient-KD, seq-KD, teachers) pass through; only the
  plug-in's references are removed.
* Anything else is refused with the reason (REFUSED_MODELS, REFUSED_TASKS).

The written checkpoint holds only tensors and plain Python values (dict, list, str, int, float,
bool, None): ``cfg`` is a plain dict, which fairseq's ``load_checkpoint_to_cpu`` turns into an
OmegaConf config itself, so ``torch.load`` opens it with ``weights_only=True`` and no allow-list
(torch >= 2.6's default; the plug-in's own checkpoints need the allow-list of
common/safe_checkpoint_loading.py). The model is stock ``transformer`` (``--arch`` mapped by
STOCK_ARCH), the task ``translation``, the criterion ``label_smoothed_cross_entropy``,
``common.user_dir`` None, and options only the plug-in defines are dropped (checked by
:func:`plugin_references` after the rewrite). Optimizer state and meters are not written.

Cost: the materialised PET student has one tensor per logical layer, so its non-embedding
parameters on disk double (4+4 logical layers from 2+2 physical), less the decoder query it shares;
embeddings are unchanged. Keep the shared checkpoint to continue training or where disk or
download size matters; export for serving.

    fc-export work/pet/kd/checkpoint_best.pt --out pet_plain.pt
    fairseq-generate DATA --path pet_plain.pt --beam 5 --remove-bpe     (no --user-dir)
"""
import argparse
import copy
import dataclasses
import os
import sys
from typing import Dict, List, Tuple

PLUGIN_PACKAGE = (__package__ or "user_dir.tools").split(".")[0]  # "user_dir"

# a plug-in arch -> the stock arch whose defaults it extends (every dimension is in the saved args)
STOCK_ARCH = {"pet_transformer_iwslt": "transformer_iwslt_de_en", "pet_transformer_wmt": "transformer"}
MATERIALISED_MODELS = ("pet_transformer",)
# model options stock TransformerModel.build_model sets on the args itself (not parser options;
# fairseq/models/transformer/transformer_legacy.py): kept, everything else outside stock's parsed
# options came from the plug-in and is dropped
SET_BY_STOCK_BUILD = ("max_source_positions", "max_target_positions", "min_params_to_wrap")

REFUSED_MODELS = {
    "can_transformer": "CAN's decoder layer is a single compressed sub-layer (one softmax over the encoder states and "
                       "the target prefix, value projections folded to the FFN width; Li et al. 2021): stock "
                       "fairseq's TransformerDecoderLayer computes self-attention, encoder attention and the FFN "
                       "as three sub-layers and cannot express it",
    "apc_transformer": "an APC model holds its compression factors (U, D, B) beside the original weights: run "
                       "`python -m user_dir.apc.tools.finalize CKPT --out FINAL.pt` first, which folds them (eqs 1-2) "
                       "and writes a stock `transformer` checkpoint when every layer of a side has one FFN width "
                       "(`--pad-attention` for compressed attentions); per-layer widths and embedding compression "
                       "(per-block widths between a pre- and a post-scaling) stay `apc_transformer --apc-finalized`, "
                       "which stock fairseq cannot express",
    "ghost_transformer": "a GhostBERT encoder keeps M of N_H heads of width embed_dim / N_H (stock fairseq's head width "
                         "is embed_dim / heads) and may hold ghost convolutions (no stock fairseq module); serve it "
                         "with fairseq-generate --user-dir",
    "hf_bert": "an imported Hugging Face BERT-family encoder for sentence prediction: fc-export writes translation "
               "models (stock `transformer`); serve it with Hugging Face transformers",
}
_VARIATOR = ("Variator's compression plugins (k hidden vectors merged into one around each encoder FFN, and a "
             "decompression adapter; Variator Sec. 3) have no stock fairseq module; the backbone alone is a stock "
             "checkpoint: export the --variator-backbone checkpoint instead")
REFUSED_TASKS = {"variator_translation": _VARIATOR, "variator_sentence_prediction": _VARIATOR}


class ExportError(ValueError):
    """A student fc-export cannot write as a stock checkpoint; the message says why."""


# ----------------------------------------------------------------------------------------------
# what comes from the plug-in
# ----------------------------------------------------------------------------------------------
def _from_plugin(obj) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module == PLUGIN_PACKAGE or module.startswith(PLUGIN_PACKAGE + ".")


def plugin_names() -> set:
    """Every arch, model, task and criterion name the plug-in registers."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    names = set()
    for registry in (ARCH_MODEL_REGISTRY, MODEL_REGISTRY, TASK_REGISTRY, CRITERION_REGISTRY):
        names.update(name for name, cls in registry.items() if _from_plugin(cls))
    return names


def plugin_references(cfg, user_dir: str = None) -> List[str]:
    """Paths in a plain cfg whose value names the plug-in: a registered plug-in name, or the
    plug-in's folder. An exported checkpoint must have none."""
    names = plugin_names()
    folder = os.path.abspath(user_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = []

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        elif isinstance(value, str) and (value in names or folder in value or
                                         os.path.basename(folder) == os.path.basename(value.rstrip("/"))):
            found.append(f"{path}={value!r}")

    walk(cfg, "")
    return found


def _non_plain(value, path="") -> List[str]:
    """Paths of values torch's weights-only unpickler would refuse without an allow-list."""
    import torch

    if isinstance(value, dict):
        return [p for k, v in value.items() for p in
                ([f"{path}.{k!r} (key)"] if not isinstance(k, (str, int)) else []) + _non_plain(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _non_plain(v, f"{path}[{i}]")]
    if value is None or isinstance(value, (str, bool, int, float, torch.Tensor)):
        return []
    return [f"{path} ({type(value).__module__}.{type(value).__qualname__})"]


def _plain(value):
    """A cfg value as plain Python: tuples to lists, enums to their string, numpy scalars to numbers."""
    import enum

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value.value, (str, int, float)) else value.name
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        return value.item()  # numpy / torch scalars
    return value


# ----------------------------------------------------------------------------------------------
# the stock configuration
# ----------------------------------------------------------------------------------------------
def _stock_arguments(arch: str, optimizer, lr_scheduler) -> argparse.Namespace:
    """Stock fairseq's parsed defaults for translation with ``arch``: the options a stock
    checkpoint may carry (anything else came from the plug-in)."""
    from fairseq import options
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY

    argv = ["DATA", "--task", "translation", "--arch", arch, "--criterion", "label_smoothed_cross_entropy"]
    if optimizer in OPTIMIZER_REGISTRY and not _from_plugin(OPTIMIZER_REGISTRY[optimizer]):
        argv += ["--optimizer", optimizer]
    if lr_scheduler in LR_SCHEDULER_REGISTRY and not _from_plugin(LR_SCHEDULER_REGISTRY[lr_scheduler]):
        argv += ["--lr-scheduler", lr_scheduler]
    return options.parse_args_and_arch(options.get_training_parser(), argv)


def _fields(config_cls, *sources: dict) -> dict:
    """``config_cls``'s fields, each from the first source that has it, else its default; a default
    interpolating another group (``${dataset.train_subset}``) is left out when no source has it."""
    instance, out = config_cls(), {}
    for f in dataclasses.fields(config_cls):
        if f.name == "_name":
            continue  # the caller names the stock component
        value = next((s[f.name] for s in sources if f.name in s), getattr(instance, f.name))
        if not (isinstance(value, str) and value.startswith("${")):
            out[f.name] = _plain(value)
    return out


def stock_cfg(cfg: dict, model_args: dict, stock_arch: str) -> Tuple[dict, List[str]]:
    """The checkpoint's cfg (plain dict) rewritten to stock translation / label-smoothed CE /
    ``stock_arch``; returns it and the plug-in options dropped from the model args."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterionConfig
    from fairseq.tasks.translation import TranslationConfig

    out = copy.deepcopy(cfg)
    stock = vars(_stock_arguments(stock_arch, model_args.get("optimizer"), model_args.get("lr_scheduler")))
    model = {k: v for k, v in model_args.items() if k in stock or k in SET_BY_STOCK_BUILD}
    dropped = sorted(k for k in model_args if k not in model and k != "_name")
    model.update(_name=stock_arch, arch=stock_arch, task="translation", criterion="label_smoothed_cross_entropy",
                 user_dir=None, checkpoint_activations=False, offload_activations=False)
    out["model"] = model

    out["task"] = {"_name": "translation", **_fields(TranslationConfig, out.get("task") or {}, model_args)}
    sentence_avg = bool((out.get("optimization") or {}).get("sentence_avg", False))
    out["criterion"] = {"_name": "label_smoothed_cross_entropy",
                        **_fields(LabelSmoothedCrossEntropyCriterionConfig, out.get("criterion") or {}, model_args),
                        "sentence_avg": sentence_avg}
    out.setdefault("common", {})["user_dir"] = None
    return _plain(out), dropped


# ----------------------------------------------------------------------------------------------
# the export
# ----------------------------------------------------------------------------------------------
def _model_args(cfg) -> dict:
    model = cfg["model"]
    if isinstance(model, argparse.Namespace):
        return dict(vars(model))
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else dict(model)


def _cfg_as_dict(cfg) -> dict:
    from omegaconf import DictConfig, OmegaConf

    out = {}
    for key in cfg:
        value = cfg[key]
        if key == "model":
            continue
        out[key] = OmegaConf.to_container(value, resolve=True, enum_to_str=True) if isinstance(value, DictConfig) \
            else value
    return out


class _Dictionaries:
    """What TransformerModel.build_model reads of a task: the two dictionaries (here of the
    checkpoint's vocabulary sizes; token identities do not matter to the weights) and task.cfg."""

    def __init__(self, state: dict, task_cfg):
        from fairseq.data import Dictionary

        def sized(n):
            d = Dictionary()
            while len(d) < n:
                d.add_symbol(f"<w{len(d)}>")
            return d

        model = state["model"]
        self.source_dictionary = sized(model["encoder.embed_tokens.weight"].size(0))
        self.target_dictionary = sized(model["decoder.embed_tokens.weight"].size(0))
        self.cfg = task_cfg


def _build(args: dict, dictionaries):
    from fairseq import models

    namespace = argparse.Namespace(**copy.deepcopy(args))
    namespace.checkpoint_activations = namespace.offload_activations = False  # no effect on the weights
    return models.build_model(namespace, dictionaries)


def _check_same_function(student, plain, vocab: int, seed: int = 0) -> float:
    """Max |difference| of the two models' output log-probabilities on random token sequences."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 9), generator=gen)
    prev = torch.randint(4, plain.decoder.embed_tokens.num_embeddings, (3, 7), generator=gen)
    prev[:, 0] = 2  # eos starts the decoder input
    lengths = torch.full((3,), 9, dtype=torch.long)
    student.eval(), plain.eval()
    with torch.no_grad():
        a, _ = student(src, lengths, prev)
        b, _ = plain(src, lengths, prev)
    return (a.float() - b.float()).abs().max().item()


def export(path: str, out: str, atol: float = 1e-5) -> dict:
    """Write ``path``'s student as a stock checkpoint at ``out``; returns a summary."""
    import torch

    import user_dir  # noqa: F401  (the plug-in's models, to read the student)
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY

    from user_dir.common.counting import count_parameters

    if not os.path.isfile(path):
        raise ExportError(f"STUDENT {path}: no such checkpoint")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state.get("cfg")
    if cfg is None:
        raise ExportError(f"{path}: a checkpoint without cfg (fairseq < 0.10); load and re-save it with fairseq 0.12")
    args = _model_args(cfg)
    arch = args.get("arch") or args.get("_name")
    task_name = (cfg["task"] or {}).get("_name") if cfg.get("task") is not None else None
    if task_name in REFUSED_TASKS:
        raise ExportError(f"{path}: task {task_name}: {REFUSED_TASKS[task_name]}")
    if arch not in ARCH_MODEL_NAME_REGISTRY:
        raise ExportError(f"{path}: arch {arch!r} is not registered in fairseq or the plug-in")
    model_name = ARCH_MODEL_NAME_REGISTRY[arch]
    if model_name in REFUSED_MODELS:
        raise ExportError(f"{path}: model {model_name} (--arch {arch}) cannot be exported: {REFUSED_MODELS[model_name]}")
    plugin_model = _from_plugin(ARCH_MODEL_REGISTRY[arch])
    if plugin_model and model_name not in MATERIALISED_MODELS:
        raise ExportError(f"{path}: model {model_name} (--arch {arch}) is defined by the plug-in and fc-export knows "
                          f"no stock fairseq equivalent of it (exportable: {', '.join(MATERIALISED_MODELS)} and "
                          "stock transformer students)")
    if not plugin_model and model_name != "transformer":
        raise ExportError(f"{path}: model {model_name} (--arch {arch}): fc-export writes translation students of "
                          "stock fairseq's `transformer`; this checkpoint is another model and needs no export")
    if task_name is not None and task_name != "translation":
        from fairseq.tasks import TASK_REGISTRY

        if task_name not in TASK_REGISTRY or not _from_plugin(TASK_REGISTRY[task_name]):
            raise ExportError(f"{path}: task {task_name}: fc-export writes translation checkpoints")

    stock_arch = STOCK_ARCH.get(arch, "transformer") if plugin_model else arch
    plain_cfg, dropped = stock_cfg(_cfg_as_dict(cfg), args, stock_arch)

    dictionaries = _Dictionaries(state, cfg["task"])
    student = _build(args, dictionaries)
    student.load_state_dict(state["model"], strict=True)
    plain = _build(plain_cfg["model"], dictionaries)
    plain.load_state_dict(student.state_dict(), strict=True)  # every logical layer's name, its own tensors
    diff = _check_same_function(student, plain, dictionaries.source_dictionary.__len__())
    if not diff <= atol:
        raise ExportError(f"{path}: the stock model's output differs from the student's by {diff:.3g} (> {atol}): "
                          "the student computes something the stock layers do not; nothing written")

    references = plugin_references(plain_cfg)
    if references:
        raise ExportError(f"internal: the rewritten cfg still names the plug-in: {references}")
    last = state["optimizer_history"][-1] if state.get("optimizer_history") else {}
    exported = {
        "args": None,
        "cfg": plain_cfg,
        "model": dict(plain.state_dict()),
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                               "optimizer_name": str(last.get("optimizer_name", "FairseqAdam")),
                               "lr_scheduler_state": {"best": None}, "num_updates": int(last.get("num_updates", 0))}],
        "extra_state": {"train_iterator": {"epoch": int(_plain(
            (state.get("extra_state") or {}).get("train_iterator", {}).get("epoch", 1))), "iterations_in_epoch": 0}},
        "task_state": {},
    }
    bad = _non_plain(exported)
    if bad:
        raise ExportError(f"internal: values a weights-only load refuses: {bad[:5]}")
    os.makedirs(os.path.dirname(os.path.abspath(out)) or ".", exist_ok=True)
    torch.save(exported, out)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(out)
    if unsafe:
        raise ExportError(f"internal: {out} pickles globals outside torch's default allow-list: {unsafe}")
    return {"student": path, "out": out, "model": model_name, "arch": arch, "stock_arch": stock_arch,
            "materialised": plugin_model, "dropped_options": dropped, "max_abs_diff": diff,
            "params_student": count_parameters(student).total, "params_export": count_parameters(plain).total,
            "non_embedding_student": count_parameters(student).non_embedding,
            "non_embedding_export": count_parameters(plain).non_embedding,
            "bytes_student": os.path.getsize(path), "bytes_export": os.path.getsize(out)}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fc-export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("student", help="the trained student's fairseq checkpoint (PET or a stock transformer student)")
    p.add_argument("--out", required=True, help="where to write the stock fairseq checkpoint")
    p.add_argument("--atol", type=float, default=1e-5,
                   help="largest output difference between student and export accepted on the check (default 1e-5)")
    return p


def main(argv=None) -> dict:
    args = get_parser().parse_args(argv)
    try:
        summary = export(args.student, args.out, atol=args.atol)
    except ExportError as e:
        raise SystemExit(f"fc-export: {e}")
    what = "materialised" if summary["materialised"] else "passed through"
    print(f"fc-export: {summary['arch']} -> {summary['stock_arch']} ({what}); parameters "
          f"{summary['params_student']:,} -> {summary['params_export']:,} (non-embedding "
          f"{summary['non_embedding_student']:,} -> {summary['non_embedding_export']:,}); file "
          f"{summary['bytes_student'] / 2**20:.1f} MB -> {summary['bytes_export'] / 2**20:.1f} MB; outputs agree to "
          f"{summary['max_abs_diff']:.1e}; plug-in options dropped: {', '.join(summary['dropped_options']) or 'none'}; "
          f"written {summary['out']}", file=sys.stderr)
    return summary


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
