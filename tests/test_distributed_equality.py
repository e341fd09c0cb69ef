"""Data-parallel training equals one process, and resuming equals never stopping (issue 19).

Two CPU ranks (gloo, legacy_ddp, through scripts/recipes/distributed_train.sh) with B sentences each take
the same first update as one process with the same 2B sentences in one batch, for plain
label-smoothed CE, ``--criterion kd`` (each rank loads its own frozen teacher) and PET's
``pet_warmup``. Which sentences each rank gets (fairseq 0.12, data/iterators.py): the training set
is sorted by length (``ordered_indices``), cut into batches of ``--batch-size`` sentences
(``--required-batch-size-multiple 1``), the batches shuffled with ``seed + epoch`` and rank r takes
batches r, r+W, r+2W, ... (``ShardedIterator``). With exactly 2B training sentences the single
process has one batch of all of them and each rank one batch of B, so the first update sees the
same sentences; the trainer sums the ranks' gradients and their ``sample_size`` (target tokens),
so both runs divide the same summed gradient by the same token count. The optimizer is plain SGD,
whose step is proportional to the gradient (Adam's first step, about lr * sign(grad), would hide a
wrong scale), and dropout is 0: fairseq seeds every rank alike, so ranks draw their dropout masks
from one stream and no mask of a 2B-sentence batch can equal them.

Resuming: a checkpoint written mid-epoch by ``--save-interval-updates`` holds the model, Adam and
scheduler state and the position in the epoch, and fairseq re-seeds torch with ``seed + update``
before every update, so a resumed run's updates k+1.. (dropout on) equal the uninterrupted run's.
The data is the reference teacher's binarised Multi30k (a slice of its training set, its dictionary).
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TEACHER, TEACHER_DIR, TINY_TRANSFORMER, USER_DIR, clean_env, needs_teacher, run_cli

B = 4  # sentences per rank; the single process takes 2B in one batch
LR = 0.5
TINY_PET = ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "32", "--decoder-embed-dim", "24",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
LSCE = ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
CRITERIA = {
    "label_smoothed_cross_entropy": [*TINY_TRANSFORMER, *LSCE],
    "kd": [*TINY_TRANSFORMER, "--criterion", "kd", "--teacher-path", TEACHER, "--label-smoothing", "0.1"],
    "pet_warmup": [*TINY_PET, "--criterion", "pet_warmup", "--teacher-path", TEACHER],
    "pet_warmup_output_layer": [*TINY_PET, "--criterion", "pet_warmup", "--teacher-path", TEACHER,
                                "--warmup-mapping", "output-layer"],
}
COMMON = ["--user-dir", USER_DIR, "-s", "de", "-t", "en", "--seed", "1", "--num-workers", "0",
          "--required-batch-size-multiple", "1", "--log-format", "json", "--log-interval", "1", "--no-progress-bar",
          "--disable-validation", "--no-epoch-checkpoints"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_on_two_ranks(args, log_dir):
    """``scripts/recipes/distributed_train.sh --nproc 2 --cpu -- args``; rank 1's log goes to ``log_dir``."""
    env = dict(clean_env(), LOG_DIR=str(log_dir), OMP_NUM_THREADS="1", PYTHON=sys.executable)
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "recipes", "distributed_train.sh"), "--nproc", "2",
                           "--master-port", str(free_port()), "--cpu", "--", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def write_slice(dest, splits):
    """A data-bin of the first ``n`` pairs of each of the teacher's splits, ``{split: (source split, n)}``,
    with the teacher's dictionaries."""
    from fairseq.data import data_utils, indexed_dataset

    src_dir = os.path.join(TEACHER_DIR, "data-bin")
    os.makedirs(dest, exist_ok=True)
    for lang in ("de", "en"):
        shutil.copy(os.path.join(src_dir, f"dict.{lang}.txt"), dest)
        for split, (source, n) in splits.items():
            data = data_utils.load_indexed_dataset(os.path.join(src_dir, f"{source}.de-en.{lang}"), None)
            prefix = os.path.join(dest, f"{split}.de-en.{lang}")
            builder = indexed_dataset.make_builder(prefix + ".bin", "mmap", vocab_size=8000)
            for i in range(n):
                builder.add_item(data[i])
            builder.finalize(prefix + ".idx")
    return str(dest)


def json_stats(log, tag="train_inner"):
    """The per-update (``train_inner``) or per-epoch (``train``) dictionaries of a --log-format json log."""
    return [json.loads(m) for m in re.findall(r"\| " + tag + r" \| (\{.*\})", log)]


def load_params(path):
    from fairseq import checkpoint_utils

    import user_dir  # noqa: F401  (allow-lists the globals fairseq checkpoints hold)

    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    params = {"model." + k: v.float() for k, v in state["model"].items()}
    params.update({"criterion." + k: v.float() for k, v in (state.get("criterion") or {}).items()})
    return params


def assert_same_weights(expected_dir, actual_dir, atol=1e-6):
    """The checkpoint_last.pt weights (model and criterion) of two save dirs agree elementwise."""
    expected, actual = (load_params(os.path.join(d, "checkpoint_last.pt")) for d in (expected_dir, actual_dir))
    assert expected.keys() == actual.keys()
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=0, atol=atol, msg=lambda m: f"{k}: {m}")
    return expected, actual


@pytest.fixture(scope="module")
def two_b_pairs(tmp_path_factory):
    """Exactly 2B training pairs of the teacher's data (different lengths, so the one batch of the
    single process pads differently from the ranks' two)."""
    if not os.path.isfile(TEACHER):
        pytest.skip(f"the test teacher and its data at {TEACHER_DIR} could not be assembled (tests/conftest.py)")
    dest = tmp_path_factory.mktemp("pairs") / "data-bin"
    return write_slice(dest, {"train": ("train", 2 * B), "valid": ("valid", 8)})


@needs_teacher
@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_two_ranks_take_the_first_update_of_one_process(criterion, two_b_pairs, tmp_path):
    args = [two_b_pairs, *COMMON, *CRITERIA[criterion], "--optimizer", "sgd", "--lr", str(LR), "--dropout", "0",
            "--max-update", "1"]
    single = run_cli("fairseq_cli.train", *args, "--batch-size", 2 * B, "--save-dir", tmp_path / "single", "--cpu")
    dist = train_on_two_ranks([*args, "--batch-size", B, "--save-dir", tmp_path / "dist"], tmp_path / "logs")
    assert dist.returncode == 0, dist.stderr[-4000:] + (tmp_path / "logs" / "rank1.log").read_text()[-3000:]
    (s,), (d,) = json_stats(single.stdout + single.stderr), json_stats(dist.stdout + dist.stderr)
    # the same 2B sentences and target tokens in the update (rank 0 logs the sum over ranks)
    assert s["num_updates"] == d["num_updates"] == "1"
    assert float(s["bsz"]) == float(d["bsz"]) == 2 * B and s["wpb"] == d["wpb"]
    assert abs(float(s["loss"]) - float(d["loss"])) <= 1e-3, (s, d)
    assert abs(float(s["gnorm"]) - float(d["gnorm"])) <= 1e-3 * float(s["gnorm"]), (s, d)
    ps, pd = assert_same_weights(tmp_path / "single", tmp_path / "dist")
    # with SGD the update is -lr * grad, its L2 norm lr * gnorm: the runs differ by float rounding only
    step = LR * float(s["gnorm"])
    diff = torch.cat([(ps[k] - pd[k]).flatten() for k in ps])
    print(f"{criterion}: |step| {step:.4g}, |single - dist| {diff.norm():.3g}, max elementwise {diff.abs().max():.3g}")
    assert step > 1e-2 and diff.norm() <= 1e-4 * step


@needs_teacher
def test_a_run_resumed_mid_epoch_continues_the_uninterrupted_loss_curve(tmp_path):
    """Updates 4-6 after resuming from the checkpoint of update 3 (Adam, inverse_sqrt warm-up,
    dropout 0.3) equal those of the run that never stopped, loss for loss and weight for weight."""
    data = write_slice(tmp_path / "data-bin", {"train": ("train", 96), "valid": ("valid", 8)})
    args = [data, *COMMON, *TINY_TRANSFORMER, *LSCE, "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler",
            "inverse_sqrt", "--warmup-updates", "4", "--dropout", "0.3", "--batch-size", "8", "--max-update", "6",
            "--save-interval-updates", "3", "--cpu"]
    whole = run_cli("fairseq_cli.train", *args, "--save-dir", tmp_path / "whole")
    curve = {int(s["num_updates"]): s for s in json_stats(whole.stdout + whole.stderr)}
    assert sorted(curve) == [1, 2, 3, 4, 5, 6] and len(set(s["loss"] for s in curve.values())) > 1
    # killed after update 3, mid-epoch (12 batches): its checkpoint_last.pt is what was saved then
    (tmp_path / "killed").mkdir()
    shutil.copy(tmp_path / "whole" / "checkpoint_1_3.pt", tmp_path / "killed" / "checkpoint_last.pt")
    resumed = run_cli("fairseq_cli.train", *args, "--save-dir", tmp_path / "killed")
    log = resumed.stdout + resumed.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 1 @ 3 updates\)", log), log[-3000:]
    after = {int(s["num_updates"]): s for s in json_stats(log)}
    assert sorted(after) == [4, 5, 6]
    for k in (4, 5, 6):
        for key in ("loss", "nll_loss", "gnorm", "lr", "wpb", "bsz"):
            assert after[k][key] == curve[k][key], (k, key, after[k], curve[k])
    assert_same_weights(tmp_path / "whole", tmp_path / "killed")
