"""The teacher cache of word-level KD: ``python -m user_dir.tools.teacher_cache`` builds it, ``--criterion kd
--teacher-cache`` reads it (user_dir/common/teacher_cache.py), on a real slice of the shipped Multi30k with the
shipped teacher."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from conftest import OPTIM_FLAGS, TEACHER, USER_DIR, needs_teacher, run_cli

import user_dir  # noqa: F401
from user_dir.common.teacher_cache import TeacherCache, TeacherCacheError
from test_distributed_equality import write_slice  # a slice of the teacher's data-bin

pytestmark = needs_teacher

TINY_PET = ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "32", "--decoder-embed-dim", "24",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """240 training pairs and their cache, built by the command line in batches of 1,500 tokens."""
    root = tmp_path_factory.mktemp("teacher_cache")
    data = write_slice(root / "data", {"train": ("train", 240), "valid": ("valid", 40)})
    cache = str(root / "cache")
    run_cli("user_dir.tools.teacher_cache", data, "--path", TEACHER, "--dest", cache, "--max-tokens", "1500", "--cpu")
    return {"root": root, "data": data, "cache": cache}


def _task_and_student(data):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en", *TINY_PET, "--dropout", "0"])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task, task.build_model(args)


def test_cache_holds_every_training_token_as_float16_log_probabilities(cached):
    cache = TeacherCache(cached["cache"])
    header = cache.header
    assert header["examples"] == 240 and header["dtype"] == "float16" and header["vocab_size"] == 7896
    assert header["tokens"] == int(cache.index[:, 1].sum()) == cache.logprobs.shape[0] and not header["skipped"]
    assert (cache.index[:, 0] >= 0).all()
    rows = cache.logprobs[:500].astype(np.float64)
    assert np.allclose(np.exp(rows).sum(-1), 1.0, atol=1e-2)  # log-probabilities (T = 1), normalised
    assert sorted(os.listdir(cached["cache"])) == ["header.json", "index.npy", "logprobs.npy"]  # no leftovers


def test_cached_kd_loss_equals_the_online_kd_loss_to_float16_rounding(cached):
    """Shuffled batches of 700 tokens (the cache was built in length-sorted batches of 1,500), at T = 1 and 2: the
    KD loss read from the cache is the online one computed on the teacher's float16-rounded log-probabilities (up to
    the float32 noise of other batch compositions), within 2e-5 of the unrounded online loss (measured: 1e-7 and
    2e-6), and the cached criterion never runs the teacher. In validation (where the slice's ids are other examples,
    which the cache would refuse) only the task loss is computed."""
    import torch.nn.functional as F

    from user_dir.common.kd_losses import word_kd_loss
    from user_dir.common.word_kd_criterion import WordKDCriterion

    task, model = _task_and_student(cached["data"])
    task.load_dataset("train")
    dataset = task.dataset("train")
    itr = task.get_batch_iterator(dataset, max_tokens=700, seed=3).next_epoch_itr(shuffle=True)
    batches = [next(itr) for _ in range(4)]
    assert sorted(i for b in batches for i in b["id"].tolist()) != list(range(sum(len(b["id"]) for b in batches)))
    pad = task.target_dictionary.pad()
    model.train()
    checked = 0
    for temperature in (1.0, 2.0):
        online = WordKDCriterion(task, False, 0.1, teacher_path=TEACHER, kd_temperature=temperature)
        from_cache = WordKDCriterion(task, False, 0.1, teacher_path=TEACHER, kd_temperature=temperature,
                                     teacher_cache=cached["cache"])
        from_cache.teacher.model.forward = None  # calling the teacher would fail
        for sample in batches:
            loss_c, _, log_c = from_cache(model, sample)
            loss_o, _, log_o = online(model, sample)
            with torch.no_grad():
                student = model(**sample["net_input"])[0]
                teacher = online.teacher.model(**sample["net_input"])[0]
                rounded = F.log_softmax(teacher.float(), -1).half().float()
                kd_rounded = word_kd_loss(student, rounded, temperature, pad_mask=sample["target"].eq(pad))
            assert log_c["kd_loss"].item() == pytest.approx(kd_rounded.item(), rel=1e-6)
            assert log_c["kd_loss"].item() == pytest.approx(log_o["kd_loss"].item(), rel=2e-5)
            assert loss_c.item() == pytest.approx(loss_o.item(), rel=2e-5)
            assert torch.equal(log_c["task_loss"], log_o["task_loss"])
            checked += 1
    assert checked == 8
    # validation: the task loss alone; the cache (of the training subset) is not read
    task.load_dataset("valid")
    valid = task.dataset("valid")
    model.eval()
    with torch.no_grad():
        loss, _, log = from_cache(model, valid.collater([valid[i] for i in range(5)]))
    assert "kd_loss" not in log and torch.isfinite(loss)


def test_stale_caches_are_refused_naming_the_flag_and_file(cached, tmp_path):
    from fairseq import checkpoint_utils

    from user_dir.common.word_kd_criterion import WordKDCriterion

    header = os.path.join(cached["cache"], "header.json")
    task, _ = _task_and_student(cached["data"])
    # another teacher: the same architecture and dictionaries, one weight changed
    state = checkpoint_utils.load_checkpoint_to_cpu(TEACHER)
    state["model"]["decoder.layers.0.fc1.bias"] += 0.01
    other_teacher = str(tmp_path / "other_teacher.pt")
    torch.save(state, other_teacher)
    with pytest.raises(TeacherCacheError, match=re.escape(f"--teacher-cache {header}") + ".*another teacher"):
        WordKDCriterion(task, False, 0.1, teacher_path=other_teacher, teacher_cache=cached["cache"])
    # other data: the first 200 training pairs instead of 240, the same dictionaries
    other_data = write_slice(tmp_path / "data", {"train": ("train", 200), "valid": ("valid", 40)})
    other_task, _ = _task_and_student(other_data)
    with pytest.raises(TeacherCacheError, match=r"--teacher-cache .*other data: train\.de-en\.de\.bin differs"):
        WordKDCriterion(other_task, False, 0.1, teacher_path=TEACHER, teacher_cache=cached["cache"])
    # a batch whose targets are not those cached (here one token shorter) is refused at the batch
    cache = TeacherCache(cached["cache"])
    task.load_dataset("train")
    ds = task.dataset("train")
    sample = ds.collater([ds[i] for i in (3, 7, 11)])
    target = sample["target"].clone()
    assert cache.gather(sample["id"], target, 1, torch.empty(0)).shape == (*target.shape, 7896)
    row = sample["id"].tolist().index(3)  # (the collater sorts by source length)
    target[row, target[row].ne(1).sum() - 1] = 1
    with pytest.raises(TeacherCacheError, match=r"--teacher-cache .*index\.npy: example 3 has target length"):
        cache.gather(sample["id"], target, 1, torch.empty(0))
    # an unfinished build or another folder
    with pytest.raises(TeacherCacheError, match=r"--teacher-cache .*no header\.json -- not a teacher cache"):
        TeacherCache(str(tmp_path))


def test_an_interrupted_build_resumes_to_the_same_cache(cached, tmp_path, monkeypatch):
    from fairseq.data import LanguagePairDataset

    from user_dir.tools import teacher_cache as tool

    dest = str(tmp_path / "cache")
    argv = [cached["data"], "--path", TEACHER, "--dest", dest, "--max-tokens", "600", "--cpu", "--save-interval", "0"]
    collater, calls = LanguagePairDataset.collater, []

    class Interrupted(Exception):
        pass

    def failing_collater(self, samples, *args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise Interrupted
        return collater(self, samples, *args, **kwargs)

    monkeypatch.setattr(LanguagePairDataset, "collater", failing_collater)
    with pytest.raises(Interrupted):
        tool.main(argv)
    monkeypatch.setattr(LanguagePairDataset, "collater", collater)
    with pytest.raises(TeacherCacheError, match="an unfinished build"):
        TeacherCache(dest)
    header = tool.main(argv)
    assert header["built"]["resumed"]
    resumed, fresh = TeacherCache(dest), TeacherCache(cached["cache"])
    assert np.array_equal(resumed.index, fresh.index)
    assert np.allclose(resumed.logprobs, fresh.logprobs, rtol=2e-3, atol=1e-3)  # other batches: float32 noise
    assert tool.main(argv)["built"] == header["built"]  # finished: left alone
    with pytest.raises(SystemExit, match="--overwrite"):  # another teacher into a finished cache
        other = str(tmp_path / "teacher.pt")
        shutil.copy(TEACHER, other)
        with open(other, "ab") as f:
            f.write(b"\0")
        tool.main([cached["data"], "--path", other, "--dest", dest, "--cpu"])


# a plain Transformer student of two layers a side (Patient-KD's intermediate layer 1), after TINY_PET's flags
PLAIN_STUDENT = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2"]


def _json_losses(log):
    return [json.loads(m)["loss"] for m in re.findall(r"\| train_inner \| (\{.*\})", log)]


def test_fairseq_train_with_the_cache_follows_the_online_run(cached, tmp_path):
    """Three updates of stock fairseq-train --criterion kd, online and from the cache: the same losses (to the
    log's rounding); Patient-KD, which also needs the teacher's hidden states, refuses the cache at start."""
    common = [cached["data"], "--user-dir", USER_DIR, *TINY_PET, *OPTIM_FLAGS, "--max-tokens", "1024",
              "--log-format", "json", "--max-update", "3", "--cpu", "--teacher-path", TEACHER,
              "--label-smoothing", "0.1", "--no-save"]
    online = run_cli("fairseq_cli.train", *common, "--criterion", "kd", "--save-dir", tmp_path / "online")
    cached_run = run_cli("fairseq_cli.train", *common, "--criterion", "kd", "--teacher-cache", cached["cache"],
                         "--save-dir", tmp_path / "cached")
    a, b = _json_losses(online.stdout + online.stderr), _json_losses(cached_run.stdout + cached_run.stderr)
    assert len(a) == len(b) == 3, (a, b)
    assert [float(x) for x in a] == pytest.approx([float(x) for x in b], abs=2e-3)
    pkd = run_cli("fairseq_cli.train", *common, *PLAIN_STUDENT, "--criterion", "patient_kd", "--teacher-cache",
                  cached["cache"], "--save-dir", tmp_path / "pkd", check=False)
    assert pkd.returncode != 0 and "--teacher-cache" in pkd.stderr and "--criterion patient_kd" in pkd.stderr
    assert "num_updates" not in pkd.stdout + pkd.stderr
