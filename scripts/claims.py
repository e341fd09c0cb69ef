#!/usr/bin/env python
"""results/claims.md: one row per central claim of each paper, as measured here.

    python scripts/claims.py                              # -> work/results/claims.md (reads results/claims/*.json)
    python scripts/claims.py --out results/claims.md      # the committed table

Each claim names the benchmark table (a driver's JSON, written with ``--seeds``) that holds its paired
comparison (``benchlib.bleu_comparison`` / ``glue_comparison``: A - B over (seed, example) units, its
95% interval and p) and the threshold the paper's claim sets on A - B: "A beats B" is A - B > 0, "a
drop under 2 points" is A - B > -2. The verdict is mechanical:

* **reproduced**: the whole 95% interval of A - B is on the claim's side of the threshold and p < 0.05
  where the threshold is 0 (a plain "A beats B");
* **not reproduced**: the whole interval is on the other side;
* **inconclusive at this budget**: the interval straddles the threshold;

and a claim whose comparison has fewer than 3 seeds is "inconclusive (N seed(s))" whatever its interval.
A claim whose table has not been measured yet says so, with the command that measures it.
"""
import argparse
import json
import os
import re
import sys

from benchlib import ROOT, default_out, invocation, write_text

# (method, claim, the paper's evidence, where our comparison lives, a regular expression matching the label the
#  driver gives it there, threshold on A - B, the command that measures it). Labels are matched case-insensitively.
GHOST_MT = ("python scripts/bench_ghost.py --widths 1/4 --variants pruned,ghost,ghost-zero-init --seeds 1,2,3 "
            "--out results/claims/ghostbert_mt")

APC_MT = ("python scripts/bench_apc.py --parts sizes word-kd --sizes 128 --updates 300 --kd-updates 300 --seeds 1,2,3 "
          "--work work/claims/apc-mt --out results/claims/apc_mt")


def ghost_glue(task, glue_work):
    name = task.lower().replace('-', '')
    return (f"python scripts/bench_ghost.py --glue-task {task} --glue-work {glue_work} --widths 3/12 --variants "
            f"pruned,ghost --seeds 1,2,3 --work work/claims/ghost-{name} --out results/claims/ghostbert_{name}")


def variator_k4(where, updates, name, parts, work=""):
    """Variator's claim (k = 4 plugins lose under 2 points) measured on ``where`` by bench_variator ``parts``."""
    return dict(method="Variator", claim=f"k = 4 plugins on the FFNs lose under 2 points ({where})",
                paper="Variator Table 1 (T5-base, k = 4): 53% of FLOPs saved, average drop < 2 points",
                budget=f"{updates}, frozen teacher, CPU", json=f"results/claims/{name}.json",
                label=r"^k=4 vs the teacher", threshold=-2.0,
                command=f"python scripts/bench_variator.py {parts} --ratios 4 --no-ablations --seeds 1,2,3 "
                        f"{work}--out results/claims/{name}")


CLAIMS = [
    dict(method="PET", claim="the shared-layer student (warm-up + KD) beats a word-KD student of the same size",
         paper="PET Table 7 (IWSLT'14 DE->EN): PET 34.36 BLEU at 9.51% of the teacher, above the KD baselines",
         budget="800 updates per student (PET: 200 warm-up + 600 KD), CPU",
         json="results/claims/pet_vs_wordkd.json", label=r"^pet vs word-kd$", threshold=0.0,
         command="python scripts/bench_translation.py --methods pet word-kd --seeds 1,2,3 --jobs 2 --threads 1 "
                 "--out results/claims/pet_vs_wordkd"),
    variator_k4("translation encoder", "400 updates per plugin", "variator_mt", "--parts translation"),
    dict(method="GhostBERT", claim="ghost modules beat pruned-only at m = 1/4 (translation encoder, 4 heads)",
         paper="GhostBERT Tables 1/10 (BERT-base, m = 3/12): MRPC 86.5 vs 85.1, RTE 72.9 vs 68.6",
         budget="200 distillation + 60 fine-tuning updates per variant, CPU",
         json="results/claims/ghostbert_mt.json", label=r"^GhostBERT vs pruned only", threshold=0.0, command=GHOST_MT),
    dict(method="GhostBERT", claim="ghost modules with --ghost-zero-init beat pruned-only at m = 1/4 (translation)",
         paper="(ours: the paper does not say how ghost modules start)",
         budget="200 distillation + 60 fine-tuning updates per variant, CPU",
         json="results/claims/ghostbert_mt.json", label=r"starting at zero.* vs pruned only", threshold=0.0,
         command=GHOST_MT),
    variator_k4("GLUE: SST-2", "200 pre-training + 800 adaptation updates per plugin", "variator_glue",
                "--parts glue --tasks SST-2", "--work work/claims/variator-glue "),
    dict(method="GhostBERT", claim="ghost modules beat pruned-only at m = 3/12 on MRPC",
         paper="GhostBERT Tables 1/10 (BERT-base, m = 3/12): MRPC 86.5 vs 85.1",
         budget="240 distillation + 240 fine-tuning updates per variant, CPU",
         json="results/claims/ghostbert_mrpc.json", label=r"^GhostBERT vs pruned only", threshold=0.0,
         command=ghost_glue("MRPC", "work/deploy-glue/glue")),
    dict(method="GhostBERT", claim="ghost modules beat pruned-only at m = 3/12 on SST-2",
         paper="GhostBERT Tables 1/10 (BERT-base, m = 3/12): SST-2 above pruned-only",
         budget="240 distillation + 240 fine-tuning updates per variant, CPU",
         json="results/claims/ghostbert_sst2.json", label=r"^GhostBERT vs pruned only", threshold=0.0,
         command=ghost_glue("SST-2", "work/glue")),
    dict(method="GhostBERT", claim="ghost modules on the unpruned encoder (m = 12/12) beat it without them, same "
                                   "training (SST-2)",
         paper="GhostBERT Table 1 / section 3.2.1 (m = 12/12): +0.9 average GLUE dev accuracy on BERT-base",
         budget="240 distillation + 240 fine-tuning updates per variant, CPU",
         json="results/claims/ghostbert_sst2_unpruned.json",
         label=r"ghost modules \(unpruned.* vs pruned only, m = 12/12", threshold=0.0,
         command="python scripts/bench_ghost.py --glue-task SST-2 --glue-work work/glue --widths 12/12 --variants "
                 "pruned,ghost --seeds 1,2,3 --work work/claims/ghost-sst2 "
                 "--out results/claims/ghostbert_sst2_unpruned"),
    dict(method="APC", claim="the APC-50-ff analogue (Finalized) beats neuron pruning of the same size (MRPC, same "
                             "updates)",
         paper="APC Tables 2-3 (BERT-base): APC-50-ff 85.3 / Finalized 83.1 vs neuron pruning 85.3 (MRPC acc)",
         budget="APC 240 compression + 240 fine-tuning updates, pruning 480, CPU",
         json="results/claims/apc_mrpc.json", label=r"Finalized vs neuron pruning", threshold=0.0,
         command="python scripts/bench_apc_glue.py --glue-task MRPC --seeds 1,2,3 --out results/claims/apc_mrpc"),
    dict(method="APC", claim="every FFN at half the parameters (1024 -> 128) beats neuron pruning + FT of the same "
                             "size (translation)",
         paper="APC Table 2 (BERT-base): APC-50-ff on par with 50% neuron-sensitivity pruning (section 5)",
         budget="300 updates per model, CPU", json="results/claims/apc_mt.json",
         label=r"^APC 128 vs pruning\+FT 128", threshold=0.0, command=APC_MT),
    dict(method="APC", claim="every FFN at half the parameters (1024 -> 128) beats a word-KD student of the same "
                             "size (translation)",
         paper="APC Table 2 (BERT-base): APC-50-ff slightly above DistilBERT on average",
         budget="300 updates per model, CPU", json="results/claims/apc_mt.json",
         label=r"^APC 128 vs word-KD student", threshold=0.0, command=APC_MT),
]


def comparisons_in(data):
    """Every paired comparison (a dict with label, diff, low, high, p) anywhere in a driver's JSON."""
    found = []
    if isinstance(data, dict):
        if {"label", "diff", "low", "high", "p"} <= data.keys():
            found.append(data)
        for v in data.values():
            found.extend(comparisons_in(v))
    elif isinstance(data, list):
        for v in data:
            found.extend(comparisons_in(v))
    return found


def commands_in(data):
    """The command lines recorded in a driver's JSON (its provenance), in order, without repeats; a driver's own
    command (``bench_command``, beside the ``command`` of the measurement it ran) first."""
    found = []
    if isinstance(data, dict):
        if isinstance(data.get("bench_command"), str):
            found.append(data["bench_command"])
        for k, v in data.items():
            if k == "command" and isinstance(v, str):
                found.append(v)
            elif k != "bench_command":
                found.extend(commands_in(v))
    elif isinstance(data, list):
        for v in data:
            found.extend(commands_in(v))
    return list(dict.fromkeys(found))


def verdict(c, threshold):
    """The mechanical verdict of the module docstring."""
    low, high = c["low"], c["high"]
    seeds = c.get("seeds", 1)
    if seeds < 3:
        return f"inconclusive ({seeds} seed{'s' if seeds != 1 else ''})"
    if low > threshold and (threshold != 0 or c["p"] < 0.05):
        return "reproduced"
    if high < threshold:
        return "not reproduced"
    return "inconclusive at this budget"


def claim_row(spec, root):
    path = os.path.join(root, spec["json"])
    if not os.path.isfile(path):
        return None, f"not measured yet: `{spec['command']}`"
    with open(path) as f:
        data = json.load(f)
    matches = [c for c in comparisons_in(data) if re.search(spec["label"], c["label"], re.I)]
    if not matches:
        return None, f"`{spec['json']}` holds no comparison labelled '{spec['label']}': `{spec['command']}`"
    commands = commands_in(data)
    # the drivers' own command lines; the tools a driver ran (fc-measure, ...) are its stages, not how to rerun it
    return matches[0], [c for c in commands if c.startswith("python scripts/")] or commands


def render(root, argv):
    lines = ["# The papers' central claims, as measured here", "",
             f"Made by `{invocation('claims.py', argv)}` from the benchmark tables named in each row. "
             "Each row is a paired comparison A vs B over (seed, test example) units "
             "(user_dir/common/significance.py: sacreBLEU's paired bootstrap for BLEU, a paired bootstrap "
             "interval and permutation test for GLUE); the verdict compares the 95% interval of A - B with the "
             "claim's threshold (scripts/claims.py's docstring). Budgets, machines and seeds are those of the "
             "named table, whose header states its selection protocol.", "",
             "| method | claim | paper | budget | comparison (A vs B) | metric | seeds | A | B | A - B [95% interval] | "
             "p | threshold on A - B | verdict | table |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    details = []
    for spec in CLAIMS:
        c, info = claim_row(spec, root)
        table = f"`{spec['json'].replace('.json', '.md')}`"
        if c is None:
            lines.append(f"| {spec['method']} | {spec['claim']} | {spec['paper']} | {spec['budget']} | "
                         f"- | - | - | - | - | - | - | - | {info} | - |")
            continue
        side = f"> {spec['threshold']:g}"
        lines.append(f"| {spec['method']} | {spec['claim']} | {spec['paper']} | {spec['budget']} | {c['label']} | "
                     f"{c.get('metric', '')} | "
                     f"{c.get('seeds', 1)} | {c['a']:.2f} | {c['b']:.2f} | {c['diff']:+.2f} [{c['low']:+.2f}, "
                     f"{c['high']:+.2f}] | {c['p']:.3g} | {side} | {verdict(c, spec['threshold'])} | "
                     f"{table} |")
        details.append(f"- {spec['method']}, {spec['claim']}: " + "; ".join(f"`{cmd}`" for cmd in info))
    if details:
        lines += ["", "Commands behind the measured rows:", "", *details]
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="the table (default work/results/claims.md; committed: results/claims.md)")
    p.add_argument("--root", default=ROOT, help="where the claims' JSON paths are read from (default: the repository)")
    args = p.parse_args(argv)
    out = args.out or default_out("claims") + ".md"
    write_text(out, render(args.root, argv))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
