"""Variator plugin files: export the plugins of a Variator training checkpoint, or show a file.

    python -m user_dir.variator.tools.plugins export checkpoints/k4/checkpoint_best.pt --out plugins/k4.pt
    python -m user_dir.variator.tools.plugins show plugins/k4.pt

A plugin file holds only the plugin's tensors, its configuration and the signature of the backbone
it was trained on (see user_dir/variator/plugged_encoder.py); attach it at inference with
``--task variator_translation --variator-plugins plugins/k4.pt --variator-ratio 4``.
"""
import argparse
import os
import sys

from user_dir.variator.plugged_encoder import VariatorError, read_plugin_source, write_plugin_file


def export(checkpoint: str, out: str, ratio: int = 0) -> list:
    payloads = read_plugin_source(checkpoint)
    if ratio:
        payloads = [p for p in payloads if p["config"]["ratio"] == ratio]
        if not payloads:
            raise VariatorError(f"--ratio {ratio}: {checkpoint} holds no plugin with that ratio")
    if len(payloads) > 1 and not out.endswith(os.sep) and not os.path.isdir(out):
        raise VariatorError(f"{checkpoint} holds {len(payloads)} plugins: give a directory as --out")
    written = []
    for payload in payloads:
        path = os.path.join(out, f"k{payload['config']['ratio']}.pt") if os.path.isdir(out) or out.endswith(os.sep) \
            else out
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_plugin_file(path, payload)
        written.append(path)
    return written


def describe(path: str) -> str:
    lines = []
    for p in read_plugin_source(path):
        n = sum(v.numel() for v in p["state_dict"].values())
        lines.append(f"{path}: k={p['config']['ratio']} {n:,} parameters, config {p['config']}, "
                     f"backbone {p['backbone']}")
    return "\n".join(lines)


def cli_main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write the plugins of a Variator training checkpoint as plugin files")
    ex.add_argument("checkpoint")
    ex.add_argument("--out", required=True, help="plugin file, or a directory (one k<ratio>.pt per plugin)")
    ex.add_argument("--ratio", type=int, default=0, help="only the plugin of this ratio")
    sh = sub.add_parser("show", help="describe a plugin file or the plugins of a checkpoint")
    sh.add_argument("path")
    args = parser.parse_args(argv)
    import user_dir  # noqa: F401  (fairseq checkpoints load under torch >= 2.6)
    try:
        if args.command == "export":
            for path in export(args.checkpoint, args.out, args.ratio):
                print(describe(path))
        else:
            print(describe(args.path))
    except VariatorError as e:
        sys.exit(f"variator_plugins: {e}")


if __name__ == "__main__":
    cli_main()
