"""scripts/bench/bench_ghost_costs.py (issue 35: GhostBERT's ghost modules against pruned only, on a CPU or a GPU): the
configurations it saves for a machine without the teacher rebuild the very architectures ghost_prune cut, and its
timing run on them writes paired ratios, the compiled form equal to the eager one, and a report its JSON re-renders."""
import json
import os
import subprocess
import sys

import torch

from conftest import REPO, clean_env

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))


def bench(*args):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", "bench_ghost_costs.py"), *map(str, args)],
                          env=dict(clean_env(), OMP_NUM_THREADS="1"), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_shapes_rebuild_the_cut_architectures_and_the_timing_report(tmp_path, tiny_glue_teacher):
    import argparse

    from fairseq import utils

    import bench_ghost_costs
    utils.import_user_module(argparse.Namespace(user_dir=os.path.join(REPO, "user_dir")))
    glue_work = tmp_path / "glue"  # scripts/recipes/glue_teachers.sh's layout around the tiny RTE teacher
    (glue_work / "RTE" / "checkpoints").mkdir(parents=True)
    (glue_work / "data-bin").mkdir()
    os.symlink(tiny_glue_teacher["teacher"], glue_work / "RTE" / "checkpoints" / "checkpoint_best.pt")
    os.symlink(tiny_glue_teacher["data"], glue_work / "data-bin" / "RTE.wordpiece")
    work, shapes, out = tmp_path / "cut", tmp_path / "shapes", tmp_path / "report" / "ghost_costs"
    widths = "1/4,2/4"
    bench("--glue-task", "RTE", "--glue-work", glue_work, "--work", work, "--widths", widths, "--save-shapes", shapes)

    for m, heads in (("1of4", 1), ("2of4", 2)):
        for variant in ("pruned", "ghost"):
            saved = torch.load(shapes / f"m{m}" / f"{variant}.cfg.pt", map_location="cpu", weights_only=False)
            assert set(saved) == {"cfg"}  # no weights travel
            built, _ = bench_ghost_costs.build_from_shape(shapes / f"m{m}" / f"{variant}.cfg.pt",
                                                          str(shapes / "data-bin"))
            cut = torch.load(work / f"m{m}" / f"{variant}.pt", map_location="cpu", weights_only=False)["model"]
            assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in cut.items()}
            assert built.encoder.sentence_encoder.layers[0].self_attn.num_heads == heads
            has_ghost = any("ghost" in k for k in cut)
            assert has_ghost == (variant == "ghost")
    assert sorted(os.listdir(shapes / "data-bin" / "input0")) == ["dict.txt", "valid.bin", "valid.idx"]

    bench("--shapes", shapes, "--widths", widths, "--time-batch", 2, "--runs", 3, "--repeats", 1, "--out", out)
    result = json.load(open(f"{out}.json"))
    (costs,) = result["costs"]
    assert [row["m"] for row in costs["rows"]] == widths.split(",")
    for row in costs["rows"]:
        for shape in ("batch", "single"):
            for form in ("ghost", "ghost, compiled"):
                r = row[f"{shape}: {form}"]
                assert len(r["runs"]) == 3 and r["min"] <= r["median"] <= r["max"] and r["min"] > 0
            assert row[f"{shape}: ghost, compiled max abs diff"] < 1e-4 * max(1.0, row[f"{shape}: max abs output"])
    text = open(f"{out}.md").read()
    assert "| 1/4 |" in text and "| 2/4 |" in text and "float32 on cpu" in text
    assert "initial weights from the checkpoints' configurations" in text
    bench("--report-only", "--out", out)
    assert open(f"{out}.md").read() == text
