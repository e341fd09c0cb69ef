"""Average the parameters of several checkpoints (the papers' recipes average the last ones).

fairseq-fixed ships no ``scripts/`` folder, so fairseq's ``scripts/average_checkpoints.py`` is
missing; this is the same operation as a command of the plug-in:

    fc-average-checkpoints --inputs ckpt_dir --num-epoch-checkpoints 5 --output averaged.pt
    fc-average-checkpoints --inputs a.pt b.pt c.pt --output averaged.pt

The result keeps the newest checkpoint's configuration and drops optimizer state. Floating-point
tensors are averaged in float64 and cast back; other tensors (e.g. version buffers) must agree
across the inputs and are kept.
"""
import argparse
import collections
import os
import re
import sys
from typing import Dict, List, Optional

import torch


class AverageError(ValueError):
    pass


def last_checkpoints(folder: str, n: int, by: str = "epoch", upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest ``checkpoint{E}.pt`` (by='epoch') or ``checkpoint_{E}_{U}.pt`` (by='update') files."""
    pattern = re.compile(r"checkpoint(\d+)\.pt$" if by == "epoch" else r"checkpoint_\d+_(\d+)\.pt$")
    if not os.path.isdir(folder):
        raise AverageError(f"--inputs {folder}: no such folder")
    found = []
    for name in os.listdir(folder):
        m = pattern.match(name)
        if m and (upper_bound is None or int(m.group(1)) <= upper_bound):
            found.append((int(m.group(1)), os.path.join(folder, name)))
    if len(found) < n:
        kind = "checkpoint{EPOCH}.pt" if by == "epoch" else "checkpoint_{EPOCH}_{UPDATE}.pt"
        raise AverageError(f"--inputs {folder}: asked for {n} {kind} files, found {len(found)}")
    return [path for _, path in sorted(found, reverse=True)[:n]]


def average_checkpoints(paths: List[str]) -> Dict:
    """Load each checkpoint (weights-only, with the plug-in's allow-list) and average its model."""
    import user_dir  # noqa: F401  (the allow-list that lets torch.load read fairseq checkpoints)

    if not paths:
        raise AverageError("no checkpoints to average")
    summed: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    newest = None
    for path in paths:
        if not os.path.isfile(path):
            raise AverageError(f"{path}: no such checkpoint")
        state = torch.load(path, map_location="cpu")
        model = state["model"]
        if summed and set(model) != set(summed):
            diff = sorted(set(model) ^ set(summed))[:5]
            raise AverageError(f"{path}: its parameters differ from {paths[0]}'s (e.g. {diff}); same model needed")
        for key, tensor in model.items():
            if key not in summed:
                summed[key] = tensor.double().clone() if tensor.is_floating_point() else tensor.clone()
            elif tensor.is_floating_point():
                if tensor.shape != summed[key].shape:
                    raise AverageError(f"{path}: {key} has shape {tuple(tensor.shape)}, "
                                       f"{paths[0]} has {tuple(summed[key].shape)}")
                summed[key] += tensor.double()
            elif not torch.equal(tensor, summed[key]):
                raise AverageError(f"{path}: non-float tensor {key} differs from {paths[0]}'s")
        newest = newest or state
    dtypes = {k: v.dtype for k, v in torch.load(paths[0], map_location="cpu")["model"].items()}
    averaged = collections.OrderedDict(
        (k, (v / len(paths)).to(dtypes[k]) if v.is_floating_point() else v) for k, v in summed.items())
    out = {k: v for k, v in newest.items() if k not in ("last_optimizer_state", "model")}
    out["model"] = averaged
    return out


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one folder with --num-*-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    p.add_argument("--num-epoch-checkpoints", type=int, default=None, help="average the last N checkpoint{E}.pt")
    p.add_argument("--num-update-checkpoints", type=int, default=None, help="average the last N checkpoint_{E}_{U}.pt")
    p.add_argument("--checkpoint-upper-bound", type=int, default=None, help="ignore checkpoints after this epoch/update")
    return p


def main(argv=None) -> str:
    args = get_parser().parse_args(argv)
    if args.num_epoch_checkpoints and args.num_update_checkpoints:
        raise AverageError("give --num-epoch-checkpoints or --num-update-checkpoints, not both")
    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n:
        if len(args.inputs) != 1:
            raise AverageError("with --num-*-checkpoints, --inputs must be one folder")
        paths = last_checkpoints(args.inputs[0], n, "epoch" if args.num_epoch_checkpoints else "update",
                                 args.checkpoint_upper_bound)
    else:
        paths = args.inputs
    print("averaging:\n  " + "\n  ".join(paths), file=sys.stderr)
    state = average_checkpoints(paths)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save(state, args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return args.output


def cli_main():
    try:
        main()
    except AverageError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    cli_main()
