"""PET under stock fairseq flags (issue 19): LayerDrop and its pruning flags, activation
checkpointing and offloading, and the language pair fairseq infers from the data directory.

Every check is numerical against stock fairseq modules, never object identity alone: the second
layer of an encoder pair must compute what a stock ``TransformerEncoderLayer`` computes with the
first layer's Q and K weights swapped, the whole student what a stock 4+4-layer Transformer holding
its state dict computes, and beam search must score its hypotheses as a teacher-forced pass does
(each logical decoder layer keeping its own incremental-decoding cache). The in-process checks run
on the GPU where there is one (activation offloading then really moves tensors to the CPU).
"""
import os

import pytest
import torch

from conftest import TRAIN_FLAGS, USER_DIR, run_cli

import user_dir  # noqa: F401
from user_dir.pet.replaceable_pairs import PETConfigError

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "24", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
STOCK_FLAGS = {
    "plain": [],
    "layerdrop": ["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"],
    "checkpoint-activations": ["--checkpoint-activations"],
    "offload-activations": ["--offload-activations"],
}


def _args(data, *flags, arch="pet_transformer_iwslt", langs=("de", "en")):
    from fairseq import options

    lang_flags = ["-s", langs[0], "-t", langs[1]] if langs else []
    return options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--task", "translation", *lang_flags, "--arch", arch, *flags])


def _build(data, *flags, seed=0):
    from fairseq import tasks

    args = _args(data, *TINY, *flags)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    return task, task.build_model(args).to(DEVICE), args


def _sample(task, n=4):
    from fairseq import utils

    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(n)])
    return utils.move_to_cuda(sample, DEVICE) if DEVICE.type == "cuda" else sample


def _stock_encoder_layer(args, physical, swap_qk):
    """A stock fairseq encoder layer holding ``physical``'s weights, Q and K swapped if asked."""
    from fairseq.modules import TransformerEncoderLayer

    state = dict(physical.state_dict())
    if swap_qk:
        for kind in ("weight", "bias"):
            q, k = f"self_attn.q_proj.{kind}", f"self_attn.k_proj.{kind}"
            state[q], state[k] = state[k], state[q]
    stock = TransformerEncoderLayer(args)
    stock.load_state_dict(state)
    return stock.to(_device_of(physical)).eval()


def _device_of(module):
    return next(module.parameters()).device


def assert_encoder_pairs_swap_qk(args, encoder_layers, dim=32):
    """Logical layers 3-4 compute as stock layers holding layers 1-2's weights with Q<->K, 1-2 as
    the unswapped ones; and the swap changes the function (so the comparison can fail)."""
    assert len(encoder_layers) == 4
    torch.manual_seed(1)
    device = _device_of(encoder_layers[0])
    x = torch.randn(7, 3, dim, device=device)
    pad = torch.zeros(3, 7, dtype=torch.bool, device=device)
    pad[0, 5:] = True
    with torch.no_grad():
        for first, second in ((0, 2), (1, 3)):
            plain, swapped = (_stock_encoder_layer(args, encoder_layers[first], s) for s in (False, True))
            assert torch.allclose(encoder_layers[first](x, pad), plain(x, pad), atol=1e-5)
            assert torch.allclose(encoder_layers[second](x, pad), swapped(x, pad), atol=1e-5)
            assert not torch.allclose(plain(x, pad), swapped(x, pad), atol=1e-3)


@pytest.mark.parametrize("name", STOCK_FLAGS)
def test_second_layer_of_each_encoder_pair_computes_with_swapped_qk(multi30k_slice, name):
    # LayerDrop draws afresh at every iteration over the layer list: the pairs must not depend on it
    for seed in range(4 if name == "layerdrop" else 1):
        _, model, args = _build(multi30k_slice, *STOCK_FLAGS[name], seed=seed)
        model.eval()
        assert len(model.decoder.layers) == 4
        assert_encoder_pairs_swap_qk(args, model.encoder.layers)
    # a hook on a logical layer is its own, not its physical layer's
    enc = model.encoder.layers
    seen = []
    handle = enc[2].register_forward_hook(lambda *_: seen.append(2))
    with torch.no_grad():
        enc[0](torch.randn(2, 1, 32, device=DEVICE), torch.zeros(1, 2, dtype=torch.bool, device=DEVICE))
    handle.remove()
    assert seen == []


@pytest.mark.parametrize("name", STOCK_FLAGS)
def test_student_computes_as_a_stock_transformer_holding_its_weights(multi30k_slice, name):
    """The student's state dict names every logical layer's weights (the shared ones under each
    name), so a stock 4+4-layer Transformer loaded with it must compute the same translation scores."""
    from fairseq import tasks

    task, model, _ = _build(multi30k_slice, *STOCK_FLAGS[name])
    stock_args = _args(multi30k_slice, *TINY, "--encoder-layers", "4", "--decoder-layers", "4",
                       "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "48",
                       arch="transformer_iwslt_de_en")
    stock = tasks.setup_task(stock_args).build_model(stock_args).to(DEVICE)
    stock.load_state_dict(model.state_dict())
    model.eval(), stock.eval()
    sample = _sample(task)
    with torch.no_grad():
        ours, theirs = model(**sample["net_input"])[0], stock(**sample["net_input"])[0]
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


@pytest.mark.parametrize("name", STOCK_FLAGS)
def test_beam_search_equals_teacher_forcing(multi30k_slice, name):
    """Each logical decoder layer keeps its own cache: the beam's positional scores of each best
    hypothesis equal a teacher-forced forward pass over that hypothesis (LayerDrop in eval mode)."""
    from fairseq.dataclass.configs import GenerationConfig

    task, model, _ = _build(multi30k_slice, *STOCK_FLAGS[name])
    model.eval()
    sample = _sample(task)
    generator = task.build_generator([model], GenerationConfig(beam=5, max_len_b=12))
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
        for i, nbest in enumerate(hypos):
            best = nbest[0]
            tokens = best["tokens"]
            prev = torch.cat([tokens.new_tensor([task.target_dictionary.eos()]), tokens[:-1]]).unsqueeze(0)
            src = sample["net_input"]["src_tokens"][i : i + 1]
            src = src[:, src.ne(task.source_dictionary.pad())[0]]  # drop left padding
            logits, _ = model(src, src.new_tensor([src.size(1)]), prev)
            lprobs = torch.log_softmax(logits.float(), dim=-1)[0]
            forced = lprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(forced, best["positional_scores"], atol=1e-4), (i, forced, best["positional_scores"])


@pytest.mark.parametrize("name", ["checkpoint-activations", "offload-activations"])
def test_checkpointed_training_step_has_the_gradients_of_a_plain_one(multi30k_slice, name):
    """Recomputing activations in the backward pass (through the logical-layer views) must not change
    the training step: same loss and same gradient on every shared tensor, dropout included."""
    from fairseq.modules.checkpoint_activations import _checkpointed_forward

    task, plain, _ = _build(multi30k_slice)
    _, checkpointed, _ = _build(multi30k_slice, *STOCK_FLAGS[name])
    for layers in (checkpointed.encoder.layers, checkpointed.decoder.layers):
        for i in range(len(layers)):  # every logical layer recomputes itself, offloading where asked
            assert layers[i].forward.func is _checkpointed_forward and layers[i].forward.args[0].__self__ is layers[i]
            assert layers[i].forward.args[1] == (name == "offload-activations")
    checkpointed.load_state_dict(plain.state_dict())
    sample = _sample(task)
    grads = []
    for model in (plain, checkpointed):
        model.train()
        torch.manual_seed(3)
        out = model(**sample["net_input"])[0]
        out.float().log_softmax(-1).gather(-1, sample["target"].unsqueeze(-1)).sum().neg().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-5), n


def test_layerdrop_drops_logical_layers_in_training_only(multi30k_slice):
    task, model, _ = _build(multi30k_slice, *STOCK_FLAGS["layerdrop"])
    called = set()
    for side, layers in (("enc", model.encoder.layers), ("dec", model.decoder.layers)):
        for i in range(len(layers)):  # (iterating a LayerDropModuleList in training mode would skip some)
            layers[i].register_forward_hook(lambda *_, key=(side, i): called.add(key))
    everything = {(side, i) for side in ("enc", "dec") for i in range(4)}
    sample = _sample(task, n=2)

    def layers_run():
        called.clear()
        with torch.no_grad():
            model(**sample["net_input"])
        return frozenset(called)

    model.train()
    torch.manual_seed(0)
    runs = [layers_run() for _ in range(30)]
    for key in everything:  # each logical layer is dropped in some updates, kept in others
        assert 0 < sum(key in run for run in runs) < len(runs), key
    # a logical layer that reuses a physical one runs while that physical layer is dropped
    assert any(("enc", 0) not in run and ("enc", 2) in run for run in runs)
    model.eval()
    assert all(layers_run() == everything for _ in range(3))


def test_training_with_layerdrop_and_checkpointing_then_loading_keeps_the_pairs(multi30k_slice, tmp_path):
    from fairseq import checkpoint_utils

    run_cli("fairseq_cli.train", multi30k_slice, "--user-dir", USER_DIR, "--arch", "pet_transformer_iwslt", *TINY,
            *TRAIN_FLAGS, *STOCK_FLAGS["layerdrop"], "--checkpoint-activations", "--max-update", "3",
            "--disable-validation", "--save-dir", tmp_path, "--cpu")
    path = str(tmp_path / "checkpoint_last.pt")
    saved = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    outputs = []
    for seed in range(3):  # loading builds the model in training mode, where LayerDrop draws: it must not matter
        torch.manual_seed(seed)
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path])
        model = models[0].to(DEVICE).eval()
        assert all(torch.equal(t.cpu(), saved[n]) for n, t in model.state_dict().items())
        assert_encoder_pairs_swap_qk(cfg.model, model.encoder.layers)
        sample = _sample(task, n=2)
        with torch.no_grad():
            outputs.append(model(**sample["net_input"])[0])
    assert all(torch.equal(outputs[0], out) for out in outputs[1:])


@pytest.mark.parametrize("flag", ["--encoder-layers-to-keep", "--decoder-layers-to-keep"])
def test_layerdrop_pruning_is_refused_naming_the_flag(multi30k_slice, flag):
    with pytest.raises(PETConfigError, match=rf"{flag} 0,2: "):
        _build(multi30k_slice, flag, "0,2")


def test_stock_command_without_source_and_target_flags_infers_the_direction(multi30k_slice, tmp_path):
    """fairseq infers the language pair from the data directory's file names: the student's
    direction-dependent widths follow it, (320, 240) into English and (240, 320) out of it."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    en_de = tmp_path / "en-de"  # the same data, named as an EN->DE directory
    en_de.mkdir()
    for name in os.listdir(multi30k_slice):
        parts = name.split(".")
        if len(parts) == 4 and parts[1] == "de-en":
            os.symlink(os.path.join(multi30k_slice, name), en_de / f"{parts[0]}.en-de.{parts[2]}.{parts[3]}")
        elif name.startswith("dict."):
            os.symlink(os.path.join(multi30k_slice, name), en_de / name)
    for data, (enc, dec) in ((multi30k_slice, (320, 240)), (en_de, (240, 320))):
        args = _args(data, langs=None)
        widths = (args.encoder_embed_dim, args.decoder_embed_dim, args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim)
        assert widths == (enc, dec, 2 * enc, 2 * dec)
        assert (args.decoder_input_dim, args.decoder_output_dim) == (dec, dec)
    # a criterion that reads the model's width (the warm-up's output-layer mapping) gets the resolved one
    cfg = convert_namespace_to_omegaconf(_args(en_de, "--criterion", "pet_warmup", "--warmup-mapping", "output-layer",
                                               langs=None))
    assert cfg.criterion.decoder_embed_dim == 320
    # the stock command, without -s/-t, trains the EN->DE student
    run_cli("fairseq_cli.train", en_de, "--user-dir", USER_DIR, "--arch", "pet_transformer_iwslt",
            "--share-decoder-input-output-embed", *TRAIN_FLAGS, "--max-update", "1", "--disable-validation",
            "--save-dir", tmp_path / "ckpt", "--cpu")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "ckpt" / "checkpoint_last.pt"))["model"]
    assert state["encoder.embed_tokens.weight"].size(1) == 240 and state["decoder.embed_tokens.weight"].size(1) == 320
    assert state["encoder.layers.0.fc1.weight"].shape == (480, 240)
    # where no data directory names the languages the arch cannot know them: an English source is refused
    from fairseq import tasks

    args = _args(tmp_path / "no-such-dir", langs=None)
    task = tasks.setup_task(_args(en_de, langs=None))
    with pytest.raises(ValueError, match=r"--arch pet_transformer_iwslt: .* pass -s en -t XX"):
        task.build_model(args)
