"""Layer importance of a translation Transformer or a GLUE encoder (APC paper, section 2.2, Figure 3):
layer dropping, Fisher information and weight imprinting per layer, normalised to sum to 1; a table
and a plot.

    python -m user_dir.apc.tools.layer_importance TEACHER.pt --data DATA-BIN --out results/apc_layer_importance
    python -m user_dir.apc.tools.layer_importance work/glue/RTE/checkpoints/checkpoint_best.pt \
        --data work/glue/data-bin/RTE.wordpiece --out results/apc_layer_importance_rte

Layer dropping and imprinting evaluation use ``--batches`` batches of the valid split; Fisher
information and the imprinted class means use as many training batches (user_dir/apc/layer_importance.py).
Writes OUT.md, OUT.json and OUT.png.
"""
import argparse
import itertools
import json

import torch

from user_dir.apc.activation_sampling import sample_batches
from user_dir.apc.layer_importance import fisher_information, layer_dropping, weight_imprinting
from user_dir.apc.tools.init import load_teacher
from user_dir.tools.measure import machine_description

METRICS = ("layer dropping", "Fisher information", "weight imprinting")


def importance(teacher, task, batches: int, max_tokens: int, seed: int) -> dict:
    pad = task.source_dictionary.pad()
    valid = list(itertools.islice(sample_batches(task, "valid", max_tokens, seed), batches))
    train = list(itertools.islice(sample_batches(task, "train", max_tokens, seed), batches))
    return {"layer dropping": layer_dropping(teacher, valid, pad),
            "Fisher information": fisher_information(teacher, train, pad),
            "weight imprinting": weight_imprinting(teacher, train, valid, pad)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="fairseq transformer checkpoint, or an hf_bert model fine-tuned on a sentence task")
    p.add_argument("--data", required=True, help="its binarised data directory")
    p.add_argument("--batches", type=int, default=8, help="batches per measurement (default 8)")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="output prefix (.md, .json, .png)")
    a = p.parse_args(argv)
    if a.batches <= 0:
        p.error(f"--batches {a.batches}: must be > 0")
    torch.manual_seed(a.seed)
    teacher, _, task = load_teacher(a.model, a.data)
    scores = importance(teacher, task, a.batches, a.max_tokens, a.seed)
    layers = [k for k in scores["layer dropping"]]
    lines = [f"# Layer importance of `{a.model}` (APC section 2.2, Figure 3; each column sums to 1)", "",
             f"Command: `python -m user_dir.apc.tools.layer_importance {a.model} --data {a.data} --batches {a.batches} "
             f"--seed {a.seed} --out {a.out}` (seed {a.seed}; machine: {machine_description()}).", "",
             "| layer | " + " | ".join(METRICS) + " |", "| --- " * (len(METRICS) + 1) + "|"]
    for layer in layers:
        cells = [scores[m].get(layer) for m in METRICS]
        lines.append(f"| {layer} | " + " | ".join("n/a" if c is None else f"{c:.3f}" for c in cells) + " |")
    imprinting = scores["weight imprinting"]
    side = "decoder" if "_accuracy_after_embeddings_and_each_decoder_layer" in imprinting else "encoder"
    acc = imprinting[f"_accuracy_after_embeddings_and_each_{side}_layer"]
    if acc is not None:
        lines += ["", f"Imprinted nearest-mean accuracy after the embeddings and after each {side} layer "
                  f"({'target words' if side == 'decoder' else 'the labels'} as classes): "
                  + ", ".join(f"{x:.3f}" for x in acc) + "."]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump({"batches": a.batches, "seed": a.seed, "model": a.model, "scores": scores}, f, indent=1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.27
    for k, m in enumerate(METRICS):
        ax.bar([i + (k - 1) * width for i in range(len(layers))], [scores[m].get(l) or 0.0 for l in layers], width, label=m)
    ax.set_xticks(range(len(layers)), [l.replace(".sentence_encoder", "").replace(".layers.", " ") for l in layers],
                  rotation=30)
    ax.set_ylabel("importance (sums to 1)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
