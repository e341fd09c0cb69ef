"""A newcomer's first run: the shipped teacher loads with stock fairseq and scores what it states, and
scripts/demo.sh runs end to end (update-bounded, SMOKE budget)."""
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REFERENCE_TEACHER, REPO, clean_env, needs_reference_teacher

SHIPPED = os.path.join(REPO, "checkpoints", "multi30k.de-en")
SHIPPED_TEACHER = os.path.join(SHIPPED, "teacher.pt")


def _ship_module():
    spec = importlib.util.spec_from_file_location("ship_checkpoint", os.path.join(REPO, "scripts", "maint", "ship_checkpoint.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stated():
    with open(os.path.join(SHIPPED, "slice_bleu.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory):
    """Where ship_checkpoint.slice_bleu prepares the test slice (with the shipped codes and dictionary) once and
    reuses it: the teacher's and the PET student's BLEU are measured on the same data-bin."""
    return str(tmp_path_factory.mktemp("slice"))


def test_shipped_teacher_is_small_weights_only_and_as_documented():
    stated = _stated()
    digest = hashlib.sha256(open(SHIPPED_TEACHER, "rb").read()).hexdigest()
    assert digest == stated["sha256"]
    with open(os.path.join(SHIPPED, "README.md")) as f:
        readme = f.read()
    assert digest in readme
    # torch's default (weights-only) loader opens it: no pickled globals, no optimizer state
    state = torch.load(SHIPPED_TEACHER, map_location="cpu")
    assert state["last_optimizer_state"] is None and set(state["optimizer_history"][0]) == {
        "criterion_name", "optimizer_name", "lr_scheduler_state", "num_updates"}
    dtype = getattr(torch, stated["dtype"])
    assert {v.dtype for v in state["model"].values() if v.is_floating_point()} == {dtype}
    # tied embeddings stored once: the file holds each of the 7,550,976 parameters once, not the embeddings 3x
    assert os.path.getsize(SHIPPED_TEACHER) < 7_550_976 * torch.finfo(dtype).bits // 8 * 1.01
    for name in ("code", "dict.de.txt", "dict.en.txt"):
        assert os.path.isfile(os.path.join(SHIPPED, name)), name


def test_shipped_teacher_reproduces_its_stated_bleu_with_stock_fairseq_generate(slice_dir):
    """Stock fairseq-generate (no --user-dir, torch's default loading) on the first 200 test sentences,
    prepared from the embedded raw text with the shipped BPE codes and dictionary."""
    stated = _stated()
    ship = _ship_module()
    bleu = ship.slice_bleu(SHIPPED_TEACHER, int(stated["slice"].split()[1]), slice_dir)
    assert abs(bleu - stated["shipped_bleu"]) <= 0.05, (bleu, stated)
    # the stated number was measured from the float32 reference teacher: half precision costs < 0.05 BLEU
    assert abs(stated["shipped_bleu"] - stated["input_bleu"]) <= 0.05
    if os.path.isfile(REFERENCE_TEACHER):
        assert ship.slice_bleu(REFERENCE_TEACHER, int(stated["slice"].split()[1]), slice_dir, SHIPPED,
                               plugin=True) == stated["input_bleu"]


SHIPPED_PET = os.path.join(SHIPPED, "pet_student.pt")


def _stated_pet():
    with open(os.path.join(SHIPPED, "pet_slice_bleu.json")) as f:
        return json.load(f)


def test_shipped_pet_student_is_small_portable_and_as_documented():
    """The full-recipe PET student ships beside the teacher: its SHA-256 as stated, no optimizer state,
    no path of the machine that trained it, weights-only loadable once the plug-in is imported."""
    stated = _stated_pet()
    digest = hashlib.sha256(open(SHIPPED_PET, "rb").read()).hexdigest()
    assert digest == stated["sha256"] and stated["needs_user_dir"] is True
    with open(os.path.join(SHIPPED, "README.md")) as f:
        assert digest in f.read()
    import user_dir  # noqa: F401  (the plug-in allow-lists the Namespace of a plug-in model's options)

    state = torch.load(SHIPPED_PET, map_location="cpu")
    assert state["last_optimizer_state"] is None
    assert state["cfg"]["common"]["user_dir"] is None and state["cfg"]["criterion"].get("teacher_path") is None
    assert vars(state["cfg"]["model"])["arch"] == "pet_transformer_iwslt"
    dtype = getattr(torch, stated["dtype"])
    assert {v.dtype for v in state["model"].values() if v.is_floating_point()} == {dtype}


def test_shipped_pet_student_reproduces_its_stated_bleu(slice_dir):
    """fairseq-generate --user-dir on the first 200 test sentences: the stated BLEU of the shipped file,
    within 0.05 of the trained checkpoint it was made from."""
    stated = _stated_pet()
    ship = _ship_module()
    bleu = ship.slice_bleu(SHIPPED_PET, int(stated["slice"].split()[1]), slice_dir, SHIPPED, plugin=True)
    assert abs(bleu - stated["shipped_bleu"]) <= 0.05, (bleu, stated)
    assert abs(stated["shipped_bleu"] - stated["input_bleu"]) <= 0.05


@needs_reference_teacher
def test_shipping_keeps_the_weights_and_the_model_cfg(tmp_path):
    ship = _ship_module()
    out = tmp_path / "t.pt"
    ship.main([REFERENCE_TEACHER, str(out), "--dtype", "float32"])
    small = torch.load(out, map_location="cpu")
    full = torch.load(REFERENCE_TEACHER, map_location="cpu", weights_only=False)
    assert small["model"].keys() == full["model"].keys()
    assert all(torch.equal(small["model"][k], full["model"][k]) for k in full["model"])
    assert small["cfg"]["model"]["encoder_layers"] == 3 and small["cfg"]["model"]["_name"] == "transformer_iwslt_de_en"


def test_demo_end_to_end_on_a_smoke_budget(tmp_path):
    """SMOKE=1: 4 warm-up + 8 KD updates on 2,000 pairs, 50 test sentences; the table and translations appear."""
    env = clean_env()
    env.update(SMOKE="1", SKIP_SETUP="1", WORK=str(tmp_path / "demo"), OMP_NUM_THREADS="1",
               REPORT=str(tmp_path / "demo.md"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # fairseq-train etc. of this Python
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "demo.sh")], capture_output=True, text=True,
                          env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    for stage in ("1/4", "2/4", "3/4", "4/4", "done"):
        assert f"] {stage}" in out or f"] {stage} " in out, stage
    # update-bounded stages: exactly the budget, whatever the machine
    kd_log = open(tmp_path / "demo" / "pet" / "kd.log").read()
    assert re.search(r"num_updates 8\b", kd_log) and not re.search(r"num_updates 9\b", kd_log)
    rows = {row["name"]: row for row in json.load(open(tmp_path / "demo" / "pet" / "measure.json"))["rows"]}
    assert set(rows) == {"teacher", "pet", "pet-full-recipe"}
    # the shipped teacher on the demo's own data: real BLEU (33.01 on these 50 sentences; a data/BPE/dictionary
    # mismatch would give about 0), and the student at under 10% of its non-embedding parameters
    assert rows["teacher"]["bleu_tok"] > 25
    assert rows["pet"]["non_embedding_params"] < 0.1 * rows["teacher"]["non_embedding_params"]
    # three typed sentences, each followed by the teacher's and the student's translation
    for name in ("teacher", "pet"):
        lines = open(tmp_path / "demo" / f"translations.{name}").read().splitlines()
        assert len(lines) == 3 and all(line.strip() for line in lines), (name, lines)
    assert "Ein Mann fährt mit dem Fahrrad" in out and out.count("  teacher: ") == 3 and out.count("  pet:     ") == 3
    # the shipped full-recipe student is measured and translates beside the demo's
    assert rows["pet-full-recipe"]["bleu_tok"] > 25 and out.count("  pet-full: ") == 3
    # REPORT=...: the run as a report, its numbers those of the measurement, a row per stage
    report = open(tmp_path / "demo.md").read()
    assert f"| BLEU (tok) | {rows['teacher']['bleu_tok']:.2f} | {rows['pet']['bleu_tok']:.2f} |" in report
    assert "`REPORT=" in report and "SMOKE=1 bash scripts/demo.sh`" in report
    stage_rows = re.findall(r"^\| ([1-4])/4 [^|]* \| ([\d.]+) \|$", report, re.M)
    assert [n for n, _ in stage_rows] == ["1", "2", "3", "4"], report
    total = float(re.search(r"^\| total \| ([\d.]+) \|$", report, re.M).group(1))
    assert total == pytest.approx(sum(float(m) for _, m in stage_rows), abs=0.25)
    assert json.load(open(tmp_path / "demo.json"))["rows"] == json.load(open(tmp_path / "demo" / "pet" / "measure.json"))["rows"]
