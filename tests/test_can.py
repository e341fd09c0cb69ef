"""CAN (user_dir/baselines/can_transformer.py) against its definition and its authors' configuration.

The compressed sub-layer is checked on hand-built tensors against an explicit FFN(x^ + Attn(x^)): with one
head, a layer holding the fold W_1 W_o W_v of an unfolded attention and FFN computes exactly what they compute;
with several heads, a per-position loop over the layer's own weights; in both, step-by-step decoding through
fairseq's incremental_state (beam reordering included) gives the full forward's outputs. Then the registered
arch's defaults and refusals, the upgrade of a checkpoint from before the FFN's first linear, and a few real
fairseq-train updates and a fairseq-generate on real Multi30k.
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import OPTIM_FLAGS, TEACHER_DIR, USER_DIR, needs_teacher, run_cli

import user_dir  # noqa: F401
from user_dir.baselines.can_transformer import AUTHORS_DEFAULTS, CompressedAttentionLayer

SHIPPED_DICTS = os.path.join(os.path.dirname(USER_DIR), "checkpoints", "multi30k.de-en")  # dict.de.txt, dict.en.txt
T, S, B = 5, 4, 2  # target steps, encoder states, batch
CLOSE = {"rtol": 1e-6, "atol": 1e-6}  # float64 throughout but the softmax (fairseq's utils.softmax: float32)


def _layer(d, f, h, d_enc, normalize_before=True, seed=0):
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig()
    cfg.decoder.embed_dim, cfg.decoder.ffn_embed_dim, cfg.decoder.attention_heads = d, f, h
    cfg.encoder.embed_dim, cfg.decoder.normalize_before = d_enc, normalize_before
    cfg.dropout = cfg.attention_dropout = cfg.activation_dropout = 0.1
    torch.manual_seed(seed)
    layer = CompressedAttentionLayer(cfg).double()
    with torch.no_grad():  # a LayerNorm that is not the identity, biases that are not zero
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer.eval()  # dropout off


def _inputs(d, d_enc, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, d, generator=g, dtype=torch.float64)
    enc = torch.randn(S, B, d_enc, generator=g, dtype=torch.float64)
    enc_pad = torch.zeros(B, S, dtype=torch.bool)
    enc_pad[1, -1] = True  # the second sentence's source is one state shorter
    return x, enc, enc_pad


def _future_mask(t):
    return torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)


def _full_and_incremental(layer, x, enc, enc_pad):
    full, _, _ = layer(x, enc, enc_pad, self_attn_mask=_future_mask(x.size(0)))
    state, steps = {}, []
    for t in range(x.size(0)):
        out, _, _ = layer(x[t: t + 1], enc, enc_pad, incremental_state=state)
        steps.append(out)
    return full, torch.cat(steps, 0)


def test_one_head_fold_is_exactly_the_ffn_of_the_attentions_residual_sum():
    """FFN(x^ + Attn(x^)) with an unfolded attention (d-wide values, output projection W_o) and an FFN (W_1, W_2):
    the layer holding v = W_1 W_o W_v, fc1 = (W_1, b_1 + W_1 b_o), fc2 = (W_2, b_2) computes the same."""
    d, f, d_enc = 6, 10, 7
    layer = _layer(d, f, 1, d_enc)
    g = torch.Generator().manual_seed(2)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])

    w_vs, b_vs, w_ve, b_ve = rand(d, d), rand(d), rand(d, d_enc), rand(d)
    w_o, b_o, w_1, b_1 = rand(d, d), rand(d), rand(f, d), rand(f)
    with torch.no_grad():
        layer.v_self.weight.copy_(w_1 @ w_o @ w_vs), layer.v_self.bias.copy_(w_1 @ w_o @ b_vs)
        layer.v_enc.weight.copy_(w_1 @ w_o @ w_ve), layer.v_enc.bias.copy_(w_1 @ w_o @ b_ve)
        layer.fc1.weight.copy_(w_1), layer.fc1.bias.copy_(b_1 + w_1 @ b_o)
    x, enc, enc_pad = _inputs(d, d_enc)

    # the explicit computation, one position at a time
    x_hat = layer.layer_norm(x)  # pre-norm, as implemented
    expected = torch.empty_like(x)
    for b in range(B):
        keys_enc = [j for j in range(S) if not enc_pad[b, j]]
        for t in range(T):
            q = layer.q_proj(x_hat[t, b])
            keys = [layer.k_enc(enc[j, b]) for j in keys_enc] + [layer.k_self(x_hat[j, b]) for j in range(t + 1)]
            values = [w_ve @ enc[j, b] + b_ve for j in keys_enc] + [w_vs @ x_hat[j, b] + b_vs for j in range(t + 1)]
            weights = torch.softmax(torch.stack([q @ k for k in keys]) / math.sqrt(d), 0)
            attn = w_o @ sum(a * v for a, v in zip(weights, values)) + b_o  # Attn(x^): d wide
            z = x_hat[t, b] + attn
            expected[t, b] = x[t, b] + layer.fc2(F.relu(w_1 @ z + b_1))  # the residual + FFN(x^ + Attn(x^))

    full, incremental = _full_and_incremental(layer, x, enc, enc_pad)
    torch.testing.assert_close(full, expected, **CLOSE)
    torch.testing.assert_close(incremental, expected, **CLOSE)


@pytest.mark.parametrize("normalize_before", [True, False], ids=["pre-norm", "post-norm"])
def test_heads_read_their_own_ffn_wide_value_slices_and_incremental_decoding_matches(normalize_before):
    d, f, h, d_enc = 8, 12, 2, 6
    layer = _layer(d, f, h, d_enc, normalize_before=normalize_before)
    x, enc, enc_pad = _inputs(d, d_enc)
    x_hat = layer.layer_norm(x) if normalize_before else x
    dh, fh = d // h, f // h
    expected = torch.empty_like(x)
    for b in range(B):
        keys_enc = [j for j in range(S) if not enc_pad[b, j]]
        for t in range(T):
            q = layer.q_proj(x_hat[t, b])
            keys = [layer.k_enc(enc[j, b]) for j in keys_enc] + [layer.k_self(x_hat[j, b]) for j in range(t + 1)]
            values = [layer.v_enc(enc[j, b]) for j in keys_enc] + [layer.v_self(x_hat[j, b]) for j in range(t + 1)]
            folded = []  # W_1 Attn(x^), head by head: FFN-wide slices
            for i in range(h):
                scores = torch.stack([q[i * dh:(i + 1) * dh] @ k[i * dh:(i + 1) * dh] for k in keys]) / math.sqrt(dh)
                folded.append(sum(a * v[i * fh:(i + 1) * fh] for a, v in zip(torch.softmax(scores, 0), values)))
            y = x[t, b] + layer.fc2(F.relu(layer.fc1(x_hat[t, b]) + torch.cat(folded)))
            expected[t, b] = y if normalize_before else layer.layer_norm(y)

    full, incremental = _full_and_incremental(layer, x, enc, enc_pad)
    torch.testing.assert_close(full, expected, **CLOSE)
    torch.testing.assert_close(incremental, expected, **CLOSE)

    # beam search reorders the cache: two steps, swap the batch, two more = the full forward of the swapped batch
    state, steps, order = {}, [], torch.tensor([1, 0])
    for t in range(T):
        if t == 2:
            layer.reorder_incremental_state(state, order)
        batch = slice(None) if t < 2 else order
        out, _, _ = layer(x[t: t + 1, batch], enc[:, batch], enc_pad[batch], incremental_state=state)
        steps.append(out)
    swapped, _, _ = layer(x[:, order], enc[:, order], enc_pad[order], self_attn_mask=_future_mask(T))
    torch.testing.assert_close(torch.cat(steps[2:], 0), swapped[2:], **CLOSE)


def _args(*flags):
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), [
        SHIPPED_DICTS, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en", *flags])


def _build(*flags, seed=0):
    from fairseq import tasks

    args = _args(*flags)
    torch.manual_seed(seed)
    return tasks.setup_task(args).build_model(args)


TINY = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--share-decoder-input-output-embed"]


def test_arch_defaults_are_the_authors_and_stock_flags_override_or_are_refused():
    import argparse

    from fairseq import tasks
    from fairseq.models import ARCH_MODEL_REGISTRY

    args = _args("--arch", "can_transformer_iwslt")
    assert (args.encoder_layers, args.decoder_layers) == (12, 2)
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert args.attention_dropout == args.activation_dropout == 0.1
    model = _build("--arch", "can_transformer_iwslt", *TINY)
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None  # pre-norm's final norms
    layer = model.decoder.layers[0]
    assert layer.normalize_before and layer.attention_dropout.p == layer.activation_dropout.p == 0.1
    # each default is a stock flag, its help naming the authors' value and code
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY["can_transformer_iwslt"].add_args(parser)
    for dest, (value, _) in AUTHORS_DEFAULTS.items():
        text = parser._option_string_actions["--" + dest.replace("_", "-")].help
        assert f"can_transformer_iwslt: {value}" in text and "Lollipop321/compressed-attention" in text, text

    # stock flags override (--relu-dropout, the authors' name, as --activation-dropout)
    args = _args("--arch", "can_transformer_iwslt", "--encoder-layers", "3", "--decoder-layers", "1",
                 "--attention-dropout", "0", "--relu-dropout", "0.2")
    assert (args.encoder_layers, args.decoder_layers, args.attention_dropout, args.activation_dropout) == (3, 1, 0, 0.2)
    # a checkpoint of the post-norm arch keeps its normalisation: its saved args say so
    old = _args("--arch", "can_transformer_iwslt", *TINY)
    old.encoder_normalize_before = old.decoder_normalize_before = False
    post = tasks.setup_task(old).build_model(old)
    assert post.decoder.layer_norm is None and not post.decoder.layers[0].normalize_before

    for flag, message in (("--cross-self-attention", "already attends over"),
                          ("--no-cross-attention", "needs encoder-decoder attention")):
        with pytest.raises(ValueError, match=message):
            _build("--arch", "can_transformer_iwslt", *TINY, flag)


def test_activation_checkpointing_wraps_the_compressed_layers_and_changes_nothing():
    flags = ["--arch", "can_transformer_iwslt", "--encoder-layers", "2", *TINY, "--dropout", "0",
             "--attention-dropout", "0", "--relu-dropout", "0"]
    plain, ckpt = _build(*flags), _build(*flags, "--checkpoint-activations")
    assert all(hasattr(layer, "precheckpoint_forward") for layer in ckpt.decoder.layers)
    ckpt.load_state_dict(plain.state_dict())
    src = torch.tensor([[5, 6, 7, 2], [1, 8, 9, 2]])  # fairseq's left-padded sources (pad 1, eos 2)
    prev = torch.tensor([[2, 10, 11], [2, 12, 1]])
    outs = []
    for model in (plain, ckpt):
        model.train()
        out, _ = model(src, torch.tensor([4, 3]), prev)
        out.float().pow(2).mean().backward()
        outs.append((out.detach(), model.decoder.layers[0].fc1.weight.grad.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])


def test_a_checkpoint_from_before_fc1_loads_and_computes_what_it_did():
    """A layer saved before fc1 (and its version buffer) existed computed x + W_2 act(W_1 Attn(x^)): it loads with
    fc1 = 0, which adds nothing to that sum."""
    model = _build("--arch", "can_transformer_iwslt", "--encoder-layers", "2", *TINY)
    old = {k: v for k, v in model.state_dict().items()
           if not (k.startswith("decoder.layers.") and (".fc1." in k or k.endswith(".version")))}
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.fc1.weight.normal_(), layer.fc1.bias.normal_(), layer.version.zero_()
    model.load_state_dict(old, strict=True)  # fairseq's load_state_dict upgrades the state dict first
    for layer in model.decoder.layers:
        assert not layer.fc1.weight.any() and not layer.fc1.bias.any() and layer.version.item() == 2


@needs_teacher
def test_the_authors_configuration_trains_with_fairseq_train_and_generates(tmp_path):
    """The registered arch at its defaults (12 + 2 layers, pre-norm, attention/ReLU dropout 0.1), tiny widths, the
    authors' criterion: 3 updates of fairseq-train on real Multi30k, then fairseq-generate on a few sentences."""
    data = os.path.join(TEACHER_DIR, "data-bin")
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--arch", "can_transformer_iwslt", *TINY, *OPTIM_FLAGS,
            "--cpu", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "1024",
            "--max-update", "3", "--save-dir", tmp_path, "--no-epoch-checkpoints")
    ckpt = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    cfg = ckpt["cfg"]["model"]
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.decoder_normalize_before, cfg.activation_dropout) == (
        12, 2, True, 0.1)
    assert ckpt["model"]["decoder.layers.1.fc1.weight"].shape == (32, 16)
    # shard 0 of 128 batches of 8: the first batch, 8 of the 1014 valid sentences
    gen = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
                  "--beam", "5", "--batch-size", "8", "--max-len-b", "5", "--gen-subset", "valid", "--cpu",
                  "--distributed-world-size", "128", "--distributed-rank", "0")
    lines = gen.stdout.splitlines()
    hypotheses = [line for line in lines if line.startswith("H-")]
    assert len(hypotheses) == sum(line.startswith("S-") for line in lines) == 8
    assert all(math.isfinite(float(line.split("\t")[1])) for line in hypotheses)
