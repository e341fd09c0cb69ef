#!/usr/bin/env python
"""The APC benchmark on GLUE: an APC-50-ff analogue of the MiniLM-L6 teachers of scripts/glue_teachers.sh
beside plain neuron pruning of the same size (APC paper, Table 2 / Table 3), written to
results/apc_glue.md (+ .json).

    nice -n 10 python scripts/bench_apc_glue.py --glue-task RTE          # resumable; one part per task
    python scripts/bench_apc_glue.py --report-only                        # the table again from the JSON
    python scripts/bench_apc_glue.py --glue-task RTE --quick --out /tmp/apc_glue   # a smoke test of every stage

The paper's APC-50-ff compresses BERT-base's FFNs 3072 -> 256 (1/12) on layers 3-12, every layer but the
first two, to ~50% of the encoder. MiniLM-L6 has 6 layers of FFN 1536: the analogue compresses layers
2-6 (0-based 1-5) to 1536 / 12 = 128 (``--ffn-dims``), 49.2% of the encoder layers' parameters.

Per task (teacher ``--glue-work``/TASK/checkpoints/checkpoint_best.pt, data ``--glue-work``/data-bin/TASK.wordpiece):
1. ``python -m user_dir.tools.apc_init`` -- neuron-pruning initialisation (the paper's best, Table 1), neuron
   sensitivity on 20 training batches (the task's cross-entropy), U least squares on 5,000 positions;
2. APC ("APC-50-ff"): ``fairseq-train --arch apc_hf_bert`` from it, 'Compr. only' (U, D, B, b_U, b_D and
   the classification head train), CE loss (the paper's choice, section 4.3), ``--compress-updates``
   updates at the paper's compression step size 1e-4 with linear decay; ``apc_finalize``; then the
   paper's 'Finalized' strategy (Table 3): every parameter of the finalized model fine-tuned with CE,
   ``--finetune-updates`` updates at the teacher's own learning rate, batch 32, linear decay, validated
   ``--validations`` times: the best dev checkpoint is the model (the paper reports dev scores), the
   last one's score beside it. ``--all-params`` adds the 'All Params' strategy (the compressed model's
   every weight fine-tuned, ``--apc-train-original``, then finalized).
3. Neuron pruning (the paper's Table 2 row): the same initialisation finalized without the compression
   stage -- exactly the neuron-pruned network (Algorithm 1) -- fine-tuned like APC's finalized model for
   ``--compress-updates`` + ``--finetune-updates`` updates, so both get the same number of updates.
4. Dev scores with ``user_dir.tools.glue_predict`` and ``user_dir.common.glue_metrics`` (the teachers'
   scoring); parameters, encoder FLOPs at length 128 and encoder speed against the teacher measured as
   scripts/bench_ghost.py does (its ``measure_costs``, imported).
The paper's stage is MLM/NSP pre-training of the compressed BERT; our imported encoders have no MLM head,
so the compression stage trains on the task itself (the issue's choice, said in the table).
Stages are skipped when done (bench_variator's stage bookkeeping: settings.json + DONE) and keyed by the
teacher checkpoint's SHA-256.
"""
import argparse
import importlib.util
import json
import os
import platform
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Table 2 (BERT-base dev; RTE in brackets = test there) and Table 3 (APC-50-ff strategies), accuracy
PAPER = {"BERT-base": {"SST-2": 92.7, "RTE": 66.4, "MRPC": 86.7, "MNLI": 84.4},
         "APC-50-ff (best strategy)": {"SST-2": 90.1, "RTE": 68.2, "MRPC": 85.3, "MNLI": 79.9},
         "APC-50-ff, Finalized": {"SST-2": 90.1, "RTE": 67.5, "MRPC": 83.1, "MNLI": 79.2},
         "Neuron Pruning": {"SST-2": 90.5, "RTE": 65.7, "MRPC": 85.3, "MNLI": 78.8}}


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(msg):
    print(f"[bench_apc_glue {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def ffn_spec(args, layers: int) -> str:
    return ",".join(f"{i}:{args.ffn_dim}" for i in range(args.first_compressed, layers))


def task_part(args, task, ghost, header):
    variator = ghost.bench_variator()
    setup = ghost.glue_setup(args, task)
    py, data, teacher = sys.executable, setup["data"], setup["teacher"]
    digest = variator.backbone_digest(teacher)
    record = variator.teacher_record(teacher, setup["metric"], None)
    work = os.path.join(args.work, task, f"{record['run']}-{digest[:8]}")
    lr = args.glue_lr if args.glue_lr is not None else setup["teacher_lr"]
    from fairseq import checkpoint_utils
    layers = checkpoint_utils.load_checkpoint_to_cpu(teacher)["cfg"]["model"].encoder_layers
    spec = ffn_spec(args, layers)
    init_dir = os.path.join(work, "init")
    init = os.path.join(init_dir, "init.pt")
    ghost.stage(init_dir, [[py, "-m", "user_dir.tools.apc_init", teacher, "--data", data, "--encoder-ffn-dims", spec,
                            "--init", "neuron-pruning", "--seed", str(args.seed), "--out", init]
                           + (["--samples", "500", "--importance-batches", "2"] if args.quick else [])], args.threads)
    arch = json.load(open(os.path.join(init_dir, "init.json")))["fairseq_flags"]
    common = [py, "-m", "fairseq_cli.train", data, "--user-dir", "user_dir", *setup["task_flags"]]

    def train(name, flags, start, updates, lr_, validate):
        directory = os.path.join(work, name)
        cmd = common + flags + ghost.glue_train_flags(args, updates, lr_) + [
            "--criterion", "glue_sentence_prediction", "--glue-task", task, "--finetune-from-model", start,
            "--save-dir", os.path.join(directory, "checkpoints")]
        if validate:
            interval = str(max(1, args.finetune_updates // args.validations))
            cmd += ["--best-checkpoint-metric", setup["best_metric"], "--maximize-best-checkpoint-metric",
                    "--validate-interval-updates", interval, "--save-interval-updates", interval,
                    "--keep-interval-updates", "1"]
        else:
            cmd += ["--disable-validation"]
        ghost.stage(directory, [cmd], args.threads)
        return directory

    def finalize(src, out):
        ghost.stage(os.path.dirname(out) + "-finalize", [[py, "-m", "user_dir.tools.apc_finalize", src, "--out", out]],
                    args.threads)
        return out

    def scores(path, name):
        return ghost.glue_scores(path, setup, task, os.path.join(work, "scores", name + ".json"), args.threads)

    def finetuned(directory):
        best, last = (os.path.join(directory, "checkpoints", f"checkpoint_{w}.pt") for w in ("best", "last"))
        return best, last

    rows = [{"name": "teacher", "what": "the fine-tuned MiniLM-L6 teacher", "final": teacher,
             "scores": scores(teacher, "teacher")}]
    log(f"{task}: APC compression stage")
    compress = train("apc-compress", arch, init, args.compress_updates, args.compress_lr, validate=False)
    compressed = os.path.join(compress, "checkpoints", "checkpoint_last.pt")
    apc_final = finalize(compressed, os.path.join(work, "apc-final", "apc.pt"))
    finalized_flags = (arch + ["--apc-finalized"])
    log(f"{task}: APC Finalized fine-tuning")
    best, last = finetuned(train("apc-finetune", finalized_flags, apc_final, args.finetune_updates, lr, True))
    rows.append({"name": "APC-50-ff analogue, Finalized", "final": best, "scores": scores(best, "apc_best"),
                 "scores_last": scores(last, "apc_last"), "scores_compressed": scores(compressed, "apc_compressed"),
                 "what": f"neuron-pruning init, {args.compress_updates} updates Compr. only (CE), finalized, "
                         f"{args.finetune_updates} updates all parameters"})
    if args.all_params:
        log(f"{task}: APC All Params fine-tuning")
        all_dir = train("apc-all-params", arch + ["--apc-train-original"], compressed, args.finetune_updates, lr, True)
        best_all, last_all = finetuned(all_dir)
        all_best = finalize(best_all, os.path.join(work, "apc-all-final", "best.pt"))
        rows.append({"name": "APC-50-ff analogue, All Params", "final": all_best,
                     "scores": scores(all_best, "apc_all_best"), "scores_last": scores(last_all, "apc_all_last"),
                     "what": f"as above, but after the compression stage every weight (W too) and APC's parameters "
                             f"fine-tuned {args.finetune_updates} updates, then finalized"})
    log(f"{task}: neuron pruning")
    pruned = finalize(init, os.path.join(work, "pruned-final", "pruned.pt"))
    total = args.compress_updates + args.finetune_updates
    best_p, last_p = finetuned(train("pruning-finetune", finalized_flags, pruned, total, lr, True))
    rows.append({"name": "neuron pruning", "final": best_p, "scores": scores(best_p, "pruning_best"),
                 "scores_last": scores(last_p, "pruning_last"), "scores_untrained": scores(pruned, "pruned_untrained"),
                 "what": f"the same neuron-pruning init, finalized (= the pruned network), {total} updates "
                         "all parameters"})
    if args.train_only:
        return None
    log(f"{task}: measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, ghost.measure_costs([r["final"] for r in rows], args, data, "valid")):
        row.update(cost)
    return dict(header, load=round(load, 2), metric=setup["metric"], teacher=record, ffn_dims=spec,
                settings={"compress_updates": args.compress_updates, "compress_lr": args.compress_lr,
                          "finetune_updates": args.finetune_updates, "lr": lr,
                          "lr_source": "--glue-lr" if args.glue_lr is not None else "the teacher's",
                          "batch_size": args.glue_batch_size, "validations": args.validations,
                          "work": os.path.relpath(work, ROOT)},
                rows=[{k: (os.path.relpath(v, ROOT) if k == "final" else v) for k, v in r.items()} for r in rows])


def _score(s, metric):
    """The task's metric; F1 with the accuracy beside it (the paper reports MRPC's accuracy)."""
    if not s:
        return ""
    return f"{s[metric]:.2f}" + (f" (acc {s['accuracy']:.2f})" if metric != "accuracy" and "accuracy" in s else "")


def write_report(data, out):
    lines = ["# APC on GLUE: an APC-50-ff analogue of the MiniLM-L6 teachers vs neuron pruning", "",
             "Made by `python scripts/bench_apc_glue.py` (raw numbers: `apc_glue.json`); each task's part names the "
             "command, machine and date that measured it. The paper's compression stage pre-trains the compressed "
             "BERT on MLM/NSP; our imported encoders have no MLM head, so it trains on the task (cross-entropy). "
             "Finalized models are dense `apc_hf_bert --apc-finalized` checkpoints (the first layer keeps its FFN, "
             "so no single `--encoder-ffn-embed-dim` describes them).", ""]
    for task, p in sorted(data.get("glue", {}).items()):
        s, metric = p["settings"], p["metric"]
        teacher = p["rows"][0]
        lines += [f"## {task}", "",
                  f"Made by `{p['command']}` on {p['machine']} ({p['date']}); seed {p['seed']}; {p['threads']} thread(s), "
                  f"load average {p['load']} when the costs were measured.", "",
                  f"Teacher: `{p['teacher']['checkpoint']}` (run {p['teacher']['run']}, sha256 {p['teacher']['sha256'][:12]}). "
                  f"Compressed FFNs: `--apc-encoder-ffn-dims {p['ffn_dims']}`. Compression stage: {s['compress_updates']} "
                  f"updates, lr {s['compress_lr']:g}; fine-tuning: lr {s['lr']:g} ({s['lr_source']}), batch "
                  f"{s['batch_size']}, Adam, linear decay to 0, no warm-up, dropout 0.1, validated {s['validations']} "
                  f"times (the best dev checkpoint is the model; the last one beside it).", "",
                  f"| model | what | params | encoder-layer params | encoder FLOPs (len 128) | encoder speed-up [min-max] "
                  f"| dev {metric} (best) | last checkpoint | before fine-tuning |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in p["rows"]:
            before = r.get("scores_compressed") or r.get("scores_untrained")
            lines.append(
                f"| {r['name']} | {r['what']} | {r['params']:,} | {r['encoder_params']:,} "
                f"({100 * r['encoder_params'] / teacher['encoder_params']:.1f}%) | {r['encoder_flops_128'] / 1e6:.1f}M "
                f"({100 * r['encoder_flops_128'] / teacher['encoder_flops_128']:.1f}%) | {r['speedup']:.2f}x "
                f"[{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}] | {_score(r['scores'], metric)} | "
                f"{_score(r.get('scores_last'), metric)} | {_score(before, metric)} |")
        rows = {r["name"]: r for r in p["rows"]}
        apc, np_ = rows["APC-50-ff analogue, Finalized"], rows["neuron pruning"]
        t = teacher["scores"][metric]
        lines += ["", f"APC-50-ff analogue (Finalized) keeps {100 * apc['scores'][metric] / t:.1f}% of the teacher's "
                      f"dev {metric} (goal: >= 97%; paper: 0.809 / 0.837 = 96.7% on average); neuron pruning "
                      f"{100 * np_['scores'][metric] / t:.1f}%; APC minus pruning: "
                      f"{apc['scores'][metric] - np_['scores'][metric]:+.2f} points. One seed; {task}'s dev set has "
                      f"{teacher['scores']['examples']} examples (one example = {100 / teacher['scores']['examples']:.2f} "
                      "points).", ""]
        if "APC-50-ff analogue, All Params" in rows:
            full = rows["APC-50-ff analogue, All Params"]["scores"]
            lines[-1:-1] = [f"APC-50-ff analogue with Table 3's All Params strategy (the same {s['compress_updates']} + "
                            f"{s['finetune_updates']} updates as the others) keeps {100 * full[metric] / t:.1f}% of "
                            f"the teacher's dev {metric}; All Params minus pruning: "
                            f"{full[metric] - np_['scores'][metric]:+.2f} points."]
        if metric != "accuracy" and "accuracy" in teacher["scores"]:
            ta = teacher["scores"]["accuracy"]
            lines[-1:-1] = [f"In dev accuracy (the paper's MRPC metric): APC-50-ff analogue "
                            f"{100 * apc['scores']['accuracy'] / ta:.1f}% of the teacher, neuron pruning "
                            f"{100 * np_['scores']['accuracy'] / ta:.1f}%."]
        if task in PAPER["BERT-base"]:
            lines += [f"Paper (BERT-base backbone, {task} dev accuracy): " + "; ".join(
                f"{k} {v[task]:.1f}" for k, v in PAPER.items()) + " (Tables 2-3; BERT-base's RTE is a test score "
                "there).", ""]
        lines += [f"Encoder speed: forward of {p['time_batch']} dev sequences x 128 tokens, {p['runs']} runs of "
                  f"{p['repeats']} alternating teacher/model forwards, median ratio.", ""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue-task", default="RTE", help="comma-separated GLUE tasks (default RTE)")
    parser.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                        help="scripts/glue_teachers.sh's work folder (teachers and binarised data)")
    parser.add_argument("--work", default=os.path.join(ROOT, "work", "apc-glue"))
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "apc_glue"))
    parser.add_argument("--ffn-dim", type=int, default=128,
                        help="cmp^f of the compressed FFNs (APC-50-ff: 3072 -> 256 = 1/12; MiniLM 1536 / 12 = 128)")
    parser.add_argument("--first-compressed", type=int, default=1,
                        help="0-based index of the first compressed layer (APC-50-ff leaves the first 2 of 12; "
                             "ours the first of 6)")
    parser.add_argument("--compress-updates", type=int, default=240,
                        help="updates of the compression stage (3 RTE epochs; the paper: 100 steps in Table 1, "
                             "up to 5 epochs of MLM/NSP)")
    parser.add_argument("--compress-lr", type=float, default=1e-4, help="the paper's compression step size (4.3)")
    parser.add_argument("--finetune-updates", type=int, default=240, help="updates of the fine-tuning stage")
    parser.add_argument("--glue-lr", type=float, default=None, help="fine-tuning lr (default: the teacher's)")
    parser.add_argument("--glue-batch-size", type=int, default=32, help="the paper's batch size (32)")
    parser.add_argument("--validations", type=int, default=4, help="dev evaluations during fine-tuning")
    parser.add_argument("--all-params", action="store_true", help="also Table 3's 'All Params' strategy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-batch", type=int, default=16)
    parser.add_argument("--train-only", action="store_true", help="train and score, measure nothing")
    parser.add_argument("--report-only", action="store_true", help="rewrite the table from OUT.json")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 5 + 6 updates, tiny samples")
    args = parser.parse_args(argv)
    if args.quick:
        args.compress_updates, args.finetune_updates, args.validations, args.runs, args.repeats = 5, 6, 2, 1, 1
        args.work += "_quick"
    sys.path.insert(0, ROOT)
    data = json.load(open(args.out + ".json")) if os.path.isfile(args.out + ".json") else {"glue": {}}
    if args.report_only:
        write_report(data, args.out)
        return
    ghost = load_script("bench_ghost")
    header = {"command": "python scripts/bench_apc_glue.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seed": args.seed, "threads": args.threads,
              "runs": args.runs, "repeats": args.repeats, "time_batch": args.time_batch}
    for task in [t for t in args.glue_task.split(",") if t]:
        part = task_part(args, task, ghost, header)
        if part:
            data["glue"][task] = part
    if args.train_only:
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(data, f, indent=1)
    write_report(data, args.out)
    log(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
