"""Deployment (issue 22): fc-export writes students as stock fairseq checkpoints that translate
identically with no --user-dir; CTranslate2's converter takes them and decodes like fairseq."""
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY_TRANSFORMER, TRAIN_FLAGS, USER_DIR, clean_env, run_cli
from test_pet_architecture import closed_form_non_embedding

import user_dir  # noqa: F401
from user_dir.deploy.export import ExportError, export, plugin_references

TINY_PET = ["--arch", "pet_transformer_iwslt", "--encoder-embed-dim", "32", "--decoder-embed-dim", "24",
            "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-decoder-input-output-embed"]
PAIRINGS = {  # name: (flags, logical layers' physical count, decoder matrix pairs)
    "paper": ([], 2, "qself-qed"),  # (1,3),(2,4), encoder Q<->K, decoder Q_self = Q_ed
    "ablation": (["--layer-pairing", "mirrored", "--encoder-matrix-pairs", "vq", "--decoder-matrix-pairs",
                  "kv-self-ed"], 2, "kv-self-ed"),
}
GEN = ["--max-len-a", "0", "--max-len-b", "8", "--batch-size", "32", "--required-batch-size-multiple", "1"]

# stock fairseq-generate in a Python that never imports the plug-in (and says so at exit)
STOCK_GENERATE = """
import runpy, sys
sys.argv = ["fairseq-generate"] + sys.argv[1:]
try:
    runpy.run_module("fairseq_cli.generate", run_name="__main__")
finally:
    print("PLUGIN_IMPORTED=%s" % any(m == "user_dir" or m.startswith("user_dir.") for m in sys.modules),
          file=sys.stderr)
"""


@pytest.fixture(scope="module")
def small_test(multi30k_slice, tmp_path_factory):
    """The slice's dictionaries and the first 60 test sentences, binarised (quick generation)."""
    dest = tmp_path_factory.mktemp("small-test")
    text = os.path.join(multi30k_slice, "text")
    for lang in ("de", "en"):
        with open(os.path.join(text, f"test.bpe.{lang}"), encoding="utf-8") as f:
            lines = f.readlines()[:60]
        with open(dest / f"head.{lang}", "w", encoding="utf-8") as f:
            f.writelines(lines)
    run_cli("fairseq_cli.preprocess", "-s", "de", "-t", "en", "--testpref", dest / "head", "--destdir", dest,
            "--srcdict", os.path.join(multi30k_slice, "dict.de.txt"),
            "--tgtdict", os.path.join(multi30k_slice, "dict.en.txt"), "--workers", "1")
    return str(dest)


def _train(data, save_dir, arch_flags, updates=3):
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, *arch_flags, *TRAIN_FLAGS, "--lr", "5e-3",
            "--max-update", str(updates), "--save-dir", save_dir, "--cpu", "--no-epoch-checkpoints")
    return os.path.join(save_dir, "checkpoint_last.pt")


def stock_generate(data, path, *flags):
    """fairseq-generate without --user-dir, in a process that never imports the plug-in."""
    env = clean_env()
    env["PYTHONPATH"] = ""  # not even importable
    proc = subprocess.run([sys.executable, "-c", STOCK_GENERATE, data, "--path", path, *flags], capture_output=True,
                          text=True, env=env, cwd="/", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "PLUGIN_IMPORTED=False" in proc.stderr
    return proc.stdout


def hypotheses(generate_output: str, kind: str = "H") -> dict:
    return dict(line.split("\t", 1) for line in generate_output.splitlines() if line.startswith(kind + "-"))


@pytest.fixture(scope="module")
def exported(multi30k_slice, tmp_path_factory):
    """PET students of two pairings and a plain 2-layer student, trained a few updates and exported."""
    out = {}
    for name, flags in [(n, TINY_PET + f) for n, (f, _, _) in PAIRINGS.items()] + [("plain", TINY_TRANSFORMER)]:
        work = tmp_path_factory.mktemp(f"export-{name}")
        student, plain = _train(multi30k_slice, work, flags), str(work / "plain.pt")
        if name == "paper":  # the console script's path once; the others in-process (a start-up less)
            log = run_cli("user_dir.deploy.export", student, "--out", plain).stderr
            counts = re.search(r"non-embedding ([\d,]+) -> ([\d,]+)", log).groups()
            counts = tuple(int(n.replace(",", "")) for n in counts)
        else:
            summary = export(student, plain)
            counts = (summary["non_embedding_student"], summary["non_embedding_export"])
        out[name] = {"student": student, "plain": plain, "non_embedding": counts}
    return out


@pytest.mark.parametrize("name", ["paper", "ablation", "plain"])
def test_exported_student_translates_identically_without_the_plugin(exported, small_test, name):
    paths = exported[name]
    ours = run_cli("fairseq_cli.generate", small_test, "--user-dir", USER_DIR, "--path", paths["student"],
                   "--beam", "5", *GEN).stdout
    stock = stock_generate(small_test, paths["plain"], "--beam", "5", *GEN)
    ours_h, stock_h = hypotheses(ours), hypotheses(stock)
    assert len(ours_h) == 60
    assert stock_h == ours_h  # sentence ids, scores and hypotheses, string for string
    assert hypotheses(stock, "P") == hypotheses(ours, "P")


@pytest.mark.parametrize("name", ["paper", "ablation"])
def test_export_materialises_every_logical_layer(exported, name):
    _, physical, decoder_pairs = PAIRINGS[name]
    student = torch.load(exported[name]["student"], weights_only=True)["model"]  # (the plug-in's allow-list)
    plain = torch.load(exported[name]["plain"], weights_only=True)["model"]
    # the role swap is written into the layer: logical layer 3's Q is physical layer 1's K (paper) ...
    if name == "paper":
        assert torch.equal(plain["encoder.layers.2.self_attn.q_proj.weight"],
                           student["encoder.layers.0.self_attn.k_proj.weight"])
        assert torch.equal(plain["decoder.layers.1.encoder_attn.q_proj.weight"],
                           plain["decoder.layers.1.self_attn.q_proj.weight"])
    else:  # mirrored (1,4),(2,3), V<->Q: logical layer 4's V is layer 1's Q; decoder K = V
        assert torch.equal(plain["encoder.layers.3.self_attn.v_proj.weight"],
                           student["encoder.layers.0.self_attn.q_proj.weight"])
        assert torch.equal(plain["decoder.layers.2.self_attn.v_proj.weight"],
                           plain["decoder.layers.1.self_attn.k_proj.weight"])
    # ... as separate tensors: the export's parameter count is the unshared 4+4-layer model's
    shared, unshared = exported[name]["non_embedding"]
    assert shared == closed_form_non_embedding(32, 24, 4, physical, decoder_pairs)
    assert unshared == closed_form_non_embedding(32, 24, 4, 4, "none")
    storages = {t.untyped_storage().data_ptr() for k, t in plain.items() if ".layers." in k}
    assert len(storages) == sum(".layers." in k for k in plain)


@pytest.mark.parametrize("name", ["paper", "plain"])
def test_exported_checkpoint_carries_no_reference_to_the_plugin(exported, name):
    path = exported[name]["plain"]
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []  # opens with weights_only, no allow-list
    state = torch.load(path, weights_only=True)
    cfg = state["cfg"]
    assert isinstance(cfg, dict) and state["args"] is None
    assert plugin_references(cfg) == []
    assert cfg["common"]["user_dir"] is None and cfg["model"]["user_dir"] is None
    assert cfg["model"]["arch"] == "transformer_iwslt_de_en" and cfg["model"]["_name"] == "transformer_iwslt_de_en"
    assert cfg["task"]["_name"] == "translation" and cfg["criterion"]["_name"] == "label_smoothed_cross_entropy"
    assert not {"layer_pairing", "encoder_matrix_pairs", "decoder_matrix_pairs"} & set(cfg["model"])
    raw = open(path, "rb").read()
    for needle in (b"pet_transformer", b"layer_pairing", USER_DIR.encode()):
        assert needle not in raw, needle


def _rewritten(path, out, **changes):
    state = torch.load(path, weights_only=True)
    for key, value in changes.items():
        group, field = key.split("__")
        if isinstance(state["cfg"][group], dict):
            state["cfg"][group][field] = value
        else:
            setattr(state["cfg"][group], field, value)
    torch.save(state, out)
    return str(out)


def test_a_plugin_criterion_and_its_options_are_replaced(exported, tmp_path):
    """A word-KD student (``--criterion kd --teacher-path ...``) exports with stock label-smoothed CE."""
    kd = _rewritten(exported["plain"]["student"], tmp_path / "kd.pt", criterion___name="kd", criterion__kd_alpha=0.5,
                    model__criterion="kd", model__teacher_path="/somewhere/teacher.pt")
    export(kd, str(tmp_path / "plain.pt"))
    cfg = torch.load(tmp_path / "plain.pt", weights_only=True)["cfg"]
    assert cfg["criterion"]["_name"] == "label_smoothed_cross_entropy" and "kd_alpha" not in cfg["criterion"]
    assert cfg["model"]["criterion"] == "label_smoothed_cross_entropy" and "teacher_path" not in cfg["model"]
    assert plugin_references(cfg) == []


def test_non_exportable_students_are_refused_with_the_reason(exported, tmp_path):
    student = exported["paper"]["student"]
    can = _rewritten(student, tmp_path / "can.pt", model__arch="can_transformer_iwslt")
    with pytest.raises(ExportError, match=r"model can_transformer .* CAN's decoder layer is a single compressed"):
        export(can, str(tmp_path / "x.pt"))
    variator = _rewritten(exported["plain"]["student"], tmp_path / "variator.pt", task___name="variator_translation")
    with pytest.raises(ExportError, match=r"task variator_translation: Variator's compression plugins"):
        export(variator, str(tmp_path / "x.pt"))
    for arch, reason in (("apc_transformer", r"run `python -m user_dir.apc.tools.finalize"),
                         ("ghost_transformer_iwslt_de_en", r"GhostBERT encoder keeps M of N_H heads")):
        with pytest.raises(ExportError, match=reason):
            export(_rewritten(student, tmp_path / f"{arch}.pt", model__arch=arch), str(tmp_path / "x.pt"))
    proc = run_cli("user_dir.deploy.export", can, "--out", tmp_path / "x.pt", check=False)
    assert proc.returncode != 0 and "fc-export:" in proc.stderr and "CAN" in proc.stderr
    assert not os.path.exists(tmp_path / "x.pt")


# ----------------------------------------------------------------------------------------------
# CTranslate2
# ----------------------------------------------------------------------------------------------
def test_ctranslate2_greedy_decoding_matches_fairseq_token_for_token(exported, small_test, tmp_path):
    pytest.importorskip("ctranslate2")
    from user_dir.deploy import ct2_engine

    plain = exported["paper"]["plain"]
    out = ct2_engine.convert(plain, small_test, str(tmp_path / "ct2"), "float32")
    rows = ct2_engine.main(["generate", out, small_test, "--beam", "1", "--max-len-b", "8", "--batch-size", "32",
                            "--post-process", "none", "--threads", "1"])
    ct2 = {f"{r['id']}": r["hypothesis"] for r in rows}
    fairseq = {k: v.split("\t")[1] for k, v in
               hypotheses(stock_generate(small_test, plain, "--beam", "1", *GEN)).items()}
    assert len(ct2) == 60 and {f"H-{k}": v for k, v in ct2.items()} == fairseq  # BPE tokens, no post-processing
    # int8 converts and decodes too (its output may differ: quantised weights)
    assert ct2_engine.convert(plain, small_test, str(tmp_path / "ct2-int8"), "int8")
    assert ct2_engine.model_bytes(str(tmp_path / "ct2-int8")) < ct2_engine.model_bytes(out)


def test_ctranslate2_refusals_name_the_reason(exported, small_test, tmp_path):
    pytest.importorskip("ctranslate2")
    from user_dir.deploy import ct2_engine

    heads = _rewritten(exported["paper"]["plain"], tmp_path / "heads.pt", model__decoder_attention_heads=4)
    with pytest.raises(ct2_engine.CT2Error, match=r"(?s)converter refuses .*--encoder-attention-heads and --decoder-attention-heads"):
        ct2_engine.convert(heads, small_test, str(tmp_path / "x"))
    with pytest.raises(ct2_engine.CT2Error, match=r"plug-in model .* run fc-export on it first"):
        ct2_engine.convert(exported["paper"]["student"], small_test, str(tmp_path / "x"))


def test_measure_puts_both_engines_in_one_table(exported, small_test, tmp_path):
    """fc-measure --engine: a CTranslate2 directory sits beside its fairseq checkpoint, scored alike
    (float32 weights decode the same sentences, so the BLEU is equal), parameters not counted."""
    pytest.importorskip("ctranslate2")
    from user_dir.deploy import ct2_engine
    from user_dir.tools import measure

    plain = exported["paper"]["plain"]
    ct2 = ct2_engine.convert(plain, small_test, str(tmp_path / "ct2"), "float32")
    out, raw = tmp_path / "table.md", tmp_path / "table.json"
    rows = measure.main([small_test, "--path", plain, ct2, "--names", "fairseq", "ct2", "--runs", "1",
                         "--threads", "1", "--max-len-b", "8", "--batch-size", "32", "--cpu",
                         "--out", str(out), "--json", str(raw)])
    fs, c2 = rows
    assert (fs["engine"], c2["engine"]) == ("fairseq", "ctranslate2")  # --engine auto, by what each path is
    assert fs["sentences"] == c2["sentences"] == 60
    assert c2["bleu_tok"] == pytest.approx(fs["bleu_tok"]) and c2["sacrebleu"] == pytest.approx(fs["sacrebleu"])
    assert c2["params"] is None and c2["compression_rate"] is None and fs["compression_rate"] == 100.0
    table = out.read_text()
    assert "| ct2 | ctranslate2 |" in table and "| - | - | - |" in table
    with pytest.raises(SystemExit, match="needs a CTranslate2 model directory"):
        measure.main([small_test, "--path", plain, "--engine", "ctranslate2"])
    with pytest.raises(SystemExit, match="gives 3 engines for 2"):
        measure.main([small_test, "--path", plain, ct2, "--engine", "fairseq", "ctranslate2", "auto"])
