"""PET's student architecture: real parameter sharing in replaceable pairs (PET Tables 2-4, 8)."""

import pytest
import torch

from conftest import TRAIN_FLAGS, USER_DIR, run_cli

import user_dir  # noqa: F401
from user_dir.common.counting import count_parameters
from user_dir.pet.replaceable_pairs import PETConfigError, layer_pairs


def _build(data, *flags):
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data, "--task", "translation", "-s", "de", "-t", "en",
                                                "--arch", "pet_transformer_iwslt", *flags])
    task = tasks.setup_task(args)
    return task, task.build_model(args), args


def _attn(d_q, d_kv):  # q, k, v, out projections with biases; k and v read d_kv-dim inputs
    return 2 * (d_q * d_q + d_q) + 2 * (d_kv * d_q + d_q)


def closed_form_non_embedding(e, d, layers, physical, decoder_pairs):
    """Non-embedding parameters of a PET student: encoder dim e, decoder dim d, FFN 2x."""
    enc_layer = _attn(e, e) + (2 * e * 2 * e + 2 * e + e) + 4 * e
    dec_layer = _attn(d, d) + _attn(d, e) + (2 * d * 2 * d + 2 * d + d) + 6 * d
    saved = {"qself-qed": d * d + d, "qself-kself": d * d + d, "kv-self-ed": (d * d + d) + (e * d + d)}
    dec_layer -= saved.get(decoder_pairs, 0)
    return physical * (enc_layer + dec_layer)


@pytest.mark.parametrize("pairing, decoder_pairs, physical", [
    ("interleaved", "qself-qed", 2), ("adjacent", "qself-qed", 2), ("mirrored", "qself-qed", 2),
    ("none", "qself-qed", 4), ("interleaved", "qself-kself", 2), ("interleaved", "kv-self-ed", 2),
    ("interleaved", "swap-kv-self", 2), ("interleaved", "none", 2), ("none", "none", 4),
])
def test_parameter_count_matches_closed_form(multi30k_slice, pairing, decoder_pairs, physical):
    enc_pairs = "none" if pairing == "none" else "qk"
    _, model, _ = _build(multi30k_slice, "--layer-pairing", pairing, "--decoder-matrix-pairs", decoder_pairs,
                         "--encoder-matrix-pairs", enc_pairs, "--share-decoder-input-output-embed")
    count = count_parameters(model)
    assert count.non_embedding == closed_form_non_embedding(320, 240, 4, physical, decoder_pairs)
    # the optimizer receives each shared tensor once (fairseq passes model.parameters())
    params = list(model.parameters())
    assert len(params) == len({id(p) for p in params})


def test_default_student_shares_exactly_the_papers_pairs(multi30k_slice):
    _, model, args = _build(multi30k_slice)
    assert (args.encoder_embed_dim, args.decoder_embed_dim, args.encoder_ffn_embed_dim) == (320, 240, 640)
    enc, dec = model.encoder.layers, model.decoder.layers
    assert len(enc) == len(dec) == 4
    for first, second in ((0, 2), (1, 3)):
        a, b = enc[first].self_attn, enc[second].self_attn
        assert b.q_proj is a.k_proj and b.k_proj is a.q_proj and b.v_proj is a.v_proj  # Q<->K only, V unmoved
        assert enc[second].fc1 is enc[first].fc1 and enc[second].final_layer_norm is enc[first].final_layer_norm
        assert dec[second].self_attn.q_proj is dec[first].self_attn.q_proj
        assert dec[second].self_attn is not dec[first].self_attn  # its own incremental-decoding cache
    assert enc[1].self_attn.q_proj is not enc[0].self_attn.q_proj
    for layer in dec:
        assert layer.encoder_attn.q_proj is layer.self_attn.q_proj
    ids = {m._incremental_state_id for layer in dec for m in (layer.self_attn, layer.encoder_attn)}
    assert len(ids) == 8


def test_source_english_swaps_the_dims(multi30k_slice):
    """(Without -s/-t the direction is the data directory's: test_pet_stock_flags.py.)"""
    from fairseq import options

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [multi30k_slice, "--task", "translation", "-s", "en", "-t", "de",
                                                "--arch", "pet_transformer_iwslt"])
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (240, 320)


def test_bad_configurations_fail_naming_the_flag(multi30k_slice):
    with pytest.raises(PETConfigError, match=r"--encoder-layers 3: --layer-pairing interleaved"):
        _build(multi30k_slice, "--encoder-layers", "3")
    with pytest.raises(PETConfigError, match=r"--decoder-matrix-pairs swap-qk-all: q_proj .* differ in shape"):
        _build(multi30k_slice, "--decoder-matrix-pairs", "swap-qk-all")
    with pytest.raises(PETConfigError, match=r"--encoder-matrix-pairs qk pairs matrices across a layer pair"):
        _build(multi30k_slice, "--layer-pairing", "none")
    assert layer_pairs(6, "interleaved") == [(0, 3), (1, 4), (2, 5)]
    assert layer_pairs(6, "mirrored") == [(0, 5), (1, 4), (2, 3)]


def test_shared_weights_stay_shared_through_training_save_and_load(multi30k_slice, tmp_path):
    from fairseq import checkpoint_utils

    dims = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "24", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
    run_cli("fairseq_cli.train", multi30k_slice, "--user-dir", USER_DIR, "--arch", "pet_transformer_iwslt", *dims,
            *TRAIN_FLAGS, "--max-update", "3", "--save-dir", tmp_path, "--cpu")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))["model"]
    assert torch.equal(state["encoder.layers.2.self_attn.q_proj.weight"], state["encoder.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(state["decoder.layers.3.fc1.weight"], state["decoder.layers.1.fc1.weight"])
    assert torch.equal(state["decoder.layers.1.encoder_attn.q_proj.weight"], state["decoder.layers.1.self_attn.q_proj.weight"])
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "checkpoint_last.pt")])
    model = models[0]
    enc, dec = model.encoder.layers, model.decoder.layers
    assert enc[2].self_attn.q_proj.weight is enc[0].self_attn.k_proj.weight  # the same tensor, not a copy
    assert dec[3].fc2.weight is dec[1].fc2.weight
    assert torch.equal(enc[0].self_attn.k_proj.weight, state["encoder.layers.0.self_attn.k_proj.weight"])
    # a step after loading moves both names of one tensor together
    with torch.no_grad():
        enc[0].self_attn.k_proj.weight.add_(1.0)
    assert torch.equal(enc[2].self_attn.q_proj.weight, enc[0].self_attn.k_proj.weight)
