#!/usr/bin/env python
"""GhostBERT's ghost modules against pruned only (issue 35's goal: GhostBERT within 10% of pruned-only's encoder
time at every m), on a CPU or a GPU, paired in one run. Written to work/results/ghost_costs.md (``--out``;
+ .json, + .png); its CPU run of MRPC is results/archive/deploy_glue.md's last section.

    python scripts/bench/bench_ghost_costs.py --glue-task MRPC --glue-work work/deploy-glue/glue      # this CPU
    python scripts/bench/bench_ghost_costs.py --glue-work work/deploy-glue/glue --save-shapes work/ghost-shapes
    python scripts/bench/bench_ghost_costs.py --shapes work/ghost-shapes --device cuda --dtype float16 \\
        --time-batch 128 --out results/ghost_costs_gpu                                   # a GPU machine

Models: pruned-only and GhostBERT encoders cut from the task's teacher (the first TASK/checkpoints/checkpoint_best.pt
of ``--glue-work``, as scripts/recipes/glue_teachers.sh leaves it) by user_dir.ghost.tools.prune at every ``--widths`` m
(importance on ``--prune-batches`` dev batches), GhostBERT with ghost modules after O and FFN2 (the paper's). An
encoder's time depends on its shapes, not its weights, so a machine without the teacher (a lent GPU) times the same
architectures from ``--save-shapes``' folder: each checkpoint's configuration alone (its task's and model's
settings, no weights) and the task's dictionaries and dev set, under 1 MB; there the models are built by fairseq from
those configurations with their initial weights (``--shapes``).

Forms of GhostBERT, each against pruned only: the fused eager form (ghost_module.add_shifted_ghost, the default),
compiled (``--ghost-compile``: torch.compile of the out-of-place form; on a CPU only from 65,536 activation elements,
ghost_module.COMPILE_MIN_ELEMENTS), and the reference form (GhostConv's depthwise_conv_time + _ghost + _masked, the
form before issue 35). The compiled form's output is checked against the eager one's on the timed batch.

Timing: on ``--time-batch`` x 128 real dev tokens and on one 128-token sequence, the encoders run forward by forward
in turn (the order rotating each round) in each of ``--runs`` rounds, ``--repeats`` forwards each (10x at 1 x 128),
on ``--device`` in ``--dtype``, ``--threads`` intra-op threads; on CUDA every forward ends with a synchronisation.
``--whole-compile MODE`` adds both encoders compiled whole (torch.compile(encoder), static shapes; reduce-overhead
replays CUDA graphs; cudagraphs: the cudagraphs backend, the eager kernels replayed as CUDA graphs without code
generation, which takes away the per-kernel launch cost a small encoder pays on a GPU), at the batch shape.
The ratio of a round is GhostBERT's time over pruned-only's in that round; the table gives the median over rounds
and their range. ``--onnx-ratios`` (CPU, from checkpoints) adds the ONNX Runtime graphs of the pruned-only and
GhostBERT classifiers (fc-export-onnx), on the batch's tokens.
"""
import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import time

from benchlib import ROOT, default_out, Device, logger, plot_panels, provenance, provenance_text, write_report

log = logger("bench_ghost_costs")
VARIANTS = (("pruned", "none"), ("ghost", "o,ffn2"))  # variant, ghost_prune's --ghost-positions
WHOLE = {"default": "torch.compile of the encoder, Inductor's default mode: the ghost module fused into the "
                    "encoder's own kernels",
         "reduce-overhead": "torch.compile of the encoder, Inductor's reduce-overhead mode: fused kernels replayed "
                            "as CUDA graphs",
         "cudagraphs": "torch.compile of the encoder with the cudagraphs backend: its eager kernels replayed as CUDA "
                       "graphs, without the per-kernel launch cost"}
FORMS = (("GhostBERT", "ghost"), ("compiled", "ghost, compiled"), ("reference form", "ghost, reference form"))


def timed_rounds(configs, items, runs):
    """{key: [seconds per round]}: in each round every config ``configs[key](item)`` runs on every item, the configs
    interleaved item by item (the order rotating by one each round), so a change of the machine's load between
    two moments falls on every config alike; a round's time of a config is the sum over the items."""
    times = {k: [] for k in configs}
    keys = list(configs)
    for r in range(runs):
        order = keys[r % len(keys):] + keys[: r % len(keys)]
        total = dict.fromkeys(keys, 0.0)
        for item in items:
            for k in order:
                start = time.perf_counter()
                configs[k](item)
                total[k] += time.perf_counter() - start
        for k in keys:
            times[k].append(total[k])
    return times


# ---- the models ----------------------------------------------------------------------------------------------
def width_dir(work, m):
    return os.path.join(work, f"m{m.replace('/', 'of')}")


def prune(setup, m, work, prune_batches, device=None):
    """{variant: checkpoint}: ghost_prune's pruned-only and GhostBERT cuts of the teacher at width ``m`` (cached),
    cut on ``device`` (benchlib.Device's argument: the timing's --device; default the CPU)."""
    from user_dir.ghost.tools import prune as ghost_prune

    paths = {}
    for variant, positions in VARIANTS:
        paths[variant] = path = os.path.join(width_dir(work, m), f"{variant}.pt")
        if not os.path.isfile(path):
            ghost_prune.main([setup["data"], "--path", setup["teacher"], "--width-mult", m, "--out", path,
                              "--ghost-positions", positions, "--max-batches", str(prune_batches),
                              "--batch-size", "16", *Device(device).tool()])
    return paths


def save_shapes(setup, widths, work, prune_batches, dest):
    """``dest``: every width's pruned-only and GhostBERT configuration without weights (VARIANT.cfg.pt) and the
    task's dictionaries and dev set (data-bin/), what ``--shapes`` times on a machine without the teacher."""
    import torch

    for m in widths:
        for variant, path in prune(setup, m, work, prune_batches).items():
            state = torch.load(path, map_location="cpu", weights_only=False)
            os.makedirs(width_dir(dest, m), exist_ok=True)
            torch.save({"cfg": state["cfg"]}, os.path.join(width_dir(dest, m), f"{variant}.cfg.pt"))
    for sub in ("input0", "input1", "label"):  # the task's dictionaries and the dev tokens (what is timed)
        source = os.path.join(setup["data"], sub)
        if os.path.isdir(source):
            os.makedirs(os.path.join(dest, "data-bin", sub), exist_ok=True)
            for name in os.listdir(source):
                if name == "dict.txt" or name.startswith("valid."):
                    shutil.copy(os.path.join(source, name), os.path.join(dest, "data-bin", sub, name))
    log(f"wrote {dest}: {len(widths)} width(s) x {len(VARIANTS)} configurations and the data-bin")


def load_checkpoint(path, data):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    return models[0], task


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


def reference_ghost(model):
    """``model`` with every GhostLinear / GhostActivation computing its ghost features in the reference form
    (GhostConv + _ghost + _masked: the form before the fused add_shifted_ghost)."""
    from user_dir.ghost.ghost_module import GhostActivation, GhostLinear

    def reference(self, y):
        return y + self._ghost(self.ghost(self._masked(y).unsqueeze(2), self.padding_mask))

    for module in model.modules():
        if isinstance(module, (GhostLinear, GhostActivation)):
            module._add_ghost = reference.__get__(module)
    return model


# ---- the measurement -----------------------------------------------------------------------------------------
def ghost_costs(args, setup=None, work=None, shapes=None):
    """Per m: paired encoder-time ratios of each GhostBERT form over pruned only at ``--time-batch`` x 128 and
    1 x 128 (and ONNX Runtime's), pruned-only's milliseconds, and the compiled form's largest difference from the
    eager one. Models from ``setup``'s teacher (cut into ``work``) or from ``shapes`` (:func:`save_shapes`)."""
    import torch

    from user_dir.common.structured_pruning import transformer_encoder
    from user_dir.ghost import ghost_module
    from user_dir.variator.tools.cost import real_batch

    device, dtype = torch.device(getattr(args, "device", "cpu")), getattr(torch, getattr(args, "dtype", "float32"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.set_num_threads(args.threads)
    whole, whole_failed = getattr(args, "whole_compile", "none"), None
    onnx_ratios = args.onnx_ratios and shapes is None and device.type == "cpu" and dtype == torch.float32
    out = []
    for m in args.widths.split(","):
        models, onnx = {}, {}
        if shapes is None:
            for variant, path in prune(setup, m, work, args.prune_batches, args).items():
                models[variant], task = load_checkpoint(path, setup["data"])
                onnx[variant] = path
        else:
            for variant, _ in VARIANTS:
                models[variant], task = build_from_shape(
                    os.path.join(width_dir(shapes, m), f"{variant}.cfg.pt"), os.path.join(shapes, "data-bin"))
        for variant in list(models):
            models[variant] = models[variant].to(device=device, dtype=dtype).eval()
        models["ghost, reference form"] = reference_ghost(copy.deepcopy(models["ghost"]))
        models["ghost, compiled"] = ghost_module.compile_ghost_modules(copy.deepcopy(models["ghost"]))
        row = {"m": m}
        for label, tokens in (("batch", real_batch(task, "valid", 128, args.time_batch)),
                              ("single", real_batch(task, "valid", 128, 1))):
            tokens = tokens.to(device)
            lengths = torch.full((tokens.size(0),), tokens.size(1), device=device)
            encoders = {k: transformer_encoder(mod) for k, mod in models.items()}
            if whole != "none" and label == "batch":  # both encoders compiled whole, at the batch shape only
                for variant, _ in VARIANTS:
                    encoders[f"{variant}, whole"] = torch.compile(
                        encoders[variant], dynamic=False, **({"backend": "cudagraphs"} if whole == "cudagraphs" else
                                                            {"mode": None if whole == "default" else whole}))
            with torch.no_grad():
                for _ in range(3 if whole != "none" else 1):  # the warm-up: compiles, records CUDA graphs, caches
                    outputs = {}
                    for k, enc in list(encoders.items()):
                        try:
                            outputs[k] = enc(tokens, src_lengths=lengths)["encoder_out"][0].float().clone()
                        except Exception as e:  # noqa: BLE001 -- a whole-model compile that fails is reported
                            if not k.endswith(", whole"):
                                raise
                            whole_failed = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                            log(f"--whole-compile {whole} failed, timed without it: {whole_failed}")
                            encoders = {k: e for k, e in encoders.items() if not k.endswith(", whole")}
                            outputs = {k: o for k, o in outputs.items() if not k.endswith(", whole")}
                            whole = "none"
                    sync()
                eager = outputs["ghost"]
                for key in [k for k in ("ghost, compiled", "ghost, whole") if k in outputs]:
                    row[f"{label}: {key} max abs diff"] = (outputs[key] - eager).abs().max().item()
                row[f"{label}: max abs output"] = eager.abs().max().item()
                reps = args.repeats if label == "batch" else args.repeats * 10

                def forward(_, enc):
                    enc(tokens, src_lengths=lengths)
                    sync()
                times = timed_rounds({k: (lambda i, enc=enc: forward(i, enc)) for k, enc in encoders.items()},
                                     range(reps), args.runs)
            if "ghost, whole" in times:
                row[f"{label}: ghost, whole"] = ratios(times, "ghost, whole", "pruned, whole")
                row[f"{label}: pruned, whole ms"] = 1e3 * statistics.median(times["pruned, whole"]) / reps
            for _, variant in FORMS:
                row[f"{label}: {variant}"] = ratios(times, variant)
            row[f"{label}: pruned ms"] = 1e3 * statistics.median(times["pruned"]) / reps
            if onnx_ratios and label == "batch":
                row["onnx: ghost"] = onnx_ratio(args, setup, task, onnx, tokens, work)
            log(f"m = {m}, {label}: GhostBERT / pruned only {row[f'{label}: ghost']['median']:.3f} (compiled "
                f"{row[f'{label}: ghost, compiled']['median']:.3f}, reference form "
                f"{row[f'{label}: ghost, reference form']['median']:.3f}); pruned only "
                f"{row[f'{label}: pruned ms']:.2f} ms")
        out.append(row)
    row0 = out[0] if out else {}
    return {"rows": out, "device": describe_device(device), "dtype": str(dtype).replace("torch.", ""),
            "time_batch": args.time_batch, "whole_compile": whole, "residual_fusion": True,
            "whole_compile_failed": whole_failed, "compile_failed": ghost_module._COMPILED.get("failed"),
            "source": "initial weights from the checkpoints' configurations (--shapes)" if shapes else
            "ghost_prune's cuts of the teacher", "onnx": "onnx: ghost" in row0}


def ratios(times, variant, base="pruned"):
    r = [a / b for a, b in zip(times[variant], times[base])]  # paired: the same round
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": r}


def onnx_ratio(args, setup, task, checkpoints, tokens, work):
    """GhostBERT / pruned only in ONNX Runtime (fc-export-onnx's graphs) on ``tokens`` as BERT's ids."""
    import torch

    from user_dir.deploy.export_hf import prepared_settings, read_vocab, vocabulary_map, wordpiece
    from user_dir.deploy.export_onnx import export_onnx, run_session, session

    folders = {}
    for variant, path in checkpoints.items():
        folders[variant] = folder = os.path.join(os.path.dirname(path), f"{variant}-onnx")
        if not os.path.isfile(os.path.join(folder, "model.onnx")):
            export_onnx(path, folder, data=setup["data"], int8=False)
    settings = prepared_settings(setup["data"])
    to_fairseq = vocabulary_map(task.source_dictionary, read_vocab(settings), wordpiece(settings).fairseq_specials)
    to_bert = torch.empty(len(to_fairseq), dtype=torch.long)
    to_bert[to_fairseq] = torch.arange(len(to_fairseq))
    ids = to_bert[tokens]
    mask = torch.ones_like(ids)
    sessions = {k: session(os.path.join(d, "model.onnx"), args.threads) for k, d in folders.items()}
    for sess in sessions.values():
        run_session(sess, ids, mask)  # warm-up
    t = timed_rounds({k: (lambda _, s=s: run_session(s, ids, mask)) for k, s in sessions.items()},
                     range(args.repeats), args.runs)
    return ratios(t, "ghost")


def describe_device(device):
    import torch

    if device.type != "cuda":
        return "cpu"
    p = torch.cuda.get_device_properties(device)
    return (f"{p.name} ({p.total_memory / 2 ** 30:.0f} GiB), CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}")


# ---- the report ----------------------------------------------------------------------------------------------
def costs_table(costs):
    """The Markdown table of :func:`ghost_costs`' result."""
    rows, batch = costs["rows"], f"{costs['time_batch']} x 128"
    whole = costs.get("whole_compile", "none") != "none"
    header = ["m", f"pruned only, ms per forward ({batch})"] + [
        f"{name} / pruned ({shape})" for shape in (batch, "1 x 128") for name, _ in FORMS] + (
        [f"ONNX Runtime GhostBERT / pruned ({batch})"] if costs.get("onnx") else []) + (
        [f"both compiled whole: pruned only, ms ({batch})", f"both compiled whole: GhostBERT / pruned ({batch})"]
        if whole else [])
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]

    def ratio(x):
        return "" if not x else f"{x['median']:.3f} [{x['min']:.3f}-{x['max']:.3f}]"

    def ms(x):
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"

    for row in rows:
        cells = [row["m"], ms(row["batch: pruned ms"])] + [
            ratio(row.get(f"{shape}: {key}")) for shape in ("batch", "single") for _, key in FORMS] + (
            [ratio(row.get("onnx: ghost"))] if costs.get("onnx") else []) + (
            [ms(row["batch: pruned, whole ms"]), ratio(row["batch: ghost, whole"])] if whole else [])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def forms_text(costs):
    failed = costs.get("compile_failed")
    return ("GhostBERT with ghost modules after O and FFN2 (the paper's) in three forms: the fused eager form "
            "(ghost_module.add_shifted_ghost, the default); compiled (`--ghost-compile`: "
            "ghost_module.compiled_shifted_ghost, torch.compile of the out-of-place form, one pass over the "
            "activations" + (", fused with the encoder layer's residual add after O and FFN2 "
                             "(ghost_model.residual_connection)" if costs.get("residual_fusion") else "")
            + "; on a CPU only from 65,536 activation elements, so 1 x 128 x 384 runs eager there"
            + (f"; here it could not compile and ran eager: {failed}" if failed else "")
            + "); the reference form (GhostConv's depthwise_conv_time + _ghost + _masked, the form before issue 35)"
            + (f"; and, beside them, both encoders compiled whole ({WHOLE[costs['whole_compile']]}; static shapes), "
               "at the batch shape, GhostBERT's against pruned-only's" if costs.get("whole_compile", "none") != "none"
               else "")
            + (f"; compiling them whole failed: {costs['whole_compile_failed']}" if costs.get("whole_compile_failed")
               else "")
            + ". The encoders run forward by forward in turn; ratio = GhostBERT's time / pruned-only's in each round, "
            "the median over rounds [min-max]; goal: at most 1.10 at every m.")


def costs_verdict(costs):
    """Whether the goal (at most 1.10 at every m, at the batch shape) is met, by which form."""
    forms = list(FORMS[:2]) + ([("both compiled whole", "ghost, whole")]
                               if costs.get("whole_compile", "none") != "none" else [])
    worst = {name: max(row[f"batch: {key}"]["median"] for row in costs["rows"]) for name, key in forms}
    met = [name for name, w in worst.items() if w <= 1.10]
    return (f"At {costs['time_batch']} x 128 the worst m runs " + ", ".join(
        f"{w:.3f}x pruned-only's time {'in the eager form' if name == 'GhostBERT' else name}"
        for name, w in worst.items()) + ": the goal (at most 1.10 at every m) is "
        + (f"met ({' and '.join(met)})." if met else "not met."))


def scaling(costs):
    """How pruned-only's time grows from 1 x 128 to the batch: where it hardly grows, the device waits on kernel
    launches (a GPU's fixed cost per kernel), and a ratio counts kernels rather than FLOPs."""
    single = [row["single: pruned ms"] for row in costs["rows"]]
    batch = [row["batch: pruned ms"] for row in costs["rows"]]
    growth = [b / s for b, s in zip(batch, single)]
    return (f"Pruned only runs {min(single):.2f}-{max(single):.2f} ms per forward at 1 x 128 and "
            f"{min(batch):.2f}-{max(batch):.2f} ms at {costs['time_batch']} x 128 ({costs['time_batch']}x the tokens): "
            f"{min(growth):.1f}x-{max(growth):.1f}x the time" + (
                "; the encoder is bound by per-kernel launch costs, not by FLOPs, so the ghost module's extra kernels "
                f"cost time out of proportion to its FLOPs" if max(growth) < costs["time_batch"] / 4 else "") + ".")


def costs_report(result):
    lines = ["# GhostBERT's ghost modules against pruned only: encoder time, paired", "",
             provenance_text(result["provenance"]), "",
             f"Task {result['task']} (its dev tokens). Load average (1, 5, 15 min) at the start "
             f"{', '.join(f'{x:.2f}' for x in result['load'][0])}, at the end "
             f"{', '.join(f'{x:.2f}' for x in result['load'][1])}.", "", forms_text(result["costs"][0]), ""]
    for costs in result["costs"]:
        diffs = [v for row in costs["rows"] for k, v in row.items() if k.endswith("max abs diff")]
        scale = max(row[f"{shape}: max abs output"] for row in costs["rows"] for shape in ("batch", "single"))
        lines += [f"## {costs['dtype']} on {costs['device']}", "", f"Models: {costs['source']}.", "",
                  *costs_table(costs), "", scaling(costs), "",
                  f"The compiled forms' outputs against the eager form's: largest absolute difference over the timed "
                  f"batches {max(diffs):.1e} (the outputs' largest magnitude {scale:.1f}).", "",
                  costs_verdict(costs), ""]
    return "\n".join(lines)


def plot_costs(result, png, plt=None):
    """GhostBERT's time over pruned-only's against m, batch and single shapes, one panel per cost table."""
    panels = []
    for costs in result["costs"]:
        ms = [row["m"] for row in costs["rows"]]
        lines = [dict(x=ms, y=[row[f"{shape}: {key}"]["median"] for row in costs["rows"]], style="o" + style,
                      label=f"{name}, {label}")
                 for shape, label, style in (("batch", f"{costs['time_batch']} x 128", "-"),
                                             ("single", "1 x 128", "--"))
                 for name, key in FORMS]
        panels.append(dict(series=lines, hlines=[dict(y=1.10, color="grey", lw=0.8, ls=":", label="goal 1.10")],
                           xlabel="m (heads and FFN width kept, of 12)", ylabel="GhostBERT time / pruned-only time",
                           title=f"{costs['device'].split(' (')[0]}, {costs['dtype']}", title_size=9, grid=True,
                           legend=dict(fontsize=7)))
    return plot_panels(png, panels, command=result["provenance"]["command"], figsize=(6.5 * len(panels), 4.4),
                       plt=plt)


# ---- the command ---------------------------------------------------------------------------------------------
def add_timing_arguments(p):
    """The flags :func:`ghost_costs` reads."""
    p.add_argument("--widths", default="1/12,3/12,6/12,12/12", help="m of the GhostBERT-vs-pruned timing")
    p.add_argument("--prune-batches", type=int, default=4, help="dev batches of ghost_prune's importance (default 4)")
    p.add_argument("--onnx-ratios", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the pruned-only and GhostBERT ONNX graphs at every m (CPU, from checkpoints; "
                        "default on)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every runtime (default 1)")
    p.add_argument("--runs", type=int, default=7, help="timing rounds (default 7)")
    p.add_argument("--repeats", type=int, default=5, help="forwards per round of each config, interleaved (default 5; "
                                                         "10x at 1 x 128)")
    p.add_argument("--time-batch", type=int, default=16,
                   help="sequences of 128 tokens in the batch timing (default 16)")


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--glue-task", default="MRPC", help="the task whose teacher is cut and whose dev tokens are timed")
    p.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                   help="scripts/recipes/glue_teachers.sh's work folder(s), comma-separated (default work/glue)")
    p.add_argument("--work", default=os.path.join(ROOT, "work", "ghost-costs"), help="the cut checkpoints")
    p.add_argument("--save-shapes", metavar="DIR", default=None,
                   help="write the configurations (no weights) and the data-bin to DIR for --shapes, then stop")
    p.add_argument("--shapes", metavar="DIR", default=None,
                   help="time the models of --save-shapes' DIR (built with their initial weights) instead of cutting "
                        "the teacher")
    p.add_argument("--device", default="cpu", help="torch device of the timing: cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="float32",
                   help="the models' dtype(s), comma-separated, of float32, float16, bfloat16: one table each "
                        "(default float32)")
    p.add_argument("--seed", type=int, default=1, help="torch's seed: the initial weights of --shapes (default 1)")
    p.add_argument("--whole-compile", default="none", choices=("none", "default", "reduce-overhead", "cudagraphs"),
                   help="also time both encoders compiled whole by torch.compile at the batch shape: Inductor in its "
                        "default or reduce-overhead mode, or the cudagraphs backend (the eager kernels replayed as "
                        "CUDA graphs, no code generation); default none")
    add_timing_arguments(p)
    p.add_argument("--out", default=None, help="the report's path without extension (default work/results/ghost_costs)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from OUT.json")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    out = args.out or default_out("ghost_costs")
    out = out[:-3] if out.endswith(".md") else out
    if args.report_only:
        with open(out + ".json") as f:
            result = json.load(f)
        written = write_report(out + ".md", costs_report(result), None, None,
                               lambda plt, png: plot_costs(result, png, plt), out + ".png")
        log(f"wrote {', '.join(written)}")
        return
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench_ghost_costs: --device cuda, but torch sees no CUDA device")
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(ROOT, "user_dir")))
    setup = None
    widths = args.widths.split(",")
    dtypes = args.dtype.split(",")
    for dtype in dtypes:
        if dtype not in ("float32", "float16", "bfloat16"):
            sys.exit(f"bench_ghost_costs: --dtype {dtype}: expected float32, float16 or bfloat16")
    if args.shapes is None:
        from glue_bench import first_glue_setup
        setup = first_glue_setup(args.glue_work, args.glue_task)
        if setup is None:
            looked = os.path.join(args.glue_work.split(",")[0], args.glue_task, "checkpoints", "checkpoint_best.pt")
            sys.exit(f"bench_ghost_costs: no {args.glue_task} teacher in --glue-work {args.glue_work} (looked for "
                     f"{looked}); make it with TASKS={args.glue_task} bash scripts/recipes/glue_teachers.sh, or time "
                     "--save-shapes' folder with --shapes")
    elif not all(os.path.isfile(os.path.join(width_dir(args.shapes, m), f"{v}.cfg.pt")) for m in widths
                 for v, _ in VARIANTS):
        sys.exit(f"bench_ghost_costs: --shapes {args.shapes} lacks a configuration of --widths {args.widths} "
                 "(write them with --save-shapes)")
    if args.save_shapes:
        save_shapes(setup, widths, args.work, args.prune_batches, args.save_shapes)
        return
    start = os.getloadavg()
    costs = []
    for dtype in dtypes:
        torch.manual_seed(args.seed)
        costs.append(ghost_costs(argparse.Namespace(**{**vars(args), "dtype": dtype}), setup, args.work, args.shapes))
    result = {"provenance": provenance("bench_ghost_costs.py", args.argv, args.threads, [args.seed]),
              "task": args.glue_task, "costs": costs, "load": [list(start), list(os.getloadavg())]}
    written = write_report(out + ".md", costs_report(result), out + ".json", result,
                           lambda plt, png: plot_costs(result, png, plt), out + ".png")
    log(f"wrote {', '.join(written)}")


if __name__ == "__main__":
    main()
