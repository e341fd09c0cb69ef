"""scripts/campaign/run.py on the CPU: a tiny-budget PET campaign (the drivers' --quick settings, PET and word-KD,
one seed) is stopped by its time budget, resumed by the same command, packed into one archive without
checkpoints, and ingested into the JSON that scripts/claims.py reads; two seeds' archives merge into one table.

The Multi30k data-bin the driver prepares (BPE learned on 29,000 pairs: a minute) is kept across test runs in
work/test-campaign/, as conftest keeps the test teacher's."""
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO, clean_env

sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "scripts", "campaign"))
import claims  # noqa: E402
import families  # noqa: E402

RUNNER = os.path.join(REPO, "scripts", "campaign", "run.py")
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
            if name != "bench-translation":
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)
        quick = os.path.join(work, "bench-translation", "quick")
        for name in os.listdir(quick) if os.path.isdir(quick) else []:
            if os.path.join(quick, name) != data:
                shutil.rmtree(os.path.join(quick, name), ignore_errors=True)
    out = tmp_path_factory.mktemp("out")
    common = ["run", "pet", "--device", "cpu", "--scale", "tiny", "--seeds", "1", "--work", work, "--out", out,
              "--jobs", "1"]
    # the budget leaves the set-up stage (an import) and a few seconds of the driver before packing
    first = campaign(*common, "--budget", 32)
    second = campaign(*common, "--budget", 0)
    return dict(work=work, out=str(out), first=first, second=second, common=common)


def test_budget_stops_a_stage_then_the_same_command_resumes_and_packs(tiny):
    rc, out = tiny["first"]
    assert rc == 3 and "resume with the same command" in out, out[-3000:]
    assert "pet_gpu: the time budget is spent: stopping it" in out
    rc, out = tiny["second"]
    assert rc == 0, out[-3000:]
    assert "setup: done before, skipped" in out  # the first call's finished stage was not run again
    with open(os.path.join(tiny["work"], "campaign.json")) as f:
        state = json.load(f)
    assert [c["finished"] for c in state["calls"]] == [False, True]
    assert state["device_seconds"] > 0 and state["machine"]["device"] == "cpu" and state["precision"] == "fp32"
    with tarfile.open(os.path.join(tiny["out"], "campaign-pet.tar.gz")) as tar:
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
    return dict(method="PET", claim="c", paper="p", budget="b", json=path, label=r"^pet vs word-kd$", threshold=0.0,
                command="x")


def test_ingest_writes_the_table_claims_reads_with_the_campaign_record(tiny, tmp_path):
    rc, out = campaign("ingest", os.path.join(tiny["out"], "campaign-pet.tar.gz"), "--results", tmp_path / "claims",
                       "--unpack", tmp_path / "unpacked")
    assert rc == 0, out[-3000:]
    with open(tmp_path / "claims" / "pet_gpu.json") as f:
        data = json.load(f)
    record = data["campaign"]
    assert record["seeds"] == [1] and record["precision"] == "fp32" and record["device"] == "cpu"
    assert record["calls"] == 2 and record["device_minutes"] > 0
    assert "run pet --device cpu --scale tiny" in record["commands"][0]
    assert "Campaign (issue 45)" in (tmp_path / "claims" / "pet_gpu.md").read_text()
    comparison, commands = claims.claim_row(claim_spec("claims/pet_gpu.json"), str(tmp_path))
    assert comparison["seeds"] == 1 and comparison["a_name"] == "pet" and commands[0].startswith(
        "python scripts/bench_translation.py")
    assert claims.verdict(comparison, 0.0) == "inconclusive (1 seed)"


def test_two_sessions_seeds_merge_into_one_table(tiny, tmp_path):
    """A second session's archive (seed 2: here the first one's outputs relabelled, the word-KD student's
    hypotheses swapped for PET's) merges with the first: rows, runs and the paired test over both seeds."""
    first = os.path.join(tiny["out"], "campaign-pet.tar.gz")
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
    second = tmp_path / "campaign-pet-seed2.tar.gz"
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
