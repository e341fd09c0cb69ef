"""scripts/bench/benchlib.py, the benchmark drivers' shared module: seeds, the selection protocol's validation points,
resumable stages, per-example outputs, the tables' seed cells and significance rows; and that every driver
imports it as a module (no script loads another script)."""
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
import benchlib  # noqa: E402


def test_seeds_parse_both_spellings_and_refuse_bad_ones():
    assert benchlib.parse_seeds(["1,2,3"]) == benchlib.parse_seeds(["1", "2", "3"]) == [1, 2, 3]
    assert benchlib.parse_seeds(["3,1"]) == [3, 1] and benchlib.parse_seeds(2) == [2]
    for bad, why in ((["1,1"], "repeats"), (["0"], "not a positive"), (["a"], "not a positive"), ([","], "no seed")):
        with pytest.raises(ValueError, match=why):
            benchlib.parse_seeds(bad)
    assert benchlib.seed_dir("w", 2) == os.path.join("w", "seed2")
    # drivers write under work/ unless --out results/... is given
    assert benchlib.default_out("x.md") == os.path.join(REPO, "work", "results", "x.md")


def test_a_two_stage_variant_is_validated_at_the_same_points_as_a_one_stage_one():
    """The issue's APC-on-GLUE case: 240 compression + 240 fine-tuning updates against 480 of neuron pruning,
    4 validations: both at updates 300, 360, 420, 480 of their whole budgets (fairseq counts a stage's updates
    from 0, so the fine-tuning stage validates from its update 60, every 60, none at epoch ends)."""
    plan = benchlib.validation_plan(480, 240, 4)
    assert plan == (60, [300, 360, 420, 480])
    assert benchlib.selection_flags(plan, 0, 240) == ["--disable-validation"]  # the compression stage: no point in it
    second = benchlib.selection_flags(plan, 240, 240, "accuracy", maximize=True)
    one = benchlib.selection_flags(plan, 0, 480, "accuracy", maximize=True)

    def value(flags, name):
        return int(flags[flags.index(name) + 1])
    # the stage-local points: multiples of the interval from --validate-after-updates to the stage's end
    local = [u for u in range(1, 241) if u % value(second, "--validate-interval-updates") == 0
             and u >= value(second, "--validate-after-updates")]
    whole = [u for u in range(1, 481) if u % value(one, "--validate-interval-updates") == 0
             and u >= value(one, "--validate-after-updates")]
    assert [240 + u for u in local] == whole == plan[1]
    assert second[second.index("--validate-interval") + 1] == "1000000"  # no validation at epoch ends
    assert "--maximize-best-checkpoint-metric" in second and "accuracy" in second
    assert benchlib.validation_plan(12, 12, 0) == (0, [])
    with pytest.raises(SystemExit, match="--validations 7"):
        benchlib.validation_plan(480, 240, 7)  # 240 updates do not split into 7 equal intervals
    with pytest.raises(SystemExit, match="does not end at the last update"):
        benchlib.validation_plan(500, 240, 4)
    with pytest.raises(SystemExit, match="do not all fall on this stage's multiples"):
        benchlib.selection_flags(plan, 250, 230)  # a stage starting off the interval's grid
    text = benchlib.protocol_text(480, plan, "dev accuracy", "the same")
    assert "validated 4 times, at updates 300, 360, 420, 480" in text and "last checkpoint's (update 480)" in text


def test_a_stage_runs_once_and_refuses_other_commands(tmp_path):
    folder = str(tmp_path / "stage")
    cmd = [sys.executable, "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"]
    assert benchlib.stage(folder, [cmd], threads=1)
    assert not benchlib.stage(folder, [cmd], threads=1)  # finished: never rerun
    log = open(os.path.join(folder, "log.txt")).read()
    assert log.count("$ ") == 1 and "threads 1" in log
    with pytest.raises(SystemExit, match="made by other commands"):
        benchlib.stage(folder, [cmd + ["again"]], threads=1)
    with pytest.raises(SystemExit, match=r"command failed \(3\)"):
        benchlib.stage(str(tmp_path / "failing"), [[sys.executable, "-c", "raise SystemExit(3)"]], threads=1)
    train_log = tmp_path / "train.log"
    train_log.write_text("x | done training in 12.5 seconds\ny | valid on 'valid' subset | loss 1 | num_updates 9 | a\n"
                         "resumed | done training in 2.5 seconds\n| valid on 'valid' subset | x 2 | num_updates 12 |\n")
    assert benchlib.fairseq_train_seconds(str(train_log)) == 15.0
    assert benchlib.validation_updates(str(train_log)) == [9, 12]


def test_seed_cells_show_the_mean_the_spread_and_every_seed():
    s = benchlib.seed_summary({1: 21.0, 2: 23.0, 3: 22.0})
    assert (s["mean"], s["std"], s["min"], s["max"], s["n"]) == (22.0, 1.0, 21.0, 23.0, 3)
    assert benchlib.format_seeds(s) == "22.00 +- 1.00 [21.00, 23.00] (s1 21.00, s2 23.00, s3 22.00)"
    assert benchlib.format_seeds(benchlib.seed_summary({2: 21.5})) == "21.50 (s2)"
    assert benchlib.fmt(3.14159) == "3.14" and benchlib.fmt(s, 1).startswith("22.0 +- 1.0")
    rows = {1: {"scores": {"accuracy": 60.0, "examples": 277}, "path": "a", "n": 5},
            2: {"scores": {"accuracy": 62.0, "examples": 277}, "path": "b", "n": 5}}
    row = benchlib.aggregate(rows)
    assert row["scores"]["examples"] == 277 and row["path"] == "a" and row["n"] == 5
    assert row["scores"]["accuracy"]["values"] == {"1": 60.0, "2": 62.0}
    diff = benchlib.difference(row["scores"]["accuracy"], 59.0)  # against a teacher without seeds
    assert diff["values"] == {"1": 1.0, "2": 3.0} and benchlib.difference(3.0, 1.0) == 2.0


def test_hypotheses_are_read_in_test_set_order_and_detokenised(tmp_path):
    log = tmp_path / "generate.log"
    log.write_text("S-1\tein mann\nH-1\t-0.5\ta man , riding .\nD-1\t-0.5\ta man , riding .\n"
                   "D-0\t-0.1\ttwo dogs ( brown ) play\nD-2\t-0.3\tis it fine ?\n2026 | INFO | BLEU4 = 12.34, 40/20\n")
    out = str(tmp_path / "hyps.txt")
    benchlib.hypotheses_from_generate(str(log), out)
    assert benchlib.read_lines(out) == ["two dogs (brown) play", "a man, riding.", "is it fine?"]
    benchlib.hypotheses_from_generate(str(log), out, lang=None, max_sentences=2)  # tokenised, ids below 2
    assert benchlib.read_lines(out) == ["two dogs ( brown ) play", "a man , riding ."]
    assert benchlib.fairseq_bleu(str(log)) == 12.34
    log.write_text("D-0\t-0.1\ta\nD-2\t-0.3\tc\n")
    with pytest.raises(SystemExit, match="do not cover"):
        benchlib.hypotheses_from_generate(str(log), out)


def test_each_comparison_gets_a_row_with_the_difference_its_interval_and_p(tmp_path):
    """The significance rows from per-seed outputs on disk: A reproduces the references on every seed, B drops
    their last words; the row says A is better, with an interval above 0."""
    refs = [f"a man number {i} rides a red bicycle down the street" for i in range(40)]
    (tmp_path / "refs.txt").write_text("\n".join(refs) + "\n")
    a, b = [], []
    for seed in (1, 2):
        a.append(str(tmp_path / f"a{seed}.txt"))
        b.append(str(tmp_path / f"b{seed}.txt"))
        benchlib.write_lines(a[-1], refs)
        benchlib.write_lines(b[-1], [" ".join(r.split()[:-3 - seed]) for r in refs])
    row = benchlib.bleu_comparison("A vs B", "A", "B", a, b, str(tmp_path / "refs.txt"))
    assert row["seeds"] == 2 and row["a"] == pytest.approx(100.0) and row["diff"] > 10 and row["low"] > 0
    assert row["verdict"] == "A better" and row["p"] < 0.05
    labels = [i % 2 for i in range(60)]
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    for name, preds in (("good", labels), ("bad", [1 - y if i % 3 == 0 else y for i, y in enumerate(labels)])):
        benchlib.write_predictions(str(tmp_path / f"{name}.json"), preds, str(tmp_path / "labels.json"))
    glue = benchlib.glue_comparison("good vs bad", "good", "bad", [str(tmp_path / "good.json")],
                                    [str(tmp_path / "bad.json")], labels, "accuracy")
    assert glue["diff"] == pytest.approx(100.0 - glue["b"]) and glue["b"] == pytest.approx(100 * 40 / 60)
    lines = benchlib.significance_lines([row, glue], "Tests")
    assert lines[2].startswith("| comparison (A vs B) | metric | seeds | A | B | A - B | 95% interval | p |")
    assert lines[4].startswith("| A vs B | sacreBLEU | 2 | 100.00 |")
    assert lines[5].startswith(f"| good vs bad | accuracy | 1 | 100.00 | 66.67 | +33.33 | [{glue['low']:+.2f}, ")
    assert benchlib.significance_lines([]) == []


def test_no_script_loads_another_script_and_every_driver_imports_as_a_module():
    """Issue 32: drivers loaded one another through importlib (bench_apc_glue -> bench_ghost -> bench_variator,
    bench_iwslt14 and merge_translation_tables -> bench_translation, pet_report via sys.path). Now each imports
    benchlib and the shared modules by name: `python scripts/x.py` puts scripts/ on sys.path."""
    for path in glob.glob(os.path.join(REPO, "scripts", "bench", "*.py")) + glob.glob(os.path.join(REPO, "scripts", "bench", "*.sh")):
        text = open(path).read()
        assert "spec_from_file_location" not in text, path
        assert "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))" not in text, path
    for driver in ("bench_translation", "bench_iwslt14", "bench_variator", "bench_ghost", "bench_apc", "bench_apc_glue",
                   "merge_translation_tables", "pet_report"):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", f"{driver}.py"), "--help"],
                              capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, (driver, proc.stderr[-2000:])
        if driver.startswith("bench_"):
            assert "--seeds" in proc.stdout, driver


def _device(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="driver")
    benchlib.add_device_args(parser)
    args = parser.parse_args(argv)
    benchlib.check_device(parser, args)
    return benchlib.Device(args)


def test_device_options_turn_into_fairseqs_and_the_tools_flags(capsys):
    """Issue 45: --device/--fp16/--bf16, the one option set of every driver, in place of the --cpu every driver
    hard-coded. The CPU (the default) keeps today's --cpu; CUDA runs one fairseq process per run (several --jobs
    share the GPU); fp16 reaches fairseq and fc-measure; bf16 trains through fc-train-bf16 (stock fairseq-train
    --bf16 implies --tpu); fp16 on the CPU and fp16 with bf16 are refused, naming the flags. No GPU is needed: the
    commands are parsed by fairseq's own parser."""
    from fairseq import options

    import translation_students as students

    cpu = _device([])
    assert (cpu.fairseq(), cpu.train_flags(), cpu.tool(), cpu.measure()) == (["--cpu"], ["--cpu"], ["--cpu"], ["--cpu"])
    assert cpu.train()[1:] == ["-m", "fairseq_cli.train"] and benchlib.Device(None).fairseq() == ["--cpu"]
    fp16 = _device(["--device", "cuda", "--fp16"])
    assert fp16.fairseq() == ["--fp16"] and fp16.tool() == [] and fp16.measure() == ["--fp16"]
    assert fp16.train_flags() == ["--fp16", "--distributed-world-size", "1"] and fp16.train()[-1] == "fairseq_cli.train"
    bf16 = _device(["--device", "cuda", "--bf16"])
    assert bf16.fairseq() == ["--bf16"] and bf16.measure() == [] and bf16.train()[-1] == "user_dir.tools.train_bf16"
    assert _device(["--bf16"]).fairseq() == ["--cpu", "--bf16"]  # fc-train-bf16 trains on the CPU too
    assert benchlib.Device(type("A", (), {"device": "cuda:1"})()).tool() == []
    for bad, words in ((["--fp16"], "--fp16 needs --device cuda"), (["--device", "cuda", "--fp16", "--bf16"],
                                                                     "not allowed with argument --fp16"),
                       (["--device", "tpu"], "invalid choice")):
        with pytest.raises(SystemExit):
            _device(bad)
        assert words in capsys.readouterr().err, bad
    # the translation benchmark's stage command on CUDA in fp16, as fairseq-train parses it
    pet = students.methods(128, 96, 96, 6)["pet"]
    argv = students.train_command("data-bin", "teacher.pt", pet[2], pet[3][1][1], 10, 1, 5, "save", None, [],
                                  device=fp16)
    parsed = options.parse_args_and_arch(options.get_training_parser(), argv)
    assert parsed.fp16 and not parsed.cpu and parsed.distributed_world_size == 1
    parsed = options.parse_args_and_arch(options.get_training_parser(), students.train_command(
        "data-bin", "teacher.pt", pet[2], pet[3][1][1], 10, 1, 5, "save", None, []))
    assert parsed.cpu and not parsed.fp16  # the default: today's CPU command


def test_a_timed_command_runs_alone_among_the_jobs():
    """benchlib.run(..., alone=True), a speed measurement among --jobs runs: it waits until the running commands
    end, and no command starts while it runs."""
    import threading
    import time

    quiet, events = benchlib._Quiet(), []

    def job(name, alone, hold):
        with quiet.hold(alone):
            events.append(("start", name))
            time.sleep(hold)
            events.append(("end", name))

    threads = [threading.Thread(target=job, args=(name, False, 0.3)) for name in ("a", "b")]
    for t in threads:
        t.start()
    time.sleep(0.05)
    timed = threading.Thread(target=job, args=("timed", True, 0.2))
    timed.start()
    time.sleep(0.05)
    late = threading.Thread(target=job, args=("c", False, 0.05))  # asks after the timing asked: waits for it
    late.start()
    for t in threads + [timed, late]:
        t.join()
    order = [e for e in events]
    start, end = order.index(("start", "timed")), order.index(("end", "timed"))
    assert order[end - 1] == ("start", "timed") and start > max(order.index(("end", "a")), order.index(("end", "b")))
    assert order.index(("start", "c")) > end
    assert [r for r in benchlib.run_jobs(lambda x: x * x, [1, 2, 3], 2)] == [1, 4, 9]


def test_no_function_name_is_defined_in_two_scripts():
    """Issue 46: what two drivers share lives once, in benchlib; a driver's own function is named after what it
    does (costs_table, serving_verdict, plot_ghost), so no top-level function name is defined in two files of
    scripts/ -- the entry points main, get_parser and cli_main excepted."""
    import ast
    import collections

    defined = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(REPO, "scripts", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined[node.name].append(os.path.relpath(path, REPO))
    twice = {name: files for name, files in defined.items()
             if len(files) > 1 and name not in ("main", "get_parser", "cli_main")}
    assert not twice, f"defined in more than one script (move it to benchlib, or name it after its job): {twice}"


def test_one_plot_helper_draws_every_drivers_panels_with_the_command(tmp_path):
    """benchlib.plot_panels: panels of series (lines, steps, error bars) with their point labels and reference
    lines, the command line that made the plot in the PNG's Description; no panel, no file."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    panels = [dict(series=[dict(x=[1, 2, 3], y=[30.0, 31.5, 32.0], style="o-", label="a", notes=["k=1", "k=2", "k=3"],
                                note_offset=(4, 4), note_style=dict(fontsize=7)),
                           dict(x=[2.5], y=[29.0], yerr=[0.5], kind="errorbar", fmt="o", notes=["b"], note_y=[29.2],
                                note_offset=(5, 0))],
                   hlines=[dict(y=31.0, ls="--", label="teacher")], xscale="log", xlabel="cost", ylabel="BLEU",
                   title="metric against cost", grid=True, legend=dict(fontsize=7)),
              dict(series=[dict(x=[0, 1, 2], y=[1, 3, 2], kind="step", where="post", label="answered")],
                   vlines=[dict(x=1, ls=":")], legend={})]
    png = str(tmp_path / "plot.png")
    assert benchlib.plot_panels(png, panels, command="python scripts/bench/x.py --out y", shape=(2, 1)) == png
    image = Image.open(png)
    assert image.info["Description"] == "python scripts/bench/x.py --out y" and image.size == (720, 960)  # 6x8 in
    assert benchlib.plot_panels(str(tmp_path / "none.png"), []) is None and not os.path.exists(tmp_path / "none.png")
