#!/usr/bin/env python
"""The which-method ladders: the students the grids made, each deployed in every engine that takes it, measured alone
in one run; rendered from the store.

    python scripts/experiments/ladder.py plan grids/ladder_mt.toml      # what would be measured, and what is missing
    python scripts/experiments/ladder.py measure grids/ladder_mt.toml   # alone on the machine: no training beside it
    python scripts/experiments/ladder.py measure grids/ladder_glue.toml # GLUE: fairseq and ONNX Runtime fp32/int8

A ladder (grids/ladder_*.toml) names grids (their cells with records are its models) or its own ``teacher`` and
``data``, and [[extra]] checkpoints (``--extra NAME=PATH``: yours). Its ``task``: "translation" (sacreBLEU on test) or
"glue" (its grids' GLUE_TASK or its data's; the task's first TASK_METRICS metric on GLUE's dev set). ``measure``:
1. deploys every model in each engine (fairseq; CTranslate2 float32/int8; ONNX Runtime fp32/int8), or says why not;
2. times each deployment ``runs`` times in turn, in its own process, at batch ``batch`` (sentences/s) and at batch 1
   (ms per sentence); the lowest seed stands for its cell; other engines' outputs are compared with fairseq's;
3. scores every seed of every cell in every engine (fairseq: the records' scores);
4. appends the run to results/store/ladders/NAME.jsonl and draws it (``plot``) into results/NAME.png;
scripts/experiments/render.py renders the latest run with the records' training cost (block NAME, '_' as '-')."""
import argparse
import json
import os
import shlex
import statistics
import sys
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]
import store as store_lib  # noqa: E402
from grid import Grid, rooted  # noqa: E402
from record import sha256_of  # noqa: E402

# each engine: fairseq (the checkpoint); CTranslate2's compute type; the file of fc-export-onnx's export
ENGINES = {"fairseq": None, "ct2-float32": "float32", "ct2-int8": "int8", "onnx-fp32": "model.onnx",
           "onnx-int8": "model.int8.onnx"}
TASK_ENGINES = {"translation": ["fairseq", "ct2-float32", "ct2-int8"], "glue": ["fairseq", "onnx-fp32", "onnx-int8"]}
ATOL = 1e-4  # an output equal to fairseq's: a hypothesis or a class exactly, a regression head's score within --atol
SCORING_STAGES = ("measure", "cost")  # the stages that score a model: the others' cost is making it


class Ladder:
    def __init__(self, path, store=None):
        with open(path, "rb") as f:
            spec = tomllib.load(f)
        self.path, self.spec = path, spec
        self.name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]
        self.store = store_lib.Store(store or os.path.join(ROOT, "results", "store"))
        self.runs_file = os.path.join(self.store.root, "ladders", f"{self.name}.jsonl")
        self.grids = [Grid(rooted(g), store=self.store.root) for g in spec.get("grids", [])]
        if not self.grids and not ("teacher" in spec and "data" in spec):
            raise SystemExit(f"ladder {path}: no grids = [...], nor a teacher = and data = of its own")
        teachers = {g.teacher for g in self.grids} or {rooted(spec["teacher"])}
        datas = {g.inputs.get("DATA") for g in self.grids} or {rooted(spec["data"])}
        if len(teachers) != 1 or len(datas) != 1:
            raise SystemExit(f"ladder {path}: its grids have other teachers or data ({teachers}, {datas})")
        (self.teacher,), (self.data,) = teachers, datas
        # the GLUE task it scores (None: translation): its own, its grids' GLUE_TASK, or its data's (prepare_glue.py's)
        named = {c.variables["GLUE_TASK"] for g in self.grids for c in g.cells if "GLUE_TASK" in c.variables}
        prepared = os.path.join(self.data, ".prepared.json")
        if "glue_task" in spec:
            named = {spec["glue_task"]}
        elif not named and os.path.isfile(prepared):
            with open(prepared) as f:
                config = json.load(f)["config"]
            named = {config["task"]} if "glue_dir" in config else set()
        if len(named) > 1:
            raise SystemExit(f"ladder {path}: its grids score other GLUE tasks ({sorted(named)})")
        self.glue_task = next(iter(named), None)
        self.task = spec.get("task") or ("glue" if self.glue_task else "translation")
        if self.task not in TASK_ENGINES or (self.task == "glue") != bool(self.glue_task):
            raise SystemExit(f"ladder {path}: task = {self.task!r}: 'translation', or 'glue' with its GLUE task (its "
                             "grids' GLUE_TASK, its data's, or glue_task = \"MRPC\")")
        self.engines = spec.get("engines", TASK_ENGINES[self.task])
        if unknown := set(self.engines) - set(TASK_ENGINES[self.task]):
            raise SystemExit(f"ladder {path}: engines {sorted(unknown)}: a {self.task} ladder's are "
                             f"{', '.join(TASK_ENGINES[self.task])}")
        if self.grids and ({"teacher", "data"} & set(spec)):
            raise SystemExit(f"ladder {path}: a ladder with grids takes their teacher and data, not its own")
        self.control = spec.get("control")  # a cell of its grids: a teacher the goal is asked against too (render.py)
        where = [os.path.relpath(g.path, ROOT) for g in self.grids if self.control in {c.name for c in g.cells}]
        if self.control and not where:
            raise SystemExit(f"ladder {path}: control = {self.control!r} names no cell of its grids")
        self.control_grid = where[0] if where else None
        missing = [field for extra in spec.get("extra", []) for field in ("name", "path") if field not in extra]
        if missing:
            raise SystemExit(f"ladder {path}: an [[extra]] has no '{missing[0]}'")

    def models(self, flags=None):
        """[{name, grid, cell, seeds: {seed: record}}] for every cell with current records, then the extras (the
        ladder's, then those of ``--extra NAME=PATH`` flags); and the cells without any."""
        models, missing = [], []
        for grid in self.grids:
            for name in dict.fromkeys(c.name for c in grid.cells):
                seeds = {r["seed"]: r for r in grid.current_records(name)}  # the latest filed of each seed
                if seeds:
                    models.append({"name": name, "grid": grid.name, "seeds": dict(sorted(seeds.items()))})
                else:
                    missing.append(f"{grid.name}/{name}")
        for extra in self.spec.get("extra", []):
            models.append({"name": extra["name"], "path": rooted(extra["path"]), "about": extra.get("about", "")})
        for value in flags or []:
            name, _, path = value.partition("=")
            if not name or not path:
                raise SystemExit(f"ladder: --extra {value}: NAME=PATH, e.g. --extra mine=work/pet-my/kd/checkpoint_best.pt")
            if not os.path.isfile(rooted(path)):
                raise SystemExit(f"ladder: --extra {value}: no checkpoint {path}")
            models.append({"name": name, "path": rooted(path), "about": f"--extra {value}"})
        return models, missing


def deployed_checkpoint(model):
    """The checkpoint that stands for the model (its lowest seed's) and that seed."""
    if "path" in model:
        return model["path"], None
    seed = min(model["seeds"])
    return rooted(model["seeds"][seed]["checkpoint"]), seed


def trained(path):
    """{epochs, updates}: a fairseq checkpoint's iterator epoch (the next one at an epoch's end) and updates, or {}."""
    import torch
    state = torch.load(path, map_location="cpu", weights_only=False)
    epoch = ((state.get("extra_state") or {}).get("train_iterator") or {}).get("epoch")
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    return {k: v for k, v in (("epochs", epoch), ("updates", updates)) if v is not None}


def made_from(target, source):
    """Whether ``target`` exists and was written after ``source`` (else an older checkpoint's deployment is redone)."""
    return os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(source)


def deploy(path, data, engine, work, label, exported=None):
    """(the path an engine measures, None) or (None, why it cannot): fairseq takes the checkpoint; CTranslate2 takes
    fc-export's stock checkpoint converted to the engine's weights (fc-export's summary into ``exported``)."""
    if ENGINES[engine] is None:
        return path, None
    if engine.startswith("onnx-"):
        return deploy_onnx(path, data, engine, work, label, exported)
    from user_dir.deploy import ct2_engine, export

    stock = os.path.join(work, f"{label}.stock.pt")
    try:
        if exported is not None and not exported:
            exported.update(export.export(path, stock))
            exported.update({k: os.path.relpath(exported[k], ROOT) for k in ("student", "out")})
        elif not made_from(stock, path):
            export.export(path, stock)
        out = os.path.join(work, f"{label}.{engine}")
        if not made_from(os.path.join(out, "model.bin"), stock):
            ct2_engine.convert(stock, data, out, ENGINES[engine])
        return out, None
    except (export.ExportError, ct2_engine.CT2Error) as error:
        return None, str(error).replace(ROOT + "/", "")


def deploy_onnx(path, data, engine, work, label, exported=None):
    """fc-export-onnx's float32 or int8 graph of a GLUE classifier (both written by one export; its summary into
    ``exported``, with the dev examples the exported tokenizer was checked on), or (None, why it cannot)."""
    from preprocess.prepare_glue import REPORT_SUBSET
    from user_dir.deploy import export_onnx

    out = os.path.join(work, f"{label}.onnx")
    summary = os.path.join(out, "export.json")
    try:
        if not made_from(summary, path):
            # int8's loss is what the ladder measures (every dev example), not a reason to refuse it
            export_onnx.export_onnx(path, out, data=data, int8_warn_only=True)
        checked = export_onnx.subset_checked(path, data, REPORT_SUBSET)
    except export_onnx.ExportHFError as error:
        return None, str(error).replace(ROOT + "/", "")
    if exported is not None and not exported:
        with open(summary) as f:
            exported.update(json.load(f))
        exported.update({k: os.path.relpath(exported[k], ROOT) for k in ("checkpoint", "data")},
                        raw_text_checked={"subset": REPORT_SUBSET, "examples": checked})
    return os.path.join(out, ENGINES[engine]), None


def scorer(ladder):
    """(the subset scored, the ladder's metric, a worker's result -> its scores): sacreBLEU and BLEU (tok) of the test
    set against its raw references; for GLUE, the task's metrics of GLUE's dev set (the first by default)."""
    from user_dir.tools import measure

    if ladder.task == "glue":
        from preprocess.prepare_glue import REPORT_SUBSET
        from user_dir.common.glue_metrics import TASK_METRICS, glue_score

        if ladder.glue_task not in TASK_METRICS:
            raise SystemExit(f"ladder: GLUE task {ladder.glue_task}: one of {', '.join(TASK_METRICS)}")
        if not os.path.isfile(os.path.join(ladder.data, "input0", f"{REPORT_SUBSET}.idx")):
            raise SystemExit(f"ladder: {ladder.data}: no '{REPORT_SUBSET}' split (GLUE's dev set, which the records "
                             "score); prepare the grids' data first (grid.py plan makes it)")
        return (REPORT_SUBSET, ladder.spec.get("metric") or TASK_METRICS[ladder.glue_task][0],
                lambda out: glue_score(ladder.glue_task, out["outputs"], out["references"]))
    text = os.path.join(ladder.data, "text")
    raw = sorted(f for f in os.listdir(text) if f.startswith("test.raw.")) if os.path.isdir(text) else []
    if len(raw) != 1:
        raise SystemExit(f"ladder: {text}: {'no' if not raw else 'more than one'} test.raw.<target> with the raw "
                         "references for sacreBLEU (a data-bin made by preprocess.prepare_multi30k or prepare_parallel "
                         "keeps them in text/); prepare the grids' data first (grid.py plan makes it)")
    return "test", ladder.spec.get("metric", "sacrebleu"), lambda out: measure.translation_scores(
        out["outputs"], out["references"], out["ids"], out["target_lang"], os.path.join(text, raw[0]))


def run_measure(ladder, args):
    from user_dir.deploy import ct2_engine, export_onnx
    from user_dir.tools import measure

    spec = ladder.spec
    runs, threads, batch = args.runs or spec.get("runs", 3), spec.get("threads", 1), spec.get("batch", 64)
    latency_sentences = spec.get("latency_sentences", 100)
    glue = ladder.task == "glue"
    subset, metric, score = scorer(ladder)
    models, missing = ladder.models(args.extra)
    if missing:
        print(f"ladder: no records yet for {', '.join(missing)} (measured without them)", file=sys.stderr)
    work = os.path.abspath(args.work or os.path.join(ROOT, "work", "ladders", ladder.name))
    os.makedirs(work, exist_ok=True)
    base = {"data": ladder.data, "subset": subset, "beam": 5, "lenpen": 1.0, "max_len_a": 0, "max_len_b": 200,
            "post_process": "subword_nmt", "classification_head": "sentence_classification_head" if glue else None,
            "threads": threads, "cpu": True, "fp16": False}

    def timed(path, engine, checkpoint, batch_size, max_sentences):
        """fc-measure's worker result for a deployment (``checkpoint``: the one an ONNX graph was exported from)."""
        job = dict(base, path=path, batch_size=batch_size, max_sentences=max_sentences)
        if ENGINES[engine] is None:  # with the encoder's, the decoder's and the search's shares of a translation's time
            return measure._run_worker(dict(job, engine="fairseq", profile=True))
        if engine.startswith("onnx-"):
            return export_onnx.measure(dict(job, checkpoint=checkpoint))
        return ct2_engine.measure(dict(job, compute_type=ENGINES[engine]))

    deployments, refused, described = [], [], []
    for model in [{"name": "teacher", "path": ladder.teacher, "about": "the grids' teacher"}] + models:
        path, seed = deployed_checkpoint(model)
        if not os.path.exists(path):
            raise SystemExit(f"ladder: {model['name']}'s checkpoint {path} is not on this machine: measure where its "
                             "cells ran (their work folders hold the checkpoints), or run the cells again here")
        exported = {}
        described.append({"name": model["name"], "grid": model.get("grid"), "checkpoint": os.path.relpath(path, ROOT),
                          "sha256": sha256_of(path), "deployed_seed": seed, "about": model.get("about", ""),
                          "records": {str(s): r["key"] for s, r in model.get("seeds", {}).items()},
                          "export": exported, "trained": trained(path)})
        for engine in ladder.engines:
            where, why = deploy(path, ladder.data, engine, work, f"{model['name']}-s{seed or 0}", exported)
            if why:
                refused.append({"model": model["name"], "engine": engine, "reason": why})
                print(f"ladder: {model['name']} in {engine}: {why}", file=sys.stderr)
            else:
                deployments.append({"model": model, "engine": engine, "path": where, "checkpoint": path, "seed": seed,
                                    "throughput": [], "latency": []})
    load_before = os.getloadavg()
    for r in range(runs):
        for d in deployments:
            print(f"[ladder] run {r + 1}/{runs}: {d['model']['name']} in {d['engine']}", file=sys.stderr, flush=True)
            d["throughput"].append(timed(d["path"], d["engine"], d["checkpoint"], batch, args.max_sentences))
            d["latency"].append(timed(d["path"], d["engine"], d["checkpoint"], 1, latency_sentences))
    load_after = os.getloadavg()
    rows = []
    for d in deployments:
        model, first = d["model"], d["throughput"][0]
        quality = score(first)
        seeds, deployed_seed = {}, d["seed"]
        for seed, record in model.get("seeds", {}).items():
            if d["engine"] == "fairseq":
                seeds[str(seed)] = record["metrics"][metric]
            elif seed == deployed_seed:
                seeds[str(seed)] = quality[metric]
            else:  # another seed's checkpoint, deployed and run once for its score
                checkpoint = rooted(record["checkpoint"])
                where, why = deploy(checkpoint, ladder.data, d["engine"], work, f"{model['name']}-s{seed}")
                if why is None:
                    seeds[str(seed)] = score(timed(where, d["engine"], checkpoint, batch, args.max_sentences))[metric]
        if not seeds:  # the teacher and the extras: the deployed checkpoint's own score
            seeds[str(deployed_seed or 0)] = quality[metric]
        sps = [x["sentences"] / x["seconds"] for x in d["throughput"]]
        ms = [1000 * x["seconds"] / x["sentences"] for x in d["latency"]]
        rows.append({"model": model["name"], "engine": d["engine"], "deployed_quality": quality[metric],
                     **({"scores": quality} if glue else {"bleu_tok": quality["bleu_tok"]}),
                     "quality_seeds": seeds, "sentences": first["sentences"],
                     "sentences_per_s": statistics.median(sps), "sentences_per_s_runs": sps,
                     "latency_ms": statistics.median(ms), "latency_ms_runs": ms,
                     "peak_memory_mb": statistics.median(x["peak_memory_mb"] for x in d["throughput"]),
                     "size_mb": first["weights_bytes"] / 2**20,
                     "outputs_identical_across_runs": all(x["outputs"] == first["outputs"] for x in d["throughput"]),
                     "time_parts": {"batch": first.get("time_parts"), "one": d["latency"][0].get("time_parts")}})
    in_fairseq = {d["model"]["name"]: d["throughput"][0] for d in deployments if d["engine"] == "fairseq"}
    for row, d in zip(rows, deployments):  # an exported model has no parameter count of its own: its fairseq model's
        reference, first = in_fairseq.get(row["model"], {}), d["throughput"][0]
        row["params"], row["non_embedding_params"] = reference.get("params"), reference.get("non_embedding_params")
        if d["engine"] != "fairseq" and reference and reference["ids"] == first["ids"]:
            pairs = list(zip(first["ids"], reference["outputs"], first["outputs"]))
            same = [abs(a - b) <= ATOL if isinstance(a, float) else a == b for _, a, b in pairs]
            row["identical_to_fairseq"] = sum(same)
            row["first_differences"] = [{"id": i, "fairseq": a, row["engine"]: b}
                                        for (i, a, b), s in zip(pairs, same) if not s][:3]
    entry = {"ladder": ladder.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": measure.machine_description(), "cpu": measure.cpu_name(),
             "command": "python scripts/experiments/ladder.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
             "settings": {"task": ladder.task, "glue_task": ladder.glue_task, "subset": subset, "metric": metric,
                          "batch": batch, "runs": runs, "threads": threads,
                          "latency_sentences": latency_sentences, "beam": None if glue else 5,
                          "max_sentences": args.max_sentences},
             "load_average_before": load_before, "load_average_after": load_after,
             "teacher_sha256": sha256_of(ladder.teacher, teacher=True), "models": described, "rows": rows, "refused": refused}
    os.makedirs(os.path.dirname(ladder.runs_file), exist_ok=True)
    with open(ladder.runs_file, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    import render

    print(render.ladder_table(ladder.store, ladder.path))
    print(f"ladder: {len(rows)} deployments measured, {len(refused)} refused -> "
          f"{os.path.relpath(ladder.runs_file, ROOT)}; the pages: python scripts/experiments/render.py")
    return entry


def plot(ladder, command=None):
    """results/NAME.png from the ladder's latest run: one panel per cost, a series per engine, each point named."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
    import render
    from benchlib import plot_panels

    e = render.ladder_run(ladder.store, ladder)
    if e is None:
        raise SystemExit(f"ladder {ladder.name}: not measured yet (ladder.py measure {os.path.relpath(ladder.path, ROOT)})")
    lost = f"{render.METRIC_NAMES[e['settings']['metric']]} lost vs the fairseq teacher"
    costs = [("speedup", f"speed-up, batch {e['settings']['batch']}", None),
             ("latency_speedup", "speed-up, batch 1", None), ("size_mb", "size MB", "log"),
             ("cost_h", "CPU h to make (records' training)", "log")]
    goal = {"color": "red", "ls": "--", "lw": 0.8}
    panels = []
    for key, label, scale in costs:
        series = []
        for engine in dict.fromkeys(r["engine"] for r in e["rows"]):
            rows = [r for r in e["rows"] if r["engine"] == engine and r[key] is not None and (scale is None or r[key] > 0)]
            if rows:
                series.append({"x": [r["lost"] for r in rows], "y": [r[key] for r in rows], "style": "o",
                               "label": engine, "notes": [r["model"] for r in rows], "note_offset": (4, 2),
                               "note_style": {"fontsize": 7}})
        panels.append({"series": series, "xlabel": lost, "ylabel": label, "yscale": scale, "grid": True,
                       "hlines": [dict(goal, y=ladder.spec.get("goal_speedup", 5.0))] if key == "speedup" else [],
                       "vlines": [dict(goal, x=ladder.spec.get("goal_loss", 0.5))],
                       "legend": {"fontsize": 7} if series else None,
                       "title": None if series else "no records yet", "title_size": 8})
    project = os.path.join(ROOT, "results", "store")  # the project's ladders are drawn in results/, others beside their store
    png = os.path.join(ROOT, "results", f"{ladder.name}.png") if os.path.samefile(ladder.store.root, project) else \
        os.path.join(ladder.store.root, "ladders", f"{ladder.name}.png")
    return plot_panels(png, panels, command=command or e["command"], shape=(2, 2),
                       title=f"{ladder.spec.get('title', ladder.name)}: measured {e['date']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("plan", "measure", "plot"))
    p.add_argument("ladder", help="a ladder file, e.g. grids/ladder_mt.toml")
    p.add_argument("--store", default=None, help="the store (default results/store)")
    p.add_argument("--work", default=None, help="deployed models (default work/ladders/NAME)")
    p.add_argument("--runs", type=int, default=None, help="timed runs (default: the ladder's)")
    p.add_argument("--extra", action="append", metavar="NAME=PATH",
                   help="a checkpoint of your own measured beside the ladder's models (repeatable)")
    p.add_argument("--max-sentences", type=int, default=None, help="throughput and scores on the first N test (GLUE: "
                   "dev) sentences only (a pipeline check: not a ladder)")
    args = p.parse_args(argv)
    ladder = Ladder(args.ladder, args.store)
    if args.action == "plan":
        models, missing = ladder.models(args.extra)
        task = f"glue ({ladder.glue_task})" if ladder.glue_task else ladder.task
        print(f"ladder {ladder.name} ({os.path.relpath(ladder.path, ROOT)}): teacher "
              f"{os.path.relpath(ladder.teacher, ROOT)}, {task}, engines {', '.join(ladder.engines)}")
        for model in models:
            path, _ = deployed_checkpoint(model)
            where = "here" if os.path.exists(path) else "NOT on this machine"
            seeds = f"seeds {', '.join(map(str, model['seeds']))}" if "seeds" in model else "one checkpoint"
            print(f"  {model['name']:<16} {seeds:<16} deploys {os.path.relpath(path, ROOT)} ({where})")
        for name in missing:
            print(f"  {name:<16} no records in the store yet")
    elif args.action == "plot":
        print(plot(ladder) or "no plot (matplotlib is not installed)")
    else:
        run_measure(ladder, args)
        if not args.max_sentences:  # a pipeline check is not a ladder: results/ keeps the ladder's plot
            plot(ladder)


if __name__ == "__main__":
    main()
