#!/usr/bin/env python
"""The table of scripts/maint/gpu_check.sh, written from its work folder: one row per (method, step,
precision) with finished, final loss, finite and seconds, plus the machine and the versions.

    python scripts/maint/gpu_check_report.py work/gpu_check --out work/gpu_check/gpu_check.md \
        --command "bash scripts/maint/gpu_check.sh" --device cuda

A row is a folder ``WORK/rows/PRECISION/METHOD/STEP/`` that gpu_check.sh fills: ``kind`` (train,
tool, generate, ct2), and once run ``command``, ``log``, ``rc``, ``seconds``, ``checkpoint`` (the file
the step saved), or ``skipped`` (why it was not run). Read from them:

* finished: exit status 0, else "no" and the error's last line (the exception line of a traceback);
* train loss: the ``loss`` of the last ``train_inner`` line (the last update), valid loss: the last
  ``valid on 'valid' subset`` line;
* finite: every loss the log holds (train_inner, train, valid) is a finite number and fairseq did not
  give up on the loss scale, and every floating tensor of the saved checkpoint's weights is finite; for
  translations, every hypothesis score is finite;
* translations: BLEU of the hypotheses against the references (sacrebleu on fairseq's tokenised,
  BPE-removed text, ``tokenize="none"``: the same measure for fairseq-generate and CTranslate2).

A row not run has a reason: skipped (why), an earlier step of its chain failed, or it is still to run
(the check's time budget ended first; the same command continues). Exit status 3 then, else 0.
"""
import argparse
import datetime
import glob
import importlib.metadata
import math
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METHODS = ["pet", "word-kd", "patient-kd", "can", "variator", "ghost", "apc"]
PRECISIONS = ["fp32", "fp16", "bf16", "bf16-notpu", "amp", "memory-efficient-fp16"]
PRECISION_FLAGS = {"fp32": "(none)", "fp16": "--fp16", "bf16": "--bf16",
                   "bf16-notpu": "--bf16 through fc-train-bf16 (user_dir/tools/train_bf16.py: fairseq's implied --tpu undone)",
                   "amp": "--amp", "memory-efficient-fp16": "--memory-efficient-fp16"}
# fairseq's log lines ("| train_inner | epoch 001: ... loss=12.3, ..."; "| valid | ... | loss 9.6 | ...")
INNER_LOSS = re.compile(r"\btrain_inner\b.*?\bloss=([^,\s]+)")
EPOCH_LOSS = re.compile(r"\btrain\b[ |:]+epoch \d+ \| loss ([^\s|]+)")
VALID_LOSS = re.compile(r"valid on '[^']*' subset \| loss ([^\s|]+)")
GAVE_UP = ("Minimum loss scale reached", "FloatingPointError")
ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit|Interrupt)\b|error:|ERROR\b)")
# causes recognised in a failed row's log, said once under the table
KNOWN_CAUSES = [
    ("get_tpu_device", "fairseq 0.12's `--bf16` implies `--tpu` (fairseq/options.py: `if args.bf16: args.tpu = True`), "
                       "so its Trainer asks torch_xla for a device instead of using CUDA or the CPU"),
    ("fairseq 0.12 turns --bf16 into --tpu", "the plug-in refuses stock `--bf16` where torch_xla is absent (fairseq 0.12 "
                                             "makes it `--tpu`), naming fc-train-bf16: the bf16-notpu rows"),
]


def read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def float_or_nan(text):
    try:
        return float(text)
    except ValueError:
        return float("nan")


def error_line(log):
    """The error's last line: the last exception line of the log, else its last non-empty line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else "(empty log)"


def log_losses(log):
    """(last update's loss, last validation loss, every loss the log holds)."""
    inner = [float_or_nan(v) for v in INNER_LOSS.findall(log)]
    valid = [float_or_nan(v) for v in VALID_LOSS.findall(log)]
    epoch = [float_or_nan(v) for v in EPOCH_LOSS.findall(log)]
    return (inner[-1] if inner else None), (valid[-1] if valid else None), inner + valid + epoch


def weights_check(path):
    """(finite?, what was seen) for the floating tensors of a checkpoint's weights."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(state, dict):
        state = state.get("model", state.get("state_dict", state))
    tensors = {k: v for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point()}
    if not tensors:
        return False, "no floating tensors"
    bad = [k for k, v in tensors.items() if not torch.isfinite(v.float()).all()]
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in tensors.values()})
    if bad:
        return False, f"{len(bad)} of {len(tensors)} tensors non-finite (first: {bad[0]})"
    return True, f"{len(tensors)} tensors, {'/'.join(dtypes)}"


def translations(log):
    """(ids, hypotheses, scores, references) from fairseq-generate's S/T/H lines."""
    hyps, refs = {}, {}
    for line in log.splitlines():
        parts = line.split("\t")
        if line.startswith("H-") and len(parts) >= 2:
            hyps[parts[0][2:]] = (float_or_nan(parts[1]), parts[2] if len(parts) > 2 else "")
        elif line.startswith("T-") and len(parts) >= 1:
            refs[parts[0][2:]] = parts[1] if len(parts) > 1 else ""
    ids = sorted(hyps, key=lambda i: int(i) if i.isdigit() else i)
    return ids, [hyps[i][1] for i in ids], [hyps[i][0] for i in ids], [refs.get(i, "") for i in ids]


def bleu(hypotheses, references):
    try:
        import sacrebleu
    except ImportError:
        return None
    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score


def read_row(folder):
    precision, method, step = folder.split(os.sep)[-3:]
    row = {"precision": precision, "method": method, "step": step.split("-", 1)[-1], "order": step,
           "kind": (read(os.path.join(folder, "kind"), "") or "").strip(), "folder": folder,
           "command": (read(os.path.join(folder, "command"), "") or "").strip(),
           "train_loss": None, "valid_loss": None, "finite": None, "finite_detail": "", "seconds": None, "notes": []}
    skipped = read(os.path.join(folder, "skipped"))
    rc = read(os.path.join(folder, "rc"))
    if skipped is not None:
        row["status"], row["finished"] = "skipped", f"skipped: {skipped.strip()}"
        return row
    if rc is None:
        row["status"], row["finished"] = "not run", "not run"
        return row
    rc = int(rc.strip() or 1)
    log = read(os.path.join(folder, "log"), "")
    row["seconds"] = float_or_nan((read(os.path.join(folder, "seconds"), "nan") or "nan").strip())
    row["status"] = "finished" if rc == 0 else "failed"
    row["finished"] = "yes" if rc == 0 else f"no: {error_line(log)}"
    row["causes"] = [cause for pattern, cause in KNOWN_CAUSES if rc != 0 and pattern in log]
    checks, problems = [], []
    if row["kind"] == "train":
        row["train_loss"], row["valid_loss"], losses = log_losses(log)
        if losses:
            checks.append("log")
            bad = [v for v in losses if not math.isfinite(v)]
            if bad:
                problems.append(f"log: {len(bad)} of {len(losses)} losses non-finite")
        elif rc == 0:
            problems.append("log: no loss logged")
        if any(marker in log for marker in GAVE_UP):
            problems.append("log: " + next(marker for marker in GAVE_UP if marker in log))
        overflows = log.count("gradient overflow detected")
        if overflows:
            row["notes"].append(f"{overflows} loss-scale overflow(s) skipped")
    if row["kind"] in ("generate", "ct2") and rc == 0:
        ids, hyps, scores, refs = translations(log)
        checks.append("scores")
        if not ids:
            problems.append("no translations")
        elif not all(math.isfinite(s) for s in scores):
            problems.append(f"scores: {sum(not math.isfinite(s) for s in scores)} of {len(ids)} non-finite")
        score = bleu(hyps, refs) if ids else None
        row["notes"].append(f"{len(ids)} sentences" + (f", BLEU {score:.2f}" if score is not None else ""))
        engine = re.search(r"^ctranslate2 \S+ on .*$", log, re.M)
        if engine:
            row["notes"].append(engine.group(0))
    checkpoint = (read(os.path.join(folder, "checkpoint"), "") or "").strip()
    if rc == 0 and checkpoint:
        path = checkpoint if os.path.isabs(checkpoint) else os.path.join(ROOT, checkpoint)
        if os.path.isfile(path):
            ok, seen = weights_check(path)
            checks.append("weights")
            row["notes"].append(f"weights: {seen}")
            if not ok:
                problems.append(f"weights: {seen}")
        else:
            problems.append(f"weights: no {checkpoint}")
    if checks or problems:
        row["finite"] = not problems
        row["finite_detail"] = ("yes (" + ", ".join(checks) + ")") if not problems else "no: " + "; ".join(problems)
    return row


def read_rows(work):
    rows = [read_row(os.path.dirname(k)) for k in glob.glob(os.path.join(work, "rows", "*", "*", "*", "kind"))]
    rows.sort(key=lambda r: (METHODS.index(r["method"]) if r["method"] in METHODS else len(METHODS), r["method"],
                             r["order"], PRECISIONS.index(r["precision"]) if r["precision"] in PRECISIONS else 99))
    # a row not run after a failed or skipped step of its chain says so; the others are still to run
    for row in rows:
        if row["status"] != "not run":
            continue
        before = [r for r in rows if (r["precision"], r["method"]) == (row["precision"], row["method"])
                  and r["order"] < row["order"] and r["status"] in ("failed", "skipped")]
        row["finished"] = (f"not run: {before[0]['step']} did not finish" if before
                           else "not run yet (time budget: run the same command again)")
        row["pending"] = not before
    return rows


def cell(value):
    return str(value).replace("|", "\\|").replace("\n", " ")


def loss(value):
    return "—" if value is None else f"{value:.3f}"


def machine_lines(device):
    """The machine and the versions, as one line each."""
    lines = []
    if device == "cuda":
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=60).stdout.strip()
            header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
            cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
            lines.append(f"GPU (nvidia-smi): {query}; driver's CUDA {cuda.group(1) if cuda else 'unknown'}")
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"GPU: nvidia-smi failed ({e})")
    cpu = "unknown CPU"
    for line in (read("/proc/cpuinfo", "") or "").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    lines.append(f"CPU: {cpu}, {os.cpu_count()} cores; {platform.platform()}")
    import torch

    torch_line = f"torch {torch.__version__}"
    if torch.cuda.is_available():
        torch_line += (f" (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
                       f"device: {torch.cuda.get_device_name(0)})")
    versions = [f"Python {platform.python_version()}", torch_line]
    for dist in ("fairseq-fixed", "fairseq", "numpy", "sacrebleu", "ctranslate2"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    lines.append("Versions: " + ", ".join(versions))
    return lines


def check_report(rows, work, args):
    settings = (read(os.path.join(work, "settings"), "") or "").strip()
    setup = (read(os.path.join(work, "setup.done"), "") or "not done").strip()
    setup_seconds = (read(os.path.join(work, "setup.seconds"), "") or "").strip()
    pending = sum(bool(r.get("pending")) for r in rows)
    commands = []  # the commands that added rows to this work folder (gpu_check.sh appends each), then this one
    for command in (read(os.path.join(work, "commands"), "") or "").splitlines() + [args.command]:
        if command.strip() and command.strip() not in commands:
            commands.append(command.strip())
    out = ["# GPU check: every method for a few updates in float32, with --fp16 and with --bf16", "",
           "Made by " + ", then ".join(f"`{c}`" for c in commands) + f" on {datetime.date.today().isoformat()} "
           f"({args.jobs} job(s) at a time, {args.threads} thread(s) each, device {args.device}).", ""]
    out += [f"- {line}" for line in machine_lines(args.device)]
    out += [f"- Settings: {settings}; precision flags: "
            + ", ".join(f"{p} `{PRECISION_FLAGS[p]}`" for p in PRECISIONS if any(r["precision"] == p for r in rows)),
            f"- Set-up: {setup}" + (f" ({setup_seconds} s)" if setup_seconds else ""),
            f"- Rows: {sum(r['status'] == 'finished' for r in rows)} finished, "
            f"{sum(r['status'] == 'failed' for r in rows)} failed, {sum(r['status'] == 'skipped' for r in rows)} "
            f"skipped, {sum(r['status'] == 'not run' for r in rows)} not run"
            + (f" ({pending} still to run: **incomplete**, run the same command again)" if pending else ""), ""]
    out += ["Data: the embedded Multi30k DE->EN slice through the shipped teacher's BPE and dictionary "
            "(checkpoints/multi30k.de-en/); the teacher is the shipped `teacher.pt`. Train loss: the last update's "
            "(`train_inner`); valid loss: fairseq's validation at the end of the step. Finite: the log's losses, "
            "the saved weights (fairseq's checkpoint writer casts float16/bfloat16 tensors to float32, so every "
            "precision saves float32), the translations' scores. BLEU: sacrebleu, tokenize none, on the tokenised, "
            "BPE-removed test slice (a few updates: only the teacher-backed rows translate well). fairseq-generate "
            "has no bfloat16 path: it decodes bf16-trained checkpoints in float32 (and fp16 ones with --fp16).", ""]
    out += ["| method | step | precision | finished | train loss (last update) | valid loss | finite | seconds | notes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        seconds = "—" if r["seconds"] is None or not math.isfinite(r["seconds"]) else f"{r['seconds']:.0f}"
        out.append("| " + " | ".join(cell(v) for v in (
            r["method"], r["step"], r["precision"], r["finished"], loss(r["train_loss"]), loss(r["valid_loss"]),
            r["finite_detail"] or "—", seconds, "; ".join(r["notes"]) or "")) + " |")
    causes = sorted({c for r in rows for c in r.get("causes", [])})
    if causes:
        out += ["", "Causes recognised in the failed rows' logs:", ""] + [f"- {c}" for c in causes]
    out += ["", "<details><summary>The commands (one precision; the others differ by the precision flag)</summary>", ""]
    shown = next((p for p in PRECISIONS if any(r["precision"] == p and r["command"] for r in rows)), None)
    for r in rows:
        if r["precision"] == shown and r["command"]:
            out += [f"{r['method']} / {r['step']}:", "", "```", r["command"], "```", ""]
    out += ["</details>", ""]
    for launcher in sorted(glob.glob(os.path.join(work, "bin", "*.py"))):
        out += [f"<details><summary>bin/{os.path.basename(launcher)} (written by gpu_check.sh)</summary>", "",
                "```python", (read(launcher, "") or "").rstrip(), "```", "", "</details>", ""]
    rows_dir = os.path.abspath(os.path.join(work, "rows"))
    logs_at = os.path.relpath(rows_dir, ROOT) if rows_dir.startswith(ROOT + os.sep) else rows_dir
    out += [f"Logs: `{logs_at}/PRECISION/METHOD/STEP/log` "
            "on the machine that ran the check.", ""]
    return "\n".join(out)


def get_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="gpu_check.sh's work folder (holds rows/)")
    p.add_argument("--out", required=True, help="the markdown report")
    p.add_argument("--command", default="bash scripts/maint/gpu_check.sh", help="the command that made the rows")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the rows ran")
    p.add_argument("--jobs", default="1", help="method chains run at a time")
    p.add_argument("--threads", default="1", help="threads per job")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    if not os.path.isdir(os.path.join(args.work, "rows")):
        sys.exit(f"gpu_check_report: {args.work} has no rows/ (run scripts/maint/gpu_check.sh first)")
    if args.device != "cuda" and os.path.abspath(args.out) == os.path.join(ROOT, "results", "gpu_check.md"):
        sys.exit("gpu_check_report: results/gpu_check.md is the GPU check's report: a --device cpu run writes elsewhere")
    rows = read_rows(args.work)
    text = check_report(rows, args.work, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"gpu_check_report: {len(rows)} rows -> {args.out}")
    return 3 if any(r.get("pending") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
