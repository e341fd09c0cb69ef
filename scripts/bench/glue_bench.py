"""GLUE pieces shared by the GLUE benchmark drivers (bench_ghost.py, bench_apc_glue.py, bench_variator.py):
a task's teacher, data and flags from scripts/recipes/glue_teachers.sh's work folder, the record naming a teacher,
Table 8-style training flags, dev scores with their per-example predictions, and the encoders' costs
(parameters, FLOPs at length 128, encoder speed against the teacher). Imported as a module; no driver
loads another driver.
"""
import json
import os
import statistics
import sys
import time

from benchlib import Device, rel, sha256_of, write_json, write_predictions
# preprocess/prepare_glue.py's layout: 'valid' (a slice of train held out at preparation) is what fairseq-train
# validates on and everything chooses by (checkpoints, learning rates, importance); 'dev' (GLUE's dev set) only
# reports
from preprocess.prepare_glue import REPORT_SUBSET, SELECTION_SUBSET


def teacher_record(path, metric, score):
    """Which GLUE teacher a row was measured on, read from its checkpoint: the run folder (glue_teachers.sh
    trains each learning rate in WORK/TASK/lrLR), learning rate, updates, SHA-256, and its dev score."""
    from fairseq import checkpoint_utils
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    lr = state["cfg"]["optimization"]["lr"]
    real = os.path.realpath(path)
    return {"run": os.path.basename(os.path.dirname(os.path.dirname(real))), "checkpoint": rel(real),
            "sha256": sha256_of(path), "lr": float(lr if isinstance(lr, (int, float, str)) else lr[0]),
            "updates": (state.get("optimizer_history") or [{}])[-1].get("num_updates"), "metric": metric,
            "score": score, "source": "read from the checkpoint when the rows were measured"}


def check_report_subset(data, task):
    """Stop, naming what to do, where the prepared GLUE data ``data`` has no REPORT_SUBSET."""
    if not os.path.isfile(os.path.join(data, "input0", f"{REPORT_SUBSET}.idx")):
        sys.exit(f"GLUE {task}: {data} has no '{REPORT_SUBSET}' subset: it was prepared before choosing moved to a "
                 f"held-out slice of train ('{SELECTION_SUBSET}') and reporting to GLUE's dev set "
                 f"('{REPORT_SUBSET}'); delete it and its teacher's runs and run TASKS={task} "
                 f"bash scripts/recipes/glue_teachers.sh again")


def selection_record(data):
    """How the prepared GLUE data ``data`` keeps choosing apart from reporting, from its .prepared.json:
    ``source`` "train" (its 'valid' is a held-out slice of train: prepare_glue --select-fraction) or "dev" (its
    'valid' is the dev set, --select-fraction 0); a part's settings keep it (see :func:`chosen_on`)."""
    with open(os.path.join(data, ".prepared.json")) as f:
        config = json.load(f)["config"]
    fraction = config.get("select_fraction") or 0
    return {"subset": SELECTION_SUBSET, "source": "train" if fraction else "dev", "fraction": fraction,
            "seed": config.get("select_seed"), "report": REPORT_SUBSET}


def chosen_on(settings):
    """What chose checkpoints and importance in a part (its settings' "selection"), in the report's words:
    "held-out" (a slice of train) or "dev" (parts made before the split, or --select-fraction 0)."""
    return "held-out" if (settings.get("selection") or {}).get("source") == "train" else "dev"


def first_glue_setup(glue_work, task):
    """:func:`glue_setup` of ``task`` from the first folder of ``glue_work`` (comma-separated) that holds its
    teacher (TASK/checkpoints/checkpoint_best.pt), with "glue_work" set to that folder; None where none does."""
    import argparse

    for folder in (f for f in glue_work.split(",") if f):
        if os.path.isfile(os.path.join(folder, task, "checkpoints", "checkpoint_best.pt")):
            setup = glue_setup(argparse.Namespace(glue_work=folder), task)
            setup["glue_work"] = folder
            return setup
    return None


def glue_setup(args, task):
    """Teacher, data, task flags and metric of GLUE ``task`` from scripts/recipes/glue_teachers.sh's work folder
    (``args.glue_work``)."""
    from fairseq import checkpoint_utils

    from user_dir.common.glue_metrics import BEST_CHECKPOINT_METRIC, TASK_METRICS
    from user_dir.common.task_flags import sentence_prediction_flags
    if task not in TASK_METRICS:
        sys.exit(f"--glue-task {task}: expected one of {', '.join(TASK_METRICS)}")
    teacher = os.path.join(args.glue_work, task, "checkpoints", "checkpoint_best.pt")
    data = os.path.join(args.glue_work, "data-bin", f"{task}.wordpiece")
    if not os.path.isfile(teacher):
        sys.exit(f"--glue-task {task}: no teacher at {teacher} (--glue-work); train it first: "
                 f"TASKS={task} bash scripts/recipes/glue_teachers.sh")
    if not os.path.isdir(os.path.join(data, "input0")):
        sys.exit(f"--glue-task {task}: no binarised data at {data} (scripts/recipes/glue_teachers.sh prepares it)")
    check_report_subset(data, task)
    cfg = checkpoint_utils.load_checkpoint_to_cpu(teacher)["cfg"]
    tcfg = cfg["task"]
    if tcfg.get("_name") != "sentence_prediction":
        sys.exit(f"{teacher} was trained with --task {tcfg.get('_name')}, not sentence_prediction")
    regression = bool(tcfg.get("regression_target"))
    if task == "STS-B" and not regression:
        sys.exit(f"{teacher}: STS-B is a regression task, but this teacher was not trained with "
                 "--regression-target --num-classes 1")
    flags = sentence_prediction_flags(tcfg)
    lr, model = cfg["optimization"]["lr"], cfg["model"]
    heads = model["encoder_attention_heads"] if isinstance(model, dict) else model.encoder_attention_heads
    return {"heads": heads, "teacher": teacher, "data": data, "task_flags": flags, "regression": regression,
            "metric": TASK_METRICS[task][0], "best_metric": BEST_CHECKPOINT_METRIC.get(task, TASK_METRICS[task][0]),
            "teacher_lr": float(lr if isinstance(lr, (int, float, str)) else lr[0]),
            "selection": selection_record(data)}


def glue_train_flags(args, updates, lr, seed):
    """Table 8 (GhostBERT), bounded by ``updates``: batch --glue-batch-size, Adam (0.9, 0.999), no warm-up,
    linear decay to 0, weight decay 0, clipping 1, dropout and attention dropout 0.1; on ``args``' device
    (benchlib.Device: --device, --fp16/--bf16; the CPU where the driver has none)."""
    return ["--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6", "--lr", str(lr),
            "--lr-scheduler", "polynomial_decay", "--total-num-update", str(updates), "--warmup-updates", "0",
            "--end-learning-rate", "0", "--clip-norm", "1", "--dropout", "0.1", "--attention-dropout", "0.1",
            "--weight-decay", "0", "--batch-size", str(args.glue_batch_size), "--max-update", str(updates),
            "--log-format", "simple", "--log-interval", "10", "--no-epoch-checkpoints", "--num-workers", "0",
            *Device(args).train_flags(), "--seed", str(seed)]


def predictions_path(scores_path):
    """Where the dev predictions behind a scores file lie: beside it, ``<name>.predictions.json``."""
    return os.path.splitext(scores_path)[0] + ".predictions.json"


def glue_scores(path, setup, task, out, threads, **predict_kwargs):
    """Dev scores of ``path`` (glue_predict's predictions, glue_metrics' metrics), kept in ``out``; the
    predictions themselves (a JSON list in dev-set order, with the gold labels' file ``dev_labels.json``
    beside) in :func:`predictions_path`, for the paired tests. ``predict_kwargs`` go to glue_predict's
    ``predict`` (e.g. Variator plugins)."""
    preds_path = predictions_path(out)
    if not (os.path.isfile(out) and os.path.isfile(preds_path)):
        import torch

        from user_dir.common.glue_metrics import glue_score
        from user_dir.tools.glue_predict import predict
        check_report_subset(setup["data"], task)
        torch.set_num_threads(threads)
        _, preds, labels, _ = predict(setup["data"], path, REPORT_SUBSET, **predict_kwargs)
        labels_path = os.path.join(os.path.dirname(os.path.abspath(out)), "dev_labels.json")
        if not os.path.isfile(labels_path):
            write_json(labels_path, list(labels))
        write_predictions(preds_path, preds, labels_path)
        write_json(out, dict(glue_score(task, preds, labels), examples=len(labels)))
    with open(out) as f:
        return json.load(f)


def read_labels(predictions_file):
    """The gold labels a predictions file names."""
    with open(predictions_file) as f:
        labels = json.load(f)["labels"]
    with open(labels) as f:
        return json.load(f)


def _cpu_sdpa_flops(query, key, value, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count
    return sdpa_flop_count(query, key, value)  # shapes (FlopCounterMode passes a custom formula shapes)


def _cpu_sdpa_mapping():
    """torch's FlopCounterMode counts the CUDA kernels of scaled_dot_product_attention but not the CPU one,
    which fairseq's MultiheadAttention calls when no attention weights are asked for (the stock encoder
    layers): without this, an unpruned encoder's QK^T and AV products (2 x 2 n^2 d per layer) went uncounted
    while the pruned layers' explicit products were counted."""
    import torch
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {op: _cpu_sdpa_flops} if op is not None else {}


def measure_costs(paths, args, data, subset):
    """Parameters, FLOPs at length 128 and alternating encoder timings of ``paths`` (first: teacher), timed
    on 128-token blocks of ``data``'s ``subset`` sentences (``args``: threads, time_batch, runs, repeats)."""
    import torch
    from fairseq import checkpoint_utils
    from torch.utils.flop_counter import FlopCounterMode

    import user_dir  # noqa: F401  (registers the plug-in's models)
    from user_dir.common.counting import count_parameters
    from user_dir.common.structured_pruning import transformer_encoder
    from user_dir.ghost.ghost_module import flops_outside_torch_counter
    from user_dir.variator.tools.cost import real_batch

    cpu_sdpa = _cpu_sdpa_mapping()
    torch.set_num_threads(args.threads)
    models, task = [], None
    for path in paths:
        loaded, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
        models.append(loaded[0].eval())
    tokens = real_batch(task, subset, 128, args.time_batch)
    one = tokens[:1]
    costs = []
    for model in models:
        encoder = transformer_encoder(model)
        with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
            encoder(one, src_lengths=torch.tensor([one.size(1)]))
        ghost = sum(p.numel() for n, p in model.named_parameters() if ".ghost." in n)
        costs.append({"params": count_parameters(model).total, "encoder_params": sum(
            p.numel() for p in encoder.layers.parameters()), "ghost_params": ghost,
            "encoder_flops_128": counter.get_total_flops() + flops_outside_torch_counter(model, one.size(1))})

    def time_encoder(model):
        encoder = transformer_encoder(model)
        lengths = torch.full((tokens.size(0),), tokens.size(1))
        with torch.no_grad():
            start = time.perf_counter()
            encoder(tokens, src_lengths=lengths)
            return time.perf_counter() - start

    for model in models:  # warm-up
        time_encoder(model)
    ratios = {i: [] for i in range(1, len(models))}
    for r in range(args.runs):
        for i in ratios:
            pair = {0: [], i: []}
            for _ in range(args.repeats):
                for which in ((i, 0) if r % 2 else (0, i)):
                    pair[which].append(time_encoder(models[which]))
            ratios[i].append(statistics.median(pair[0]) / statistics.median(pair[i]))
    for i, cost in enumerate(costs):
        cost["speedup"] = 1.0 if i == 0 else statistics.median(ratios[i])
        cost["speedup_range"] = [1.0, 1.0] if i == 0 else [min(ratios[i]), max(ratios[i])]
    return costs
