#!/usr/bin/env python
"""The APC benchmark on GLUE: an APC-50-ff analogue of the MiniLM-L6 teachers of scripts/recipes/glue_teachers.sh
beside plain neuron pruning of the same size (APC paper, Table 2 / Table 3), written to
work/results/apc_glue.md (``--out``; + .json).

    nice -n 10 python scripts/bench/bench_apc_glue.py --glue-task RTE          # resumable; one part per task
    python scripts/bench/bench_apc_glue.py --report-only                        # the table again from the JSON
    python scripts/bench/bench_apc_glue.py --glue-task RTE --quick --out /tmp/apc_glue   # a smoke test of every stage

The seed runs of the committed table (each seed trains in --work/seed<k>/, resumable; --train-only runs of
one seed each may go in parallel, then the same command without --train-only measures and writes):

    nice -n 10 python scripts/bench/bench_apc_glue.py --glue-task RTE,MRPC,SST-2 --all-params --seeds 1,2,3 --out results/apc_glue

On a GPU: ``--device cuda --fp16 --jobs 3`` (benchlib.add_device_args; default the CPU in float32) trains the
seeds at once on it; the costs are measured afterwards, in this process on the CPU, nothing else running.

The paper's APC-50-ff compresses BERT-base's FFNs 3072 -> 256 (1/12) on layers 3-12, every layer but the
first two, to ~50% of the encoder. MiniLM-L6 has 6 layers of FFN 1536: the analogue compresses layers
2-6 (0-based 1-5) to 1536 / 12 = 128 (``--ffn-dims``), 49.2% of the encoder layers' parameters.

Per task (teacher ``--glue-work``/TASK/checkpoints/checkpoint_best.pt, data ``--glue-work``/data-bin/TASK.wordpiece):
1. ``python -m user_dir.apc.tools.init`` -- neuron-pruning initialisation (the paper's best, Table 1), neuron
   sensitivity on 20 training batches (the task's cross-entropy), U least squares on 5,000 positions;
2. APC ("APC-50-ff"): ``fairseq-train --arch apc_hf_bert`` from it, 'Compr. only' (U, D, B, b_U, b_D and
   the classification head train), CE loss (the paper's choice, section 4.3), ``--compress-updates``
   updates at the paper's compression step size 1e-4 with linear decay; ``apc_finalize``; then the
   paper's 'Finalized' strategy (Table 3): every parameter of the finalized model fine-tuned with CE,
   ``--finetune-updates`` updates at the teacher's own learning rate, batch 32, linear decay.
   ``--all-params`` adds the 'All Params' strategy (the compressed model's every weight fine-tuned,
   ``--apc-train-original``; finalized for the costs).
3. Neuron pruning (the paper's Table 2 row): the same initialisation finalized without the compression
   stage -- exactly the neuron-pruned network (Algorithm 1) -- fine-tuned like APC's finalized model for
   ``--compress-updates`` + ``--finetune-updates`` updates, so both get the same number of updates.
Selection, the same for every variant (issue 32: the baseline used to be validated twice as often as APC's
fine-tuning, and its best checkpoint reported): ``--validations`` evaluations on the held-out selection set
('valid': a slice of train held out at preparation; the dev set only reports) at the same update points
of each variant's whole budget, all in its last ``--finetune-updates`` updates (APC: its fine-tuning stage;
neuron pruning: the same updates of its one stage), none at epoch ends; the primary score is the last
checkpoint's, the best-of-N beside it. Seeds (``--seeds 1,2,3``): every stage per seed; the tables give the
mean, spread and every seed, and APC is compared with neuron pruning and with its teacher by the cluster test of
common/significance.py (dev examples as clusters of all seeds' predictions; kept as ``*.predictions.json``).
4. Dev scores with ``user_dir.tools.glue_predict`` and ``user_dir.common.glue_metrics`` (the teachers'
   scoring); parameters, encoder FLOPs at length 128 and encoder speed against the teacher measured as
   scripts/bench/bench_ghost.py does (scripts/bench/glue_bench.py's ``measure_costs``).
The paper's stage is MLM/NSP pre-training of the compressed BERT; our imported encoders have no MLM head,
so the compression stage trains on the task itself (the issue's choice, said in the table).
Stages are skipped when done (benchlib's stage bookkeeping: settings.json + DONE) and keyed by the
teacher checkpoint's SHA-256.
"""
import argparse
import json
import os
import sys

from benchlib import (ROOT, add_device_args, add_seed_arguments, aggregate, check_device, default_out, Device,
                      difference, fc_flags, fmt, glue_comparison, is_summary, logger, num, protocol_text, provenance,
                      rel, run_jobs, seed_dir, seeds_of, seeds_text, selection_flags, sha256_of, significance_lines,
                      stage, validation_plan, validation_updates, write_json, write_text)
from glue_bench import (REPORT_SUBSET, chosen_on, glue_scores, glue_setup, glue_train_flags, measure_costs, predictions_path,
                        read_labels, teacher_record)

# Table 2 (BERT-base dev; RTE in brackets = test there) and Table 3 (APC-50-ff strategies), accuracy
PAPER = {"BERT-base": {"SST-2": 92.7, "RTE": 66.4, "MRPC": 86.7, "MNLI": 84.4},
         "APC-50-ff (best strategy)": {"SST-2": 90.1, "RTE": 68.2, "MRPC": 85.3, "MNLI": 79.9},
         "APC-50-ff, Finalized": {"SST-2": 90.1, "RTE": 67.5, "MRPC": 83.1, "MNLI": 79.2},
         "Neuron Pruning": {"SST-2": 90.5, "RTE": 65.7, "MRPC": 85.3, "MNLI": 78.8}}


log = logger("bench_apc_glue")


def ffn_spec(args, layers: int) -> str:
    return ",".join(f"{i}:{args.ffn_dim}" for i in range(args.first_compressed, layers))


def plan_of(args):
    """Every variant validated --validations times at the same points of its whole budget, all in the last
    --finetune-updates updates (APC's fine-tuning stage; the same updates of neuron pruning's one stage)."""
    return validation_plan(args.compress_updates + args.finetune_updates, args.finetune_updates, args.validations)


def seed_rows(args, task, setup, record, lr, seed):
    """Every variant of ``task`` trained and scored with seed ``seed``: {name: row} (the teacher excluded)."""
    py, data, teacher = sys.executable, setup["data"], setup["teacher"]
    work = os.path.join(seed_dir(args.work, seed), task, f"{record['run']}-{record['sha256'][:8]}")
    from fairseq import checkpoint_utils
    layers = checkpoint_utils.load_checkpoint_to_cpu(teacher)["cfg"]["model"].encoder_layers
    spec = ffn_spec(args, layers)
    init_dir = os.path.join(work, "init")
    init = os.path.join(init_dir, "init.pt")
    stage(init_dir, [[py, "-m", "user_dir.apc.tools.init", teacher, "--data", data, "--encoder-ffn-dims", spec,
                      "--init", "neuron-pruning", "--seed", str(seed), "--out", init]
                     + (["--samples", "200", "--importance-batches", "2"] if args.quick else [])], args.threads)
    arch = fc_flags(init)
    common = [*Device(args).train(), data, "--user-dir", "user_dir", *setup["task_flags"]]
    plan, compress_n, total = plan_of(args), args.compress_updates, args.compress_updates + args.finetune_updates

    def train(name, flags, start, updates, lr_, stage_start):
        """One stage of ``updates`` updates that starts ``stage_start`` updates into its variant's budget."""
        directory = os.path.join(work, name)
        cmd = common + flags + glue_train_flags(args, updates, lr_, seed) + [
            "--criterion", "glue_sentence_prediction", "--glue-task", task, "--finetune-from-model", start,
            *selection_flags(plan, stage_start, updates, setup["best_metric"], maximize=True),
            "--save-dir", os.path.join(directory, "checkpoints")]
        stage(directory, [cmd], args.threads)
        return directory

    def finalize(src, out):
        stage(os.path.dirname(out) + "-finalize", [[py, "-m", "user_dir.apc.tools.finalize", src, "--out", out]],
              args.threads)
        return out

    def scores(path, name):
        return glue_scores(path, setup, task, os.path.join(work, "scores", name + ".json"), args.threads)

    def finetuned(directory, name, stage_start):
        """The last checkpoint (the primary score, its predictions kept) and the best-of-N beside it."""
        last, best = (os.path.join(directory, "checkpoints", f"checkpoint_{w}.pt") for w in ("last", "best"))
        row = {"scores": scores(last, name + "_last"), "last": last,
               "predictions": predictions_path(os.path.join(work, "scores", name + "_last.json")),
               "validations": [stage_start + u for u in validation_updates(os.path.join(directory, "log.txt"))]}
        if len(plan[1]) > 1:
            row["scores_best"] = scores(best, name + "_best")
        return row

    rows = {}
    log(f"{task}, seed {seed}: APC compression stage")
    compress = train("apc-compress", arch, init, compress_n, args.compress_lr, 0)
    compressed = os.path.join(compress, "checkpoints", "checkpoint_last.pt")
    apc_final = finalize(compressed, os.path.join(work, "apc-final", "apc.pt"))
    finalized_flags = (arch + ["--apc-finalized"])
    log(f"{task}, seed {seed}: APC Finalized fine-tuning")
    apc = finetuned(train("apc-finetune", finalized_flags, apc_final, args.finetune_updates, lr, compress_n), "apc",
                    compress_n)
    rows["APC-50-ff analogue, Finalized"] = dict(
        apc, final=apc["last"], scores_compressed=scores(compressed, "apc_compressed"),
        what=f"neuron-pruning init, {compress_n} updates Compr. only (CE), finalized, {args.finetune_updates} updates "
             "all parameters")
    if args.all_params:
        log(f"{task}, seed {seed}: APC All Params fine-tuning")
        full = finetuned(train("apc-all-params", arch + ["--apc-train-original"], compressed, args.finetune_updates, lr,
                               compress_n), "apc_all", compress_n)
        rows["APC-50-ff analogue, All Params"] = dict(
            full, final=finalize(full["last"], os.path.join(work, "apc-all-final", "last.pt")),
            what=f"as above, but after the compression stage every weight (W too) and APC's parameters fine-tuned "
                 f"{args.finetune_updates} updates (finalized for the costs)")
    log(f"{task}, seed {seed}: neuron pruning")
    pruned = finalize(init, os.path.join(work, "pruned-final", "pruned.pt"))
    pruning = finetuned(train("pruning-finetune", finalized_flags, pruned, total, lr, 0), "pruning", 0)
    rows["neuron pruning"] = dict(pruning, final=pruning["last"], scores_untrained=scores(pruned, "pruned_untrained"),
                                  what=f"the same neuron-pruning init, finalized (= the pruned network), {total} "
                                       "updates all parameters")
    return spec, rows


def task_part(args, task, header):
    setup = glue_setup(args, task)
    teacher = setup["teacher"]
    record = teacher_record(teacher, setup["metric"], None)
    lr = args.glue_lr if args.glue_lr is not None else setup["teacher_lr"]
    done = run_jobs(lambda seed: seed_rows(args, task, setup, record, lr, seed), args.seeds, args.jobs)
    spec, by_seed = done[-1][0], {seed: rows for seed, (_, rows) in zip(args.seeds, done)}
    if args.train_only:
        return None
    teacher_scores = os.path.join(args.work, "teacher", task, f"{sha256_of(teacher)[:8]}.json")
    rows = [{"name": "teacher", "what": "the fine-tuned MiniLM-L6 teacher", "final": teacher,
             "scores": glue_scores(teacher, setup, task, teacher_scores, args.threads),
             "predictions": rel(predictions_path(teacher_scores))}]
    names = list(by_seed[args.seeds[0]])
    for name in names:
        row = aggregate({seed: {k: v for k, v in seed_rows_[name].items() if k != "predictions"}
                         for seed, seed_rows_ in by_seed.items()})
        row.update(name=name, predictions={str(s): rel(by_seed[s][name]["predictions"]) for s in args.seeds})
        rows.append(row)
    log(f"{task}: measuring cost")
    load = os.getloadavg()[0]
    for row, cost in zip(rows, measure_costs([r["final"] for r in rows], args, setup["data"], REPORT_SUBSET)):
        row.update(cost)
    labels = read_labels(predictions_path(teacher_scores))
    comparisons = [glue_comparison(f"{name} vs neuron pruning", name, "neuron pruning",
                                   [by_seed[s][name]["predictions"] for s in args.seeds],
                                   [by_seed[s]["neuron pruning"]["predictions"] for s in args.seeds], labels,
                                   setup["metric"])
                   for name in names if name != "neuron pruning"]
    # each variant against the teacher (its outputs once per seed): APC's "retains about 97%" (scripts/bench/claims.py)
    comparisons += [glue_comparison(f"{name} vs the teacher", name, "teacher",
                                    [by_seed[s][name]["predictions"] for s in args.seeds],
                                    [predictions_path(teacher_scores)] * len(args.seeds), labels, setup["metric"])
                    for name in names]
    return dict(header, load=round(load, 2), metric=setup["metric"], teacher=record, ffn_dims=spec,
                comparisons=comparisons,
                settings={"compress_updates": args.compress_updates, "compress_lr": args.compress_lr,
                          "finetune_updates": args.finetune_updates, "lr": lr,
                          "lr_source": "--glue-lr" if args.glue_lr is not None else "the teacher's",
                          "batch_size": args.glue_batch_size, "validations": args.validations,
                          "plan": list(plan_of(args)), "best_metric": setup["best_metric"], "work": rel(args.work),
                          "selection": setup["selection"]},
                rows=[{k: (rel(v) if k in ("final", "last") else v) for k, v in r.items()} for r in rows])


def _score(s, metric):
    """The task's metric; F1 with the accuracy beside it (the paper reports MRPC's accuracy); over seeds, the
    metric's mean, spread and every seed, the accuracy's mean."""
    if not s:
        return ""
    return fmt(s[metric]) + (f" (acc {num(s['accuracy']):.2f})" if metric != "accuracy" and "accuracy" in s else "")


def _share(x, of):
    """``x`` in % of the teacher's ``of``: a summary over seeds gives every seed's share."""
    if is_summary(x):
        return fmt({**x, **{k: 100 * x[k] / of for k in ("mean", "min", "max")}, "std": 100 * x["std"] / of,
                    "values": {s: 100 * v / of for s, v in x["values"].items()}}, 1)
    return f"{100 * x / of:.1f}"


def _diff(x):
    return (f"{x['mean']:+.2f} (" + ", ".join(f"s{s} {v:+.2f}" for s, v in x["values"].items()) + ")"
            if is_summary(x) else f"{x:+.2f}")


def write_apc_glue_report(data, out):
    lines = ["# APC on GLUE: an APC-50-ff analogue of the MiniLM-L6 teachers vs neuron pruning", "",
             f"Made by `python scripts/bench/bench_apc_glue.py` (raw numbers: `{os.path.basename(out)}.json`); each task's "
             "part names the command, machine and date that measured it. The paper's compression stage pre-trains the compressed "
             "BERT on MLM/NSP; our imported encoders have no MLM head, so it trains on the task (cross-entropy). "
             "Finalized models are dense `apc_hf_bert --apc-finalized` checkpoints (the first layer keeps its FFN, "
             "so no single `--encoder-ffn-embed-dim` describes them).", ""]
    for task, p in sorted(data.get("glue", {}).items()):
        s, metric = p["settings"], p["metric"]
        teacher = p["rows"][0]
        new = "seeds" in p  # a part made with seeds: last checkpoint primary, best-of-N beside, every seed shown
        if new:
            made = (f"Made by `{p['command']}` on {p['machine']} ({p['date']}); {seeds_text(p['seeds'])}; "
                    f"{p['threads']} thread(s) per run, load average {p['load']} when the costs were measured.")
            total = s["compress_updates"] + s["finetune_updates"]
            selection = protocol_text(total, tuple(s["plan"]), f"{chosen_on(s)} {s['best_metric']}",
                                      f"APC's compression stage {s['compress_lr']:g}, then {s['lr']:g} ({s['lr_source']}) "
                                      f"over its fine-tuning stage; neuron pruning {s['lr']:g} over its one stage; each "
                                      "decaying linearly to 0 without warm-up")
            selection = (". " + selection + " Scores: mean +- sample std [min, max] over the seeds, then every "
                         "seed's value; costs: the first seed's models.")
            columns = f"| dev {metric} (last checkpoint) | best-of-{len(s['plan'][1])} | before fine-tuning |"
        else:
            made = (f"Made by `{p['command']}` on {p['machine']} ({p['date']}); seed {p['seed']}; {p['threads']} "
                    f"thread(s), load average {p['load']} when the costs were measured.")
            selection = (f", validated {s['validations']} times (the best dev checkpoint is the model; the last one "
                         "beside it).")
            columns = f"| dev {metric} (best) | last checkpoint | before fine-tuning |"
        lines += [f"## {task}", "", made, "",
                  f"Teacher: `{p['teacher']['checkpoint']}` (run {p['teacher']['run']}, sha256 {p['teacher']['sha256'][:12]}). "
                  f"Compressed FFNs: `--apc-encoder-ffn-dims {p['ffn_dims']}`. Compression stage: {s['compress_updates']} "
                  f"updates, lr {s['compress_lr']:g}; fine-tuning: lr {s['lr']:g} ({s['lr_source']}), batch "
                  f"{s['batch_size']}, Adam, linear decay to 0, no warm-up, dropout 0.1{selection}", "",
                  "| model | what | params | encoder-layer params | encoder FLOPs (len 128) | encoder speed-up [min-max] "
                  + columns, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in p["rows"]:
            before = r.get("scores_compressed") or r.get("scores_untrained")
            other = r.get("scores_best") if new else r.get("scores_last")
            lines.append(
                f"| {r['name']} | {r['what']} | {r['params']:,} | {r['encoder_params']:,} "
                f"({100 * r['encoder_params'] / teacher['encoder_params']:.1f}%) | {r['encoder_flops_128'] / 1e6:.1f}M "
                f"({100 * r['encoder_flops_128'] / teacher['encoder_flops_128']:.1f}%) | {r['speedup']:.2f}x "
                f"[{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}] | {_score(r['scores'], metric)} | "
                f"{_score(other, metric)} | {_score(before, metric)} |")
        rows = {r["name"]: r for r in p["rows"]}
        apc, np_ = rows["APC-50-ff analogue, Finalized"], rows["neuron pruning"]
        t = teacher["scores"][metric]
        seeds = f"{len(p['seeds'])} seed(s)" if new else "One seed"
        lines += ["", f"APC-50-ff analogue (Finalized) keeps {_share(apc['scores'][metric], t)}% of the teacher's "
                      f"dev {metric} (goal: >= 97%; paper: 0.809 / 0.837 = 96.7% on average); neuron pruning "
                      f"{_share(np_['scores'][metric], t)}%; APC minus pruning: "
                      f"{_diff(difference(apc['scores'][metric], np_['scores'][metric]))} points. {seeds}; {task}'s "
                      f"dev set has {teacher['scores']['examples']} examples (one example = "
                      f"{100 / teacher['scores']['examples']:.2f} points).", ""]
        if "APC-50-ff analogue, All Params" in rows:
            full = rows["APC-50-ff analogue, All Params"]["scores"]
            lines[-1:-1] = [f"APC-50-ff analogue with Table 3's All Params strategy (the same {s['compress_updates']} + "
                            f"{s['finetune_updates']} updates as the others) keeps {_share(full[metric], t)}% of "
                            f"the teacher's dev {metric}; All Params minus pruning: "
                            f"{_diff(difference(full[metric], np_['scores'][metric]))} points."]
        if metric != "accuracy" and "accuracy" in teacher["scores"]:
            ta = teacher["scores"]["accuracy"]
            lines[-1:-1] = [f"In dev accuracy (the paper's MRPC metric): APC-50-ff analogue "
                            f"{_share(apc['scores']['accuracy'], ta)}% of the teacher, neuron pruning "
                            f"{_share(np_['scores']['accuracy'], ta)}%."]
        if task in PAPER["BERT-base"]:
            lines += [f"Paper (BERT-base backbone, {task} dev accuracy): " + "; ".join(
                f"{k} {v[task]:.1f}" for k, v in PAPER.items()) + " (Tables 2-3; BERT-base's RTE is a test score "
                "there).", ""]
        lines += significance_lines(p.get("comparisons"), f"Each APC variant (A) against neuron pruning (B), last "
                                    f"checkpoints, dev {metric}")
        lines += [f"Encoder speed: forward of {p['time_batch']} dev sequences x 128 tokens, {p['runs']} runs of "
                  f"{p['repeats']} alternating teacher/model forwards, median ratio.", ""]
    write_text(out + ".md", "\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glue-task", default="RTE", help="comma-separated GLUE tasks (default RTE)")
    parser.add_argument("--glue-work", default=os.path.join(ROOT, "work", "glue"),
                        help="scripts/recipes/glue_teachers.sh's work folder (teachers and binarised data)")
    parser.add_argument("--work", default=os.path.join(ROOT, "work", "apc-glue"))
    parser.add_argument("--out", default=default_out("apc_glue"),
                        help="the table's path without extension (default work/results/apc_glue; the committed one: "
                             "results/apc_glue)")
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
    parser.add_argument("--validations", type=int, default=4,
                        help="held-out ('valid') evaluations of every variant, at the same points of its last --finetune-updates "
                             "updates (default 4); the last checkpoint is the primary score, the best of them beside it")
    parser.add_argument("--all-params", action="store_true", help="also Table 3's 'All Params' strategy")
    add_seed_arguments(parser, default="1")
    parser.add_argument("--threads", type=int, default=1)
    add_device_args(parser)
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (default 1)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-batch", type=int, default=16)
    parser.add_argument("--train-only", action="store_true", help="train and score, measure nothing")
    parser.add_argument("--report-only", action="store_true", help="rewrite the table from OUT.json")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 6 + 6 updates, 2 validations, tiny samples")
    args = parser.parse_args(argv)
    args.seeds = seeds_of(parser, args)
    check_device(parser, args)
    if args.quick:
        args.compress_updates, args.finetune_updates, args.validations, args.runs, args.repeats = 6, 6, 2, 1, 1
        args.work += "_quick"
    plan_of(args)  # the validation points are checked before anything trains
    data = json.load(open(args.out + ".json")) if os.path.isfile(args.out + ".json") else {"glue": {}}
    if args.report_only:
        write_apc_glue_report(data, args.out)
        return
    header = dict(provenance("bench_apc_glue.py", argv, args.threads, args.seeds), runs=args.runs,
                  repeats=args.repeats, time_batch=args.time_batch)
    for task in [t for t in args.glue_task.split(",") if t]:
        part = task_part(args, task, header)
        if part:
            data["glue"][task] = part
    if args.train_only:
        return
    write_json(args.out + ".json", data)
    write_apc_glue_report(data, args.out)
    log(f"wrote {args.out}.md")


if __name__ == "__main__":
    main()
