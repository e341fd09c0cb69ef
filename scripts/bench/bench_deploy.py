#!/usr/bin/env python
"""What serving a compressed model gives: the teacher and a PET student, each in fairseq (fp32)
and in CTranslate2 (float32 and int8 weights), measured in one run -> results/deploy.md + .json.

    python scripts/bench/bench_deploy.py --student work/deploy-pet/kd/checkpoint_best.pt \\
        --data work/deploy-pet/data-bin --raw-reference work/deploy-pet/data-bin/text/test.raw.en
    python scripts/bench/bench_deploy.py     # the shipped teacher and PET student, the data-bin built from the embedded text

Steps: the student goes through fc-export (user_dir/deploy/export.py) into a stock checkpoint;
the teacher (already stock) and the export are converted by CTranslate2's own fairseq converter
(user_dir/deploy/ct2_engine.py) to float32 and int8. Then, ``--runs`` times, every row is measured in
turn (A B C ... A B C ...: a drifting machine affects all rows alike), each in a fresh process:
fairseq rows by fc-measure's worker (user_dir/tools/measure.py), CTranslate2 rows by ct2_engine's
(a process importing only ctranslate2), on the same batches (fairseq's length-sorted order, a fixed
``--batch-size``), beam ``--beam``, one warm-up batch excluded. BLEU comes from the first run, scored
by measure.translation_scores for every engine. The CTranslate2 float32 rows' hypotheses are compared
with fairseq's string for string (the conversion round trip).

A CPU benchmark by design (no ``--device``): ct2_engine decodes on the CPU, where CTranslate2's int8 weights
are what a deployment gains, so every row runs there (fc-measure's worker with ``cpu`` set).
"""
import argparse
import json
import os
import shlex
import statistics
import sys
import time

from benchlib import ROOT, SHIPPED_TEACHER, SHIPPED_TEACHER_DIR, multi30k_data_bin


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher", default=SHIPPED_TEACHER,
                   help="the teacher checkpoint (default: the reference teacher, shipped in "
                        "checkpoints/multi30k.de-en)")
    p.add_argument("--student", default=os.path.join(SHIPPED_TEACHER_DIR, "pet_student.pt"),
                   help="the trained PET student, a plug-in checkpoint (default: the shipped full-recipe student)")
    p.add_argument("--data", default=None,
                   help="data-bin with the test subset and dictionaries (default: the shipped teacher's, built once "
                        "from the embedded Multi30k, work/data-bin/multi30k.de-en; its text/test.raw.en the "
                        "--raw-reference)")
    p.add_argument("--render", default=None, help="only write --out again from this raw JSON of an earlier run")
    p.add_argument("--raw-reference", default=None, help="untokenised references for sacreBLEU (as fc-measure)")
    p.add_argument("--work", default=os.path.join(ROOT, "work", "deploy"), help="exported and converted models")
    p.add_argument("--runs", type=int, default=3, help="timed runs per row (median and range reported; default 3)")
    p.add_argument("--threads", type=int, default=2, help="threads per engine: torch threads / CTranslate2 "
                                                          "intra_threads (default 2, this machine's cores)")
    p.add_argument("--batch-size", type=int, default=128, help="sentences per batch, fixed (default 128)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument("--max-sentences", type=int, default=None, help="only sentence ids below N (quick checks)")
    p.add_argument("--student-recipe", default="", help="how the student was trained (one line, for the table)")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "deploy.md"), help="Markdown table")
    p.add_argument("--json", default=None, help="raw numbers (default: --out with .json)")
    return p


def load_average():
    try:
        return os.getloadavg()
    except OSError:
        return None


def main(argv=None):
    args = get_parser().parse_args(argv)
    if args.render:
        with open(args.render) as f:
            text = format_report(json.load(f))
        with open(args.out, "w") as f:
            f.write(text)
        return text
    for flag, path in (("--teacher", args.teacher), ("--student", args.student)):
        if not os.path.isfile(path):
            raise SystemExit(f"{flag} {path}: no such checkpoint")
    if args.data is None:
        args.data = multi30k_data_bin()
        args.raw_reference = args.raw_reference or os.path.join(args.data, "text", "test.raw.en")
    if not os.path.isdir(args.data):
        raise SystemExit(f"--data {args.data}: no such directory")
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (the table reports the spread over runs)")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["MKL_NUM_THREADS"] = str(args.threads)

    from user_dir.deploy import ct2_engine, export
    from user_dir.tools import measure

    os.makedirs(args.work, exist_ok=True)
    plain = os.path.join(args.work, "pet_plain.pt")
    exported = export.export(args.student, plain)
    print(f"[deploy] exported {args.student} -> {plain}", file=sys.stderr, flush=True)
    converted = {}
    for name, path in (("teacher", args.teacher), ("pet", plain)):
        for quantization in ("float32", "int8"):
            out = os.path.join(args.work, f"{name}-ct2-{quantization}")
            converted[name, quantization] = ct2_engine.convert(path, args.data, out, quantization)
    print("[deploy] converted", file=sys.stderr, flush=True)

    # (row name, model, engine, weights, path)
    rows = [("teacher / fairseq", "teacher", "fairseq", "fp32", args.teacher),
            ("teacher / CT2 float32", "teacher", "ctranslate2", "float32", converted["teacher", "float32"]),
            ("teacher / CT2 int8", "teacher", "ctranslate2", "int8", converted["teacher", "int8"]),
            ("PET shared / fairseq + plug-in", "pet", "fairseq", "fp32", args.student),
            ("PET exported / fairseq", "pet", "fairseq", "fp32", plain),
            ("PET / CT2 float32", "pet", "ctranslate2", "float32", converted["pet", "float32"]),
            ("PET / CT2 int8", "pet", "ctranslate2", "int8", converted["pet", "int8"])]
    base = {"data": os.path.abspath(args.data), "subset": "test", "beam": args.beam, "lenpen": 1.0, "max_len_a": 0,
            "max_len_b": 200, "batch_size": args.batch_size, "post_process": "subword_nmt",
            "classification_head": None, "max_sentences": args.max_sentences, "threads": args.threads,
            "cpu": True, "fp16": False}
    load_before = load_average()
    results = {name: [] for name, *_ in rows}
    for r in range(args.runs):
        for name, _, engine, weights, path in rows:
            print(f"[deploy] run {r + 1}/{args.runs}: {name}", file=sys.stderr, flush=True)
            spec = dict(base, path=os.path.abspath(path))
            if engine == "fairseq":
                results[name].append(measure._run_worker(spec))
            else:
                results[name].append(ct2_engine.measure(dict(spec, compute_type=weights)))
    load_after = load_average()

    table = []
    fairseq_first = {"teacher": results["teacher / fairseq"][0], "pet": results["PET shared / fairseq + plug-in"][0]}
    for name, model, engine, weights, path in rows:
        runs = results[name]
        first = runs[0]
        quality = measure.translation_scores(first["outputs"], first["references"], first["ids"], first["target_lang"],
                                             args.raw_reference)
        sps = [x["sentences"] / x["seconds"] for x in runs]
        tps = [x["tokens"] / x["seconds"] for x in runs]
        ref = fairseq_first[model]
        same = sum(a == b for a, b in zip(first["outputs"], ref["outputs"])) if first["ids"] == ref["ids"] else None
        differing = [{"id": i, "fairseq": b, name: a} for i, a, b in zip(first["ids"], first["outputs"], ref["outputs"])
                     if a != b][:5]
        size = os.path.getsize(path) if os.path.isfile(path) else ct2_engine.model_bytes(path)
        table.append({
            "row": name, "model": model, "engine": engine, "weights": weights, "path": path, **quality,
            "sentences": first["sentences"], "size_mb": size / 2**20,
            "sentences_per_s": statistics.median(sps), "sentences_per_s_runs": sps,
            "tokens_per_s": statistics.median(tps), "tokens_per_s_runs": tps,
            "peak_memory_mb": statistics.median(x["peak_memory_mb"] for x in runs),
            "peak_memory_mb_runs": [x["peak_memory_mb"] for x in runs],
            "identical_to_fairseq": same, "first_differences": differing,
            "outputs_identical_across_runs": all(x["outputs"] == first["outputs"] for x in runs),
        })
    teacher_speed = table[0]["sentences_per_s"]
    for row in table:
        row["speedup_vs_fairseq_teacher"] = row["sentences_per_s"] / teacher_speed
    by = {row["row"]: row for row in table}
    goals = {
        "pet_ct2_int8_speedup_vs_fairseq_teacher": by["PET / CT2 int8"]["speedup_vs_fairseq_teacher"],
        "pet_ct2_int8_bleu_minus_pet_fairseq": by["PET / CT2 int8"]["bleu_tok"] - by["PET shared / fairseq + plug-in"]["bleu_tok"],
        "pet_vs_teacher_in_ct2_int8": by["PET / CT2 int8"]["sentences_per_s"] / by["teacher / CT2 int8"]["sentences_per_s"],
        "pet_vs_teacher_in_ct2_float32": by["PET / CT2 float32"]["sentences_per_s"] / by["teacher / CT2 float32"]["sentences_per_s"],
        "pet_vs_teacher_in_fairseq": by["PET shared / fairseq + plug-in"]["sentences_per_s"] / teacher_speed,
    }
    import ctranslate2

    report = {"command": "python scripts/bench/bench_deploy.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
              "machine": measure.machine_description(), "ctranslate2": ctranslate2.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
              "batch_size": args.batch_size, "beam": args.beam, "runs": args.runs,
              "load_average_before": load_before, "load_average_after": load_after,
              "student": args.student, "student_recipe": args.student_recipe, "export": exported,
              "goals": goals, "rows": table}
    text = format_report(report)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(args.json or os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(report, f, indent=1)
    return report


def format_report(rep: dict) -> str:
    head = ["model / engine", "weights", "BLEU (tok)", "sacreBLEU", "size on disk MB", "sent/s (median; range)",
            "tok/s", "speed-up vs fairseq teacher", "peak MB", "hypotheses = fairseq's"]
    lines = ["# Deployment: fairseq and CTranslate2, teacher and PET student (Multi30k DE->EN)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rep["rows"]:
        same = "-" if r["engine"] == "fairseq" and r["row"].startswith(("teacher", "PET shared")) else \
            (f"{r['identical_to_fairseq']}/{r['sentences']}" if r["identical_to_fairseq"] is not None else "n/a")
        spread = f"{r['sentences_per_s']:.1f}; {min(r['sentences_per_s_runs']):.1f}-{max(r['sentences_per_s_runs']):.1f}"
        lines.append("| " + " | ".join([
            r["row"], r["weights"], f"{r['bleu_tok']:.2f}", f"{r['sacrebleu']:.2f}", f"{r['size_mb']:.1f}", spread,
            f"{r['tokens_per_s']:.0f}", f"{r['speedup_vs_fairseq_teacher']:.2f}x", f"{r['peak_memory_mb']:.0f}",
            same]) + " |")
    g, e = rep["goals"], rep["export"]
    lines += [
        "",
        f"Test set: {rep['rows'][0]['sentences']} sentences, beam {rep['beam']}, batch {rep['batch_size']} sentences "
        f"(fairseq's length-sorted order, the same batches in both engines), {rep['threads']} threads per engine "
        f"(torch threads / CTranslate2 intra_threads, 1 translator); speed: median and range over {rep['runs']} runs, "
        "one warm-up batch excluded, rows measured in turn within each run. Peak MB: the peak RSS of the measuring "
        "process (fairseq: torch + fairseq + the test set; CTranslate2: a process importing only ctranslate2, "
        "given the source tokens). Size on disk: the checkpoint file (fairseq) or the converted model directory "
        "(CTranslate2). BLEU as fc-measure scores it (tokenised BLEU on the BPE-removed output; sacreBLEU on "
        "Moses-detokenised output against the raw references), for both engines. Last column: hypotheses equal "
        "string for string to the same model's fairseq output (the shared PET student's for PET rows).",
        "",
        "Goals of issue 22 (computed): PET in CTranslate2 int8 at "
        f"{g['pet_ct2_int8_speedup_vs_fairseq_teacher']:.2f}x the fairseq teacher's sentences/s (goal >= 4x: "
        f"{'met' if g['pet_ct2_int8_speedup_vs_fairseq_teacher'] >= 4 else 'not met'}); its BLEU (tok) "
        f"{g['pet_ct2_int8_bleu_minus_pet_fairseq']:+.2f} against PET in fairseq (goal within 0.3: "
        f"{'met' if abs(g['pet_ct2_int8_bleu_minus_pet_fairseq']) <= 0.3 else 'not met'}). What compression alone "
        f"brings: PET / teacher sentences/s = {g['pet_vs_teacher_in_fairseq']:.2f}x in fairseq, "
        f"{g['pet_vs_teacher_in_ct2_float32']:.2f}x in CTranslate2 float32, {g['pet_vs_teacher_in_ct2_int8']:.2f}x in "
        "CTranslate2 int8.",
        "",
        f"Export (fc-export): {e['arch']} -> {e['stock_arch']}, parameters {e['params_student']:,} shared -> "
        f"{e['params_export']:,} materialised (non-embedding {e['non_embedding_student']:,} -> "
        f"{e['non_embedding_export']:,}); checkpoint file {e['bytes_student'] / 2**20:.1f} MB (with optimizer state) "
        f"-> {e['bytes_export'] / 2**20:.1f} MB; outputs of the two models agree to {e['max_abs_diff']:.1e}.",
        "",
        f"Student: `{rep['student']}`" + (f" ({rep['student_recipe']})" if rep["student_recipe"] else "") + ".",
        f"Machine: {rep['machine']}; CTranslate2 {rep['ctranslate2']}. Load average (1, 5, 15 min) before: "
        f"{_load(rep['load_average_before'])}, after: {_load(rep['load_average_after'])} (the machine was shared "
        "with other jobs: absolute speeds are low and noisy; rows measured in turn share the load alike).",
        f"Date: {rep['date']}.", "", "Command:", "```", rep["command"], "```", ""]
    diffs = [(r["row"], d) for r in rep["rows"] for d in r["first_differences"] if r["weights"] == "float32"]
    if diffs:
        lines += ["First hypotheses where CTranslate2 float32 differs from fairseq:", ""]
        lines += [f"- {row}, sentence {d['id']}: fairseq `{d['fairseq']}` / CT2 `{d[row]}`" for row, d in diffs]
        lines.append("")
    return "\n".join(lines)


def _load(value):
    return "n/a" if value is None else ", ".join(f"{v:.1f}" for v in value)


if __name__ == "__main__":
    main()
