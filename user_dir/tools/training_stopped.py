"""Whether a fairseq-train command's run has already met its stopping rule: exit 0 (printing why) when its
``--save-dir`` holds a ``checkpoint_last.pt`` at ``--max-update``, at ``--max-epoch``, or ``--patience`` validations
past its best checkpoint; exit 1 when it has not (or has no checkpoint yet).

    python -m user_dir.tools.training_stopped fairseq-train DATA --arch ... --save-dir DIR ...

The recipes' ``stage`` (scripts/recipes/common.sh) asks it before running a fairseq-train stage again, so that a
stage killed after its last checkpoint is marked done instead of trained one update or one epoch more (fairseq-train
checks its stopping rule only after an update or a validation). The command's flags are parsed by fairseq's own
training parser, with the command's ``--user-dir``.
"""
import sys

from fairseq import options

from user_dir.common.resume_patience import stopping_state


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith("fairseq-train"):
        argv = argv[1:]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    why = stopping_state(args.save_dir, max_update=args.max_update or 0, max_epoch=args.max_epoch or 0,
                         patience=args.patience, validate_interval=args.validate_interval or 1,
                         validate_interval_updates=args.validate_interval_updates or 0)
    if why:
        print(f"{args.save_dir}: already stopped ({why})")
    return 0 if why else 1


if __name__ == "__main__":
    sys.exit(main())
