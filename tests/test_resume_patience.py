"""A fairseq-train run resumed from its checkpoint stops where the same run uninterrupted stops
(user_dir/common/resume_patience.py): its --patience count survives the resume, and a recipe stage whose checkpoint
had already met its rule is marked done instead of trained on (user_dir.tools.training_stopped, common.sh's stage)."""
import os
import subprocess
import sys

import torch
from conftest import OPTIM_FLAGS, REPO, TINY_TRANSFORMER, USER_DIR, clean_env, run_cli

# --lr 0: every validation equals the first, none is better, so --patience 2 stops an uninterrupted run after 3 epochs
FLAGS = [*TINY_TRANSFORMER, *OPTIM_FLAGS]
FLAGS[FLAGS.index("--lr") + 1] = "0"
FLAGS += ["--criterion", "cross_entropy", "--cpu", "--no-epoch-checkpoints", "--max-valid-steps", "1",
          "--user-dir", USER_DIR]


def train(data, save_dir, *extra):
    return run_cli("fairseq_cli.train", data, *FLAGS, "--save-dir", save_dir, *extra)


def epochs_and_updates(save_dir):
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=False)
    return state["extra_state"]["train_iterator"]["epoch"] - 1, state["optimizer_history"][-1]["num_updates"]


def stopped(data, save_dir, *extra):
    proc = run_cli("user_dir.tools.training_stopped", "fairseq-train", data, *FLAGS, "--save-dir", save_dir, *extra,
                   check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_an_interrupted_run_resumes_its_patience_count_and_stops_with_the_uninterrupted_run(multi30k_slice, tmp_path):
    parts = str(tmp_path / "parts")
    train(multi30k_slice, parts, "--patience", "2", "--max-epoch", "2")  # stopped after epoch 2 (as a kill would)
    assert epochs_and_updates(parts)[0] == 2
    assert stopped(multi30k_slice, parts, "--patience", "2", "--max-epoch", "10") is None  # 1 validation since best
    assert "(patience)" in stopped(multi30k_slice, parts, "--patience", "1", "--max-epoch", "10")
    proc = train(multi30k_slice, parts, "--patience", "2", "--max-epoch", "10")
    assert "1 validation(s) since it" in proc.stdout + proc.stderr
    assert epochs_and_updates(parts)[0] == 3  # as uninterrupted; not 5: fairseq alone counts from 0 again


def test_a_stage_killed_after_its_last_checkpoint_is_marked_done_not_trained_past_max_update(multi30k_slice, tmp_path):
    work = tmp_path / "work"
    save_dir = work / "train"
    train(multi30k_slice, str(save_dir), "--max-update", "4")  # the stage's run; its DONE marker never written
    assert epochs_and_updates(save_dir)[1] == 4
    command = ["fairseq-train", multi30k_slice, *FLAGS, "--save-dir", str(save_dir), "--max-update", "4"]
    script = ('ROOT="$1"; shift; source "$ROOT/scripts/recipes/common.sh"; WORK="$1"; shift; stage train "$@"')
    env = dict(clean_env(), PYTHON=sys.executable,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])  # the venv's fairseq-train
    proc = subprocess.run(["bash", "-c", script, "stage", REPO, str(work), *command], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "marked done" in proc.stdout and (save_dir / "DONE").exists()
    assert epochs_and_updates(save_dir)[1] == 4  # fairseq-train alone would take a fifth update
