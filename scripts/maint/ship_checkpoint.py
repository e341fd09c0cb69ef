"""Make a small, shippable copy of a fairseq translation checkpoint that stock fairseq loads as it is.

What is kept: the model's state dict (floating tensors in ``--dtype``, float16 by default: half the bytes; fairseq's
``load_state_dict`` copies them into the float32 model it builds, so they are cast back to float32 at load), and ``cfg``
(the architecture and task settings fairseq needs to rebuild the model). What is dropped: the optimizer state, the
meters and the training-iterator state.

Two details let ``fairseq-generate --path`` / ``fairseq-interactive --path`` open the copy with torch >= 2.6's default
``weights_only=True`` loading, without ``--user-dir`` and without any environment switch:
* old-style checkpoints keep the model's settings in ``cfg["model"]`` as an ``argparse.Namespace`` (a pickled global
  torch refuses); it is written as a plain dict, which fairseq's ``build_model`` accepts the same way (``_name`` names
  the architecture);
* fairseq's ``checkpoint_utils._upgrade_state_dict`` reads ``optimizer_history[-1]`` and ``extra_state``: both are kept
  as one-line records of plain values (no optimizer state).

    python scripts/maint/ship_checkpoint.py ../shared/teachers/multi30k.de-en/teacher.pt \\
        checkpoints/multi30k.de-en/teacher.pt --dtype float16 --slice-json checkpoints/multi30k.de-en/slice_bleu.json

A plug-in model (a PET student, ``--arch pet_transformer_iwslt``) is shipped the same way, except that its
``cfg["model"]`` stays the ``argparse.Namespace`` fairseq wrote: fairseq rebuilds a legacy model's extra options (PET's
``--layer-pairing`` ...) only from a Namespace (``TransformerConfig.from_namespace`` drops unknown keys of a dict), and
the ``--user-dir user_dir`` such a model needs anyway allow-lists Namespace for torch's weights-only loading. The copy
names no path of the machine that trained it (``common.user_dir`` and the KD criterion's ``teacher_path`` are cleared).

``--slice-json`` also scores the input and the copy with stock ``fairseq-generate`` (no ``--user-dir``) on the first
``--slice-lines`` sentences of Multi30k's test_2016_flickr, prepared with the copy's own BPE codes and dictionary
(``DIR/code``, ``DIR/dict.*.txt``), and writes both BLEU scores: the number the test suite holds the shipped file to
(tests/test_demo.py)."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
from record import ROOT, sha256_of  # noqa: E402  (one definition of the checkout and of a file's SHA-256)

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def plain(value):
    """``value`` with every Namespace turned into a dict, recursively (torch's weights-only loader allows dicts)."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def cast_shared(tensors: dict, dtype: torch.dtype) -> dict:
    """Cast floating tensors to ``dtype``, keeping tied weights (one storage under several names,
    e.g. shared embeddings and output projection) one tensor, so they are stored once."""
    out, seen = {}, {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key not in seen:
            seen[key] = t.to(dtype) if t.is_floating_point() else t
        out[name] = seen[key]
    return out


def is_plugin_model(cfg: dict) -> bool:
    """Whether the checkpoint's architecture is one the plug-in registers (it then loads with --user-dir)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from fairseq.models import ARCH_MODEL_REGISTRY

    from user_dir.deploy.export import _from_plugin  # (importing user_dir registers the plug-in's architectures)

    model = cfg.get("model") or {}
    arch = model.get("_name") or model.get("arch")
    return arch in ARCH_MODEL_REGISTRY and _from_plugin(ARCH_MODEL_REGISTRY[arch])


def shrink(state: dict, dtype: torch.dtype, plugin: bool) -> dict:
    if state.get("cfg") is None:
        raise SystemExit("error: the checkpoint has no cfg (a pre-hydra fairseq checkpoint): load and re-save it "
                         "with fairseq >= 0.10 first")
    history = (state.get("optimizer_history") or [{}])[-1]
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    model_args = state["cfg"].get("model")
    cfg = plain(state["cfg"])
    if isinstance(model_args, argparse.Namespace) and plugin:
        cfg["model"] = model_args  # see the docstring: a plug-in model's options survive only as a Namespace
    # no path of the training machine in a shipped file (a plug-in model is loaded with the user's --user-dir)
    if isinstance(cfg.get("common"), dict):
        cfg["common"]["user_dir"] = None
    if isinstance(cfg.get("criterion"), dict) and "teacher_path" in cfg["criterion"]:
        cfg["criterion"]["teacher_path"] = None
    return {
        "args": None, "cfg": cfg, "model": cast_shared(state["model"], dtype),
        "optimizer_history": [{"criterion_name": history.get("criterion_name", "CrossEntropyCriterion"),
                               "optimizer_name": history.get("optimizer_name", "FairseqAdam"),
                               "lr_scheduler_state": {}, "num_updates": int(history.get("num_updates", 0))}],
        "extra_state": {"train_iterator": {"epoch": int(iterator.get("epoch", 0)), "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }


MULTI30K_TEST = os.path.join(ROOT, "preprocess", "data", "multi30k.de-en", "test_2016_flickr")


def slice_bleu(checkpoint: str, lines: int, workdir: str, vocab_dir: str = None, plugin: bool = False,
               src: str = "de", tgt: str = "en") -> float:
    """Tokenised BLEU4 of stock ``fairseq-generate`` (beam 5; no --user-dir unless ``plugin``, which an
    unconverted checkpoint needs for its loading fix under torch >= 2.6) on the first ``lines`` test
    pairs, with the BPE codes and dictionary in ``vocab_dir`` (default: beside ``checkpoint``)."""
    import gzip

    folder = vocab_dir or os.path.dirname(os.path.abspath(checkpoint))
    data = os.path.join(workdir, f"slice{lines}")
    if not os.path.isdir(data):
        for lang in (src, tgt):
            with gzip.open(f"{MULTI30K_TEST}.{lang}.gz", "rt", encoding="utf-8") as f:
                head = [next(f) for _ in range(lines)]
            with open(os.path.join(workdir, f"slice.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(head)
        prefix = os.path.join(workdir, "slice")
        subprocess.run([sys.executable, "-m", "preprocess.prepare_parallel", "--train-prefix", prefix,
                        "--valid-prefix", prefix, "--test-prefix", prefix, "-s", src, "-t", tgt, "--lowercase",
                        "--bpe-codes", os.path.join(folder, "code"), "--srcdict", os.path.join(folder, f"dict.{src}.txt"),
                        "--workers", "1", "--dest", data], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}  # a user's shell
    out = subprocess.run([sys.executable, "-m", "fairseq_cli.generate", data, "--path", checkpoint, "--beam", "5",
                          "--batch-size", "128", "--remove-bpe", "--gen-subset", "test", "--cpu", "--quiet"]
                         + (["--user-dir", os.path.join(ROOT, "user_dir")] if plugin else []),
                         capture_output=True, text=True, env=env)
    match = re.search(r"BLEU4 = ([0-9.]+)", out.stdout + out.stderr)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"fairseq-generate --path {checkpoint} failed:\n{out.stderr[-3000:]}")
    return float(match.group(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a fairseq checkpoint (trusted: it is unpickled in full)")
    p.add_argument("out", help="where the small copy goes")
    p.add_argument("--dtype", default="float16", choices=sorted(DTYPES),
                   help="on-disk precision of floating tensors (default: float16; fairseq casts back at load)")
    p.add_argument("--slice-json", default=None,
                   help="also write the BLEU of input and copy on a test slice here (Multi30k DE->EN teachers)")
    p.add_argument("--slice-lines", type=int, default=200, help="test sentences in that slice (default: 200)")
    args = p.parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        raise SystemExit(f"error: {args.checkpoint}: no such file")
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    plugin = state.get("cfg") is not None and is_plugin_model(plain(state["cfg"]))
    small = shrink(state, DTYPES[args.dtype], plugin)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    torch.save(small, args.out)
    torch.load(args.out, map_location="cpu", weights_only=True)  # fails here, not at the user's, if a global slipped in
    print(f"{args.out}: {os.path.getsize(args.out) / 1e6:.1f} MB ({args.dtype}), sha256 {sha256_of(args.out)}",
          file=sys.stderr)
    if args.slice_json:
        with tempfile.TemporaryDirectory() as tmp:
            vocab = os.path.dirname(os.path.abspath(args.out))  # the copy's codes and dictionaries, for both
            scores = {"input_bleu": slice_bleu(args.checkpoint, args.slice_lines, tmp, vocab, plugin=True),
                      "shipped_bleu": slice_bleu(args.out, args.slice_lines, tmp, vocab, plugin=plugin)}
        record = {"slice": f"first {args.slice_lines} sentences of test_2016_flickr", "beam": 5, **scores,
                  "input": os.path.basename(args.checkpoint), "dtype": args.dtype, "sha256": sha256_of(args.out),
                  "needs_user_dir": plugin,
                  "command": "python scripts/maint/ship_checkpoint.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        with open(args.slice_json, "w") as f:
            json.dump(record, f, indent=1)
        print(json.dumps(record, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
