#!/usr/bin/env python
"""GhostBERT's ghost modules against pruned only (issue 35's goal: GhostBERT within 10% of pruned-only's encoder
time at every m), paired in one run on a CPU or a GPU; writes work/results/ghost_costs.md (``--out``; + .json, + .png).

    python scripts/bench/bench_ghost_costs.py --glue-task MRPC --glue-work work/deploy-glue/glue      # this CPU
    python scripts/bench/bench_ghost_costs.py --glue-work work/deploy-glue/glue --save-shapes work/ghost-shapes
    python scripts/bench/bench_ghost_costs.py --shapes work/ghost-shapes --device cuda --dtype float16 \\
        --time-batch 128 --out results/ghost_costs_gpu                                   # a GPU machine

Both are cut from the task's teacher (glue_teachers.sh's) at every ``--widths`` m, ghost modules after O and FFN2.
Time depends on shapes, not weights: ``--shapes`` builds the cuts with initial weights from ``--save-shapes``' files
(under 1 MB) where the teacher is not. GhostBERT runs eager and compiled, forward by forward in turn with pruned only;
a round's ratio is GhostBERT's time over pruned-only's.
"""
import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import time

from benchlib import ROOT, default_out, logger, plot_panels, provenance, provenance_text, write_report

log = logger("bench_ghost_costs")
VARIANTS = (("pruned", "none"), ("ghost", "o,ffn2"))  # variant, ghost_prune's --ghost-positions
FORMS = (("GhostBERT", "ghost"), ("compiled", "ghost, compiled"))  # the report's name, the key of the JSON's rows
PRUNE_BATCHES, SEED = 4, 1  # dev batches of ghost_prune's importance; torch's seed (the initial weights of --shapes)


def timed_rounds(calls, repeats, runs):
    """{key: [seconds per round]}: in each of ``runs`` rounds every call runs ``repeats`` times, the calls
    interleaved one by one (the order rotating by one each round), so a change of the machine's load falls on all."""
    keys, times = list(calls), {k: [] for k in calls}
    for r in range(runs):
        total = dict.fromkeys(keys, 0.0)
        for k in (keys[r % len(keys):] + keys[: r % len(keys)]) * repeats:
            start = time.perf_counter()
            calls[k]()
            total[k] += time.perf_counter() - start
        for k, t in total.items():
            times[k].append(t)
    return times


# ---- the models ----------------------------------------------------------------------------------------------
def width_dir(work, m):
    return os.path.join(work, f"m{m.replace('/', 'of')}")


def prune(setup, m, work, args=None):
    """{variant: checkpoint}: ghost_prune's pruned-only and GhostBERT cuts of the teacher at width ``m`` (cached)."""
    from user_dir.ghost.tools import prune as ghost_prune
    paths = {v: os.path.join(width_dir(work, m), f"{v}.pt") for v, _ in VARIANTS}
    for variant, positions in VARIANTS:
        if not os.path.isfile(paths[variant]):
            ghost_prune.main([setup["data"], "--path", setup["teacher"], "--width-mult", m, "--out", paths[variant],
                              "--ghost-positions", positions, "--max-batches", str(PRUNE_BATCHES),
                              "--batch-size", "16", *(["--cpu"] if getattr(args, "device", "cpu") == "cpu" else [])])
    return paths


def save_shapes(setup, widths, work, dest):
    """``dest``: every width's configurations without weights (VARIANT.cfg.pt) and the task's dictionaries and dev
    set (data-bin/), what ``--shapes`` times on a machine without the teacher."""
    import torch
    for m in widths:
        os.makedirs(width_dir(dest, m), exist_ok=True)
        for variant, path in prune(setup, m, work).items():
            cfg = torch.load(path, map_location="cpu", weights_only=False)["cfg"]
            torch.save({"cfg": cfg}, os.path.join(width_dir(dest, m), f"{variant}.cfg.pt"))
    for sub in ("input0", "input1", "label"):
        if os.path.isdir(os.path.join(setup["data"], sub)):
            shutil.copytree(os.path.join(setup["data"], sub), os.path.join(dest, "data-bin", sub), dirs_exist_ok=True,
                            ignore=lambda _, names: [n for n in names if not (n == "dict.txt" or n[:6] == "valid.")])
    log(f"wrote {dest}: {len(widths)} width(s) x {len(VARIANTS)} configurations and the data-bin")


def build_from_shape(path, data):
    """The model of a configuration saved by :func:`save_shapes`, built by fairseq with its initial weights."""
    import torch
    from fairseq import tasks
    from omegaconf import open_dict
    cfg = torch.load(path, map_location="cpu", weights_only=False)["cfg"]
    with open_dict(cfg):
        cfg.task.data = data
        cfg.common.user_dir = os.path.join(ROOT, "user_dir")
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), task


def load_models(args, setup, m):
    """({variant: model} at width ``m``, the task): cut from ``setup``'s teacher, or built from ``--shapes``."""
    from fairseq import checkpoint_utils
    if args.shapes:
        built = [build_from_shape(os.path.join(width_dir(args.shapes, m), f"{v}.cfg.pt"),
                                  os.path.join(args.shapes, "data-bin")) for v, _ in VARIANTS]
        return {v: model for (v, _), (model, _) in zip(VARIANTS, built)}, built[0][1]
    paths = prune(setup, m, args.work, args)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(list(paths.values()), {"data": setup["data"]})
    return dict(zip(paths, models)), task


# ---- the measurement -----------------------------------------------------------------------------------------
def ghost_costs(args, dtype, setup=None):
    """Per m: paired encoder-time ratios of each GhostBERT form over pruned only at ``--time-batch`` x 128 and
    1 x 128, pruned-only's milliseconds, and the compiled form's largest difference from the eager one."""
    import torch

    from user_dir.common.structured_pruning import transformer_encoder
    from user_dir.ghost import ghost_module
    from user_dir.variator.tools.cost import real_batch
    device, dtype = torch.device(args.device), getattr(torch, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)  # each dtype's table from the same initial weights (--shapes)
    rows = []
    for m in args.widths.split(","):
        models, task = load_models(args, setup, m)
        models = {k: model.to(device=device, dtype=dtype).eval() for k, model in models.items()}
        models["ghost, compiled"] = ghost_module.compile_ghost_modules(copy.deepcopy(models["ghost"]))
        encoders, row = {k: transformer_encoder(model) for k, model in models.items()}, {"m": m}
        for label, size, reps in (("batch", args.time_batch, args.repeats), ("single", 1, 10 * args.repeats)):
            tokens, lengths = real_batch(task, "valid", 128, size).to(device), torch.full((size,), 128, device=device)
            with torch.no_grad():  # the first forward is the warm-up: it compiles and fills the caches
                out = {k: enc(tokens, src_lengths=lengths)["encoder_out"][0].float() for k, enc in encoders.items()}
                sync()
                times = timed_rounds({k: (lambda enc=enc: (enc(tokens, src_lengths=lengths), sync()))
                                      for k, enc in encoders.items()}, reps, args.runs)
            row[f"{label}: ghost, compiled max abs diff"] = (out["ghost, compiled"] - out["ghost"]).abs().max().item()
            row[f"{label}: max abs output"] = out["ghost"].abs().max().item()
            row[f"{label}: pruned ms"] = 1e3 * statistics.median(times["pruned"]) / reps
            for _, key in FORMS:
                r = [a / b for a, b in zip(times[key], times["pruned"])]  # paired: the same round
                row[f"{label}: {key}"] = {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r}
            log(f"m = {m}, {label}: GhostBERT / pruned only {row[f'{label}: ghost']['median']:.3f} (compiled "
                f"{row[f'{label}: ghost, compiled']['median']:.3f}); pruned only {row[f'{label}: pruned ms']:.2f} ms")
        rows.append(row)
    gpu = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    return {"rows": rows, "dtype": str(dtype).replace("torch.", ""), "time_batch": args.time_batch,
            "device": f"{gpu.name} ({gpu.total_memory / 2 ** 30:.0f} GiB), CUDA {torch.version.cuda}, cuDNN "
                      f"{torch.backends.cudnn.version()}" if gpu else "cpu",
            "residual_fusion": True, "compile_failed": ghost_module._COMPILED.get("failed"),
            "source": "initial weights from the checkpoints' configurations (--shapes)" if args.shapes else
            "ghost_prune's cuts of the teacher"}


# ---- the report ----------------------------------------------------------------------------------------------
def costs_verdict(costs):
    """Whether the goal (at most 1.10 at every m, at the batch shape) is met, by which form."""
    worst = {name: max(row[f"batch: {key}"]["median"] for row in costs["rows"]) for name, key in FORMS}
    met = [name for name, w in worst.items() if w <= 1.10]
    return (f"At {costs['time_batch']} x 128 the worst m runs " + ", ".join(
        f"{w:.3f}x pruned-only's time {'in the eager form' if name == 'GhostBERT' else name}"
        for name, w in worst.items()) + ": the goal (at most 1.10 at every m) is "
        + (f"met ({' and '.join(met)})." if met else "not met."))


def costs_report(result):
    """The Markdown report of a run's JSON: a table per dtype (pruned-only's milliseconds at both shapes: where they
    hardly differ, the device waits on kernel launches), the compiled form against the eager one, the verdict."""
    failed = result["costs"][0].get("compile_failed")
    lines = ["# GhostBERT's ghost modules against pruned only: encoder time, paired", "",
             provenance_text(result["provenance"]), "",
             f"Task {result['task']} (its dev tokens). Load average (1, 5, 15 min) at the start "
             + ", at the end ".join(", ".join(f"{x:.2f}" for x in load) for load in result["load"]) + ".", "",
             "GhostBERT (ghost modules after O and FFN2, the paper's) in the fused eager form (the default) and "
             "compiled (`--ghost-compile`: torch.compile of the out-of-place form"
             + (", fused with the layer's residual add" if result["costs"][0].get("residual_fusion") else "")
             + "; on a CPU only from 65,536 activation elements, so 1 x 128 x 384 runs eager there"
             + (f"; here it could not compile and ran eager: {failed}" if failed else "") + "). The encoders run "
             "forward by forward in turn; ratio = GhostBERT's time / pruned-only's in each round, the median over "
             "rounds [min-max]; goal: at most 1.10 at every m.", ""]
    for costs in result["costs"]:
        shapes = {"batch": f"{costs['time_batch']} x 128", "single": "1 x 128"}
        header = ["m"] + [f"pruned only, ms per forward ({s})" for s in shapes.values()] + [
            f"{name} / pruned ({s})" for s in shapes.values() for name, _ in FORMS]
        lines += [f"## {costs['dtype']} on {costs['device']}", "", f"Models: {costs['source']}.", "",
                  "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for row in costs["rows"]:
            lines.append(f"| {row['m']} | " + " | ".join([f"{row[f'{s}: pruned ms']:.2f}" for s in shapes] + [
                f"{x['median']:.3f} [{x['min']:.3f}-{x['max']:.3f}]" for x in
                (row[f"{s}: {key}"] for s in shapes for _, key in FORMS)]) + " |")
        diff = max(v for row in costs["rows"] for k, v in row.items() if k.endswith("max abs diff"))
        scale = max(row[f"{s}: max abs output"] for row in costs["rows"] for s in shapes)
        lines += ["", f"The compiled form's outputs against the eager form's: largest absolute difference over the "
                  f"timed batches {diff:.1e} (the outputs' largest magnitude {scale:.1f}).", "",
                  costs_verdict(costs), ""]
    return "\n".join(lines)


def plot_costs(result, png, plt=None):
    """GhostBERT's time over pruned-only's against m, batch and single shapes, one panel per cost table."""
    panels = [dict(series=[dict(x=[row["m"] for row in costs["rows"]], label=f"{name}, {label}", style="o" + style,
                                y=[row[f"{shape}: {key}"]["median"] for row in costs["rows"]])
                           for shape, label, style in (("batch", f"{costs['time_batch']} x 128", "-"),
                                                       ("single", "1 x 128", "--")) for name, key in FORMS],
                   hlines=[dict(y=1.10, color="grey", lw=0.8, ls=":", label="goal 1.10")], grid=True,
                   xlabel="m (heads and FFN width kept, of 12)", ylabel="GhostBERT time / pruned-only time",
                   title=f"{costs['device'].split(' (')[0]}, {costs['dtype']}", title_size=9, legend=dict(fontsize=7))
              for costs in result["costs"]]
    return plot_panels(png, panels, command=result["provenance"]["command"], figsize=(6.5 * len(panels), 4.4), plt=plt)


# ---- the command ---------------------------------------------------------------------------------------------
def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--glue-task", default="MRPC", help="the task whose teacher is cut and whose dev tokens are timed")
    p.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                   help="scripts/recipes/glue_teachers.sh's work folder(s), comma-separated (default work/glue)")
    p.add_argument("--work", default=os.path.join(ROOT, "work", "ghost-costs"), help="the cut checkpoints")
    p.add_argument("--widths", default="1/12,3/12,6/12,12/12", help="m of the GhostBERT-vs-pruned timing")
    p.add_argument("--save-shapes", metavar="DIR", help="write the cuts' configurations and the data-bin, then stop")
    p.add_argument("--shapes", metavar="DIR", help="time --save-shapes' DIR (initial weights), not the teacher's cuts")
    p.add_argument("--device", default="cpu", help="torch device of the timing: cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32", help="float32, float16, bfloat16, comma-separated: a table each")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    p.add_argument("--runs", type=int, default=7, help="timing rounds (default 7)")
    p.add_argument("--repeats", type=int, default=5, help="forwards per round of each encoder (10x at 1 x 128)")
    p.add_argument("--time-batch", type=int, default=16, help="sequences of 128 tokens in the batch (default 16)")
    p.add_argument("--out", default=None, help="the report's path without extension (default work/results/ghost_costs)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from OUT.json")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    out = (args.out or default_out("ghost_costs")).removesuffix(".md")
    if args.report_only:
        result = json.load(open(out + ".json"))
    else:
        import torch
        from fairseq import utils
        widths, dtypes, setup = args.widths.split(","), args.dtype.split(","), None
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            sys.exit("bench_ghost_costs: --device cuda, but torch sees no CUDA device")
        if set(dtypes) - {"float32", "float16", "bfloat16"}:
            sys.exit(f"bench_ghost_costs: --dtype {args.dtype}: expected float32, float16 or bfloat16")
        utils.import_user_module(argparse.Namespace(user_dir=os.path.join(ROOT, "user_dir")))
        if args.shapes is None:
            from glue_bench import first_glue_setup
            setup = first_glue_setup(args.glue_work, args.glue_task)
            if setup is None:
                looked = os.path.join(args.glue_work.split(",")[0], args.glue_task, "checkpoints", "checkpoint_best.pt")
                sys.exit(f"bench_ghost_costs: no {args.glue_task} teacher in --glue-work {args.glue_work} (looked for "
                         f"{looked}); make it with TASKS={args.glue_task} bash scripts/recipes/glue_teachers.sh, or "
                         "time --save-shapes' folder with --shapes")
        elif not all(os.path.isfile(os.path.join(width_dir(args.shapes, m), f"{v}.cfg.pt")) for m in widths
                     for v, _ in VARIANTS):
            sys.exit(f"bench_ghost_costs: --shapes {args.shapes} lacks a configuration of --widths {args.widths} "
                     "(write them with --save-shapes)")
        if args.save_shapes:
            return save_shapes(setup, widths, args.work, args.save_shapes)
        start, costs = os.getloadavg(), [ghost_costs(args, dtype, setup) for dtype in dtypes]
        result = {"provenance": provenance("bench_ghost_costs.py", argv, args.threads, [SEED]),
                  "task": args.glue_task, "costs": costs, "load": [list(start), list(os.getloadavg())]}
    written = write_report(out + ".md", costs_report(result), None if args.report_only else out + ".json", result,
                           lambda plt, png: plot_costs(result, png, plt), out + ".png")
    log(f"wrote {', '.join(written)}")


if __name__ == "__main__":
    main()
