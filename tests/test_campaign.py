"""scripts/bench/campaign/run.py on the CPU: a tiny-budget PET campaign (the drivers' --quick settings, PET and word-KD,
one seed) is stopped by its time budget, resumed by the same command, packed into one archive without
checkpoints, and ingested into the JSON that scripts/bench/claims.py reads; two seeds' archives merge into one table.

The Multi30k data-bin the driver prepares (BPE learned on 29,000 pairs: a minute) is kept across test runs in
work/test-campaign/, as conftest keeps the test teacher's."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO, clean_env

sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
sys.path.insert(0, os.path.join(REPO, "scripts", "bench", "campaign"))
import claims  # noqa: E402
import families  # noqa: E402

RUNNER = os.path.join(REPO, "scripts", "bench", "campaign", "run.py")
KEPT = os.path.join(REPO, "work", "test-campaign")


def campaign(*args, timeout=900):
    env = clean_env()
    env.update(OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, RUNNER, *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny campaign's work folder (its data-bin kept from an earlier test run), its archive and outputs."""
    work = os.path.join(KEPT, "pet")
    data = os.path.join(work, "bench-translation", "quick", "data-bin")
    if os.path.isdir(work):  # every run starts afresh but for the prepared data
        for name in os.listdir(work):
            path = os.path.join(work, name)
            if os.path.isfile(path):
                os.remove(path)
            elif name != "bench-translation":
                shutil.rmtree(path)
        quick = os.path.join(work, "bench-translation", "quick")
        for name in os.listdir(quick) if os.path.isdir(quick) else []:
            if os.path.join(quick, name) != data:
                shutil.rmtree(os.path.join(quick, name))
    out = tmp_path_factory.mktemp("out")
    common = ["run", "pet", "--device", "cpu", "--scale", "tiny", "--seeds", "1", "--work", work, "--out", out,
              "--jobs", "1"]
    # 45 s of work (the budget less the packing margin): the set-up stage (an import) and part of the driver's
    # (data, three trainings, decoding, measuring: minutes here)
    first = campaign(*common, "--budget", 60)
    second = campaign(*common, "--budget", 0)
    return dict(work=work, out=str(out), first=first, second=second, common=common)


def test_budget_stops_a_stage_then_the_same_command_resumes_and_packs(tiny):
    rc, out = tiny["first"]
    assert rc == 3 and "resume with the same command" in out, out[-3000:]
    started = re.findall(r"\] (\w+): (?:/|bash )", out)
    (stopped,) = re.findall(r"\] (\w+): the time budget is spent: stopping it", out)
    assert started[-1] == stopped
    rc, out = tiny["second"]
    assert rc == 0, out[-3000:]
    for name in started[:-1]:  # what the first call finished is not run again; the stopped stage runs on
        assert f"{name}: done before, skipped" in out
    assert re.search(rf"\] {stopped}: (?:/|bash )", out)
    with open(os.path.join(tiny["work"], "campaign.json")) as f:
        state = json.load(f)
    assert [c["finished"] for c in state["calls"]] == [False, True]
    assert state["device_seconds"] > 0 and state["machine"]["device"] == "cpu" and state["precision"] == "fp32"
    with tarfile.open(os.path.join(tiny["out"], "campaign-pet-s1.tar.gz")) as tar:
        names = tar.getnames()
    assert "campaign-pet/campaign.json" in names and "campaign-pet/stages/pet_gpu/DONE" in names
    assert "campaign-pet/results/pet_gpu.json" in names
    # per-example outputs and logs travel, checkpoints and binarised data do not
    assert any(n.endswith("hypotheses/test.last.txt") for n in names)
    assert any(n.endswith("train.log") for n in names)
    assert not any(n.endswith(".pt") or "/data-bin/" in n for n in names)


def test_other_settings_on_the_same_work_are_refused(tiny):
    rc, out = campaign(*[a if a != "1" else "2" for a in tiny["common"]], "--budget", 0)
    assert rc != 0 and "was started with other settings" in out and "'seeds'" in out


def claim_spec(path):
    return dict(method="PET", kind="better", claim="c", paper="p", budget="b", json=path, label=r"^pet vs word-kd$",
                threshold=0.0, command="x")


def test_ingest_writes_the_table_claims_reads_with_the_campaign_record(tiny, tmp_path):
    archive = os.path.join(tiny["out"], "campaign-pet-s1.tar.gz")
    rc, out = campaign("ingest", archive, "--results", tmp_path / "claims", "--unpack", tmp_path / "unpacked")
    assert rc == 0, out[-3000:]
    with open(tmp_path / "claims" / "pet_gpu.json") as f:
        data = json.load(f)
    record = data["campaign"]
    assert record["seeds"] == [1] and record["precision"] == "fp32" and record["device"] == "cpu"
    assert record["calls"] == 2 and record["device_minutes"] > 0
    assert "run pet --device cpu --scale tiny" in record["commands"][0]
    assert "Campaign (issue 45)" in (tmp_path / "claims" / "pet_gpu.md").read_text()
    # claims.py finds the comparison and re-tests it from the outputs the table keeps
    row = claims.claim_row(claim_spec("claims/pet_gpu.json"), str(tmp_path))
    assert row["c"]["a_name"] == "pet" and row["c"]["b_name"] == "word-kd"
    assert row["commands"][0].startswith("python scripts/bench/bench_translation.py")
    assert row["source"] == "the table's JSON" and row["r"]["seeds"] == 1


def test_two_sessions_seeds_merge_into_one_table(tiny, tmp_path):
    """A second session's archive (seed 2: here the first one's outputs relabelled, the word-KD student's
    hypotheses swapped for PET's) merges with the first: rows, runs and the paired test over both seeds."""
    first = os.path.join(tiny["out"], "campaign-pet-s1.tar.gz")
    with tarfile.open(first) as tar:
        tar.extractall(tmp_path / "s2", filter="data")
    root = tmp_path / "s2" / "campaign-pet"
    state = json.loads((root / "campaign.json").read_text())
    state["seeds"], state["work"] = [2], "/elsewhere/campaign/pet"
    (root / "campaign.json").write_text(json.dumps(state))
    table = json.loads((root / "results" / "pet_gpu.json").read_text())
    text = json.dumps(table).replace(tiny["work"], "/elsewhere/campaign/pet").replace("-s1", "-s2")
    table = json.loads(text)
    table["settings"]["seeds"] = [2]
    for run in table["runs"].values():
        run["seed"] = 2
    table["runs"]["word-kd-s2"]["hypotheses_last"] = table["runs"]["pet-s2"]["hypotheses_last"]
    (root / "results" / "pet_gpu.json").write_text(json.dumps(table))
    second = tmp_path / "elsewhere" / "campaign-pet-s1.tar.gz"  # the same name as the first: unpacked apart
    second.parent.mkdir()
    with tarfile.open(second, "w:gz") as tar:
        tar.add(root, arcname="campaign-pet")
    rc, out = campaign("ingest", first, second, "--results", tmp_path / "claims", "--unpack", tmp_path / "unpacked")
    assert rc == 0, out[-3000:]
    data = json.loads((tmp_path / "claims" / "pet_gpu.json").read_text())
    assert data["settings"]["seeds"] == [1, 2] and data["campaign"]["seeds"] == [1, 2]
    assert {"pet-s1", "pet-s2", "word-kd-s1", "word-kd-s2"} <= set(data["runs"])
    (c,) = data["comparisons"]
    assert c["label"] == "pet vs word-kd" and c["seeds"] == 2
    assert "| pet | 2 |" in (tmp_path / "claims" / "pet_gpu.md").read_text()
    # the same seed from two archives is refused
    rc, out = campaign("ingest", first, first, "--results", tmp_path / "again", "--unpack", tmp_path / "u2")
    assert rc != 0 and "more than one archive" in out


def test_ingest_refuses_what_is_not_a_campaign_archive(tmp_path):
    bad = tmp_path / "x.tar.gz"
    (tmp_path / "a.txt").write_text("x")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "a.txt", arcname="a.txt")
    rc, out = campaign("ingest", bad, "--results", tmp_path / "r", "--unpack", tmp_path / "u")
    assert rc != 0 and "not a campaign archive" in out
    rc, out = campaign("ingest", tmp_path / "missing.tar.gz", "--results", tmp_path / "r")
    assert rc != 0 and "no such archive" in out


def test_driver_flags_follow_the_drivers_options():
    both = "usage ... --device {cpu,cuda} --fp16 --bf16 --jobs N"
    assert families.driver_flags(both, "cuda", "fp16", 6) == ["--device", "cuda", "--fp16", "--jobs", "6"]
    assert families.driver_flags(both, "cpu", "fp32", 1) == ["--device", "cpu", "--jobs", "1"]
    assert families.driver_flags("usage ... --jobs N", "cpu", "fp32", 2) == ["--jobs", "2"]
    with pytest.raises(SystemExit, match="no --device option"):
        families.driver_flags("usage ... --jobs N", "cuda", "fp16", 6)
    with pytest.raises(SystemExit, match="no --bf16 option"):
        families.driver_flags("usage ... --device {cpu,cuda} --fp16", "cuda", "bf16", 6)


def test_plan_states_budgets_rates_and_sessions():
    rc, out = campaign("plan", "pet")
    assert rc == 0, out
    assert "--updates 5658 --warmup-updates 738 --validations 20" in out
    assert "6 at once at 12 updates/s each" in out and "lent sessions of 15 device minutes: 3, 1 seed(s) each" in out
    # GLUE families count Table 8's epochs in updates of batch 32 from the TSVs (RTE: 2,490 pairs -> 78 per epoch)
    glue = os.path.join(os.path.dirname(REPO), "shared", "data", "glue")
    if os.path.isdir(glue):
        rc, out = campaign("plan", "ghost", "--tasks", "RTE", "--glue-dir", glue)
        assert rc == 0 and "--glue-distill-updates 234 --glue-finetune-updates 234" in out, out


def fake_archive(tmp_path, name, seed, predictions, labels_file, label="GhostBERT vs pruned only, m = 3/12"):
    """A finished one-seed campaign archive of a GLUE table: campaign.json, the stage's DONE, the driver's table with
    one comparison (benchlib.glue_comparison of the given dev predictions, kept in the row)."""
    from benchlib import glue_comparison, write_predictions
    root = tmp_path / f"seed{seed}" / "campaign-ghost"
    (root / "stages" / name).mkdir(parents=True)
    (root / "stages" / name / "DONE").write_text("done\n")
    (root / "results").mkdir()
    files = []
    for which, preds in zip("ab", predictions):
        files.append(str(root / f"{which}.json"))
        write_predictions(files[-1], preds, labels_file)
    labels = [int(x) for x in open(labels_file).read().split()]
    c = glue_comparison(label, "ghost", "pruned", [files[0]], [files[1]], labels, "accuracy")
    (root / "results" / f"{name}.json").write_text(json.dumps({"parts": {"RTE": {"comparisons": [c]}},
                                                                "bench_command": "python scripts/bench/bench_ghost.py"}))
    (root / "results" / f"{name}.md").write_text("# GhostBERT\n")
    machine = {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0"}
    (root / "campaign.json").write_text(json.dumps({
        "seeds": [seed], "tables": [name], "command": f"python3 scripts/bench/campaign/run.py run ghost --seeds {seed}",
        "machine": machine, "precision": "fp16", "device": "cuda", "scale": "full", "work": "/w", "calls": [{}],
        "device_seconds": 600.0}))
    archive = tmp_path / f"campaign-ghost-seed{seed}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="campaign-ghost")
    return archive, c


def test_another_drivers_seeds_merge_by_their_kept_outputs(tmp_path):
    """Two sessions' archives of a GLUE table (a seed each): the comparison is re-tested over both seeds from the
    outputs each row keeps -- the same result as benchlib's test of both seeds at once."""
    from benchlib import glue_comparison, write_predictions
    labels_file = tmp_path / "labels.txt"
    labels = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1]
    labels_file.write_text("\n".join(map(str, labels)))
    seed1 = ([1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1], [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1])
    seed2 = ([1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 0, 1, 1, 0, 1, 0, 1])
    name = "ghostbert_rte_gpu"
    a1, c1 = fake_archive(tmp_path, name, 1, seed1, labels_file)
    a2, _ = fake_archive(tmp_path, name, 2, seed2, labels_file)
    rc, out = campaign("ingest", a2, a1, "--results", tmp_path / "claims", "--unpack", tmp_path / "u")
    assert rc == 0, out[-3000:]
    data = json.loads((tmp_path / "claims" / f"{name}.json").read_text())
    (c,) = data["parts"]["RTE"]["comparisons"]
    files = {}
    for seed, preds in ((1, seed1), (2, seed2)):
        for which, p in zip("ab", preds):
            files.setdefault(which, []).append(str(tmp_path / f"{which}{seed}.json"))
            write_predictions(files[which][-1], p, labels_file)
    both = glue_comparison(c1["label"], "ghost", "pruned", files["a"], files["b"], labels, "accuracy")
    assert c["seeds"] == 2 and c["per_seed"] == both["per_seed"] and c["diff"] == pytest.approx(both["diff"])
    assert (c["low"], c["high"], c["p"]) == pytest.approx((both["low"], both["high"], both["p"]))
    assert data["campaign"]["seeds"] == [1, 2] and "every other row is seed(s) [1]'s" in data["campaign"]["merged"]
    assert data["campaign"]["device_minutes"] == 20.0 and data["campaign"]["gpu"] == "NVIDIA H200"
    assert "Merged by the campaign's ingest over seeds 1, 2" in (tmp_path / "claims" / f"{name}.md").read_text()
    # archives whose tables do not hold the same comparisons are refused
    a3, _ = fake_archive(tmp_path / "x", name, 3, seed2, labels_file, label="another comparison")
    rc, out = campaign("ingest", a1, a3, "--results", tmp_path / "c3", "--unpack", tmp_path / "u3")
    assert rc != 0 and "differ at the comparison" in out
