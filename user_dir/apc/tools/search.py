"""Search APC's per-layer compression sizes with Optuna's TPE sampler (APC paper, section 4.1: layers
grouped by their importance, Figure 3; "we search compression dimensions for a total compression rate
of 90% / 50% / 15%"; every candidate trained 100 steps and scored on the pre-training tasks, Table 4).

    python -m user_dir.apc.tools.search TEACHER.pt --data DATA-BIN --encoder-groups 0-2 --decoder-groups 0-2 \\
        --target 0.5 --trials 20 --updates 100 --out apc-search/
    python -m user_dir.apc.tools.search work/glue/RTE/checkpoints/checkpoint_best.pt \\
        --data work/glue/data-bin/RTE.wordpiece --encoder-groups 0,1-5 --attention --target 0.5 --out apc-rte-search/

Each group of layers (``--encoder-groups`` / ``--decoder-groups``: comma-separated layer ranges, 0-based)
gets one FFN width from ``--ffn-choices``, with ``--attention`` one attention width from
``--attn-choices`` (a decoder group's self- and encoder-decoder attention share it) and with ``--embedding``
one block width from ``--embed-choices`` (embedding compression; consecutive layers of one width form a
run with one pre- and one post-scaling). A sampled
candidate whose layer parameters are not within ``--tolerance`` of ``--target`` times the teacher's is
pruned without training (its size is a closed form, :func:`layer_parameters`). A feasible one is
initialised (``apc_init``, ``--init``), trained ``--updates`` updates with stock ``fairseq-train`` in the
default 'Compr. only' mode (Adam, lr 1e-4 with linear decay, the paper's compression setting, and the
task's own loss: label-smoothed CE with smoothing 0 for translation, the GLUE criterion for sentence
tasks; ``--train-args`` adds or overrides training flags) and scored by ``fairseq-validate``'s valid loss, which
the study minimises (the paper maximised MLM/NSP accuracy; a loss exists for every task).

The study lives in ``OUT/study.db`` (SQLite): an interrupted search resumes where it stopped, and a
finished trial is never retrained (its folder holds a DONE file and its score). ``OUT/search.md`` lists
every trial and the best sizes as ``apc_init`` flags.

Choices the paper leaves open, and ours: the objective is the validation loss after the updates; the
size constraint is on the parameters of the layer stacks (what APC compresses; embeddings excluded),
enforced by pruning infeasible samples (TPE then samples elsewhere); choices default to multiples of
1/16 of the FFN width and of 1/8 of the embedding width (a multiple of the heads).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Dict, List

from user_dir.apc.embedding_compression import runs_of
from user_dir.common.task_flags import sentence_prediction_flags

SIDES = ("encoder", "decoder")


def parse_groups(spec: str, layers: int, flag: str) -> List[List[int]]:
    """``"0-2,3,4-5"`` -> ``[[0, 1, 2], [3], [4, 5]]``; every layer at most once, in range."""
    if not spec:
        return []
    groups, seen = [], set()
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if not m:
            raise SystemExit(f"apc_search: {flag} {spec!r}: expected comma-separated layer ranges such as 0-2,3-5")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo > hi or hi >= layers:
            raise SystemExit(f"apc_search: {flag} {spec!r}: the range {item.strip()} is not within the model's "
                             f"{layers} layers (0..{layers - 1})")
        group = list(range(lo, hi + 1))
        if seen & set(group):
            raise SystemExit(f"apc_search: {flag} {spec!r}: a layer is in two groups")
        seen |= set(group)
        groups.append(group)
    return groups


def layer_parameters(dims: dict, model_args, stack_params: int) -> int:
    """Parameters of the layer stacks once the sizes ``dims`` are finalized: the teacher's ``stack_params``
    minus its layers' closed form, plus each layer's at its sizes (:func:`finalized_layer_parameters`)."""
    total = stack_params
    for side in SIDES:
        sizes = {key: dims.get(f"{side}_{key}", {}) for key in ("ffn", "attn", "embed")}
        runs = runs_of(sizes["embed"])
        ends = {run[0] for run in runs}, {run[-1] for run in runs}
        for i in {i for v in sizes.values() for i in v}:
            total -= finalized_layer_parameters(model_args, side)
            total += finalized_layer_parameters(model_args, side, sizes["ffn"].get(i), sizes["attn"].get(i),
                                                sizes["embed"].get(i), i in ends[0], i in ends[1])
    return total


def finalized_layer_parameters(model_args, side: str, c=None, a=None, e=None, pre=False, post=False) -> int:
    """One finalized layer of ``side`` with FFN width ``c``, attention width ``a`` (a decoder's self- and
    encoder-decoder attention alike) and block width ``e`` (``None``: the teacher's), with ``D^PS`` before it
    (``pre``) and ``U^PS`` after it (``post``): q, k, v are ``e x a`` (+ ``a``), out ``a x e`` (+ ``e``); an
    encoder-decoder attention's k, v read the encoder output (``d_enc x a``); fc1 ``e x c`` (+ ``c``), fc2
    ``c x e`` (+ ``e``); a LayerNorm ``2e``; ``D^PS`` ``d x e + e``, ``U^PS`` ``e x d + d``."""
    d, f = getattr(model_args, f"{side}_embed_dim"), getattr(model_args, f"{side}_ffn_embed_dim")
    c, a, e = c or f, a or d, e or d
    attention = 3 * (e * a + a) + a * e + e
    total = attention + (e * c + c) + (c * e + e) + 2 * 2 * e
    if side == "decoder":
        d_enc = getattr(model_args, "encoder_embed_dim", d)
        total += (e * a + a) + 2 * (d_enc * a + a) + a * e + e + 2 * e
    return total + pre * (d * e + e) + post * (e * d + d)


def spec(sizes: Dict[int, int]) -> str:
    return ",".join(f"{i}:{n}" for i, n in sorted(sizes.items()))


def task_train_flags(state) -> List[str]:
    """The task flags and loss a teacher's own training used, for fairseq-train/-validate."""
    task = state["cfg"]["task"]
    name = task.get("_name") if hasattr(task, "get") else getattr(task, "_name", None)
    if name == "sentence_prediction":
        return sentence_prediction_flags(task) + ["--criterion", "sentence_prediction", "--batch-size", "32"]
    if name == "translation":
        return ["--task", "translation", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0",
                "--max-tokens", "2048"]
    raise SystemExit(f"apc_search: the teacher was trained with --task {name}; the search knows translation and "
                     "sentence_prediction")


def run(cmd: List[str], log: str) -> str:
    with open(log, "a") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        f.write(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"apc_search: a trial's command failed ({proc.returncode}); see {log}")
    return proc.stdout


def train_and_score(a, dims: dict, trial_dir: str, task_flags: List[str]) -> float:
    """apc_init + fairseq-train (--updates) + fairseq-validate of one candidate; its valid loss."""
    done = os.path.join(trial_dir, "DONE")
    if os.path.exists(done):
        return json.load(open(done))["valid_loss"]
    os.makedirs(trial_dir, exist_ok=True)
    log, py, init = os.path.join(trial_dir, "log.txt"), sys.executable, os.path.join(trial_dir, "init.pt")
    flags = []
    for side in SIDES:
        if dims.get(f"{side}_ffn"):
            flags += [f"--{side}-ffn-dims", spec(dims[f"{side}_ffn"])]
        if dims.get(f"{side}_attn"):
            flags += [f"--{side}-attn-dims", spec(dims[f"{side}_attn"])]
            if side == "decoder":
                flags += ["--cross-attn-dims", spec(dims[f"{side}_attn"])]
        if dims.get(f"{side}_embed"):
            flags += [f"--{side}-embed-dims", spec(dims[f"{side}_embed"])]
    if not os.path.exists(init):
        run([py, "-m", "user_dir.apc.tools.init", a.teacher, "--data", a.data, *flags, "--init", a.init,
             "--samples", str(a.samples), "--seed", str(a.seed), "--out", init], log)
    arch = json.load(open(os.path.join(trial_dir, "init.json")))["fairseq_flags"]
    save = os.path.join(trial_dir, "checkpoints")
    from user_dir import PLUGIN_DIR as user_dir
    common = [a.data, "--user-dir", user_dir, *task_flags, "--seed", str(a.seed), "--log-format", "simple",
              *(["--cpu"] if a.cpu else [])]
    run([py, "-m", "fairseq_cli.train", *common, *arch, "--finetune-from-model", init, "--optimizer", "adam",
         "--lr", str(a.lr), "--lr-scheduler", "polynomial_decay", "--total-num-update", str(a.updates),
         "--end-learning-rate", "0", "--max-update", str(a.updates), "--disable-validation", "--no-epoch-checkpoints",
         "--num-workers", "0", "--save-dir", save, *shlex.split(a.train_args)], log)
    out = run([py, "-m", "fairseq_cli.validate", *common, "--path", os.path.join(save, "checkpoint_last.pt"),
               "--valid-subset", "valid", "--num-workers", "0"], log)
    m = re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", out)
    if not m:
        raise SystemExit(f"apc_search: no valid loss in fairseq-validate's output; see {log}")
    loss = float(m[-1])
    with open(done, "w") as f:
        json.dump({"valid_loss": loss, "dims": {k: spec(v) for k, v in dims.items()}}, f)
    return loss


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("teacher", help="the trained model to compress (a fairseq transformer or hf_bert checkpoint)")
    p.add_argument("--data", required=True, help="its binarised data directory")
    p.add_argument("--encoder-groups", default="", help="encoder layer groups sharing sizes, e.g. 0-1,2-5 "
                   "(section 4.1 groups layers of similar importance); layers in no group stay uncompressed")
    p.add_argument("--decoder-groups", default="", help="decoder layer groups, as --encoder-groups")
    p.add_argument("--attention", action="store_true", help="search attention widths too (eqs 5-11)")
    p.add_argument("--ffn-choices", default=None, help="FFN widths to choose from (default: multiples of 1/16 "
                   "of the FFN width)")
    p.add_argument("--embedding", action="store_true", help="search block widths too (embedding compression, "
                   "section 3.2; the paper's searches include them, Table 4)")
    p.add_argument("--embed-choices", default=None, help="block widths to choose from (default: multiples of 1/8 "
                   "of the embedding width)")
    p.add_argument("--attn-choices", default=None, help="attention widths to choose from (default: multiples of "
                   "1/8 of the embedding width)")
    p.add_argument("--target", type=float, default=0.5, help="layer parameters as a fraction of the teacher's "
                   "(paper: 0.9, 0.5, 0.15 compression; default 0.5)")
    p.add_argument("--tolerance", type=float, default=0.02, help="allowed deviation from --target (default 0.02)")
    p.add_argument("--trials", type=int, default=20, help="trained candidates (default 20)")
    p.add_argument("--max-samples", type=int, default=2000, help="sampled candidates at most, pruned ones included")
    p.add_argument("--updates", type=int, default=100, help="training updates per candidate (paper: 100 steps)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (paper: 1e-4, linear decay)")
    p.add_argument("--init", default="neuron-pruning", help="apc_init's --init (paper's best: neuron-pruning)")
    p.add_argument("--samples", type=int, default=5000, help="apc_init's --samples (paper: 5000)")
    p.add_argument("--train-args", default="", help="extra fairseq-train flags (after, so overriding, the defaults)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--out", required=True, help="the study's folder (study.db, one folder per trial, search.md)")
    p.add_argument("--report", default=None, help="also write the report (markdown) here, e.g. results/apc_search.md")
    a = p.parse_args(argv)
    a.command = shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        import optuna
    except ImportError:
        raise SystemExit("apc_search needs Optuna: pip install 'fairseq-compress[search]' (or pip install optuna)")
    if not os.path.isfile(a.teacher):
        p.error(f"{a.teacher}: no such checkpoint")
    if not 0 < a.target <= 1:
        p.error(f"--target {a.target}: a fraction of the teacher's layer parameters in (0, 1]")
    import user_dir  # noqa: F401  checkpoint loading
    from fairseq import checkpoint_utils
    state = checkpoint_utils.load_checkpoint_to_cpu(a.teacher)
    margs = state["cfg"]["model"]
    task_flags = task_train_flags(state)
    layers = {side: len({m.group(1) for k in state["model"]
                         for m in [re.match(rf"{side}\.(?:sentence_encoder\.)?layers\.(\d+)\.", k)] if m})
              for side in SIDES}
    groups = {side: parse_groups(getattr(a, f"{side}_groups"), layers[side], f"--{side}-groups") for side in SIDES}
    if not any(groups.values()):
        p.error("give --encoder-groups and/or --decoder-groups: nothing would be searched")
    stack_params = sum(v.numel() for k, v in state["model"].items() if re.search(r"(^|\.)layers\.\d+\.", k))

    def choices(option, full, parts):
        unit = max(1, full // parts)
        values = [int(x) for x in option.split(",")] if option else list(range(unit, full + 1, unit))
        bad = [v for v in values if not 0 < v <= full]
        if bad:
            p.error(f"choices {bad}: sizes must lie in 1..{full}")
        return values

    def sample(trial):
        dims = {}
        for side in SIDES:
            d, f = getattr(margs, f"{side}_embed_dim", 0), getattr(margs, f"{side}_ffn_embed_dim", 0)
            for g, group in enumerate(groups[side]):
                c = trial.suggest_categorical(f"{side}_ffn_{g}", choices(a.ffn_choices, f, 16))
                dims.setdefault(f"{side}_ffn", {}).update({i: c for i in group})
                if a.attention:
                    at = trial.suggest_categorical(f"{side}_attn_{g}", choices(a.attn_choices, d, 8))
                    dims.setdefault(f"{side}_attn", {}).update({i: at for i in group})
                if a.embedding:
                    e = trial.suggest_categorical(f"{side}_embed_{g}", choices(a.embed_choices, d, 8))
                    dims.setdefault(f"{side}_embed", {}).update({i: e for i in group})
        return dims

    os.makedirs(a.out, exist_ok=True)
    study = optuna.create_study(study_name="apc", storage=f"sqlite:///{os.path.abspath(a.out)}/study.db",
                                sampler=optuna.samplers.TPESampler(seed=a.seed), direction="minimize",
                                load_if_exists=True)

    def objective(trial):
        dims = sample(trial)
        ratio = layer_parameters(dims, margs, stack_params) / stack_params
        trial.set_user_attr("ratio", ratio)
        trial.set_user_attr("dims", {k: spec(v) for k, v in dims.items()})
        if abs(ratio - a.target) > a.tolerance:
            raise optuna.TrialPruned()
        name = "_".join(f"{k}{spec(v).replace(':', '-').replace(',', '_')}" for k, v in sorted(dims.items()))
        return train_and_score(a, dims, os.path.join(a.out, "trials", name), task_flags)

    def trained():
        return sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)

    while trained() < a.trials and len(study.trials) < a.max_samples:
        study.optimize(objective, n_trials=1)
    write_report(a, study, optuna)


def write_report(a, study, optuna):
    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
    from user_dir.tools.measure import machine_description
    lines = [f"# APC size search of `{a.teacher}` (Optuna TPE, APC section 4.1)", "",
             f"Command: `python -m user_dir.apc.tools.search {a.command}`. "
             f"Machine: {machine_description()}.", "",
             f"Target: layer parameters {a.target:.0%} +- {a.tolerance:.0%} of the teacher's; {len(done)} candidates "
             f"trained {a.updates} updates each (valid loss after them), {pruned} samples pruned for their size. "
             f"Seed {a.seed}.", "", "| trial | sizes | layer params / teacher | valid loss |", "| --- | --- | --- | --- |"]
    for t in done:
        sizes = "; ".join(f"{k} {v}" for k, v in t.user_attrs["dims"].items())
        lines.append(f"| {t.number} | {sizes} | {t.user_attrs['ratio']:.3f} | {t.value:.4f} |")
    if done:
        best = done[0].user_attrs["dims"]
        # encoder_ffn -> --encoder-ffn-dims, and so on
        flags = " ".join(f"--{k.replace('_', '-')}-dims {v}" for k, v in best.items())
        if "decoder_attn" in best:
            flags += f" --cross-attn-dims {best['decoder_attn']}"
        lines += ["", f"Best: `python -m user_dir.apc.tools.init {a.teacher} --data {a.data} {flags} --out init.pt`"]
    for path in [os.path.join(a.out, "search.md")] + ([a.report] if a.report else []):
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
