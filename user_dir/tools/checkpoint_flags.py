"""``fc-flags CHECKPOINT``: the fairseq-train flags that rebuild a checkpoint's architecture, on one line.

fairseq-train builds the model it trains from its command line, never from the checkpoint it starts
from (``--finetune-from-model`` / ``--restore-file`` load weights into the model the flags built), so
a tool that writes an initial checkpoint, or a recipe that trains a plugin on a frozen backbone, needs
that checkpoint's architecture flags. This is the one way to get them::

    fairseq-train DATA --user-dir user_dir $(fc-flags ghost/init.pt) --finetune-from-model ghost/init.pt ...
    fairseq-train DATA --user-dir user_dir --task variator_translation --variator-backbone teacher.pt \\
        $(fc-flags teacher.pt) ...
    fc-flags --task glue_teacher.pt     # the task flags instead: --task sentence_prediction --num-classes 2 ...

The flags are ``--arch`` plus every model option whose value differs from that architecture's default
(user_dir/common/model_flags.py), computed from the configuration stored in the checkpoint, then parsed
back with fairseq's own training parser and compared with it field by field: a configuration the flags
cannot rebuild (a switch that is on by default and off here) stops the command, naming the field.
Left out, because they do not change which parameters a model has or what it computes in evaluation
and a recipe sets its own: the dropout and layerdrop rates, quant-noise, activation checkpointing and
FSDP wrapping (``REGULARISATION``; ``--with-regularisation`` keeps them).

Also read, for the side files tools wrote before this command existed (they still write them):
ghost_prune's ``init.pt.flags``, apc_init's ``init.json`` (``fairseq_flags``), import_hf_bert's
``import.json`` or its output folder. Their flags are parsed and printed in the same form, so
``fc-flags init.pt`` and ``fc-flags init.pt.flags`` print the same line (tests/test_checkpoint_flags.py).
"""
import argparse
import json
import os
import shlex
import sys
import tempfile
from typing import List

# model options that shape training, not the model a checkpoint holds (see the module docstring)
REGULARISATION = {"dropout", "attention_dropout", "activation_dropout", "relu_dropout", "pooler_dropout",
                  "encoder_layerdrop", "decoder_layerdrop", "quant_noise_pq", "quant_noise_pq_block_size",
                  "quant_noise_scalar", "checkpoint_activations", "offload_activations", "min_params_to_wrap"}
SIDE_FILES = (".flags", ".json")
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FlagsError(Exception):
    pass


def model_args_of(state: dict, path: str) -> argparse.Namespace:
    """The stored model configuration of a loaded checkpoint as a Namespace with ``arch`` (a Namespace
    for fairseq-train's checkpoints, a plain dict in shipped/exported ones, a DictConfig after loading)."""
    from omegaconf import OmegaConf
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if isinstance(cfg, dict) or OmegaConf.is_config(cfg) else None
    if model is None and state.get("args") is not None:
        model = state["args"]
    if model is None:
        raise FlagsError(f"{path}: no model configuration (cfg['model'] or args) in the checkpoint")
    if OmegaConf.is_config(model):
        model = OmegaConf.to_container(model, resolve=True)
    values = dict(model) if isinstance(model, dict) else dict(vars(model))
    values["arch"] = values.get("arch") or values.get("_name")
    return argparse.Namespace(**values)


def model_option_dests(arch: str) -> List[str]:
    from fairseq.models import ARCH_MODEL_REGISTRY
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    return [a.dest for a in parser._actions if a.option_strings]


def parse_flags(flags: List[str]) -> argparse.Namespace:
    """What fairseq-train makes of ``flags`` (its own parser, with this plug-in)."""
    from fairseq import options
    with tempfile.TemporaryDirectory() as data:  # parsing never reads the data folder
        return options.parse_args_and_arch(options.get_training_parser(), [data, "--user-dir", USER_DIR, *flags])


def _same(a, b) -> bool:
    return a == b or str(a) == str(b)


def flags_of_args(model_args: argparse.Namespace, where: str, with_regularisation: bool = False) -> List[str]:
    """The architecture flags of ``model_args``, checked to rebuild it under fairseq-train's parser."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from user_dir.common.model_flags import architecture_flags
    arch = getattr(model_args, "arch", None)
    if arch not in ARCH_MODEL_REGISTRY:
        raise FlagsError(f"{where}: architecture {arch!r} is not a registered --arch (with --user-dir user_dir)")
    shown = argparse.Namespace(**vars(model_args))
    for dest in () if with_regularisation else REGULARISATION:
        setattr(shown, dest, None)  # architecture_flags leaves unset options out
    flags = architecture_flags(shown)
    rebuilt = parse_flags(flags)
    wrong = [d for d in model_option_dests(arch) if d not in REGULARISATION and getattr(model_args, d, None) is not None
             and not _same(getattr(model_args, d), getattr(rebuilt, d, None))]
    if wrong:
        raise FlagsError(f"{where}: no flags rebuild {', '.join(f'{d}={getattr(model_args, d)!r}' for d in wrong)} "
                         f"(fairseq-train would build {', '.join(f'{d}={getattr(rebuilt, d, None)!r}' for d in wrong)})")
    return flags


def side_file_flags(path: str) -> List[str]:
    """The flags a tool wrote beside its output: ``*.flags`` (ghost_prune), ``*.json`` with
    ``fairseq_flags`` (apc_init's init.json, import_hf_bert's import.json), or import_hf_bert's folder."""
    if os.path.isdir(path):
        path = os.path.join(path, "import.json")
        if not os.path.isfile(path):
            raise FlagsError(f"{os.path.dirname(path)}: a folder without import.json (import_hf_bert's output); "
                             "give a checkpoint")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".flags"):
            return shlex.split(f.read())
        try:
            flags = json.load(f).get("fairseq_flags")
        except (json.JSONDecodeError, AttributeError) as e:
            raise FlagsError(f"{path}: not a tool's JSON report ({e})")
    if not isinstance(flags, list) or not flags:
        raise FlagsError(f"{path}: no 'fairseq_flags' list (apc_init's init.json or import_hf_bert's import.json)")
    return [str(x) for x in flags]


def load_state(path: str) -> dict:
    import user_dir  # noqa: F401  registers the plug-in's models and allow-lists fairseq checkpoints
    from fairseq import checkpoint_utils
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # a torch/pickle error of a file that is no checkpoint
        raise FlagsError(f"{path}: not a fairseq checkpoint ({type(e).__name__}: {e})")


def checkpoint_flags(path: str, with_regularisation: bool = False) -> List[str]:
    """The architecture flags of a checkpoint or of a tool's side file (see the module docstring)."""
    import user_dir  # noqa: F401
    if not os.path.exists(path):
        raise FlagsError(f"{path}: no such file or folder")
    if os.path.isdir(path) or path.endswith(SIDE_FILES):
        model_args = parse_flags(side_file_flags(path))
    else:
        model_args = model_args_of(load_state(path), path)
    return flags_of_args(model_args, path, with_regularisation)


def task_flags(path: str) -> List[str]:
    """The task flags a checkpoint was trained with: for a sentence task the options that shape its data
    (user_dir/common/task_flags.py), for translation the task and its language pair."""
    from omegaconf import OmegaConf

    from user_dir.common.task_flags import sentence_prediction_flags
    if not os.path.isfile(path) or path.endswith(SIDE_FILES):
        raise FlagsError(f"{path}: --task reads a checkpoint (the side files hold no task)")
    task = (load_state(path).get("cfg") or {}).get("task")
    if task is None:
        raise FlagsError(f"{path}: no task configuration (cfg['task']) in the checkpoint")
    task = OmegaConf.to_container(task, resolve=True) if OmegaConf.is_config(task) else dict(
        task if isinstance(task, dict) else vars(task))
    name = task.get("_name") or task.get("task")
    if task.get("num_classes") is not None:
        flags = sentence_prediction_flags(task)
        flags[1] = name
        return flags
    flags = ["--task", name]
    for key, option in (("source_lang", "--source-lang"), ("target_lang", "--target-lang")):
        if task.get(key):
            flags += [option, task[key]]
    return flags


def main(argv=None):
    p = argparse.ArgumentParser(prog="fc-flags", description=__doc__.split("\n\n")[0],
                                epilog="See the module docstring (python -m user_dir.tools.checkpoint_flags) and "
                                       "user_dir/tools/README.md.")
    p.add_argument("checkpoint", help="a fairseq checkpoint, or a tool's side file: init.pt.flags (ghost_prune), "
                                      "init.json (apc_init), import.json or its folder (import_hf_bert)")
    p.add_argument("--task", action="store_true",
                   help="print the checkpoint's task flags instead (sentence tasks: --task, --num-classes, "
                        "--init-token, separator, shortening, regression; translation: --task and the language pair)")
    p.add_argument("--with-regularisation", action="store_true",
                   help="keep the stored dropout, layerdrop, quant-noise and activation-checkpointing options")
    p.add_argument("--lines", action="store_true",
                   help="one flag or value per line (for bash's mapfile -t), e.g. when a value holds a space")
    args = p.parse_args(argv)
    try:
        flags = task_flags(args.checkpoint) if args.task else checkpoint_flags(args.checkpoint, args.with_regularisation)
    except FlagsError as e:
        raise SystemExit(f"fc-flags: {e}")
    if args.lines:
        print("\n".join(flags))
        return
    spaced = [f for f in flags if f != shlex.quote(f)]
    if spaced:
        raise SystemExit(f"fc-flags: {args.checkpoint}: {spaced} would not survive $(fc-flags ...)'s word splitting; "
                         "use --lines with mapfile -t")
    print(" ".join(flags))


def cli_main():
    main()


if __name__ == "__main__":
    cli_main()
