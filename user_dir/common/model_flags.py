"""The command line that rebuilds a model: fairseq-train builds the model it trains from flags, so a
tool that writes an initial checkpoint (``--finetune-from-model init.pt``) must also say which flags
build that checkpoint's architecture."""
import argparse

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def architecture_flags(model_args) -> list:
    """``--arch`` and every model flag whose value differs from the architecture's default (widths,
    method settings, and for imported encoders e.g. ``--max-positions``, ``--segment-embeddings``,
    ``--classification-pooling``)."""
    arch = model_args.arch
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser)
    defaults = argparse.Namespace(arch=arch)
    ARCH_CONFIG_REGISTRY[arch](defaults)
    flags = ["--arch", arch]
    for action in parser._actions:
        value, default = getattr(model_args, action.dest, None), getattr(defaults, action.dest, None)
        if not action.option_strings or value is None or value == default:
            continue
        option = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                flags.append(option)
        elif not isinstance(action, (argparse._StoreFalseAction, argparse._StoreConstAction)):
            flags += [option, str(value)]
    return flags
