"""scripts/maint/gpu_check.sh (issue 31's GPU check): its report writer on a hand-made work folder, and the
command of every row (a dry run) through fairseq's own parsers."""
import importlib.util
import os
import shlex
import subprocess
import sys

import pytest
import torch

from conftest import REPO, clean_env

SCRIPT = os.path.join(REPO, "scripts", "maint", "gpu_check.sh")


def _report_module():
    spec = importlib.util.spec_from_file_location("gpu_check_report", os.path.join(REPO, "scripts", "maint", "gpu_check_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(work, path, kind, rc=None, log="", checkpoint=None, seconds="12.5", skipped=None):
    folder = work / "rows" / path
    folder.mkdir(parents=True)
    (folder / "kind").write_text(kind + "\n")
    if skipped is not None:
        (folder / "skipped").write_text(skipped + "\n")
    if rc is not None:
        (folder / "rc").write_text(f"{rc}\n")
        (folder / "log").write_text(log)
        (folder / "seconds").write_text(seconds + "\n")
        (folder / "command").write_text(f"python -m fairseq_cli.train data --save-dir {folder}\n")
    if checkpoint is not None:
        (folder / "checkpoint").write_text(str(checkpoint) + "\n")
    return folder


def _train_log(*losses, valid="9.657"):
    lines = ["2026-11-25 09:42:10 | INFO | fairseq_cli.train | Start iterating over samples"]
    lines += [f"2026-11-25 09:42:2{i} | INFO | train_inner | epoch 001:      {i + 1} / 11 loss={v}, class_acc=19.5, "
              f"wps=0, num_updates={i + 1}, lr=0.000125, gnorm=7.953" for i, v in enumerate(losses)]
    lines.append(f"2026-11-25 09:43:13 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {valid} | "
                 f"class_acc 24.3 | wps 750.5 | num_updates {len(losses)}")
    lines.append(f"2026-11-25 09:43:14 | INFO | train | epoch 001 | loss {losses[-1]} | wps 275.4 | num_updates 3")
    return "\n".join(lines) + "\n"


def _table(text):
    """{(method, step, precision): {column: cell}} of the report's table."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        row = dict(zip(header, cells))
        rows[(row["method"], row["step"], row["precision"])] = row
    return rows


def test_report_reads_losses_finiteness_failures_and_rows_not_run(tmp_path):
    report = _report_module()
    work = tmp_path / "work"
    finite = tmp_path / "finite.pt"
    torch.save({"model": {"w": torch.ones(3, dtype=torch.float16), "steps": torch.tensor([4])}}, finite)
    infinite = tmp_path / "infinite.pt"
    torch.save({"model": {"a": torch.ones(2), "b": torch.tensor([1.0, float("inf")])}}, infinite)
    _row(work, "fp32/pet/1-warmup", "train", 0, _train_log("15.695", "12.333"), finite)
    # the weights are finite, but one logged loss is not
    _row(work, "fp16/pet/1-warmup", "train", 0, _train_log("15.1", "nan") +
         "| WARNING | fairseq.trainer | gradient overflow detected, ignoring gradient, setting loss scale to: 64.0\n",
         finite)
    # fairseq's --bf16 on a machine without torch_xla: the traceback's last line and the recognised cause
    _row(work, "bf16/pet/1-warmup", "train", 1,
         "Traceback (most recent call last):\n  File \"fairseq/trainer.py\", line 64, in __init__\n"
         "    self.device = utils.get_tpu_device()\nAttributeError: 'NoneType' object has no attribute 'xla_device'\n"
         "\n2026-11-25 | INFO | some line printed after it\n")
    _row(work, "bf16/pet/2-kd", "train")
    _row(work, "fp32/pet/2-kd", "train", 0, _train_log("11.0", "10.5", valid="10.2"), infinite)
    _row(work, "fp32/pet/3-generate", "generate", 0,
         "S-1\tein mann\nT-1\ta man rides a bike\nH-1\t-0.52\ta man rides a bike\n"
         "S-0\tzwei hunde\nT-0\ttwo dogs play in the snow\nH-0\t-0.61\ttwo dogs play in the snow\n")
    _row(work, "fp16/pet/3-generate", "generate", 0, "T-0\ttwo dogs\nH-0\t-inf\ttwo dogs\n")
    _row(work, "fp16/word-kd/1-kd", "train", skipped="not run on a CPU (fairseq's --fp16 needs CUDA)")
    _row(work, "fp32/word-kd/1-kd", "train")  # not run, nothing before it failed: the time budget ended first
    _row(work, "fp32/word-kd/2-generate", "generate")
    out = tmp_path / "gpu_check.md"
    status = report.main([str(work), "--out", str(out), "--device", "cpu", "--command", "bash scripts/maint/gpu_check.sh"])
    text = out.read_text()
    rows = _table(text)
    assert status == 3 and "**incomplete**" in text and "bash scripts/maint/gpu_check.sh" in text
    ok = rows[("pet", "warmup", "fp32")]
    assert (ok["finished"], ok["train loss (last update)"], ok["valid loss"], ok["seconds"]) == ("yes", "12.333", "9.657", "12")
    assert ok["finite"] == "yes (log, weights)" and "float16" in ok["notes"]
    nan = rows[("pet", "warmup", "fp16")]
    assert nan["finished"] == "yes" and nan["finite"] == "no: log: 2 of 4 losses non-finite"
    assert "1 loss-scale overflow(s) skipped" in nan["notes"]
    failed = rows[("pet", "warmup", "bf16")]
    assert failed["finished"] == "no: AttributeError: 'NoneType' object has no attribute 'xla_device'"
    assert "`--bf16` implies `--tpu`" in text
    assert rows[("pet", "kd", "bf16")]["finished"] == "not run: warmup did not finish"
    weights = rows[("pet", "kd", "fp32")]
    assert weights["finite"] == "no: weights: 1 of 2 tensors non-finite (first: b)" and weights["valid loss"] == "10.200"
    translated = rows[("pet", "generate", "fp32")]
    assert translated["finite"] == "yes (scores)" and translated["notes"] == "2 sentences, BLEU 100.00"
    assert rows[("pet", "generate", "fp16")]["finite"] == "no: scores: 1 of 1 non-finite"
    assert rows[("word-kd", "kd", "fp16")]["finished"] == "skipped: not run on a CPU (fairseq's --fp16 needs CUDA)"
    assert rows[("word-kd", "kd", "fp32")]["finished"].startswith("not run yet (time budget")
    assert rows[("word-kd", "generate", "fp32")]["finished"].startswith("not run yet (time budget")
    # the table is ordered by method, step, then precision
    assert list(rows)[:3] == [("pet", "warmup", "fp32"), ("pet", "warmup", "fp16"), ("pet", "warmup", "bf16")]
    # a CPU run never writes the GPU report
    with pytest.raises(SystemExit, match="GPU check's report"):
        report.main([str(work), "--out", os.path.join(REPO, "results", "gpu_check.md"), "--device", "cpu"])


def _dry_run(tmp_path, *args):
    env = dict(clean_env(), DEVICE="cpu", PYTHON=sys.executable)
    return subprocess.run(["bash", SCRIPT, "--dry-run", "--work", str(tmp_path / "work"), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_every_row_command_parses_with_fairseq_and_chains_its_checkpoints(tmp_path):
    from fairseq import options

    proc = _dry_run(tmp_path, "--updates", "2")  # the default precisions: fp32, fp16, bf16, bf16-notpu
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
    work = str(tmp_path / "work")
    steps = {"pet": ["1-warmup", "2-kd", "3-generate"], "word-kd": ["1-kd", "2-generate", "3-ctranslate2"],
             "patient-kd": ["1-kd", "2-generate"], "can": ["1-kd", "2-generate"],
             "variator": ["1-train", "2-export", "3-generate"], "ghost": ["1-prune", "2-distill", "3-generate"],
             "apc": ["1-init", "2-train", "3-finalize", "4-generate"]}
    precisions = ("fp32", "fp16", "bf16", "bf16-notpu")
    assert set(rows) == {f"{p}/{m}/{s}" for p in precisions for m, ss in steps.items() for s in ss}
    assert all(rows[k] == "skipped: not run on a CPU (fairseq's --fp16 needs CUDA)" for k in rows if k.startswith("fp16/"))
    criteria = {"pet/1-warmup": "pet_warmup", "pet/2-kd": "kd", "word-kd/1-kd": "kd", "patient-kd/1-kd": "patient_kd",
                "can/1-kd": "kd", "variator/1-train": "variator_distill"}
    for precision in ("fp32", "bf16", "bf16-notpu"):
        for key, criterion in criteria.items():
            argv = shlex.split(rows[f"{precision}/{key}"])
            # bf16-notpu: fairseq-train's arguments through the launcher that undoes --bf16's implied --tpu
            launcher = ["-m", "fairseq_cli.train"] if precision != "bf16-notpu" else ["-m", "user_dir.tools.train_bf16"]
            assert argv[1:1 + len(launcher)] == launcher, argv
            argv = argv[:1] + ["-m", "fairseq_cli.train"] + argv[1 + len(launcher):]
            try:
                args = options.parse_args_and_arch(options.get_training_parser(), argv[3:])
            except SystemExit as e:
                raise AssertionError(f"{precision}/{key}: fairseq-train rejects {argv}") from e
            assert args.criterion == criterion and args.cpu and args.max_update == 2
            assert args.bf16 == precision.startswith("bf16") and not args.fp16
            assert args.save_dir == f"{work}/rows/{precision}/{key}"
        kd = options.parse_args_and_arch(options.get_training_parser(),
                                         shlex.split(rows[f"{precision}/pet/2-kd"])[3:])
        assert kd.finetune_from_model == f"{work}/rows/{precision}/pet/1-warmup/checkpoint_last.pt"
        # each translation reads the checkpoint its chain saved last (apc: the finalized one)
        for key, path in [("pet/3-generate", "pet/2-kd/checkpoint_last.pt"), ("can/2-generate", "can/1-kd/checkpoint_last.pt"),
                          ("apc/4-generate", "apc/3-finalize/final.pt"), ("ghost/3-generate", "ghost/2-distill/checkpoint_last.pt")]:
            argv = shlex.split(rows[f"{precision}/{key}"])
            gen = options.parse_args_and_arch(options.get_generation_parser(), argv[3:])
            assert gen.path == f"{work}/rows/{precision}/{path}" and gen.cpu and gen.gen_subset == "test" and not gen.fp16
        variator = shlex.split(rows[f"{precision}/variator/3-generate"])
        assert variator[variator.index("--variator-plugins") + 1] == f"{work}/rows/{precision}/variator/2-export/k4.pt"
        # the tools' flags are only known once they ran
        for key, tool_output, criterion in [("ghost/2-distill", "ghost/1-prune/init.pt", "ghost_distill"),
                                            ("apc/2-train", "apc/1-init/init.pt", "apc_activation_kd")]:
            argv = shlex.split(rows[f"{precision}/{key}"])
            assert f"<the flags of {work}/rows/{precision}/{tool_output}>" in argv
            assert argv[argv.index("--criterion") + 1] == criterion
            assert argv[argv.index("--lr") + 1] == {"ghost_distill": "5e-4", "apc_activation_kd": "1e-4"}[criterion]
    bad = subprocess.run(["bash", SCRIPT, "--only", "pet,bert"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "--only bert: not one of" in bad.stderr
