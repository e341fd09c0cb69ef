#!/usr/bin/env python
"""The which-method ladders: the students the grids made, each deployed in every engine that takes it, measured alone
in one run; rendered from the store.

    python scripts/experiments/ladder.py plan grids/ladder_mt.toml      # what would be measured, and what is missing
    python scripts/experiments/ladder.py measure grids/ladder_mt.toml   # alone on the machine: no training beside it
    python scripts/experiments/ladder.py measure grids/ladder_glue.toml # GLUE: fairseq and ONNX Runtime fp32/int8

A ladder (grids/ladder_*.toml) names grids; each of their cells with records in the store is a model, with the
teacher and the ladder's [[extra]] checkpoints (and ``--extra NAME=PATH``'s: your own student beside them). A ladder
without grids names its ``teacher`` and ``data`` itself: your own teacher, data and students, e.g.

    name = "mine"
    teacher = "checkpoints/my.fr-en/teacher.pt"
    data = "data-bin/my.fr-en"                # with text/test.raw.<target> for sacreBLEU
    [[extra]]
    name = "pet"
    path = "work/pet-my/kd/checkpoint_best.pt"

A ladder's ``task`` is "translation" or "glue" (by default "glue" where its grids set GLUE_TASK or its data was
prepared by preprocess/prepare_glue.py; the GLUE task itself: ``glue_task``, else theirs). Its metric (``metric``):
sacreBLEU on the test set; for GLUE the task's first metric of user_dir/common/glue_metrics.py's TASK_METRICS (MRPC:
F1, in points) on GLUE's dev set, the report split the grids' records score.

``measure``:
1. deploys every model in each of the ladder's engines: fairseq as trained; for translation CTranslate2 float32 and
   int8 from fc-export's stock checkpoint (user_dir/deploy/export.py, then ct2_engine.convert); for GLUE ONNX Runtime
   fp32 and int8 from fc-export-onnx's graphs (user_dir/deploy/export_onnx.py: checked against fairseq's logits, the
   exported tokenizer checked on the raw text of every dev example); a model an engine refuses is listed with the
   reason (e.g. GhostBERT's depthwise convolutions have no CTranslate2 layer; Variator's plugins no ONNX export);
2. measures, ``runs`` times, every deployment in turn (A B C ... A B C ...: a drifting machine affects all alike) at
   batch ``batch`` over the test set (GLUE: dev; sentences/s) and at batch 1 over its first ``latency_sentences`` (ms
   per sentence), each in its own process (fc-measure's worker; ct2_engine's; ONNX Runtime in fc-measure's worker
   with a fresh session), so every speed ratio comes from one run on one machine; the lowest seed's checkpoint stands
   for its cell; in fairseq, where a translation's time goes (the encoder's forwards, the decoder's steps, the beam
   search around them); each other engine's outputs compared with the same model's in fairseq, example for example
   (CTranslate2's hypotheses string for string, ONNX Runtime's predicted classes; the conversion round trip: float32
   keeps them all);
3. scores every seed of every cell in every engine: the records' scores in fairseq (what the claims test), the other
   engine's own run of each seed's checkpoint otherwise;
4. appends the run to results/store/ladders/NAME.jsonl and draws it (``plot``: again from the store) into
   results/NAME.png: quality lost against the fairseq teacher beside the speed-up (batch ``batch``, batch 1), the size
   and the CPU hours each point took to make (its records' training and compression).
scripts/experiments/render.py renders the latest run with the records' training cost (block NAME, '_' as '-').
"""
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
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
import store as store_lib  # noqa: E402
from grid import Grid, rooted  # noqa: E402
from record import sha256_of  # noqa: E402

# each engine: fairseq (the checkpoint); CTranslate2's compute type; the file of fc-export-onnx's export
ENGINES = {"fairseq": None, "ct2-float32": "float32", "ct2-int8": "int8", "onnx-fp32": "model.onnx",
           "onnx-int8": "model.int8.onnx"}
TASK_ENGINES = {"translation": ["fairseq", "ct2-float32", "ct2-int8"], "glue": ["fairseq", "onnx-fp32", "onnx-int8"]}
ATOL = 1e-4  # a regression head's score equal to fairseq's: within fc-export-onnx's --atol
# the stages whose cost is making the model (not scoring it)
SCORING_STAGES = ("measure", "cost")


class Ladder:
    def __init__(self, path, store=None):
        with open(path, "rb") as f:
            spec = tomllib.load(f)
        self.path, self.spec = path, spec
        self.name = spec.get("name") or os.path.splitext(os.path.basename(path))[0]
        self.store = store_lib.Store(store or os.path.join(ROOT, "results", "store"))
        self.grids = [Grid(rooted(g), store=self.store.root) for g in spec.get("grids", [])]
        if not self.grids and not ("teacher" in spec and "data" in spec):
            raise SystemExit(f"ladder {path}: no grids = [...], nor a teacher = and data = of its own")
        teachers = {g.teacher for g in self.grids} or {rooted(spec["teacher"])}
        datas = {g.inputs.get("DATA") for g in self.grids} or {rooted(spec["data"])}
        if len(teachers) != 1 or len(datas) != 1:
            raise SystemExit(f"ladder {path}: its grids have other teachers or data ({teachers}, {datas})")
        (self.teacher,), (self.data,) = teachers, datas
        self.glue_task = glue_task_of(path, spec, self.grids, self.data)
        self.task = spec.get("task") or ("glue" if self.glue_task else "translation")
        if self.task not in TASK_ENGINES or (self.task == "glue") != bool(self.glue_task):
            raise SystemExit(f"ladder {path}: task = {self.task!r}: 'translation', or 'glue' with its GLUE task (its "
                             "grids' GLUE_TASK, its data's, or glue_task = \"MRPC\")")
        self.engines = spec.get("engines", TASK_ENGINES[self.task])
        unknown = set(self.engines) - set(TASK_ENGINES[self.task])
        if unknown:
            raise SystemExit(f"ladder {path}: engines {sorted(unknown)}: a {self.task} ladder's are "
                             f"{', '.join(TASK_ENGINES[self.task])}")
        if self.grids and ({"teacher", "data"} & set(spec)):
            raise SystemExit(f"ladder {path}: a ladder with grids takes their teacher and data, not its own")
        for extra in spec.get("extra", []):
            for field in ("name", "path"):
                if field not in extra:
                    raise SystemExit(f"ladder {path}: an [[extra]] has no '{field}'")

    @property
    def runs_file(self):
        return os.path.join(self.store.root, "ladders", f"{self.name}.jsonl")

    def models(self):
        """[{name, grid, cell, seeds: {seed: record}}] for every cell with current records, then the extras; and the
        cells without any."""
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
        return models, missing


def glue_task_of(path, spec, grids, data):
    """The GLUE task a ladder scores (None: translation): its own ``glue_task``, its grids' GLUE_TASK, or the task its
    data was prepared for (preprocess/prepare_glue.py's .prepared.json)."""
    named = {c.variables["GLUE_TASK"] for g in grids for c in g.cells if "GLUE_TASK" in c.variables}
    if "glue_task" in spec:
        named = {spec["glue_task"]}
    elif not named and os.path.isfile(os.path.join(data, ".prepared.json")):
        with open(os.path.join(data, ".prepared.json")) as f:
            config = json.load(f)["config"]
        named = {config["task"]} if "glue_dir" in config else set()
    if len(named) > 1:
        raise SystemExit(f"ladder {path}: its grids score other GLUE tasks ({sorted(named)})")
    return next(iter(named), None)


def deployed_checkpoint(model):
    """The checkpoint that stands for the model (its lowest seed's) and that seed."""
    if "path" in model:
        return model["path"], None
    seed = min(model["seeds"])
    return rooted(model["seeds"][seed]["checkpoint"]), seed


def made_from(target, source):
    """Whether ``target`` exists and was written after ``source`` (a deployment of an older checkpoint under the same
    label is made again)."""
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


def measure_one(spec, engine, checkpoint=None):
    """fc-measure's worker result for a deployment (``checkpoint``: the checkpoint an ONNX graph was exported from)."""
    from user_dir.deploy import ct2_engine, export_onnx
    from user_dir.tools import measure

    if ENGINES[engine] is None:  # with the encoder's, the decoder's and the search's shares of a translation's time
        return measure._run_worker(dict(spec, engine="fairseq", profile=True))
    if engine.startswith("onnx-"):
        return export_onnx.measure(dict(spec, checkpoint=checkpoint))
    return ct2_engine.measure(dict(spec, compute_type=ENGINES[engine]))


def scorer(ladder):
    """(the subset scored, the ladder's metric, a function of a worker's result to its scores): sacreBLEU and BLEU
    (tok) of the test set against its raw references (translation); the GLUE task's metrics of GLUE's dev set, the
    task's first by default."""
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
    raw_reference = os.path.join(text, raw[0])
    return "test", ladder.spec.get("metric", "sacrebleu"), lambda out: measure.translation_scores(
        out["outputs"], out["references"], out["ids"], out["target_lang"], raw_reference)


def same_output(a, b):
    """An output equal to fairseq's: a hypothesis or a class exactly, a regression head's score within ATOL."""
    return abs(a - b) <= ATOL if isinstance(a, float) else a == b


def run_measure(ladder, args):
    from user_dir.tools import measure

    spec = ladder.spec
    engines = ladder.engines
    runs = args.runs or spec.get("runs", 3)
    threads = spec.get("threads", 1)
    glue = ladder.task == "glue"
    subset, metric, score = scorer(ladder)
    models, missing = ladder.models()
    models += extras(args.extra)
    if missing:
        print(f"ladder: no records yet for {', '.join(missing)} (measured without them)", file=sys.stderr)
    work = os.path.abspath(args.work or os.path.join(ROOT, "work", "ladders", ladder.name))
    os.makedirs(work, exist_ok=True)
    teacher = {"name": "teacher", "path": ladder.teacher, "about": "the grids' teacher"}
    base = {"data": ladder.data, "subset": subset, "beam": 5, "lenpen": 1.0, "max_len_a": 0, "max_len_b": 200,
            "post_process": "subword_nmt", "classification_head": "sentence_classification_head" if glue else None,
            "threads": threads, "cpu": True, "fp16": False}
    deployments, refused, described = [], [], []
    for model in [teacher] + models:
        path, seed = deployed_checkpoint(model)
        if not os.path.exists(path):
            raise SystemExit(f"ladder: {model['name']}'s checkpoint {path} is not on this machine: measure where its "
                             "cells ran (their work folders hold the checkpoints), or run the cells again here")
        exported = {}
        described.append({"name": model["name"], "grid": model.get("grid"), "checkpoint": os.path.relpath(path, ROOT),
                          "sha256": sha256_of(path), "deployed_seed": seed, "about": model.get("about", ""),
                          "records": {str(s): r["key"] for s, r in model.get("seeds", {}).items()},
                          "export": exported})
        for engine in engines:
            where, why = deploy(path, ladder.data, engine, work, f"{model['name']}-s{seed or 0}", exported)
            if why:
                refused.append({"model": model["name"], "engine": engine, "reason": why})
                print(f"ladder: {model['name']} in {engine}: {why}", file=sys.stderr)
            else:
                deployments.append({"model": model, "engine": engine, "path": where, "checkpoint": path,
                                    "throughput": [], "latency": []})
    load_before = os.getloadavg()
    for r in range(runs):
        for d in deployments:
            print(f"[ladder] run {r + 1}/{runs}: {d['model']['name']} in {d['engine']}", file=sys.stderr, flush=True)
            d["throughput"].append(measure_one(dict(base, path=d["path"], batch_size=spec.get("batch", 64),
                                                    max_sentences=args.max_sentences), d["engine"], d["checkpoint"]))
            d["latency"].append(measure_one(dict(base, path=d["path"], batch_size=1,
                                                 max_sentences=spec.get("latency_sentences", 100)), d["engine"],
                                            d["checkpoint"]))
    load_after = os.getloadavg()
    rows = []
    fairseq_params = {}
    for d in deployments:
        model, first = d["model"], d["throughput"][0]
        quality = score(first)
        seeds = {}
        _, deployed_seed = deployed_checkpoint(model)
        for seed, record in model.get("seeds", {}).items():
            if d["engine"] == "fairseq":
                seeds[str(seed)] = record["metrics"][metric]
            elif seed == deployed_seed:
                seeds[str(seed)] = quality[metric]
            else:  # another seed's checkpoint, deployed and run once for its score
                checkpoint = rooted(record["checkpoint"])
                where, why = deploy(checkpoint, ladder.data, d["engine"], work, f"{model['name']}-s{seed}")
                if why is None:
                    out = measure_one(dict(base, path=where, batch_size=spec.get("batch", 64),
                                           max_sentences=args.max_sentences), d["engine"], checkpoint)
                    seeds[str(seed)] = score(out)[metric]
        if not seeds:  # the teacher and the extras: the deployed checkpoint's own score
            seeds[str(deployed_seed or 0)] = quality[metric]
        if d["engine"] == "fairseq":
            fairseq_params[model["name"]] = (first.get("params"), first.get("non_embedding_params"))
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
        row["params"], row["non_embedding_params"] = fairseq_params.get(row["model"], (None, None))
        reference, first = in_fairseq.get(row["model"]), d["throughput"][0]
        if d["engine"] != "fairseq" and reference is not None and reference["ids"] == first["ids"]:
            pairs = list(zip(first["ids"], reference["outputs"], first["outputs"]))
            row["identical_to_fairseq"] = sum(same_output(a, b) for _, a, b in pairs)
            row["first_differences"] = [{"id": i, "fairseq": a, row["engine"]: b} for i, a, b in pairs
                                        if not same_output(a, b)][:3]
    entry = {"ladder": ladder.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": measure.machine_description(), "cpu": measure.cpu_name(),
             "command": "python scripts/experiments/ladder.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
             "settings": {"task": ladder.task, "glue_task": ladder.glue_task, "subset": subset, "metric": metric,
                          "batch": spec.get("batch", 64), "runs": runs, "threads": threads,
                          "latency_sentences": spec.get("latency_sentences", 100), "beam": None if glue else 5,
                          "max_sentences": args.max_sentences},
             "load_average_before": load_before, "load_average_after": load_after,
             "teacher_sha256": sha256_of(ladder.teacher), "models": described, "rows": rows, "refused": refused}
    os.makedirs(os.path.dirname(ladder.runs_file), exist_ok=True)
    with open(ladder.runs_file, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    import render

    print(render.ladder_table(ladder.store, ladder.path))
    print(f"ladder: {len(rows)} deployments measured, {len(refused)} refused -> "
          f"{os.path.relpath(ladder.runs_file, ROOT)}; the pages: python scripts/experiments/render.py")
    return entry


def extras(values):
    """[model] of ``--extra NAME=PATH`` flags."""
    out = []
    for value in values or []:
        name, _, path = value.partition("=")
        if not name or not path:
            raise SystemExit(f"ladder: --extra {value}: NAME=PATH, e.g. --extra mine=work/pet-my/kd/checkpoint_best.pt")
        if not os.path.isfile(rooted(path)):
            raise SystemExit(f"ladder: --extra {value}: no checkpoint {path}")
        out.append({"name": name, "path": rooted(path), "about": f"--extra {value}"})
    return out


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
    panels = []
    for key, label, scale in costs:
        series = []
        for engine in dict.fromkeys(r["engine"] for r in e["rows"]):
            rows = [r for r in e["rows"] if r["engine"] == engine and r[key] is not None and (scale is None or r[key] > 0)]
            if rows:
                series.append({"x": [r["lost"] for r in rows], "y": [r[key] for r in rows], "style": "o",
                               "label": engine, "notes": [r["model"] for r in rows], "note_offset": (4, 2),
                               "note_style": {"fontsize": 7}})
        goal = [{"y": ladder.spec.get("goal_speedup", 5.0), "color": "red", "ls": "--", "lw": 0.8}] \
            if key == "speedup" else []
        panels.append({"series": series, "hlines": goal, "xlabel": lost, "ylabel": label, "yscale": scale, "grid": True,
                       "legend": {"fontsize": 7} if series else None, "vlines": [{"x": ladder.spec.get("goal_loss", 0.5), "color": "red", "ls": "--", "lw": 0.8}],
                       "title": None if series else "no records yet", "title_size": 8})
    project = os.path.join(ROOT, "results", "store")  # the project's ladders are drawn in results/, others beside their store
    png = os.path.join(ROOT, "results", f"{ladder.name}.png") if os.path.samefile(ladder.store.root, project) else \
        os.path.join(ladder.store.root, "ladders", f"{ladder.name}.png")
    return plot_panels(png, panels, command=command or e["command"], shape=(2, 2),
                       title=f"{ladder.spec.get('title', ladder.name)}: measured {e['date']}")


def run_plan(ladder, args):
    models, missing = ladder.models()
    models += extras(args.extra)
    task = f"glue ({ladder.glue_task})" if ladder.glue_task else ladder.task
    print(f"ladder {ladder.name} ({os.path.relpath(ladder.path, ROOT)}): teacher "
          f"{os.path.relpath(ladder.teacher, ROOT)}, {task}, engines {', '.join(ladder.engines)}")
    for model in models:
        path, seed = deployed_checkpoint(model)
        where = "here" if os.path.exists(path) else "NOT on this machine"
        seeds = f"seeds {', '.join(map(str, model['seeds']))}" if "seeds" in model else "one checkpoint"
        print(f"  {model['name']:<16} {seeds:<16} deploys {os.path.relpath(path, ROOT)} ({where})")
    for name in missing:
        print(f"  {name:<16} no records in the store yet")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("plan", "measure", "plot"))
    p.add_argument("ladder", help="a ladder file, e.g. grids/ladder_mt.toml")
    p.add_argument("--store", default=None, help="the store (default results/store)")
    p.add_argument("--work", default=None, help="deployed models (default work/ladders/NAME)")
    p.add_argument("--runs", type=int, default=None, help="timed runs (default: the ladder's)")
    p.add_argument("--extra", action="append", metavar="NAME=PATH",
                   help="a checkpoint of your own measured beside the ladder's models (repeatable)")
    p.add_argument("--max-sentences", type=int, default=None,
                   help="throughput and scores on the first N test (GLUE: dev) sentences only (a pipeline check: not "
                        "a ladder)")
    args = p.parse_args(argv)
    ladder = Ladder(args.ladder, args.store)
    if args.action == "plan":
        run_plan(ladder, args)
    elif args.action == "plot":
        print(plot(ladder) or "no plot (matplotlib is not installed)")
    else:
        run_measure(ladder, args)
        if not args.max_sentences:  # a pipeline check is not a ladder: results/ keeps the ladder's plot
            plot(ladder)


if __name__ == "__main__":
    main()
