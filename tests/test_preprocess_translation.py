"""Translation data pipelines: exact reproduction of the reference files, and bad input."""
import filecmp
import gzip
import os

import pytest

from conftest import REFERENCE_TEACHER_DIR, SHARED_DATA, needs_reference_teacher, needs_shared_data, run_cli

from preprocess import prepare_multi30k, prepare_translation
from preprocess.iwslt_xml import read_train_tags, read_xml_segments
from preprocess.textio import DataError, read_lines
from preprocess.translation_text import apply_bpe, clean_corpus

IWSLT = os.path.join(SHARED_DATA, "iwslt14.de-en")


@needs_shared_data
@pytest.mark.parametrize("split", ["valid", "test"])
def test_iwslt14_bpe_reproduces_fairseq_files_byte_for_byte(split, tmp_path):
    for lang in ("de", "en"):
        tok = read_lines(os.path.join(IWSLT, "tok", f"{split}.{lang}"), allow_empty=True)
        out = tmp_path / f"{split}.{lang}"
        out.write_text("".join(line + "\n" for line in apply_bpe(os.path.join(IWSLT, "code"), tok)), encoding="utf-8")
        assert filecmp.cmp(out, os.path.join(IWSLT, "bpe", f"{split}.{lang}"), shallow=False), f"{split}.{lang} differs"


@needs_reference_teacher
def test_multi30k_pipeline_reproduces_the_reference_teacher_data(tmp_path):
    """Embedded raw text -> our pipeline -> the reference teacher's BPE codes and binarised data, exactly."""
    dest = tmp_path / "m30k"
    run_cli("preprocess.prepare_multi30k", "--dest", dest)
    assert filecmp.cmp(dest / "code", os.path.join(REFERENCE_TEACHER_DIR, "code"), shallow=False)
    for name in ["dict.de.txt", "dict.en.txt"] + [f"{s}.de-en.{l}.{e}" for s in ("train", "valid", "test")
                                                  for l in ("de", "en") for e in ("bin", "idx")]:
        assert filecmp.cmp(dest / name, os.path.join(REFERENCE_TEACHER_DIR, "data-bin", name), shallow=False), name
    # idempotent: a second run with the same options does nothing (no file rewritten)
    stamps = {name: os.stat(dest / name).st_mtime_ns for name in os.listdir(dest)}
    again = run_cli("preprocess.prepare_multi30k", "--dest", dest)
    assert "already prepared" in again.stderr
    assert {name: os.stat(dest / name).st_mtime_ns for name in os.listdir(dest)} == stamps


def test_multi30k_reverse_direction_and_reuse_of_codes(multi30k_slice, tmp_path):
    from fairseq.data import Dictionary, data_utils

    from preprocess.translation_text import moses_tokenize

    dest = tmp_path / "en-de"
    prepare_multi30k.main(["--src", "en", "--tgt", "de", "--dest", str(dest), "--train-lines", "500",
                           "--bpe-codes", os.path.join(multi30k_slice, "code")])
    assert filecmp.cmp(dest / "code", os.path.join(multi30k_slice, "code"), shallow=False)
    # English is the source now: the first 500 training pairs, lowercased, Moses-tokenised, with the given BPE
    raw = {(stem, lang): read_lines(os.path.join(prepare_multi30k.EMBEDDED, f"{stem}.{lang}.gz"))
           for stem, lang in (("train", "en"), ("train", "de"), ("test_2016_flickr", "de"))}
    dictionary = Dictionary.load(str(dest / "dict.en.txt"))
    for lang in ("en", "de"):
        binarised = data_utils.load_indexed_dataset(str(dest / f"train.en-de.{lang}"), dictionary)
        assert len(binarised) == 500
        expected = moses_tokenize([raw["train", lang][0]], lang, lowercase=True, escape=False)[0]
        assert dictionary.string(binarised[0], "subword_nmt") == expected, lang
    # the German references, lowercased and untokenised, are kept for sacreBLEU
    assert read_lines(str(dest / "text" / "test.raw.de"))[:3] == [line.lower() for line in raw["test_2016_flickr", "de"][:3]]


def _write(path, lines, gz=False):
    data = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def _raw_multi30k(tmp_path, de_train, en_train):
    raw = tmp_path / "raw"
    raw.mkdir()
    for stem in ("val", "test_2016_flickr"):
        _write(raw / f"{stem}.de", ["ein hund ."])
        _write(raw / f"{stem}.en", ["a dog ."])
    _write(raw / "train.de", de_train)
    _write(raw / "train.en", en_train)
    return raw


def test_misaligned_parallel_files_are_reported_and_nothing_is_written(tmp_path):
    raw = _raw_multi30k(tmp_path, ["ein hund .", "eine katze ."], ["a dog ."])
    dest = tmp_path / "out"
    with pytest.raises(DataError, match=r"train\.de has 2 lines but .*train\.en has 1"):
        prepare_multi30k.main(["--raw-dir", str(raw), "--dest", str(dest)])
    assert not dest.exists()


def test_empty_line_is_reported_with_file_and_line(tmp_path):
    raw = _raw_multi30k(tmp_path, ["ein hund .", "", "eine katze ."], ["a dog .", "x", "a cat ."])
    with pytest.raises(DataError, match=r"train\.de:2: empty line"):
        prepare_multi30k.main(["--raw-dir", str(raw), "--dest", str(tmp_path / "out")])


def test_missing_file_and_bad_flags(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        prepare_multi30k.main(["--raw-dir", str(tmp_path), "--dest", str(tmp_path / "out")])
    with pytest.raises(DataError, match="--bpe-codes"):
        prepare_multi30k.main(["--dest", str(tmp_path / "out"), "--bpe-codes", str(tmp_path / "nope")])
    with pytest.raises(DataError, match="--src and --tgt"):
        prepare_multi30k.main(["--src", "en", "--tgt", "en", "--dest", str(tmp_path / "out")])


def test_failed_run_leaves_an_earlier_destination_intact(multi30k_slice, tmp_path):
    raw = _raw_multi30k(tmp_path, ["ein hund ."], [])
    before = sorted(os.listdir(multi30k_slice))
    with pytest.raises(DataError):
        prepare_multi30k.main(["--raw-dir", str(raw), "--dest", multi30k_slice, "--force"])
    assert sorted(os.listdir(multi30k_slice)) == before


def test_clean_corpus_follows_clean_corpus_n():
    src = ["a b c", "a", "", "a b c d e f g", "x " * 200]
    tgt = ["a b", "a b c d", "a", "a b c d e", "y"]
    kept_src, kept_tgt = clean_corpus(src, tgt, 1, 175, 1.5)
    # ratio 3/2 = 1.5 kept; 1 vs 4 tokens dropped; empty dropped; 7/5 = 1.4 kept; 200 tokens dropped
    assert kept_src == ["a b c", "a b c d e f g"] and kept_tgt == ["a b", "a b c d e"]


def _iwslt_release(tmp_path):
    """A miniature WIT3 release in the official layout (real IWSLT'14 sentences)."""
    rel = tmp_path / "release" / "en-es"
    rel.mkdir(parents=True)
    en = ["thank you so much , chris .", "and it 's truly a great honor .", "i have been blown away by this ."] * 40
    es = ["muchas gracias chris .", "y es en verdad un gran honor .", "me he quedado conmovido ."] * 40
    for lang, lines in (("en", en), ("es", es)):
        _write(rel / f"train.tags.en-es.{lang}", ["<url>http://www.ted.com/talks/x</url>", "<talkid>1</talkid>",
                                                  "<keywords>talks</keywords>", f"<title>title {lang}</title>"] + lines)
        for name in ("IWSLT14.TED.dev2010", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012"):
            _write(rel / f"{name}.en-es.{lang}.xml", ['<refset>', '<doc docid="1">',
                                                      f'<seg id="1"> {lines[0]} </seg>', f'<seg id="2">{lines[1]}</seg>',
                                                      '</doc>', '</refset>'])
    return rel.parent


def test_iwslt_reading_follows_prepare_iwslt14(tmp_path):
    rel = _iwslt_release(tmp_path)
    train = read_train_tags(str(rel / "en-es" / "train.tags.en-es.en"))
    assert train[0] == "title en" and not any("<url>" in t or "<talkid>" in t for t in train)
    segs = read_xml_segments(str(rel / "en-es" / "IWSLT14.TED.dev2010.en-es.en.xml"))
    assert segs == ["thank you so much , chris .", "and it 's truly a great honor ."]


def test_sentencepiece_corpus_pipeline_both_directions(tmp_path):
    import sentencepiece
    from fairseq.data import Dictionary, data_utils

    rel = _iwslt_release(tmp_path)
    for src, tgt in (("en", "es"), ("es", "en")):
        dest = tmp_path / f"{src}-{tgt}"
        prepare_translation.main(["--corpus", "iwslt14.en-es", "--src", src, "--tgt", tgt, "--raw-dir", str(rel),
                                  "--dest", str(dest), "--spm-vocab", "60", "--workers", "1"])
        # every pair binarised, each side in its own language: decoded ids give back the release's text
        sp = sentencepiece.SentencePieceProcessor(model_file=str(dest / "spm.model"))
        dictionary = Dictionary.load(str(dest / f"dict.{src}.txt"))
        for split, first in (("train", {"en": "title en", "es": "title es"}),
                             ("test", {"en": "thank you so much , chris .", "es": "muchas gracias chris ."})):
            for lang in (src, tgt):
                ds = data_utils.load_indexed_dataset(str(dest / f"{split}.{src}-{tgt}.{lang}"), dictionary)
                assert len(ds) == (121 if split == "train" else 6)  # title + 120 lines; 3 test sets x 2 segments
                assert sp.decode(dictionary.string(ds[0]).split()) == first[lang], (split, lang)
    with pytest.raises(DataError, match="--src fr --tgt en"):
        prepare_translation.main(["--corpus", "iwslt14.en-es", "--src", "fr", "--tgt", "en", "--raw-dir", str(rel),
                                  "--dest", str(tmp_path / "x")])


def test_command_line_reports_bad_input_without_a_traceback(tmp_path):
    proc = run_cli("preprocess.prepare_multi30k", "--src", "en", "--tgt", "en", "--dest", tmp_path / "x", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("error: --src and --tgt are both 'en': choose two different languages")


# ---------------------------------------------------------------------------------------------
# any parallel corpus: preprocess.prepare_parallel on plain aligned files laid out unlike Multi30k
# ---------------------------------------------------------------------------------------------
def _iwslt_text_corpus(tmp_path):
    """Real IWSLT'14 sentences (the tokenised valid/test text) as three splits in three folders,
    named freely: train = 400 pairs of valid, dev = test pairs 1-30, eval = test pairs 31-60."""
    tok = {(split, lang): read_lines(os.path.join(IWSLT, "tok", f"{split}.{lang}")) for split in ("valid", "test")
           for lang in ("de", "en")}
    layout = {"train": (tmp_path / "corpus" / "ted-train", tok["valid", "de"][:400], tok["valid", "en"][:400]),
              "valid": (tmp_path / "held-out" / "dev", tok["test", "de"][:30], tok["test", "en"][:30]),
              "test": (tmp_path / "eval.set", tok["test", "de"][30:60], tok["test", "en"][30:60])}
    for prefix, de, en in layout.values():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        _write(prefix.parent / f"{prefix.name}.de", de)
        _write(prefix.parent / f"{prefix.name}.en.gz", en, gz=True)  # one side gzipped: both are read
    return {split: (str(prefix), {"de": de, "en": en}) for split, (prefix, de, en) in layout.items()}


def _prefix_args(corpus):
    return [arg for split in ("train", "valid", "test") for arg in (f"--{split}-prefix", corpus[split][0])]


@needs_shared_data
def test_any_parallel_corpus_both_directions(tmp_path):
    import sentencepiece
    from fairseq.data import Dictionary, data_utils

    from preprocess import prepare_parallel
    from preprocess.translation_text import moses_tokenize

    corpus = _iwslt_text_corpus(tmp_path)
    # DE->EN, text tokenised already, joint BPE: every pair binarised and decoded back to the input, each side its own
    dest = tmp_path / "bin.de-en"
    argv = [*_prefix_args(corpus), "-s", "de", "-t", "en", "--tokenizer", "none", "--bpe-merges", "300",
            "--workers", "1", "--dest", str(dest)]
    prepare_parallel.main(argv)
    dictionary = Dictionary.load(str(dest / "dict.de.txt"))
    assert filecmp.cmp(dest / "dict.de.txt", dest / "dict.en.txt", shallow=False)  # joined dictionary
    for split, n in (("train", 400), ("valid", 30), ("test", 30)):
        for lang in ("de", "en"):
            ds = data_utils.load_indexed_dataset(str(dest / f"{split}.de-en.{lang}"), dictionary)
            assert len(ds) == n
            for i in (0, n - 1):
                assert dictionary.string(ds[i], "subword_nmt") == corpus[split][1][lang][i], (split, lang, i)
    assert read_lines(str(dest / "text" / "test.raw.en")) == corpus["test"][1]["en"]
    assert any("@@" in line for line in read_lines(str(dest / "text" / "train.bpe.de")))  # BPE did split words
    # idempotent; a changed input file is noticed and the destination redone
    assert prepare_parallel.main(argv) == str(dest)
    stamp = os.stat(dest / "train.de-en.de.bin").st_mtime_ns
    prepare_parallel.main(argv)
    assert os.stat(dest / "train.de-en.de.bin").st_mtime_ns == stamp
    _write(tmp_path / "eval.set.de", corpus["test"][1]["de"][:29] + ["ein neuer satz ."])
    prepare_parallel.main(argv)
    ds = data_utils.load_indexed_dataset(str(dest / "test.de-en.de"), dictionary)
    assert dictionary.string(ds[29], "subword_nmt") == "ein neuer satz ."

    # EN->DE, Moses tokenisation and one joint sentencepiece model
    dest = tmp_path / "bin.en-de"
    prepare_parallel.main([*_prefix_args(corpus), "-s", "en", "-t", "de", "--subword", "sentencepiece",
                           "--spm-vocab", "400", "--workers", "1", "--dest", str(dest)])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(dest / "spm.model"))
    dictionary = Dictionary.load(str(dest / "dict.en.txt"))
    for lang in ("en", "de"):
        ds = data_utils.load_indexed_dataset(str(dest / f"valid.en-de.{lang}"), dictionary)
        expected = moses_tokenize(corpus["valid"][1][lang][:3], lang, lowercase=False, escape=False)
        assert [sp.decode(dictionary.string(ds[i]).split()) for i in range(3)] == expected, lang
    assert read_lines(str(dest / "text" / "test.raw.de")) == read_lines(str(tmp_path / "eval.set.de"))


@needs_shared_data
def test_any_parallel_corpus_bad_input_names_file_and_line(tmp_path):
    from preprocess import prepare_parallel

    corpus = _iwslt_text_corpus(tmp_path)
    dest = tmp_path / "out"
    run = lambda *extra: prepare_parallel.main([*_prefix_args(corpus), "-s", "de", "-t", "en",  # noqa: E731
                                                "--dest", str(dest), *extra])
    dev_de, dev_en = tmp_path / "held-out" / "dev.de", tmp_path / "held-out" / "dev.en.gz"
    lines = corpus["valid"][1]["de"]
    # mismatched line counts
    _write(dev_de, lines[:29])
    with pytest.raises(DataError, match=r"dev\.de has 29 lines but .*dev\.en\.gz has 30"):
        run()
    # an empty line
    _write(dev_de, lines[:11] + [""] + lines[12:])
    with pytest.raises(DataError, match=r"dev\.de:12: empty line"):
        run()
    # not UTF-8: a Latin-1 line
    dev_de.write_bytes("".join(line + "\n" for line in lines[:6]).encode() + "für\n".encode("latin-1")
                       + "".join(line + "\n" for line in lines[7:]).encode())
    with pytest.raises(DataError, match=r"dev\.de:7: not UTF-8 \(byte 0xfc at column 2\)"):
        run()
    # a missing file, and a missing language
    os.remove(dev_en)
    with pytest.raises(DataError, match=r"held-out/dev\.en\[\.gz\]: no such file"):
        run()
    with pytest.raises(DataError, match=r"ted-train\.fr\[\.gz\]: no such file"):
        prepare_parallel.main([*_prefix_args(corpus), "-s", "de", "-t", "fr", "--dest", str(dest)])
    assert not dest.exists()  # nothing half-written
    proc = run_cli("preprocess.prepare_parallel", *_prefix_args(corpus), "-s", "de", "-t", "en", "--dest", dest,
                   check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "dev.en[.gz]: no such file" in proc.stderr
