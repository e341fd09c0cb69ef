"""PET's competitors: Patient-KD (criterion) and CAN (model), on real Multi30k data."""
import math
import re
import subprocess
import sys
import os

import pytest
import torch

from conftest import OPTIM_FLAGS, REPO, TEACHER, TEACHER_DIR, USER_DIR, needs_teacher, run_cli

import user_dir  # noqa: F401
from user_dir.baselines.patient_kd_criterion import PatientKDConfigError, parse_layer_map


def _load_script(name):
    """A module of scripts/, imported as running a script does: scripts/ on sys.path (they are not a package)."""
    import importlib

    if os.path.join(REPO, "scripts", "bench") not in sys.path:
        sys.path.insert(0, os.path.join(REPO, "scripts", "bench"))
    return importlib.import_module(name)


# a plain (unshared) student: 2+2 layers, narrower than the 256-wide reference teacher
PLAIN_STUDENT = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "2", "--decoder-layers", "2",
                 "--encoder-embed-dim", "32", "--decoder-embed-dim", "24", "--encoder-ffn-embed-dim", "64",
                 "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                 "--share-decoder-input-output-embed", "--dropout", "0"]


def test_layer_maps_skip_last_explicit_and_bad_indices():
    # intermediate layers only: the last ones are left to the KD loss (tests/test_patient_kd.py: the paper's maps)
    assert parse_layer_map("skip", 3, 6, "--pkd-encoder-map") == [(1, 2), (2, 4)]  # PKD: i <- 2i
    assert parse_layer_map("skip", 2, 3, "--pkd-encoder-map") == [(1, 1)]
    assert parse_layer_map("skip", 3, 3, "--pkd-encoder-map") == [(1, 1), (2, 2)]
    assert parse_layer_map("last", 2, 6, "--pkd-decoder-map") == [(1, 5)]
    assert parse_layer_map("none", 2, 6, "--pkd-decoder-map") == []
    assert parse_layer_map("1:3, 2:5", 3, 6, "--pkd-decoder-map") == [(1, 3), (2, 5)]
    with pytest.raises(PatientKDConfigError, match=r"--pkd-decoder-map .*teacher layer 7 is out of range 1..6"):
        parse_layer_map("1:7", 2, 6, "--pkd-decoder-map")
    with pytest.raises(PatientKDConfigError, match=r"--pkd-encoder-map .*student layer 0 is out of range"):
        parse_layer_map("0:1", 2, 6, "--pkd-encoder-map")
    with pytest.raises(PatientKDConfigError, match="--pkd-encoder-map skip: the student has more layers"):
        parse_layer_map("skip", 4, 3, "--pkd-encoder-map")
    with pytest.raises(PatientKDConfigError, match="appears twice"):
        parse_layer_map("1:1,1:2", 2, 6, "--pkd-encoder-map")
    with pytest.raises(PatientKDConfigError, match="expected 'skip'"):
        parse_layer_map("1-2", 2, 6, "--pkd-encoder-map")


def _task_and_student(arch_flags):
    return _task_and_student_on(os.path.join(TEACHER_DIR, "data-bin"), arch_flags)


def _task_and_student_on(data, arch_flags):
    """The task on ``data``, a student built from ``arch_flags`` (seed 0), six validation pairs."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en", *arch_flags])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    return task, model, ds.collater([ds[i] for i in range(6)])


@needs_teacher
def test_patient_kd_loss_is_kd_plus_beta_times_normalised_hidden_distance():
    import torch.nn.functional as F

    from user_dir.baselines.patient_kd_criterion import PatientKDConfig, PatientKDCriterion
    from user_dir.common.word_kd_criterion import WordKDCriterion

    task, model, sample = _task_and_student(PLAIN_STUDENT)
    cfg = PatientKDConfig(teacher_path=TEACHER, label_smoothing=0.1, pkd_beta=10.0, sentence_avg=False,
                          encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=24)
    crit = PatientKDCriterion.build_criterion(cfg, task)
    assert crit.encoder_map == [(1, 1)] and crit.decoder_map == [(1, 1)]  # the last layers are left to KD
    model.train()
    loss, sample_size, log = crit(model, sample)
    loss.backward()
    assert math.isfinite(loss.item()) and log["pkd_loss"] > 0

    # the same number by hand: word-KD loss + beta * L_PT * sample_size, L_PT the mean over matched layer pairs of
    # F.mse_loss of the normalised states (the authors' units), fairseq dividing the whole by sample_size
    kd_only = WordKDCriterion(task, False, 0.1, teacher_path=TEACHER)
    kd_loss, _, _ = kd_only(model, sample)
    net = sample["net_input"]
    teacher = crit.teacher.model
    with torch.no_grad():
        s_enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
        s_dec = model.decoder(net["prev_output_tokens"], encoder_out=s_enc, return_all_hiddens=True)
        t_enc = teacher.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
        t_dec = teacher.decoder(net["prev_output_tokens"], encoder_out=t_enc, return_all_hiddens=True)
        per_pair = []
        for s_states, t_states, proj, tokens in (
                (s_enc["encoder_states"], t_enc["encoder_states"], crit.encoder_proj, net["src_tokens"]),
                (s_dec[1]["inner_states"], t_dec[1]["inner_states"], crit.decoder_proj, net["prev_output_tokens"])):
            keep = tokens.ne(1)
            h_s = F.normalize(proj(s_states[1].transpose(0, 1))[keep], dim=-1)
            h_t = F.normalize(t_states[1].transpose(0, 1)[keep], dim=-1)
            per_pair.append(F.mse_loss(h_s, h_t).item())
        expected = sum(per_pair) / len(per_pair) * sample_size
    assert sample_size == sample["ntokens"]
    assert log["pkd_loss"] == pytest.approx(expected, rel=1e-4)
    assert loss.item() == pytest.approx(kd_loss.item() + 10.0 * expected, rel=1e-4)

    # gradients: every student weight and both width maps; never the teacher
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing
    assert crit.encoder_proj.weight.grad.abs().sum() > 0 and crit.decoder_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    # validation reports the task loss alone, as every KD criterion here
    model.eval()
    val_loss, _, val_log = crit(model, sample)
    assert "pkd_loss" not in val_log
    # fairseq lists only the layers that ran: with layerdrop the map would pair wrong layers, so it is refused
    model.train()
    model.decoder.decoder_layerdrop = 0.2
    with pytest.raises(PatientKDConfigError, match="--decoder-layerdrop with --criterion patient_kd"):
        crit(model, sample)


@needs_teacher
def test_patient_kd_trains_with_fairseq_train_and_generates(tmp_path):
    data = os.path.join(TEACHER_DIR, "data-bin")
    common = [data, "--user-dir", USER_DIR, *PLAIN_STUDENT, *OPTIM_FLAGS, "--cpu", "--criterion", "patient_kd",
              "--teacher-path", TEACHER, "--label-smoothing", "0.1"]
    bad = run_cli("fairseq_cli.train", *common, "--pkd-decoder-map", "1:4", "--max-update", "1",
                  "--save-dir", tmp_path / "bad", check=False)
    assert bad.returncode != 0 and "--pkd-decoder-map '1:4': teacher layer 4 is out of range 1..3" in bad.stderr
    assert "num_updates" not in bad.stdout + bad.stderr
    train = run_cli("fairseq_cli.train", *common, "--max-update", "3", "--save-dir", tmp_path / "ckpt")
    # every update logs the hidden-state distance: positive (a fresh student is far from its teacher), finite
    logged = [float(v) for v in re.findall(r"\| train_inner \|.*?pkd_loss=([\d.]+)", train.stdout + train.stderr)]
    assert len(logged) == 3 and all(0 < v < float("inf") for v in logged), logged
    ckpt = torch.load(tmp_path / "ckpt" / "checkpoint_last.pt", map_location="cpu")
    # the width maps (student 32/24 -> teacher 256) train with the student and are saved in the criterion
    # state, not in the model
    assert ckpt["criterion"]["encoder_proj.weight"].shape == (256, 32)
    assert ckpt["criterion"]["decoder_proj.weight"].shape == (256, 24)
    assert not any(k.startswith(("encoder_proj", "decoder_proj")) for k in ckpt["model"])
    # shard 0 of 8: about a batch of the 1014 valid sentences (test_can_trains_with_kd_and_generates decodes all)
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", tmp_path / "ckpt" / "checkpoint_last.pt",
                  "--beam", "5", "--batch-size", "128", "--max-len-b", "5", "--gen-subset", "valid", "--cpu",
                  "--distributed-world-size", "8", "--distributed-rank", "0")
    lines = gen.stdout.splitlines()
    assert sum(line.startswith("H-") for line in lines) == sum(line.startswith("S-") for line in lines) > 64


# ---------------------------------------------------------------------------------------------
# CAN
# ---------------------------------------------------------------------------------------------
TINY_CAN = ["--arch", "can_transformer_iwslt", "--encoder-layers", "3", "--decoder-layers", "2",
            "--encoder-embed-dim", "32", "--decoder-embed-dim", "24", "--encoder-ffn-embed-dim", "64",
            "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
            "--share-decoder-input-output-embed"]


def can_closed_form_non_embedding(e, fe, d, fd, enc_layers, dec_layers):
    """Standard pre-norm encoder layers and the encoder's final LayerNorm; CAN decoder layers: q, k_self,
    v_self (FFN-wide), k_enc, v_enc (reading e-dim states), fc1 (the FFN's first linear on the decoder
    state), fc2 back to d, one LayerNorm; the decoder's final LayerNorm. Biases everywhere."""
    enc_layer = 4 * (e * e + e) + (e * fe + fe) + (fe * e + e) + 4 * e
    dec_layer = (2 * (d * d + d) + (d * fd + fd) + (e * d + d) + (e * fd + fd) + (d * fd + fd) + (fd * d + d)
                 + 2 * d)
    return enc_layers * enc_layer + 2 * e + dec_layers * dec_layer + 2 * d


def test_can_parameter_count_and_one_sublayer_per_decoder_layer(multi30k_slice):
    from user_dir.baselines.can_transformer import CompressedAttentionLayer
    from user_dir.common.counting import count_parameters

    task, model, _ = _task_and_student_on(multi30k_slice, TINY_CAN)
    assert all(isinstance(layer, CompressedAttentionLayer) for layer in model.decoder.layers)
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 2
    assert count_parameters(model).non_embedding == can_closed_form_non_embedding(32, 64, 24, 48, 3, 2)
    # the defaults are the authors' deep encoder and shallow decoder (tests/test_can.py: the rest of them)
    _, default, _ = _task_and_student_on(multi30k_slice, ["--arch", "can_transformer_iwslt"])
    assert len(default.encoder.layers) == 12 and len(default.decoder.layers) == 2


def test_can_beam_search_agrees_with_teacher_forcing(multi30k_slice):
    """The compressed attention caches prefix and encoder keys/values per layer and reorders them
    with the beam: beam scores of the best hypothesis equal a teacher-forced pass over it."""
    from fairseq.dataclass.configs import GenerationConfig

    task, model, sample = _task_and_student_on(multi30k_slice, TINY_CAN)
    model.eval()
    generator = task.build_generator([model], GenerationConfig(beam=5, max_len_b=12))
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
        for i, nbest in enumerate(hypos):
            for hypo in nbest[:2]:
                tokens = hypo["tokens"]
                prev = torch.cat([tokens.new_tensor([task.target_dictionary.eos()]), tokens[:-1]]).unsqueeze(0)
                src = sample["net_input"]["src_tokens"][i: i + 1]
                src = src[:, src.ne(task.source_dictionary.pad())[0]]
                logits, extra = model(src, torch.tensor([src.size(1)]), prev)
                forced = torch.log_softmax(logits.float(), -1)[0].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
                assert torch.allclose(forced, hypo["positional_scores"], atol=1e-4), (i, forced, hypo)
        # teacher forcing over a right-padded batch equals one sentence at a time
        full, _ = model(**sample["net_input"])
        one = sample["net_input"]
        j = int(one["prev_output_tokens"].ne(1).sum(1).argmin())  # the shortest target: padded on the right
        n = int(one["prev_output_tokens"][j].ne(1).sum())
        src = one["src_tokens"][j: j + 1]
        src = src[:, src.ne(1)[0]]
        alone, _ = model(src, torch.tensor([src.size(1)]), one["prev_output_tokens"][j: j + 1, :n])
        assert torch.allclose(full[j, :n], alone[0], atol=1e-4)


@needs_teacher
def test_can_trains_with_kd_and_generates(tmp_path):
    data = os.path.join(TEACHER_DIR, "data-bin")
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *TINY_CAN, *OPTIM_FLAGS, "--cpu", "--criterion", "kd",
            "--teacher-path", TEACHER, "--label-smoothing", "0.1", "--max-update", "3", "--save-dir", tmp_path)
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
                  "--beam", "5", "--batch-size", "128", "--max-len-b", "5", "--gen-subset", "valid", "--cpu")
    lines = gen.stdout.splitlines()
    assert sum(line.startswith("H-") for line in lines) == sum(line.startswith("S-") for line in lines) > 1000


@needs_teacher
def test_benchmark_quick_mode_trains_measures_and_resumes(tmp_path):
    """The benchmark runner end to end on one method: trains (in seed 1's folder, validated at the planned
    update only), measures, keeps the test hypotheses, writes the table, its raw measurement and the plots;
    --render writes the table again from the raw measurement alone; a second call retrains nothing, decodes
    nothing and measures nothing. As on a fresh clone: nothing beside the checkout (FAIRSEQ_COMPRESS_SHARED an
    empty folder), the shipped teacher by default, the device given through the drivers' --device option."""
    import json

    from conftest import clean_env

    empty = tmp_path / "no-shared"
    empty.mkdir()
    env = dict(clean_env(), FAIRSEQ_COMPRESS_SHARED=str(empty))
    cmd = [sys.executable, os.path.join(REPO, "scripts", "bench", "bench_translation.py"), "--quick", "--methods", "word-kd",
           "--max-sentences", "10", "--work", str(tmp_path), "--device", "cpu"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    table = (tmp_path / "quick" / "translation.md").read_text()
    # the table shows the raw measurement kept beside it, named after it
    raw = json.loads((tmp_path / "quick" / "translation.json").read_text())
    teacher, student = raw["rows"]
    assert (teacher["name"], student["name"]) == ("teacher", "word-kd-s1") and teacher["sentences"] == 10
    assert f"| word-kd | 1 | {student['bleu_tok']:.2f} (s1) | {student['sacrebleu']:.2f} (s1) | 501,696 | 9.07% |" in table
    assert f"| teacher | - | {teacher['bleu_tok']:.2f} | {teacher['sacrebleu']:.2f} | 5,529,600 | 100.00% |" in table
    assert f"| word-kd-s1 | {student['bleu_tok']:.2f} | {student['sacrebleu']:.2f} | {student['sentences_per_s']:.1f} |" \
        in table
    assert raw["settings"]["updates"] == 6 and raw["bench_command"].endswith(f"--work {tmp_path} --device cpu")
    assert raw["settings"]["teacher"] == os.path.join(REPO, "checkpoints", "multi30k.de-en", "teacher.pt")
    assert raw["settings"]["device"] == "cpu/fp32" and "--cpu" in raw["command"].split()
    train_log = (tmp_path / "quick" / "seed1" / "u6-w3-e128-d96" / "word-kd" / "kd" / "train.log").read_text()
    assert "--cpu" in train_log.splitlines()[0].split() and "--fp16" not in train_log.splitlines()[0]
    run = raw["runs"]["word-kd-s1"]
    assert run["validations"] == [6] and raw["settings"]["plan"] == [3, [6]]  # one validation, at the last update
    hypotheses = run["hypotheses_last"]  # the test set's first 10 sentences, detokenised, in order
    assert hypotheses == str(tmp_path / "quick" / "seed1" / "u6-w3-e128-d96" / "word-kd" / "hypotheses" / "test.last.txt")
    assert len(open(hypotheses).read().splitlines()) == 10 and "Selection protocol, the same for every variant" in table
    assert (tmp_path / "quick" / "translation_bleu_vs_speed.png").stat().st_size > 1000
    # --render writes the same table again from the JSON alone (in this process: it trains and decodes nothing)
    bench = _load_script("bench_translation")
    bench.main(["--render", str(tmp_path / "quick" / "translation.json"), "--out", str(tmp_path / "quick" / "translation.md")])
    again = (tmp_path / "quick" / "translation.md").read_text()
    assert again.split("Raw measurement")[0] == table.split("Raw measurement")[0]
    assert "training and measuring nothing, by:\n```\npython scripts/bench/bench_translation.py --render" in again
    done = tmp_path / "quick" / "seed1" / "u6-w3-e128-d96" / "word-kd" / "kd" / "DONE"
    assert done.is_file()
    stamp, decoded = done.stat().st_mtime, os.stat(hypotheses).st_mtime
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert done.stat().st_mtime == stamp and "not measuring again" in second.stderr
    assert os.stat(hypotheses).st_mtime == decoded
    # the reused measurement keeps the load it ran under (the speed columns' caveat)
    assert "1-minute load average when the measurement ended" in (tmp_path / "quick" / "translation.md").read_text()
    with pytest.raises(SystemExit, match=re.escape("unknown ['pet-layers-diagonal']")):
        bench.main(cmd[2:] + ["--ablations", "pet-layers-diagonal"])


def test_benchmark_reuses_a_measurement_only_for_the_same_checkpoints(tmp_path):
    """The benchmarks skip the slow measurement when measure.json already covers their checkpoints; the
    check must read --path/--names wherever the measurement command puts its other flags
    (bench_iwslt14's has --tokenized-reference after --names)."""
    import json
    import time

    bench = _load_script("bench_translation")
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    a.write_bytes(b"a"), b.write_bytes(b"b")
    measure_json = tmp_path / "measure.json"
    measure_json.write_text(json.dumps({"rows": [{"name": "teacher", "path": str(a)}, {"name": "pet", "path": str(b)}]}))
    now = time.time()
    for checkpoint in (a, b):  # checkpoints older than the measurement, whatever the file system's clock grain
        os.utime(checkpoint, (now - 10, now - 10))
    os.utime(measure_json, (now, now))
    cmd = ["python", "-m", "user_dir.tools.measure", "data", "--path", str(a), str(b), "--names", "teacher", "pet",
           "--tokenized-reference", "test.en", "--beam", "5", "--json", str(measure_json)]
    assert bench.measured_already(str(measure_json), cmd)
    other_names = cmd[:cmd.index("pet")] + ["pet2"] + cmd[cmd.index("pet") + 1:]
    assert not bench.measured_already(str(measure_json), other_names)
    os.utime(b, (now + 5, now + 5))  # a checkpoint newer than the measurement
    assert not bench.measured_already(str(measure_json), cmd)


def test_pet_report_reads_the_validation_nll_of_every_kd_epoch_once(tmp_path):
    """scripts/bench/pet_report.py's convergence line: a resumed run's log repeats an epoch; its last line counts."""
    report = _load_script("pet_report")
    line = ("2026-11-22 23:09:07 | INFO | valid | epoch {:03d} | valid on 'valid' subset | loss 5.027 | nll_loss {} | "
            "task_loss 5.027 | ppl 12.99 | num_updates 738 | best_loss 5.027\n")
    log = tmp_path / "kd.log"
    log.write_text(line.format(1, "4.74") + "| INFO | train | epoch 001 | nll_loss 9.9\n" + line.format(2, "4.2")
                   + line.format(2, "4.15"))
    assert report.valid_nll_per_epoch(str(log)) == {1: 4.74, 2: 4.15}
    assert report.valid_nll_per_epoch(str(tmp_path / "missing.log")) == {}


def test_learning_curves_place_each_log_after_its_offset_and_keep_a_resumed_runs_last_line(tmp_path):
    """scripts/bench/learning_curves.py: validation NLL by total updates (a KD stage after a warm-up of OFFSET
    updates), one row per update count, '-' where a run has no value, and a clear error for a log
    without validation lines."""
    line = ("2026-11-22 23:09:07 | INFO | valid | epoch {:03d} | valid on 'valid' subset | loss 5.027 | nll_loss {} | "
            "task_loss 5.027 | ppl 12.99 | num_updates {} | best_loss 5.027\n")
    pet, plain, empty = tmp_path / "pet.log", tmp_path / "plain.log", tmp_path / "empty.log"
    pet.write_text(line.format(1, "4.74", 246) + line.format(2, "4.2", 492) + line.format(2, "4.15", 492))
    plain.write_text(line.format(1, "6.12", 246) + "| INFO | train | epoch 001 | nll_loss 9.9 | num_updates 246\n"
                     + line.format(4, "3.9", 984))
    empty.write_text("| INFO | train | epoch 001 | nll_loss 9.9 | num_updates 246\n")
    out = tmp_path / "curves" / "long.md"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", "learning_curves.py"),
                           "--run", "PET", str(pet), "738", "--run", "word KD", str(plain), "0", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert rows == ["| 246 | - | 6.120 |", "| 984 | 4.740 | 3.900 |", "| 1,230 | 4.150 | - |"]
    import json

    raw = json.loads((tmp_path / "curves" / "long.json").read_text())  # the curves as read, beside the table
    assert [(r["label"], r["offset"], r["valid_nll"]) for r in raw["runs"]] == [
        ("PET", 738, {"984": 4.74, "1230": 4.15}), ("word KD", 0, {"246": 6.12, "984": 3.9})]
    assert raw["command"].startswith("python scripts/bench/learning_curves.py --run PET")
    bad = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", "learning_curves.py"),
                          "--run", "x", str(empty), "0", "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode != 0 and "has no validation line" in bad.stderr


def test_sequence_level_kd_data_replaces_targets_with_the_teachers_beam_outputs(trained_tiny, tmp_path):
    from fairseq.data import Dictionary, data_utils

    data, teacher = trained_tiny["data"], os.path.join(trained_tiny["save_dir"], "checkpoint_last.pt")
    dest = tmp_path / "seqkd"
    run_cli("user_dir.baselines.tools.seq_kd_data", data, "--path", teacher, "--dest", dest, "--beam", "2", "--max-len-a", "0",
            "--max-len-b", "3", "--cpu")

    def load(folder, lang):
        return data_utils.load_indexed_dataset(os.path.join(folder, f"train.de-en.{lang}"), None)

    orig_src, new_src, orig_tgt, new_tgt = load(data, "de"), load(dest, "de"), load(data, "en"), load(dest, "en")
    assert len(new_src) == len(orig_src) == len(new_tgt) == 3000
    assert all(torch.equal(orig_src[i], new_src[i]) for i in range(0, 3000, 7))  # sources unchanged, same order
    # targets are the teacher's outputs of at most 3 tokens + EOS, not the references
    assert all(len(new_tgt[i]) <= 4 for i in range(3000))
    assert sum(not torch.equal(orig_tgt[i], new_tgt[i]) for i in range(3000)) > 2900
    assert Dictionary.load(os.path.join(dest, "dict.en.txt")).symbols == Dictionary.load(
        os.path.join(data, "dict.en.txt")).symbols
    assert os.path.isfile(dest / "valid.de-en.en.bin") and os.path.isfile(dest / "test.de-en.en.bin")
    # the teacher's own beam search, in this process, gives the same targets for a few pairs
    from fairseq import checkpoint_utils
    from fairseq.dataclass.configs import GenerationConfig

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([teacher], arg_overrides={"data": data})
    task.load_dataset("train")
    ds = task.dataset("train")
    sample = ds.collater([ds[i] for i in (0, 1, 2, 1234)])
    generator = task.build_generator(models, GenerationConfig(beam=2, max_len_a=0, max_len_b=3))
    with torch.no_grad():
        hypos = task.inference_step(generator, models, sample)
    for idx, nbest in zip(sample["id"].tolist(), hypos):
        assert torch.equal(nbest[0]["tokens"], new_tgt[idx]), idx


def test_benchmark_summary_averages_seeds_and_heads_the_ablations_with_pets_own_seed():
    """The summary's numbers come from the measured rows: PET's mean +- std [min, max] and every seed's BLEU in
    the main table, its best-of-N checkpoints' beside; the selection protocol said once; PET against each method
    with its paired test; the ablation table starts with PET at the ablations' seed (not the mean), each row
    beside the paper's number for that ablation, and ablations never enter the main table."""
    import argparse
    bench = _load_script("bench_translation")

    def row(name, bleu, params=483_072):
        return dict(name=name, bleu_tok=bleu, sacrebleu=bleu, non_embedding_params=params,
                    compression_rate=100 * params / 5_529_600, weights_mb=8.6, sentences_per_s=50.0, sentences=1000)

    rows = [row("teacher", 36.0, 5_529_600), row("pet-s1", 21.0), row("pet-s2", 23.0), row("pet-s3", 22.0),
            row("pet-layers-mirrored-s1", 20.0), row("pet-layers-none-s1", 24.0, 1_003_392)]
    details = {f"pet-s{s}": dict(sacrebleu_best=b, validations=[400, 600, 800], seconds=600)
               for s, b in ((1, 21.5), (2, 23.5), (3, 22.5))}
    comparison = {"label": "pet vs word-kd", "metric": "sacreBLEU", "seeds": 3, "a": 22.0, "b": 21.0, "diff": 1.0,
                  "low": 0.2, "high": 1.8, "p": 0.012, "verdict": "A better", "per_seed": [0.5, 1.5, 1.0],
                  "per_seed_mean": 1.0, "per_seed_std": 0.5}
    args = argparse.Namespace(teacher=os.path.join(REPO, "teacher.pt"), updates=800, warmup_updates=200,
                              measure_runs=1, work=os.path.join(REPO, "work"), machine="test machine",
                              load_after_measure=None, plan=(200, [400, 600, 800]), lr_warmup=200, runs=details,
                              comparisons=[comparison])
    text, stats, _ = bench.summarise(rows, bench.methods(128, 96, 96, 6), args, "python scripts/bench/bench_translation.py")
    main, ablations = text.split("## PET ablations")
    pet = "22.00 +- 1.00 [21.00, 23.00] (s1 21.00, s2 23.00, s3 22.00)"
    assert f"| pet | 3 | {pet} | {pet} |" in main and "pet-layers" not in main.split("Methods:")[0]
    assert main.count("validated 3 times, at updates 400, 600, 800 of the whole budget") == 1
    assert "| 22.50 +- 1.00 [21.50, 23.50] (s1 21.50, s2 23.50, s3 22.50) |" in main  # best-of-N beside
    assert ("| pet vs word-kd | sacreBLEU | 3 | 22.00 | 21.00 | +1.00 | [+0.20, +1.80] | 0.012 | "
            "+0.50, +1.50, +1.00 (mean +1.00 +- 0.50) | A better |") in main
    assert "| pet-s2 | 23.00 | 23.00 | 50.0 | 23.50 | 400, 600, 800 | 10.0 min |" in text
    table = [line for line in ablations.splitlines() if line.startswith("| pet")]
    assert table[0].startswith("| pet | 1 | 21.00 (s1) |") and "T2: 34.57" in table[0]
    assert table[1].startswith("| pet-layers-mirrored | 1 | 20.00 (s1) |") and "| T2: 33.83 | - |" in table[1]
    assert table[2].startswith("| pet-layers-none | 1 | 24.00 (s1) |") and "18.15%" in table[2]
    assert stats["pet"]["bleu"] == (22.0, 1.0)  # the plots show PET's mean, not its ablation-seed row


def test_benchmark_plot_labels_of_close_points_are_moved_apart_and_others_stay():
    bench = _load_script("translation_students")
    stats = {"a": dict(bleu=(21.65, 0.0), compression=8.74), "b": dict(bleu=(21.29, 0.0), compression=8.74),
             "c": dict(bleu=(21.30, 0.0), compression=8.74), "far": dict(bleu=(21.40, 0.0), compression=18.15)}
    heights = bench.dodged(stats, "compression", gap=0.7)
    close = sorted(heights[m] for m in "abc")
    assert all(high - low >= 0.69 for low, high in zip(close, close[1:]))
    assert heights["b"] == 21.29 and heights["far"] == 21.40


def test_merged_benchmark_table_averages_runs_of_several_tables_and_refuses_tables_that_do_not_merge(tmp_path):
    """Tables written by the benchmark in parts (seed 1 here, seeds 2-3 there) merge into one: BLEU over all
    runs of a method, speed as each run's speed-up over the teacher of its own measurement. Tables of another
    teacher or budget, a run held twice, or a file that is no benchmark table stop with the file's name."""
    import argparse

    bench, merge = _load_script("bench_translation"), _load_script("merge_translation_tables")
    grid = bench.methods(128, 96, 96, 6)

    def table(name, runs, teacher_speed, updates=800, teacher_bleu=36.0):
        rows = [dict(name="teacher", bleu_tok=teacher_bleu, sacrebleu=teacher_bleu, non_embedding_params=5_529_600,
                     compression_rate=100.0, weights_mb=28.8, sentences_per_s=teacher_speed, sentences=1000)]
        rows += [dict(name=n, bleu_tok=b, sacrebleu=b, non_embedding_params=p, compression_rate=100 * p / 5_529_600,
                      weights_mb=8.6, sentences_per_s=s, sentences=1000) for n, b, p, s in runs]
        args = argparse.Namespace(teacher=os.path.join(REPO, "teacher.pt"), updates=updates, warmup_updates=200,
                                  measure_runs=1, work=os.path.join(REPO, "work"), machine=f"machine of {name}",
                                  load_after_measure=None)
        path = tmp_path / f"{name}.md"
        path.write_text(bench.summarise(rows, grid, args, "python scripts/bench/bench_translation.py")[0])
        return str(path)

    a = table("a", [("pet-s1", 21.0, 483_072, 40.0), ("can-s1", 8.0, 532_608, 50.0)], teacher_speed=20.0)
    b = table("b", [("pet-s2", 23.0, 483_072, 90.0), ("pet-s3", 22.0, 483_072, 60.0),
                    ("pet-nowarmup-s1", 25.0, 483_072, 60.0)], teacher_speed=30.0)
    by_method, tables = merge.merge([a, b])
    text, stats, _ = merge.merged_summary(by_method, tables, "python scripts/bench/merge_translation_tables.py a b")
    pet = next(line for line in text.splitlines() if line.startswith("| pet |"))
    # BLEU over the three runs; speed-up (2x, 3x, 2x) averaged, never the raw sent/s of two measurements
    assert pet.startswith("| pet | 3 | 22.00 +- 1.00 |") and "| 2.33x |" in pet and "`a.md`, `b.md`" in pet
    assert next(line for line in text.splitlines() if line.startswith("| can |")).startswith("| can | 1 | 8.00 |")
    assert stats["pet"]["bleu"] == (22.0, 1.0) and "machine of a" in text and "machine of b" in text
    # PET Table 9 from the merged runs: the BLEU drop from the teacher with and without the warm-up
    assert "| with warm-up | 22.00 +- 1.00 | 14.00 | 0.27 |" in text and "| without warm-up | 25.00 +- 0.00 | 11.00 |" in text

    def refused(*paths):
        with pytest.raises(SystemExit) as e:
            merge.merge(list(paths))
        return str(e.value)

    assert "pet-s1 is in both" in refused(a, table("again", [("pet-s1", 20.0, 483_072, 40.0)], 20.0))
    assert "teacher BLEU 35.00" in refused(a, table("other", [("pet-s4", 20.0, 483_072, 40.0)], 20.0, teacher_bleu=35.0))
    assert "trained for 5658 updates" in refused(a, table("long", [("pet-s5", 37.0, 483_072, 40.0)], 20.0, updates=5658))
    assert "not the same model" in refused(a, table("wide", [("pet-s6", 20.0, 600_000, 40.0)], 20.0))
    junk = tmp_path / "notes.md"
    junk.write_text("# some notes\n")
    assert str(junk) in refused(a, str(junk))


def test_the_committed_translation_table_is_what_its_merge_command_writes(tmp_path):
    """results/translation.md is generated: running the command written in it again gives the same table."""
    import shlex

    merge = _load_script("merge_translation_tables")
    committed = open(os.path.join(REPO, "results", "translation.md")).read()
    command = committed.split("Command:\n```\n")[1].split("\n```")[0]
    argv = shlex.split(command)[2:]
    out = argv.index("--out") + 1
    argv[out] = str(tmp_path / "translation.md")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        merge.main(argv)
    finally:
        os.chdir(cwd)
    regenerated = (tmp_path / "translation.md").read_text()

    def body(text):  # the date and the plots' names are the only lines allowed to differ
        return [line for line in text.splitlines() if not line.startswith(("Date:", "Plots", "python scripts/bench/merge"))]

    assert body(regenerated) == body(committed)


def test_every_stage_of_the_translation_benchmark_is_a_valid_fairseq_train_command(tmp_path):
    """The benchmark's fairseq-train command of every stage of every method parses with fairseq's own
    parser (a criterion never receives a flag it does not take: seq-KD's cross-entropy stage has no
    teacher), every criterion that distils gets the teacher, and every method is validated at the same
    updates of its whole budget (400, 600, 800: PET's warm-up stage not at all, its KD stage from its 200th)."""
    from fairseq import options

    bench, benchlib = _load_script("translation_students"), _load_script("benchlib")
    plan = benchlib.validation_plan(800, 600, 3)
    for method, (_, _, arch, stages) in bench.methods(128, 96, 96, 6).items():
        previous, start, validated = None, 0, []
        for stage, criterion, share in stages:
            n = bench.stage_updates(share, 800, 200)
            argv = bench.train_command(str(tmp_path / "data-bin"), TEACHER, arch, criterion, n, 1, 200,
                                       str(tmp_path / method / stage), previous, [],
                                       benchlib.selection_flags(plan, start, n, "loss"))
            try:
                args = options.parse_args_and_arch(options.get_training_parser(), argv)
            except SystemExit as e:
                raise AssertionError(f"{method}/{stage}: fairseq-train rejects {argv}") from e
            assert args.max_update == n and args.seed == 1 and (args.finetune_from_model == previous)
            assert ("--teacher-path" in argv) == (args.criterion != "label_smoothed_cross_entropy"), (method, stage)
            if not args.disable_validation:
                validated += [start + u for u in range(1, n + 1) if u % args.validate_interval_updates == 0
                              and u >= args.validate_after_updates]
                assert args.validate_interval == 1000000  # none at epoch ends
            previous, start = str(tmp_path / method / stage / "checkpoint_last.pt"), start + n
        assert validated == [400, 600, 800], method
