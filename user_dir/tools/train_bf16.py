"""``fc-train-bf16``: ``fairseq-train --bf16`` on a GPU (or a CPU) without a TPU.

fairseq 0.12 turns every ``--bf16`` into ``--tpu`` (``fairseq/options.py``), so its Trainer asks torch_xla for
a device and fails wherever torch_xla is not installed -- every GPU machine. This command undoes that one
implication when torch_xla is absent, then runs ``fairseq_cli.train`` unchanged: its Trainer and optimizer
have a bfloat16 path (the model and batches in bfloat16, float32 master weights, no loss scaling), which is
what ``--bf16`` means on a GPU. With torch_xla installed it is ``fairseq-train`` itself. Flags are
``fairseq-train``'s:

    fc-train-bf16 DATA --user-dir user_dir --arch ... --bf16 [fairseq-train flags]

(The stock fairseq wrapper is replaced by a thin launcher rather than a patched copy of fairseq: the only
change is the ``tpu`` field after fairseq's own parser ran.)
"""
import importlib.util
import logging
import os
import runpy
import sys


def main():
    # fairseq_cli.train's logging, set before fairseq's imports log anything (as fairseq_cli.train does)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout)
    from fairseq import options

    if importlib.util.find_spec("torch_xla") is None:
        parse_args_and_arch = options.parse_args_and_arch

        def parse_without_tpu(*args, **kwargs):
            parsed = parse_args_and_arch(*args, **kwargs)
            (parsed[0] if isinstance(parsed, tuple) else parsed).tpu = False
            return parsed

        options.parse_args_and_arch = parse_without_tpu
    runpy.run_module("fairseq_cli.train", run_name="__main__", alter_sys=True)


def cli_main():
    main()


if __name__ == "__main__":
    main()
