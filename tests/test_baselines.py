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


def test_learning_curves_draw_each_records_last_stage_after_its_earlier_stages_updates(tmp_path):
    """scripts/bench/learning_curves.py: from the store, each current record's last training stage's validation curve
    by total updates (PET's KD after its warm-up's updates; the warm-up's own curve is not drawn), one row per update
    count, '-' where a student has no value; a record of another teacher is left out; no curve at all is an error."""
    import json

    sys.path.insert(0, os.path.join(REPO, "scripts", "experiments"))
    from grid import Grid

    path = os.path.join(REPO, "grids", "pet.toml")
    grid = Grid(path, store=str(tmp_path / "store"))
    current = {"teacher": {"sha256": grid.teacher_sha}, "data": {"fingerprint": grid.data_fingerprint()}}
    script = os.path.join(REPO, "scripts", "bench", "learning_curves.py")
    out = tmp_path / "curves" / "pet.md"

    def run():
        return subprocess.run([sys.executable, script, path, "--store", str(tmp_path / "store"), "--out", str(out)],
                              capture_output=True, text=True)

    bad = run()
    assert bad.returncode != 0 and "holds a validation curve" in bad.stderr
    records = [
        {"cell": "pet", "commands": [{"stage": "warmup"}, {"stage": "kd"}, {"stage": "measure"}],
         "training": {"warmup": {"updates": 738, "validation": [[3, 738, 2.3, None]]},
                      "kd": {"updates": 492, "validation": [[1, 246, 4.7, 3.1], [2, 492, 4.1, 2.9]]}}},
        {"cell": "patient-kd", "commands": [{"stage": "train"}, {"stage": "measure"}],
         "training": {"train": {"updates": 984, "validation": [[1, 246, 6.1, 4.0], [4, 984, 3.9, 2.5]]}}},
        {"cell": "can", "commands": [{"stage": "train"}], "teacher": {"sha256": "another teacher"},
         "training": {"train": {"updates": 246, "validation": [[1, 246, 9.0, 9.0]]}}}]
    os.makedirs(tmp_path / "store")
    with open(tmp_path / "store" / "records.jsonl", "w") as f:
        for i, record in enumerate(records):
            f.write(json.dumps({"key": str(i) * 64, "grid": "pet", "seed": 1, **current, **record}) + "\n")
    proc = run()
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "| updates | pet s1 | patient-kd s1 |" in text and "can s1" not in text
    rows = [r for r in text.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert rows == ["| 246 | - | 6.100 |", "| 984 | 4.700 | 3.900 |", "| 1,230 | 4.100 | - |"]


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
