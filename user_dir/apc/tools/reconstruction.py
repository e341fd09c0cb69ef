"""APC's reconstruction error (eq. 4) of every initialisation on real activations (the paper's Table 5).

    python -m user_dir.apc.tools.reconstruction TEACHER.pt --data DATA-BIN --encoder-ffn-dims 256 \
        --decoder-ffn-dims 256 [--json out.json]

The teacher's activations are sampled once: ``--samples`` training positions fit the data-driven
initialisations (least-squares U), and as many validation positions measure the error; neuron
sensitivity is scored once on ``--importance-batches`` training batches. Prints one row per
initialisation: the error per compressed layer and their mean (the paper averages over layers).
"""
import argparse
import json

import torch

from user_dir.apc.activation_sampling import sample_batches
from user_dir.apc.initialisations import INITIALISATIONS
from user_dir.apc.neuron_sensitivity import neuron_sensitivity
from user_dir.apc.tools.init import (add_common_args, build_apc_model, initial_D_U, load_teacher,
                                     reconstruction_errors, sample_activations, set_D_U)


def compare_initialisations(teacher, cfg, task, encoder_ffn_dims, decoder_ffn_dims, samples, seed,
                            importance_batches, max_tokens, methods=INITIALISATIONS) -> dict:
    model, _ = build_apc_model(teacher, cfg, task, encoder_ffn_dims, decoder_ffn_dims)
    X_fit = sample_activations(teacher, task, "train", samples, seed, max_tokens)
    X_valid = sample_activations(teacher, task, "valid", samples, seed, max_tokens)
    scores = None
    if "neuron-pruning" in methods:
        scores = neuron_sensitivity(teacher, sample_batches(task, "train", max_tokens, seed),
                                    task.target_dictionary.pad(), importance_batches)
    out = {}
    for method in methods:
        set_D_U(model, initial_D_U(model, teacher, task, method, samples, seed, importance_batches, max_tokens,
                                   X=X_fit, scores=scores))
        out[method] = reconstruction_errors(model, X_valid)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--json", default=None, help="write the errors here")
    a = p.parse_args(argv)
    if not a.encoder_ffn_dims and not a.decoder_ffn_dims:
        p.error("give --encoder-ffn-dims and/or --decoder-ffn-dims")
    torch.manual_seed(a.seed)
    teacher, cfg, task = load_teacher(a.teacher, a.data)
    errors = compare_initialisations(teacher, cfg, task, a.encoder_ffn_dims, a.decoder_ffn_dims, a.samples,
                                     a.seed, a.importance_batches, a.max_tokens)
    layers = list(next(iter(errors.values())))
    print("| initialisation | " + " | ".join(layers) + " | mean |")
    print("| --- " * (len(layers) + 2) + "|")
    for method, per_layer in errors.items():
        vals = [per_layer[name] for name in layers]
        print(f"| {method} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {sum(vals) / len(vals):.3f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"samples": a.samples, "seed": a.seed, "errors": errors}, f, indent=1)


if __name__ == "__main__":
    main()
